"""CPU benchmark, one run: eager vs torch.compile (inductor) vs ours (engine.compile with
the "inductor" backend) on a pointwise chain, LayerNorm+GELU, softmax, RMSNorm, an MLP and
a small transformer block (inference and a training step).

Prints, per model: runtime (best and median of interleaved rounds, ms), speedup of each compiler over eager, ours vs
torch.compile, and cold and warm compile times (warm: the same graphs compiled again in a
fresh compiler state, kernels from the on-disk caches).

    .venv/bin/python tests/bench/bench_cpu_inductor.py [--quick] [--only softmax,train]
"""

import os
import sys
import tempfile
import time

_ours_cache = tempfile.mkdtemp(prefix="bench-engine-cache-")
_torch_cache = tempfile.mkdtemp(prefix="bench-torchinductor-cache-")
os.environ["ENGINE_CACHE_DIR"] = _ours_cache
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _torch_cache

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import engine  # noqa: E402  (first: it owns TORCH_LOGS)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

QUICK = "--quick" in sys.argv
# --only SUBSTR[,SUBSTR...]: run only the models whose name contains one of them
ONLY = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None


class PointwiseChain(nn.Module):
    def forward(self, x, y):
        return torch.tanh((x * 1.5 + y).relu() * y - 0.5).sigmoid() * x


class LayerNormGelu(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return F.gelu(self.ln(x))


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class MLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = MLP(d, 4 * d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TrainStep(nn.Module):
    """forward + backward of the block (the loss and its gradients)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x).pow(2).mean()


def models():
    s = 4 if QUICK else 1
    n = 4_194_304 // s
    r, d = 4096 // s, 1024
    yield "pointwise chain f32", PointwiseChain(), (torch.randn(n), torch.randn(n)), False
    yield "LayerNorm+GELU f32", LayerNormGelu(d), (torch.randn(r, d),), False
    yield "softmax f32", Softmax(), (torch.randn(r, d),), False
    yield "RMSNorm f32", RMSNorm(d), (torch.randn(r, d),), False
    yield "MLP f32 512->2048->512", MLP(512, 2048), (torch.randn(1024 // s, 512),), False
    blk = Block(256, 4)
    yield "transformer block inference", blk.eval(), (torch.randn(8 // s, 128, 256),), False
    yield "transformer block train step", TrainStep(Block(256, 4)), (torch.randn(8 // s, 128, 256),), True


def step(fn, args, train):
    if train:
        out = fn(*args)
        out.backward()
        return out
    with torch.no_grad():
        return fn(*args)


def bench_interleaved(fns, args, train, reps):
    """Time the callables round-robin (one call each per round), so that a machine shared
    with other work slows them alike; report each one's best and median round."""
    for fn in fns:
        for _ in range(3):
            step(fn, args, train)
    times = [[] for _ in fns]
    for _ in range(reps):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            step(fn, args, train)
            times[k].append(time.perf_counter() - t0)
    out = []
    for ts in times:
        ts.sort()
        out.append((ts[0] * 1e3, ts[len(ts) // 2] * 1e3))
    return out


def first_call(fn, args, train):
    t0 = time.perf_counter()
    if train:
        fn(*args).backward()
    else:
        with torch.no_grad():
            fn(*args)
    return time.perf_counter() - t0


def main():
    import torch._dynamo
    from engine.codegen import cache as ours_cache

    reps = 10 if QUICK else 30
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu: {ours_cache.cpu_id()}")
    for name, model, args, train in models():
        if ONLY and not any(o in name for o in ONLY):
            continue
        # cold compiles: empty caches for both
        torch._dynamo.reset()
        tc = torch.compile(model)
        tc_cold = first_call(tc, args, train)
        engine.reset()
        ours = engine.compile(model)
        ours_cold = first_call(ours, args, train)
        (eager_ms, eager_med), (tc_ms, tc_med), (ours_ms, ours_med) = bench_interleaved(
            [model, tc, ours], args, train, reps)
        # warm compiles: fresh compiler state, kernels from the disk caches
        torch._dynamo.reset()
        tc_warm = first_call(torch.compile(model), args, train)
        engine.reset()
        ours_cache._loaded.clear()
        ours_warm = first_call(engine.compile(model), args, train)
        rows.append((name, eager_ms, tc_ms, ours_ms, tc_cold, ours_cold, tc_warm, ours_warm))
        print(f"{name:30s} best (median) ms: eager {eager_ms:7.2f} ({eager_med:7.2f}) | torch.compile {tc_ms:7.2f} "
              f"({tc_med:7.2f}) {eager_ms / tc_ms:5.2f}x | ours {ours_ms:7.2f} ({ours_med:7.2f}) "
              f"{eager_ms / ours_ms:5.2f}x | ours vs torch.compile {tc_ms / ours_ms:5.2f}x | compile cold "
              f"{tc_cold:5.2f}s vs ours {ours_cold:5.2f}s, warm {tc_warm:4.2f}s vs ours {ours_warm:4.2f}s", flush=True)
    import math
    g = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))
    print(f"geomean speedup over eager: torch.compile {g([r[1] / r[2] for r in rows]):.2f}x, "
          f"ours {g([r[1] / r[3] for r in rows]):.2f}x; ours vs torch.compile {g([r[2] / r[3] for r in rows]):.2f}x")
    print(f"total cold compile: torch.compile {sum(r[4] for r in rows):.1f}s, ours {sum(r[5] for r in rows):.1f}s; "
          f"warm: torch.compile {sum(r[6] for r in rows):.1f}s, ours {sum(r[7] for r in rows):.1f}s")


if __name__ == "__main__":
    main()
