"""Random training steps, each run eagerly and compiled with the backward in the graph
(engine.config.backward_in_graph): a random stack of layers, some frozen; one of the
optimizer configurations of tests/test_training.py, with one or two param groups; one or
two micro-batches (gradients accumulated); clipping or none; zero_grad to None or to zeros;
bf16 autocast or none. After each of three steps the losses, parameters and `.grad`s must
be eager's.

    python -m tests.fuzz.training_steps --backend inductor --seed 0 --count 100
"""

from __future__ import annotations

import argparse
import copy
import random
import sys

import torch
import torch.nn as nn

import engine


def _model(rng: random.Random):
    d = rng.choice([4, 8, 12])
    layers, width = [], d
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["linear", "linear_nobias", "ln", "gelu", "tanh"])
        if kind.startswith("linear"):
            w = rng.choice([4, 8, 16])
            layers.append(nn.Linear(width, w, bias=kind == "linear"))
            width = w
        elif kind == "ln":
            layers.append(nn.LayerNorm(width))
        else:
            layers.append(nn.GELU() if kind == "gelu" else nn.Tanh())
    layers.append(nn.Linear(width, 3))
    return nn.Sequential(*layers), d


def check(seed: int, backend: str, optimizers: list) -> str:
    """One random step, three times, eager against compiled; raises on a difference.
    Returns what the seed drew."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model, d = _model(rng)
    frozen = [p for p in list(model.parameters())[:-1] if rng.random() < 0.15]  # the last bias trains
    for p in frozen:
        p.requires_grad_(False)
    kind, options = rng.choice(optimizers)
    two_groups = rng.random() < 0.3
    clip = rng.choice([None, 0.05, 10.0])
    micro = rng.choice([1, 1, 2])
    set_to_none = rng.random() < 0.85
    autocast = rng.random() < 0.3

    def make_opt(m):
        ps = list(m.parameters())
        if two_groups and len(ps) > 1:
            ps = [{"params": ps[::2]}, {"params": ps[1::2], "lr": options.get("lr", 1e-2) * 0.5}]
        return getattr(torch.optim, kind)(ps, **options)

    def step(m, o, xs, ys):
        total = 0
        for x, y in zip(xs, ys):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = nn.functional.cross_entropy(m(x).float(), y) / len(xs)
            loss.backward()
            total = total + loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip) if clip is not None else None
        o.step()
        o.zero_grad(set_to_none=set_to_none)
        return total, norm

    ours = copy.deepcopy(model)
    eager_opt, ours_opt = make_opt(model), make_opt(ours)
    compiled = engine.compile(step, backend=backend)
    g = torch.Generator().manual_seed(seed)
    tol = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-4, atol=1e-5)
    for _ in range(3):
        xs = [torch.randn(5, d, generator=g) for _ in range(micro)]
        ys = [torch.randint(0, 3, (5,), generator=g) for _ in range(micro)]
        want = step(model, eager_opt, xs, ys)
        got = compiled(ours, ours_opt, xs, ys)
        torch.testing.assert_close(got, want, **tol)
        for a, b in zip(ours.parameters(), model.parameters()):
            torch.testing.assert_close(a, b, **tol)
            assert (a.grad is None) == (b.grad is None)
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, **tol)
    return (f"{kind} {options} groups={two_groups} clip={clip} micro-batches={micro} "
            f"set_to_none={set_to_none} autocast={autocast} frozen={len(frozen)}")


def main(argv=None) -> int:
    sys.path.insert(0, "tests")
    from test_training import OPTIMIZERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=50)
    args = ap.parse_args(argv)
    failed = 0
    with engine.config.patch(backward_in_graph=True):
        for seed in range(args.seed, args.seed + args.count):
            engine.reset()
            try:
                check(seed, args.backend, OPTIMIZERS)
            except Exception as exc:    # noqa: BLE001 (each seed reports and the run goes on)
                failed += 1
                print(f"seed {seed}: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
    print(f"{args.count} random training steps on {args.backend}: {args.count - failed} as eager, {failed} not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
