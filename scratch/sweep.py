import os, sys, torch, itertools
sys.path.insert(0, os.getcwd())
from torch.fx.experimental.proxy_tensor import make_fx
from triton.testing import do_bench
from engine.codegen import decomposition_table
from engine.codegen.triton import compile_fx_triton, kernel as K
from engine.codegen.triton.heuristics import Config
import torch.nn.functional as F
def sweep(name, fn, inputs, nbytes, persist_max, configs):
    K.PERSISTENT_MAX = persist_max
    gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    c = compile_fx_triton(gm, list(inputs))
    assert c.fallback_reason is None, c.fallback_reason
    (ks, ) = c.triton_kernels.values()
    import engine.codegen.triton.launcher as L
    mod = [m for m in L._modules.values()][-1]
    launcher = None
    for cfg in configs:
        c._call.__globals__[ks.name].configs.clear()
        lau = c._call.__globals__[ks.name]
        lau.config_for = lambda args, x, r, cfg=cfg: cfg
        try:
            ms = do_bench(lambda: c(*inputs), warmup=10, rep=50, return_mode="median")
            print(f"{name} persistent={ks.persistent} {cfg}: {ms*1000:.1f} us {nbytes/ms/1e6:.0f} GB/s", flush=True)
        except Exception as e:
            print(name, cfg, "FAIL", str(e)[:200])
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
nb = 2 * x.numel() * 2
sweep("softmax", lambda t: torch.softmax(t, -1), (x,), nb, 8192,
      [Config(1, 8192, w) for w in (4, 8, 16, 32)])
sweep("softmax", lambda t: torch.softmax(t, -1), (x,), nb, 0,
      [Config(1, r, w) for r in (1024, 2048, 4096) for w in (4, 8, 16)])
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16); w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
sweep("ln_gelu", lambda t, a, b: F.gelu(F.layer_norm(t, (4096,), a, b)), (x, w, w), 2 * x.numel() * 2, 8192,
      [Config(xb, 4096, wp) for xb in (1, 2) for wp in (4, 8, 16)])
x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
sweep("rmsnorm", rms, (x, w), 2 * x.numel() * 2, 8192, [Config(xb, 4096, wp) for xb in (1, 2) for wp in (4, 8, 16)])
