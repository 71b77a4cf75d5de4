"""Host time per call of a compiled graph on the GPU: a one-kernel graph, a graph of
about 100 kernels, and an AdamW step over GPT-2's 148 parameters (about 740 inputs), on
tensors small enough that the GPU waits for the host. Eager, torch.compile (default,
reduce-overhead) and ours (default, reduce-overhead), one run:

    python -m tests.bench.bench_host_overhead [--calls 500] [--profile] [--device cpu]

Per graph and implementation: microseconds per call (wall time of many calls, one
synchronize at the end: the rate the host issues them; the best of 7 rounds), and the
ratio to torch.compile's in the same mode. Each implementation runs in a fresh process
(`--same-process` to share one), so none inherits another's threads and caches."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402

import engine  # noqa: E402

DEV = "cuda"


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def one_kernel(x, y):
    return (x * y + 1).relu()


def hundred_kernels(x, ws):
    for w in ws:                      # 50 matmuls (extern calls) and 50 softmax kernels
        x = torch.softmax(x @ w, dim=-1)
    return x


def adamw_step(opt):
    opt.step()


def gpt2_sized_adamw():
    """AdamW over 148 small parameters, GPT-2's count (12 blocks of 12, and 4 more), with
    gradients and a first step taken: the step is then ~740 inputs and 148 updates."""
    shapes = [(64,), (64,), (64, 192), (192,), (64, 64), (64,), (64,), (64,), (64, 256), (256,), (256, 64), (64,)]
    params = [torch.nn.Parameter(torch.randn(s, device=DEV)) for _ in range(12) for s in shapes]
    params += [torch.nn.Parameter(torch.randn(s, device=DEV)) for s in [(512, 64), (128, 64), (64,), (64,)]]
    for p in params:
        p.grad = torch.randn_like(p)
    return torch.optim.AdamW(params, lr=1e-4)


def graphs():
    x, y = torch.randn(1024, device=DEV), torch.randn(1024, device=DEV)
    h = torch.randn(16, 64, device=DEV)
    ws = [torch.randn(64, 64, device=DEV) / 8 for _ in range(50)]
    return {"1 kernel": (one_kernel, (x, y)), "~100 kernels": (hundred_kernels, (h, ws)),
            "AdamW, 148 p": (adamw_step, (gpt2_sized_adamw(),))}


def compiled(impl, fn):
    mode = "reduce-overhead" if impl.endswith("-ro") else None
    if impl == "eager":
        return fn
    if impl.startswith("torch"):
        import torch._dynamo
        torch._dynamo.reset()
        return torch.compile(fn, mode=mode)
    engine.reset()
    return engine.compile(fn, mode=mode)


def us_per_call(fn, args, calls: int, rounds: int = 7) -> float:
    """The best of `rounds` rounds (a busy host only ever makes a round slower)."""
    best = float("inf")
    with torch.no_grad():
        for _ in range(5):
            fn(*args)
        for _ in range(rounds):
            _sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            _sync()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--profile", action="store_true", help="cProfile ours (default mode) per graph instead")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to see the host's share alone")
    ap.add_argument("--graphs", default=None, help="a comma list of graph names' first words (default: all)")
    ap.add_argument("--same-process", action="store_true",
                    help="measure every implementation in this process; by default each runs in a fresh one "
                         "(on the CPU, torch.compile's OpenMP threads left spinning made our kernels 3.6x slower)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)     # graph-first-word:impl, in a child
    args = ap.parse_args(argv)
    global DEV
    DEV = args.device
    chosen = {k: v for k, v in graphs().items()
              if args.graphs is None or k.split(",")[0].split()[0] in args.graphs.split(",")}
    if args.one:
        word, impl = args.one.split(":")
        (fn, a), = [v for k, v in chosen.items() if k.split()[0] == word]
        print(json.dumps(us_per_call(compiled(impl, fn), a, args.calls)))
        return
    if args.profile:
        import cProfile
        import pstats
        for name, (fn, a) in chosen.items():
            f = compiled("ours", fn)
            us_per_call(f, a, 10)
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.runcall(lambda: [f(*a) for _ in range(args.calls)])
            print(f"== {name}: {args.calls} calls")
            pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        return
    impls = ["eager", "torch", "ours", "torch-ro", "ours-ro"] if DEV == "cuda" else ["eager", "torch", "ours"]
    print(f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu'}: microseconds per call")
    print(f"{'graph':14} " + " ".join(f"{i:>9}" for i in impls) + f" {'ours/torch':>11} {'ro: ours/torch':>15}")
    for name, (fn, a) in chosen.items():
        if args.same_process:
            us = {i: us_per_call(compiled(i, fn), a, args.calls) for i in impls}
        else:
            us = {i: _in_child(name.split()[0], i, args) for i in impls}
        ro = f" {us['ours-ro'] / us['torch-ro']:15.2f}" if "ours-ro" in us else ""
        print(f"{name:14} " + " ".join(f"{us[i]:9.1f}" for i in impls) + f" {us['ours'] / us['torch']:11.2f}" + ro,
              flush=True)


def _in_child(word: str, impl: str, args) -> float:
    cmd = [sys.executable, "-m", "tests.bench.bench_host_overhead", "--one", f"{word}:{impl}", "--calls",
           str(args.calls), "--device", args.device]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], flush=True)
        raise RuntimeError(f"the child process for {word}:{impl} exited with {proc.returncode}")
    return float(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
