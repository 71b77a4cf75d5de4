"""Saved activations of the AOT stage's partitioners on a small transformer block, next to
torch's own AOT autograd (torch.compile with aot_eager-style backends) measured in the
same run, plus the training-step time of each path.

    .venv/bin/python tests/bench/bench_aot_partition.py [--batch 8 --seq 64 --dim 128]

"saved" is every tensor the forward hands to the backward; "activations" leaves out the
graph inputs (parameters and x), which stay alive anyway."""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from engine.aot import aot_compile
from engine.backends.aot_eager import decomposition_table, run_graph


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1)   # seq == T
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def ours(model, x, partitioner, decomps):
    compiled = aot_compile(torch.fx.symbolic_trace(model), [x], fw_compiler=run_graph,
                           partitioner=partitioner, decompositions=decomposition_table() if decomps else None)
    s = compiled.last_stats.saved[partitioner]
    return compiled, {"tensors": s["tensors"], "bytes": s["bytes"], "activations": s["bytes"] - s["input_bytes"],
                      "recomputed": len(s["recomputed"])}


def torchs(model, x, partition_fn, decomps):
    """torch's AOT autograd with a recording backward compiler (the anchor; bench only)."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    stats = {}

    def bw_compiler(gm, example_inputs):
        saved = [n for n in gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
        sizes = {n.name: (n.meta["val"].numel() * n.meta["val"].element_size()
                          if isinstance(n.meta.get("val"), torch.Tensor) else 0) for n in saved}
        stats.update(tensors=len(saved), bytes=sum(sizes.values()),
                     activations=sum(v for k, v in sizes.items() if not k.startswith("primals")))
        return gm

    kwargs = {"fw_compiler": lambda gm, ex: gm, "bw_compiler": bw_compiler, "partition_fn": partition_fn}
    if decomps:
        from torch._inductor.decomposition import select_decomp_table
        kwargs["decompositions"] = select_decomp_table()
    torch._dynamo.reset()
    fn = torch.compile(model, backend=aot_autograd(**kwargs), fullgraph=True)
    fn(x).sum().backward()
    stats["recomputed"] = "-"
    return fn, stats


def step_times(paths: dict, x, rounds: int) -> dict:
    """Fastest single forward+backward step of each path, in ms. Paths take turns, one
    step each, so a busy machine slows them all alike; the minimum filters the noise."""
    best = {name: float("inf") for name in paths}
    for fn, model in paths.values():
        for _ in range(3):
            fn(x).sum().backward()
    for _ in range(rounds):
        for name, (fn, model) in paths.items():
            for p in model.parameters():
                p.grad = None
            start = time.perf_counter()
            fn(x).sum().backward()
            best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    base = Block(args.dim, args.heads, args.seq)
    x = torch.randn(args.batch, args.seq, args.dim)
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    rows, paths = [], {}
    for label, partitioner, decomps in [("ours default (aot_eager)", "default", False),
                                        ("ours default + decomps", "default", True),
                                        ("ours min_cut (aot_eager_decomp_partition)", "min_cut", True)]:
        model = copy.deepcopy(base)
        fn, stats = ours(model, x, partitioner, decomps)
        rows.append((label, stats))
        paths[label] = (fn, model)
    for label, pfn, decomps in [("torch default_partition", default_partition, False),
                                ("torch aot_eager_decomp_partition (min-cut)",
                                 lambda *a, **k: min_cut_rematerialization_partition(*a, compiler="inductor", **k), True)]:
        model = copy.deepcopy(base)
        fn, stats = torchs(model, x, pfn, decomps)
        rows.append((label, stats))
        paths[label] = (fn, model)
    model = copy.deepcopy(base)
    paths["eager"] = (model, model)
    ms = step_times(paths, x, args.rounds)
    eager_ms = ms["eager"]

    print(f"transformer block: batch={args.batch} seq={args.seq} dim={args.dim} heads={args.heads}, "
          f"x = {x.numel() * 4} bytes, torch {torch.__version__}")
    print(f"{'partitioner':45s} {'saved':>6s} {'saved bytes':>12s} {'activations':>12s} {'recomputed':>10s} "
          f"{'step ms':>8s} {'vs eager':>8s}")
    for label, s in rows:
        print(f"{label:45s} {s['tensors']:6d} {s['bytes']:12d} {s['activations']:12d} {str(s['recomputed']):>10s} "
              f"{ms[label]:8.2f} {ms[label] / eager_ms:7.2f}x")
    print(f"{'eager':45s} {'':6s} {'':12s} {'':12s} {'':>10s} {eager_ms:8.2f} {1.0:7.2f}x")
    ours_mc = rows[2][1]["activations"]
    torch_mc = rows[4][1]["activations"]
    print(f"min-cut activations, ours / torch: {ours_mc / torch_mc:.2f}")


if __name__ == "__main__":
    main()
