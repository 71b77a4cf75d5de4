import os, sys, tempfile, time, cProfile, pstats
_TMP = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = os.path.join(_TMP, "triton")
os.environ["ENGINE_CACHE_DIR"] = os.path.join(_TMP, "engine")
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "tests/bench")
import torch, engine
from bench_gpu import Block
m = Block(1024, 16).to("cuda", torch.bfloat16)
x = torch.randn(8, 2048, 1024, device="cuda", dtype=torch.bfloat16)
cm = engine.compile(m)
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
out = cm(x); out.float().square().mean().backward(); torch.cuda.synchronize()
pr.disable()
print("cold", time.perf_counter() - t)
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(30)
st.sort_stats("tottime").print_stats(15)
