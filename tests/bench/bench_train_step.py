"""Whole training steps of the zoo's models, as users write them: forward under autocast,
loss.backward(), an AdamW step and zero_grad, all inside the compiled function. The
engine and torch.compile are measured side by side in one run, against eager:

    .venv/bin/python tests/bench/bench_train_step.py [--device cuda --dtype bfloat16]
        [--models GPT2LMHeadModel,...] [--backend inductor] [--steps 10] [--checkpoint]
        [--backward-in-graph]

Per model: graphs and graph breaks (ours, torch's), the largest parameter difference from
eager after the steps (bf16 autocast: rounding of the order of the learning rate is
expected from both compilers), and the median step time after a warm-up step, with the
ratio eager/compiled (above 1: faster than eager). `--checkpoint` wraps each transformer
layer in torch.utils.checkpoint (non-reentrant) through the model's own
gradient_checkpointing_enable(), and prints the peak memory of a step on CUDA."""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch._dynamo

import engine
from tests.zoo import models


def make_step(entry, device: str, dtype):
    def step(model, opt, inputs):
        with torch.autocast(device, dtype=dtype):
            out = model(**inputs)
            loss = entry.loss(out)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def run(fn, model, opt, inputs, steps: int, device: str):
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(model, opt, inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) if len(times) > 1 else times[0]


def counting(graphs: list):
    def backend(gm, example_inputs):
        graphs.append(1)
        return gm.forward
    return backend


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--models", default="GPT2LMHeadModel,BertForMaskedLM,LlamaForCausalLM")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--backward-in-graph", action="store_true",
                    help="ours with engine.config.backward_in_graph: loss.backward() traced into the graph")
    args = ap.parse_args()
    engine.config.backward_in_graph = args.backward_in_graph
    dtype = getattr(torch, args.dtype)
    print(f"{'model':36} {'graphs ours/torch':>17} {'breaks':>8} {'max |dparam| ours/torch':>24} "
          f"{'eager ms':>9} {'ours ms':>8} {'torch ms':>9} {'eager/ours':>10} {'eager/torch':>11}")
    for name in args.models.split(","):
        entry = models.ZOO[name]
        base, inputs = models.build(name, "train", device=args.device)
        if args.checkpoint and hasattr(base, "gradient_checkpointing_enable"):
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        step = make_step(entry, args.device, dtype)
        results = {}
        for impl in ("eager", "ours", "torch"):
            model = copy.deepcopy(base)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            if impl == "eager":
                fn = step
            elif impl == "ours":
                engine.reset()
                fn = engine.compile(step, backend=args.backend)
            else:
                torch._dynamo.reset()
                fn = torch.compile(step, backend=args.backend)
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            ms = run(fn, model, opt, inputs, args.steps, args.device) * 1e3
            peak = torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None
            results[impl] = (model, ms, peak)
        engine.reset()
        m = copy.deepcopy(base)
        r = engine.explain(step)(m, torch.optim.AdamW(m.parameters(), lr=1e-3), inputs)
        torch._dynamo.reset()
        g_torch: list = []
        m = copy.deepcopy(base)
        torch.compile(step, backend=counting(g_torch))(m, torch.optim.AdamW(m.parameters(), lr=1e-3), inputs)
        graphs = (r.graph_count, len(g_torch))

        def diff(impl):
            return max((a - b).abs().max().item() for a, b in
                       zip(results[impl][0].parameters(), results["eager"][0].parameters()))
        e, o, t = (results[k][1] for k in ("eager", "ours", "torch"))
        print(f"{name:36} {graphs[0]:>8}/{graphs[1]:<8} {r.graph_break_count:>8} "
              f"{diff('ours'):>11.2e}/{diff('torch'):<11.2e} {e:9.2f} {o:8.2f} {t:9.2f} {e / o:10.2f} {e / t:11.2f}"
              + (f"  peak MiB eager/ours/torch {results['eager'][2]:.0f}/{results['ours'][2]:.0f}/"
                 f"{results['torch'][2]:.0f}" if args.device == "cuda" else ""), flush=True)


if __name__ == "__main__":
    main()
