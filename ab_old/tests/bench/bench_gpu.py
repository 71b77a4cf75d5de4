"""GPU benchmark: eager vs torch.compile (the anchor) vs ours (engine.compile, Triton
kernels), measured side by side in one run with triton.testing.do_bench.

    python3 tests/bench/bench_gpu.py                  # all seven models
    python3 tests/bench/bench_gpu.py --quick          # smaller sizes, fewer repetitions
    python3 tests/bench/bench_gpu.py --models softmax,rmsnorm --max-autotune
    python3 tests/bench/bench_gpu.py --models block_train --profile   # where the time goes

Prints, per model: times (ms), speedups over eager, achieved GB/s of memory-bound models
(against the device's copy bandwidth measured in this run, and against a copy of the same
bytes: the ceiling at that size), cold compile times (fresh caches), the max error of ours
vs eager, and the geomean of the speedups. With $OUT set (or --json PATH) the results are
also written as JSON. Each model runs in its own try/except: one failure does not lose the
others."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback

# fresh compile caches for both compilers: cold compile times are cold
_TMP = tempfile.mkdtemp(prefix="bench-gpu-")
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_TMP, "triton"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_TMP, "inductor"))
os.environ.setdefault("ENGINE_CACHE_DIR", os.path.join(_TMP, "engine"))


def fresh_caches(tag: str) -> None:
    """Empty cache directories for one compiler and model (Triton's binaries and C
    launchers too): neither compiler finds what the other, or an earlier model, built."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_TMP, tag, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_TMP, tag, "inductor")
    engine.config.cache_dir = os.path.join(_TMP, tag, "engine")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import engine  # noqa: E402
import observe  # noqa: E402
import observe.metrics  # noqa: E402

BF16 = torch.bfloat16


# -- models --------------------------------------------------------------------------------
def pointwise_chain(x, y):
    return (torch.relu(x * 1.5 + y) * torch.sigmoid(x) - y * 0.5).tanh()


def layernorm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def softmax(x):
    return torch.softmax(x, dim=-1)


def rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


class MLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-LN transformer block: attention (SDPA) and a 4x GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d, 4 * d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


