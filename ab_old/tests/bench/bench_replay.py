"""What recording for engine.debug.replay costs: the capture's bytecode-tracing time of a
zoo model (backend="eager", so tracing is most of the compile), three ways:

  head     the interpreter's main loop as it was before the recorder hook: --head-run FILE
           holds that `def run(self)` (dedented), cut from `git show
           <commit before the hook>:engine/capture/interpreter.py`; skipped without it
  off      the loop with the hook, no recorder installed (what every user runs)
  on       engine.debug.replay recording every instruction

    .venv/bin/python tests/bench/bench_replay.py [--model GPT2LMHeadModel] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")

import engine  # noqa: E402
import observe  # noqa: E402
from engine.capture import interpreter  # noqa: E402
from engine.debug.replay_stepper import replay  # noqa: E402
from tests.zoo.models import build  # noqa: E402


def tracing_seconds(run) -> tuple[float, float]:
    """(seconds in the bytecode_tracing stage, wall seconds) of one compile-and-run."""
    total = [0]

    def on_end(event):
        if event.metadata.get("name") == "bytecode_tracing":
            total[0] += event.metadata["duration_ns"]

    observe.subscribe(on_end, events=["stage_end"])
    t0 = time.perf_counter()
    try:
        run()
    finally:
        observe.unsubscribe(on_end)
    return total[0] / 1e9, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="GPT2LMHeadModel")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--head-run", help="a file holding HEAD's `def run(self)` of interpreter.Frame")
    a = ap.parse_args()
    model, inputs = build(a.model, "infer")
    torch.set_grad_enabled(False)

    def plain():
        engine.reset()
        engine.compile(model, backend="eager")(**inputs)

    def recorded():
        replay(model, backend="eager", interactive=False)(**inputs)

    hooked_run = interpreter.Frame.run
    head_run = None
    if a.head_run:
        ns = dict(vars(interpreter))
        exec(compile(open(a.head_run).read(), "<head Frame.run>", "exec"), ns)
        head_run = ns["run"]
    plain()   # warm-up: imports, first FakeTensor dispatches
    rows = {"head": [], "off": [], "on": []}
    steps = 0
    for _ in range(a.repeat):
        if head_run is not None:
            interpreter.Frame.run = head_run
            try:
                rows["head"].append(tracing_seconds(plain)[0])
            finally:
                interpreter.Frame.run = hooked_run
        rows["off"].append(tracing_seconds(plain)[0])
        holder = {}

        def rec():
            holder["r"] = replay(model, backend="eager", interactive=False)(**inputs)

        rows["on"].append(tracing_seconds(rec)[0])
        steps = len(holder["r"].recording.steps)
    print(f"{a.model}: {steps} traced instructions, bytecode_tracing seconds ({a.repeat} runs each, "
          "interleaved; the minimum is the least disturbed by other processes):")
    for k, v in rows.items():
        if v:
            print(f"  {k:>4}: min {min(v):.3f} s, median {statistics.median(v):.3f} s   "
                  f"runs: {', '.join(f'{x:.3f}' for x in v)}")
    print(f"  on / off = {min(rows['on']) / min(rows['off']):.2f}x (min), "
          f"{statistics.median(rows['on']) / statistics.median(rows['off']):.2f}x (median)")
    if rows["head"]:
        print(f"  off / head = {min(rows['off']) / min(rows['head']):.3f}x (min), "
              f"{statistics.median(rows['off']) / statistics.median(rows['head']):.3f}x (median)")
    # what the hook adds per instruction when off: one local `is None` test
    import timeit
    rec = None
    n = 10_000_000
    loop = timeit.timeit("for _ in r:\n    if rec is None:\n        pass", globals={"rec": rec, "r": range(n)}, number=1)
    bare = timeit.timeit("for _ in r:\n    pass", globals={"r": range(n)}, number=1)
    per_inst = min(rows["off"]) / steps
    print(f"  the off check: {(loop - bare) / n * 1e9:.1f} ns per instruction, against "
          f"{per_inst * 1e6:.1f} us to trace one ({(loop - bare) / n / per_inst * 100:.3f}%)")


if __name__ == "__main__":
    main()
