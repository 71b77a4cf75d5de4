"""Per-call overhead of a compiled frame's hit path (cache lookup + guard check + call),
in microseconds: eager, torch.compile(backend="eager") and engine.compile(backend="eager"),
measured side by side in one run.

    .venv/bin/python tests/bench/bench_guard_overhead.py [--calls N] [--repeat R]

Three programs: `f(x) = x + 1` on a one-element tensor, a frame with 20 guarded inputs
(20 tensors), and a 12-block model (its parameters and modules guarded). The reported time is the best of R interleaved rounds of N calls, per call."""

from __future__ import annotations

import argparse
import time

import torch

import engine


def add_one(x):
    return x + 1


def twenty(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19):
    return (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15 + a16 + a17
            + a18 + a19)


def blocks_model():
    """12 blocks of Linear + LayerNorm on a one-row input: the guards of a model's 48
    parameters and 36 modules, more than its compute."""
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
                                  for _ in range(12)])

    def forward(x):
        return model(x)
    return forward


def per_call_us(fns: list, args, calls: int, repeat: int) -> list[float]:
    """Best per-call time of each function; rounds interleave the functions so that a busy
    machine slows them all alike."""
    for fn in fns:
        for _ in range(200):
            fn(*args)
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            best[i] = min(best[i], (time.perf_counter() - t0) / calls)
    return [b * 1e6 for b in best]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    import torch._dynamo  # the anchor, measured beside us (tests/bench may use it)

    cases = [("x + 1 (1 element)", add_one, (torch.randn(1),)),
             ("20 guarded inputs", twenty, tuple(torch.randn(1) for _ in range(20))),
             ("12-block model", blocks_model(), (torch.randn(1, 8),))]
    print(f"torch {torch.__version__}; best of {a.repeat} x {a.calls} calls; microseconds per call")
    print(f"{'program':<22}{'eager':>9}{'torch.compile':>15}{'engine':>9}   {'engine/torch':>12}"
          f"{'engine-eager':>14}{'torch-eager':>13}")
    for name, fn, args in cases:
        torch._dynamo.reset()
        engine.reset()
        tc = torch.compile(fn, backend="eager")
        ours = engine.compile(fn, backend="eager")
        expect = fn(*args)
        assert torch.equal(tc(*args), expect) and torch.equal(ours(*args), expect)
        t_eager, t_torch, t_ours = per_call_us([fn, tc, ours], args, a.calls, a.repeat)
        print(f"{name:<22}{t_eager:>9.2f}{t_torch:>15.2f}{t_ours:>9.2f}   {t_ours / t_torch:>11.2f}x"
              f"{t_ours - t_eager:>14.2f}{t_torch - t_eager:>13.2f}")


if __name__ == "__main__":
    main()
