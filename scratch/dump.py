import os, sys, torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "tests/bench")
import engine, observe
from bench_gpu import Block
srcs = {}
def sub(ev):
    if ev.metadata.get("name") == "kernel_code":
        srcs.setdefault(ev.metadata["kernel"], []).append(ev.payload())
observe.subscribe(sub, events=["artifact"])
m = Block(1024, 16).to("cuda", torch.bfloat16)
x = torch.randn(8, 2048, 1024, device="cuda", dtype=torch.bfloat16)
cm = engine.compile(m)
out = cm(x); out.float().square().mean().backward()
from engine.codegen import debug_files
d = debug_files()
with open(os.path.join(os.environ.get("OUT", "/tmp"), "bw_wrapper.py"), "w") as f:
    f.write(d["output_code.py"])
with open(os.path.join(os.environ.get("OUT", "/tmp"), "kernels.txt"), "w") as f:
    for k, v in srcs.items():
        f.write(f"##### {k}\n" + "\n".join(v) + "\n")
