import os, sys, torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "tests/bench")
from torch.fx.experimental.proxy_tensor import make_fx
from triton.testing import do_bench
from engine.codegen import decomposition_table
from engine.codegen.triton import compile_fx_triton
from engine.codegen.triton.heuristics import Config
def sweep(name, fn, inputs, nbytes, configs):
    gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    c = compile_fx_triton(gm, list(inputs))
    assert c.fallback_reason is None, c.fallback_reason
    (ks, ) = c.triton_kernels.values()
    lau = c._call.__globals__[ks.name]
    for cfg in configs:
        lau.configs.clear()
        lau.config_for = lambda args, x, r, cfg=cfg: cfg
        ms = do_bench(lambda: c(*inputs), warmup=10, rep=40, return_mode="median")
        print(f"{name} xc={ks.x_contiguous} {cfg}: {ms*1000:.1f} us {nbytes/ms/1e6:.0f} GB/s", flush=True)
for cols in (4096, 1024):
    x = torch.randn(16384, cols, device="cuda", dtype=torch.bfloat16)
    sweep(f"colsum{cols}", lambda t: t.sum(0), (x,), x.numel() * 2,
          [Config(xb, rb, w) for xb, rb in ((64, 64), (32, 128), (16, 256), (8, 512), (16, 128), (8, 256)) for w in (4, 8)])
import engine
from bench_gpu import Block
m = Block(1024, 16).to("cuda", torch.bfloat16)
x = torch.randn(8, 2048, 1024, device="cuda", dtype=torch.bfloat16)
cm = engine.compile(m)
for _ in range(3):
    out = cm(x); out.float().square().mean().backward()
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        out = cm(x); out.float().square().mean().backward()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))