def spec(name, quick):
    """(callable, inputs, bytes moved by an ideal kernel or None, training?)"""
    dev = "cuda"
    q = 4 if quick else 1
    g = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=dev, dtype=dtype, generator=g)

    if name == "pointwise":
        n = (64 << 20) // q
        x, y = randn(n), randn(n)
        return pointwise_chain, (x, y), 3 * n * 4, False
    if name == "layernorm_gelu":
        r, d = 8192 // q, 4096
        return layernorm_gelu, (randn(r, d, dtype=BF16), randn(d, dtype=BF16), randn(d, dtype=BF16)), \
            2 * r * d * 2, False
    if name == "softmax":
        r, d = 8192 // q, 8192
        return softmax, (randn(r, d, dtype=BF16),), 2 * r * d * 2, False
    if name == "rmsnorm":
        r, d = 16384 // q, 4096
        return rmsnorm, (randn(r, d, dtype=BF16), randn(d, dtype=BF16)), 2 * r * d * 2, False
    if name == "mlp":
        m = MLP(4096, 16384).to(dev, BF16)
        return m, (randn(8192 // q, 4096, dtype=BF16),), None, False
    if name in ("block", "block_train"):
        torch.manual_seed(0)
        m = Block(1024, 16).to(dev, BF16)
        x = randn(8 // q if quick else 8, 2048, 1024, dtype=BF16)
        train = name == "block_train"
        if not train:
            m.eval()
        return m, (x,), None, train
    raise ValueError(name)


MODELS = ["pointwise", "layernorm_gelu", "softmax", "rmsnorm", "mlp", "block", "block_train"]


# -- measuring -----------------------------------------------------------------------------
def bench(fn, quick):
    from triton.testing import do_bench
    return do_bench(fn, warmup=10 if quick else 25, rep=30 if quick else 100, return_mode="median")


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy moving `nbytes` (half read, half written; default 1 GiB each
    way: the device's copy bandwidth), in GB/s. At a model's own size it is that model's
    ceiling: a smaller copy loses more of its time to the launch's ramp-up and tail."""
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), False)
    del src, dst
    return nbytes / ms / 1e6


def runner(fn, inputs, train):
    """A zero-arg callable running one step: a forward, or a forward and backward."""
    if not train:
        def run():
            with torch.no_grad():
                return fn(*inputs)
        return run

    def run_train():
        out = fn(*inputs)
        out.float().square().mean().backward()
        return out
    return run_train


def params_of(fn):
    return list(fn.parameters()) if isinstance(fn, nn.Module) else []


def cold_call(run, params):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = run()
    torch.cuda.synchronize()
    for p in params:
        p.grad = None
    return time.perf_counter() - t, out


class HintCollector:
    """Our compiler's perf hints and kernel counts while a model compiles."""

    def __init__(self):
        self.hints, self.kernels, self.fallbacks, self.sources = [], 0, [], []

    def __call__(self, ev):
        name = ev.metadata.get("name") if ev.name == "artifact" else None
        if name == "kernel_code":
            self.kernels += 1
            self.sources.append(ev.payload())
        elif name == "perf_hints":
            text = ev.payload() or ""
            self.hints.append(text)
            if "uncompiled" in text:
                self.fallbacks.append(text)


def top_kernels(run, n=12, steps=5) -> list:
    """The step's n most expensive CUDA kernels (torch.profiler): [name, ms per step, launches per step]."""
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    rows = [(e.key, e.self_device_time_total / 1e3 / steps, e.count / steps) for e in prof.key_averages()
            if e.self_device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return [[k[:100], round(ms, 4), c] for k, ms, c in rows[:n]]


def max_err(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max())


def run_model(name, args) -> dict:
    fn, inputs, nbytes, train = spec(name, args.quick)
    params = params_of(fn)
    res = {"model": name, "train": train}
    eager_run = runner(fn, inputs, train)
    ref = eager_run()
    for p in params:
        p.grad = None
    res["eager_ms"] = bench(eager_run, args.quick)
    if args.profile:
        res["eager_top"] = top_kernels(eager_run)

    mode = "max-autotune" if args.max_autotune else None
    if not args.skip_torch_compile:
        import torch._dynamo
        torch._dynamo.reset()
        fresh_caches(f"{name}-torch-compile")
        # max-autotune also turns on CUDA graphs in torch.compile; we launch kernels, so
        # compare kernels with kernels (and the runner keeps outputs across calls)
        tc = torch.compile(fn, mode="max-autotune-no-cudagraphs" if mode else None)
        run = runner(tc, inputs, train)
        res["torch_compile_cold_s"], out = cold_call(run, params)
        res["torch_compile_err"] = max_err(out, ref)
        res["torch_compile_ms"] = bench(run, args.quick)
        if args.profile:
            res["torch_compile_top"] = top_kernels(run)
        del tc, run
        torch._dynamo.reset()

    engine.reset()
    fresh_caches(f"{name}-ours")
    hints = HintCollector()
    observe.subscribe(hints, events=["artifact"])
    if args.profile:
        observe.metrics.reset()
        observe.metrics.start()
    try:
        ours = engine.compile(fn, mode=mode)
        run = runner(ours, inputs, train)
        res["ours_cold_s"], out = cold_call(run, params)
        run()        # a backward graph may compile on the first backward: keep it out of the timing
    finally:
        observe.unsubscribe(hints)
        if args.profile:
            res["ours_compile_times"] = observe.metrics.compile_times()
            observe.metrics.stop()
    res["ours_err"] = max_err(out, ref)
    res["ours_kernels"] = hints.kernels
    res["ours_fallbacks"] = hints.fallbacks[:3]
    res["ours_hints"] = hints.hints[:8]
    res["ours_ms"] = bench(run, args.quick)
    if args.profile:
        res["ours_top"] = top_kernels(run)
        res["ours_kernel_sources"] = hints.sources
    for p in params:
        p.grad = None

    res["speedup_torch_compile"] = res["eager_ms"] / res["torch_compile_ms"] if "torch_compile_ms" in res else None
    res["speedup_ours"] = res["eager_ms"] / res["ours_ms"]
    if nbytes is not None:
        res["bytes"] = nbytes
        res["copy_same_bytes_GBps"] = copy_bandwidth(nbytes)
        for k in ("eager", "torch_compile", "ours"):
            if f"{k}_ms" in res:
                res[f"{k}_GBps"] = nbytes / res[f"{k}_ms"] / 1e6
    return res


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list from {','.join(MODELS)}")
    ap.add_argument("--quick", action="store_true", help="a quarter of the sizes, fewer repetitions")
    ap.add_argument("--max-autotune", action="store_true", help='mode="max-autotune" for both (torch.compile without CUDA graphs)')
    ap.add_argument("--skip-torch-compile", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also print each compiler's most expensive CUDA kernels and our compile-stage times")
    ap.add_argument("--json", default=None, help="write results here (default: $OUT/bench_gpu.json if $OUT is set)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    dev = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    print(f"device: {dev}, torch {torch.__version__}, copy bandwidth {bw:.0f} GB/s (read+write)")
    results = []
    for name in names:
        t0 = time.perf_counter()
        try:
            r = run_model(name, args)
        except Exception as exc:
            traceback.print_exc()
            r = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        _print_row(r, bw)
        _write_json(args, {"device": dev, "torch": torch.__version__, "copy_GBps": bw, "partial": True,
                           "results": results})     # so far: a later crash or timeout loses nothing
        torch.cuda.empty_cache()

    print()
    print(f"{'model':16} {'eager ms':>9} {'tc ms':>8} {'ours ms':>8} {'tc x':>6} {'ours x':>7} {'ours/tc':>7} "
          f"{'ours GB/s':>9} {'%copy':>6} {'tc cold s':>9} {'ours cold s':>11} {'err':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['model']:16} ERROR {r['error'][:100]}")
            continue

        def f(k, fmt):
            v = r.get(k)
            return format(v, fmt) if isinstance(v, (int, float)) else "-"
        ratio = (r["torch_compile_ms"] / r["ours_ms"]) if r.get("torch_compile_ms") else None
        pct = 100 * r["ours_GBps"] / bw if "ours_GBps" in r else None
        print(f"{r['model']:16} {f('eager_ms', '9.3f')} {f('torch_compile_ms', '8.3f')} {f('ours_ms', '8.3f')} "
              f"{f('speedup_torch_compile', '6.2f')} {f('speedup_ours', '7.2f')} "
              f"{format(ratio, '7.2f') if ratio else '      -'} {f('ours_GBps', '9.0f')} "
              f"{format(pct, '6.1f') if pct else '     -'} {f('torch_compile_cold_s', '9.2f')} "
              f"{f('ours_cold_s', '11.2f')} {f('ours_err', '8.1e')}")
    ok = [r for r in results if "error" not in r]
    g_tc = geomean([r.get("speedup_torch_compile") for r in ok])
    g_ours = geomean([r.get("speedup_ours") for r in ok])
    print(f"geomean speedup over eager: torch.compile {g_tc and round(g_tc, 3)}, ours {g_ours and round(g_ours, 3)}"
          + (f", ours/torch.compile {g_ours / g_tc:.3f}" if g_tc and g_ours else ""))
    summary = {"device": dev, "torch": torch.__version__, "copy_GBps": bw, "quick": args.quick,
               "max_autotune": args.max_autotune, "geomean_torch_compile": g_tc, "geomean_ours": g_ours,
               "results": results}
    path = _write_json(args, summary)
    if path:
        print(f"results written to {path}")
    return 0


def _write_json(args, summary):
    path = args.json or (os.path.join(os.environ["OUT"], "bench_gpu.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as fh:
            json.dump(summary, fh, indent=1, default=str)
    return path


def _print_row(r, bw):
    if "error" in r:
        print(f"[{r['model']}] ERROR: {r['error']}", flush=True)
        return
    parts = [f"eager {r['eager_ms']:.3f} ms"]
    if r.get("torch_compile_ms"):
        parts.append(f"torch.compile {r['torch_compile_ms']:.3f} ms (x{r['speedup_torch_compile']:.2f}, "
                     f"cold {r['torch_compile_cold_s']:.1f} s)")
    parts.append(f"ours {r['ours_ms']:.3f} ms (x{r['speedup_ours']:.2f}, cold {r['ours_cold_s']:.1f} s, "
                 f"{r['ours_kernels']} kernels, err {r['ours_err']:.2e})")
    if "ours_GBps" in r:
        parts.append(f"ours {r['ours_GBps']:.0f} GB/s = {100 * r['ours_GBps'] / bw:.0f}% of copy (a copy of the "
                     f"same bytes: {100 * r['copy_same_bytes_GBps'] / bw:.0f}%)")
    print(f"[{r['model']}] " + "; ".join(parts), flush=True)
    for h in r.get("ours_fallbacks", []):
        print(f"    fallback: {h[:300]}")
    for who in ("eager", "torch_compile", "ours"):
        if r.get(f"{who}_top"):
            print(f"    {who}: top CUDA kernels (ms per step, launches per step)")
            for k, ms, c in r[f"{who}_top"]:
                print(f"      {ms:8.4f} {c:5.1f}  {k}")
    if r.get("ours_compile_times"):
        print("    ours: compile stages\n" + "\n".join("      " + ln for ln in r["ours_compile_times"].splitlines()))


if __name__ == "__main__":
    sys.exit(main())
