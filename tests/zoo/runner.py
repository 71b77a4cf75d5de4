"""Run the zoo: each model eagerly (the reference) and compiled, by the engine or by
torch.compile, and compare. In the spirit of PyTorch's HuggingFace benchmark harness.

    python -m tests.zoo --impl engine|torch --backend eager|aot_eager|inductor \
        --mode infer|train [--models GPT2LMHeadModel,...] [--compare] [--json out.json]

Per model: build it (tests/zoo/models.py), copy it before anything runs, run the copy
eagerly for the reference, and run another copy compiled, twice (the second call goes
through the cache). Inference compares every tensor of the output (generate: the token
ids, exactly). Training runs two steps of forward, loss.backward() and an eager
torch.optim.SGD step, and compares the loss, the output, every parameter's grad and the
updated parameters and buffers after each step.

Graphs are counted by a counting backend wrapped around the engine's backend, and for
torch by dynamo's own `unique_graphs` counter (torch.compile gets the backend by name,
as users call it). Graph breaks: the engine's `graph_break` bus events; torch's
`counters["graph_break"]`.

Exit status 1 when a model gives a wrong result (with --compare, only the engine's count:
torch.compile is the anchor); errors are reported, and fail only with --strict.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import math
import os
import platform
import sys
import time
import traceback
from typing import Optional

import engine  # first: observe reads TORCH_LOGS / TORCH_TRACE before torch does
import observe
import torch

from . import models
from ..timeouts import TimeLimit, time_limit

RTOL = ATOL = 1e-4
DEVICE = ["cpu", None]   # --device, --dtype


# ---------------------------------------------------------------------------- comparing

_SCALARS = (int, float, bool, str, type(None))


def flatten(obj, path: str = "out", depth: int = 0, seen: Optional[set] = None) -> list:
    """(path, leaf) for every tensor and plain scalar in a model's output: ModelOutput and
    dicts by key, tuples and lists by index, other objects (a KV cache) by attribute."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, _SCALARS):
        return [(path, obj)]
    if depth > 8:
        return []
    if isinstance(obj, tuple):   # immutable: no cycle through it (and `()` is one shared object)
        return [leaf for i, v in enumerate(obj) for leaf in flatten(v, f"{path}[{i}]", depth + 1, seen)]
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, dict):   # ModelOutput is an OrderedDict
        return [leaf for k, v in obj.items() for leaf in flatten(v, f"{path}.{k}", depth + 1, seen)]
    if isinstance(obj, list):
        return [leaf for i, v in enumerate(obj) for leaf in flatten(v, f"{path}[{i}]", depth + 1, seen)]
    if isinstance(obj, (torch.nn.Module, type, torch.device, torch.dtype)) or callable(obj):
        return []
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return [leaf for k, v in sorted(attrs.items()) if not k.startswith("_")
                for leaf in flatten(v, f"{path}.{k}", depth + 1, seen)]
    return []


def snapshot(obj) -> list:
    """The leaves of `obj`, detached and copied (later steps must not change them)."""
    return [(p, v.detach().clone() if isinstance(v, torch.Tensor) else v) for p, v in flatten(obj)]


def compare(expected: list, actual: list, rtol: float, atol: float, exact: bool = False) -> Optional[str]:
    """None when they match, else what differs first (and how many leaves differ)."""
    exp, act = dict(expected), dict(actual)
    if list(exp) != list(act):
        missing = [p for p in exp if p not in act]
        extra = [p for p in act if p not in exp]
        return f"output structure differs: missing {missing[:3]} extra {extra[:3]}"
    problems = []
    for path, e in exp.items():
        a = act[path]
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            problems.append(f"{path}: {type(e).__name__} vs {type(a).__name__}")
        elif not isinstance(e, torch.Tensor):
            if e != a and not (isinstance(e, float) and isinstance(a, float) and math.isclose(e, a, rel_tol=rtol,
                                                                                            abs_tol=atol)):
                problems.append(f"{path}: {e!r} vs {a!r}")
        elif exact:
            if e.shape != a.shape or e.dtype != a.dtype or not torch.equal(e, a):
                problems.append(f"{path}: not equal ({tuple(e.shape)} vs {tuple(a.shape)})\n  "
                                f"expected {e.tolist()}\n  actual   {a.tolist()}")
        else:
            try:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as exc:
                problems.append(f"{path}: " + " ".join(str(exc).split("\n")[:4]))
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def _named_state(model: torch.nn.Module, prefix: str):
    params = [(f"{prefix}.param.{n}", p) for n, p in model.named_parameters()]
    buffers = [(f"{prefix}.buffer.{n}", b) for n, b in model.named_buffers()]
    return params + buffers


def _grads(model: torch.nn.Module):
    return [(f"grad.{n}", None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()]


# ---------------------------------------------------------------------------- running

def _call(fn, entry, inputs):
    return fn(**copy.deepcopy(inputs))   # a fresh copy per call: a model may change its inputs


def run_steps(model: torch.nn.Module, fn, entry, inputs, mode: str, calls: int = 2) -> tuple[list, list]:
    """Run `fn` (eager or compiled) `calls` times; the snapshots to compare after each
    call, and each call's wall time."""
    records, times = [], []
    torch.manual_seed(0)    # a model that draws random numbers draws the same ones in each run
    if mode == "infer":
        for _ in range(calls):
            t0 = time.perf_counter()
            with torch.no_grad():
                out = _call(fn, entry, inputs)
            times.append(time.perf_counter() - t0)
            records.append(snapshot(out))
        return records, times
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(calls):
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out = _call(fn, entry, inputs)
        loss = entry.loss(out)
        loss.backward()
        times.append(time.perf_counter() - t0)
        opt.step()
        records.append([("loss", loss.detach().clone())] + snapshot(out) + _grads(model)
                       + [(n, t.detach().clone()) for n, t in _named_state(model, "after_step")])
    return records, times


def _first_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_first_line(str(exc), 300)}"


class EngineCounter:
    """The engine's backend (a name, or a callable backend(gm, example_inputs)), wrapped
    to count the graphs it compiles, and the graph breaks the engine reports on the bus
    while `active`."""

    def __init__(self, backend):
        from engine.backends import lookup_backend

        self.inner = lookup_backend(backend)
        name = backend if isinstance(backend, str) else getattr(backend, "__name__", "backend")
        self.graphs = 0
        self.ops = 0     # call nodes over all graphs (torch's counters["stats"]["calls_captured"])
        self.breaks: collections.Counter = collections.Counter()
        self.uncompiled: list = []   # graphs codegen ran as aten ops: (crashed, reason)
        counter = self

        def counting_backend(gm, example_inputs):
            counter.graphs += 1
            counter.ops += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
            return counter.inner(gm, example_inputs)
        counting_backend.__name__ = name   # the name the engine's logs and trace show
        self.backend = counting_backend

    def _on_break(self, event) -> None:
        md = event.metadata
        reason = _first_line(md.get("reason", "?"))
        gid = md.get("graph_break_id")
        self.breaks[f"[{gid}] {reason}" if gid else reason] += 1

    def _on_artifact(self, event) -> None:
        if event.metadata.get("name") == "graph_uncompiled":
            self.uncompiled.append((bool(event.metadata.get("crash")), _first_line(event.payload(), 200)))

    @contextlib.contextmanager
    def active(self):
        observe.subscribe(self._on_break, events=["graph_break"])
        observe.subscribe(self._on_artifact, events=["artifact"])
        try:
            yield
        finally:
            observe.unsubscribe(self._on_break)
            observe.unsubscribe(self._on_artifact)


def compile_with(impl: str, backend: str, model: torch.nn.Module, entry):
    """(callable to run, counter). For generate entries the model's forward is replaced by
    its compiled version and the callable is model.generate."""
    if impl == "engine":
        counter = EngineCounter(backend)
        if entry.kind == "generate":
            model.forward = engine.compile(model.forward, backend=counter.backend)
            return model.generate, counter
        return engine.compile(model, backend=counter.backend), counter
    if entry.kind == "generate":
        model.forward = torch.compile(model.forward, backend=backend)
        return model.generate, None
    return torch.compile(model, backend=backend), None


def reset(impl: str) -> None:
    engine.reset()
    if impl == "torch":
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()


def _torch_counts():
    from torch._dynamo.utils import counters

    graphs, ops = counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"]
    breaks = collections.Counter()
    for reason, n in counters["graph_break"].items():
        breaks[_first_line(reason)] += n
    return graphs, ops, breaks


def reference(name: str, mode: str, base: torch.nn.Module, inputs: dict) -> dict:
    entry = models.ZOO[name]
    model = copy.deepcopy(base)
    records, times = run_steps(model, model.generate if entry.kind == "generate" else model, entry, inputs, mode)
    return {"records": records, "times": times}


def run_compiled(name: str, impl: str, backend: str, mode: str, base: torch.nn.Module, inputs: dict, ref: dict,
                 rtol: float, atol: float, timeout: float) -> dict:
    entry = models.ZOO[name]
    row = {"model": name, "impl": impl, "backend": backend, "mode": mode, "status": None, "error": None,
           "graphs": None, "ops": None, "breaks": None, "break_reasons": {}, "compile_s": None, "first_call_s": None,
           "second_call_s": None, "eager_s": ref["times"][-1]}
    counter = None
    try:
        reset(impl)
        model = copy.deepcopy(base)
        with time_limit(timeout):
            fn, counter = compile_with(impl, backend, model, entry)
            ctx = counter.active() if counter is not None else contextlib.nullcontext()
            with ctx:
                records, times = run_steps(model, fn, entry, inputs, mode)
        row["first_call_s"], row["second_call_s"] = times[0], times[-1]
        row["compile_s"] = max(0.0, times[0] - ref["times"][-1])
        problems = []
        for i, (exp, act) in enumerate(zip(ref["records"], records), 1):
            diff = compare(exp, act, rtol, atol, exact=entry.kind == "generate")
            if diff:
                problems.append(f"call {i}: {diff}")
        row["status"] = "wrong" if problems else "pass"
        row["error"] = "; ".join(problems) or None
    except (Exception, TimeLimit) as exc:  # one model's error must not stop the others
        row["status"] = "error"
        row["error"] = _error_text(exc)
        row["traceback"] = traceback.format_exc(limit=-8)
    finally:
        try:
            if impl == "engine" and counter is not None:
                row["graphs"], row["ops"], breaks = counter.graphs, counter.ops, counter.breaks
                row["uncompiled"] = [reason for _, reason in counter.uncompiled]
                row["codegen_crashes"] = [reason for crashed, reason in counter.uncompiled if crashed]
            elif impl == "torch":
                row["graphs"], row["ops"], breaks = _torch_counts()
            else:
                breaks = collections.Counter()
            row["breaks"] = sum(breaks.values()) if row["graphs"] is not None else None
            row["break_reasons"] = dict(breaks.most_common())
        except Exception as exc:
            row["count_error"] = _error_text(exc)
        try:
            reset(impl)
        except Exception:
            pass
    return row


def run_model(name: str, impls: list, backend: str, mode: str, rtol: float, atol: float, timeout: float) -> list:
    """One row per impl for one model. The reference runs once, on its own copy."""
    entry = models.ZOO[name]
    if not entry.supports(mode):
        return [{"model": name, "impl": impl, "backend": backend, "mode": mode, "status": "skip",
                 "error": f"{entry.kind} entry: modes {', '.join(entry.modes)}"} for impl in impls]
    try:
        with time_limit(timeout):
            base, inputs = models.build(name, mode, device=DEVICE[0], dtype=DEVICE[1])
            ref = reference(name, mode, base, inputs)
    except (Exception, TimeLimit) as exc:
        return [{"model": name, "impl": impl, "backend": backend, "mode": mode, "status": "error",
                 "error": "eager: " + _error_text(exc), "traceback": traceback.format_exc(limit=-8)}
                for impl in impls]
    return [run_compiled(name, impl, backend, mode, base, inputs, ref, rtol, atol, timeout) for impl in impls]


# ---------------------------------------------------------------------------- reporting

def _fmt_s(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _fmt_n(v) -> str:
    return "-" if v is None else str(v)


def _status(row, width: int) -> str:
    s = row["status"]
    if s in ("error", "wrong"):
        s = f"{s}: {_first_line(row.get('error') or '')}"
    return s if len(s) <= width else s[:width - 3] + "..."


def _reasons(row, top: int = 3) -> str:
    items = list((row.get("break_reasons") or {}).items())[:top]
    text = "; ".join(f"{n}x {r}" for r, n in items)
    if row.get("uncompiled"):   # graphs the backend ran as aten ops: never silent
        text = f"{len(row['uncompiled'])} graph(s) uncompiled: {row['uncompiled'][0]}" + (f"; {text}" if text else "")
    return text


def _counts(row) -> str:
    return (f"{_fmt_n(row.get('graphs')):>6} {_fmt_n(row.get('ops')):>5} {_fmt_n(row.get('breaks')):>6} "
            f"{_fmt_s(row.get('compile_s')):>7}")


_COUNTS_HEAD = f"{'graphs':>6} {'ops':>5} {'breaks':>6} {'comp s':>7}"


def print_table(rows: list, compare_mode: bool, out=sys.stdout) -> None:
    """One line per model: status, graphs, ops captured (call nodes in all graphs),
    graph breaks, compile seconds (first compiled call less an eager call), and the top
    break reasons with counts."""
    by_model = collections.OrderedDict()
    for r in rows:
        by_model.setdefault(r["model"], {})[r["impl"]] = r
    width = max([len("model")] + [len(m) for m in by_model])
    if compare_mode:
        head = (f"{'model':<{width}}  {'engine':<30} {_COUNTS_HEAD}   {'torch':<20} {_COUNTS_HEAD}  "
                "engine break reasons")
        print(head, file=out)
        print("-" * len(head), file=out)
        for m, r in by_model.items():
            e, t = r.get("engine", {}), r.get("torch", {})
            print(f"{m:<{width}}  {_status(e, 30):<30} {_counts(e)}   {_status(t, 20):<20} {_counts(t)}  "
                  f"{_reasons(e)}", file=out)
        return
    head = f"{'model':<{width}}  {'status':<44} {_COUNTS_HEAD}  top break reasons"
    print(head, file=out)
    print("-" * len(head), file=out)
    for m, r in by_model.items():
        for row in r.values():
            print(f"{m:<{width}}  {_status(row, 44):<44} {_counts(row)}  {_reasons(row)}", file=out)


def summarize(rows: list) -> dict:
    out = collections.defaultdict(collections.Counter)
    for r in rows:
        out[r["impl"]][r["status"]] += 1
    return {impl: dict(c) for impl, c in out.items()}


# ---------------------------------------------------------------------------- CLI

def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.zoo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["engine", "torch"], default="engine")
    ap.add_argument("--backend", default="eager", help="eager, aot_eager, inductor, ... (default eager)")
    ap.add_argument("--mode", choices=["infer", "train"], default="infer")
    ap.add_argument("--models", default="", help="comma-separated names (default: all); --list shows them")
    ap.add_argument("--compare", action="store_true", help="run the engine and torch.compile side by side")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the torchvision entries need a GPU machine)")
    ap.add_argument("--dtype", default=None, help="cast models and float inputs, e.g. bfloat16 (pass --rtol/--atol)")
    ap.add_argument("--rtol", type=float, default=RTOL)
    ap.add_argument("--atol", type=float, default=ATOL)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per model (0: none)")
    ap.add_argument("--strict", action="store_true", help="an error also makes the exit status 1")
    ap.add_argument("--warm-caches", action="store_true",
                    help="keep the kernel caches on disk (default: both compilers start from empty ones, so "
                         "compile seconds are cold compiles)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print the traceback of each error")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for e in models.ENTRIES:
            print(f"{e.name:<40} {e.kind:<9} {','.join(e.modes)}")
        return 0
    DEVICE[:] = [args.device, getattr(torch, args.dtype) if args.dtype else None]
    if not args.warm_caches:  # cold compiles for both: empty kernel caches of their own
        import tempfile
        fresh = tempfile.mkdtemp(prefix="zoo-caches-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(fresh, "torch")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(fresh, "triton")
        engine.config.cache_dir = os.path.join(fresh, "engine")
    missing = models.available()
    if missing:
        print(f"zoo: transformers is not importable ({missing})", file=sys.stderr)
        return 2
    import transformers

    transformers.logging.set_verbosity_error()
    names = [n.strip() for n in args.models.split(",") if n.strip()] or models.names()
    unknown = [n for n in names if n not in models.ZOO]
    if unknown:
        print(f"zoo: unknown model(s) {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    impls = ["engine", "torch"] if args.compare else [args.impl]
    t_start = time.perf_counter()
    rows = []
    for name in names:
        t0 = time.perf_counter()
        got = run_model(name, impls, args.backend, args.mode, args.rtol, args.atol, args.timeout)
        for r in got:
            r["wall_s"] = time.perf_counter() - t0
        rows.extend(got)
        if args.verbose:
            for r in got:
                if r.get("traceback"):
                    print(f"--- {name} [{r['impl']}]\n{r['traceback']}", file=sys.stderr)
    total = time.perf_counter() - t_start
    print(f"zoo: impl={'engine+torch' if args.compare else args.impl} backend={args.backend} mode={args.mode} "
          f"torch {torch.__version__} transformers {transformers.__version__}")
    print_table(rows, args.compare)
    summary = summarize(rows)
    print(f"total {total:.1f}s; " + "; ".join(f"{impl}: " + ", ".join(f"{n} {s}" for s, n in sorted(c.items()))
                                           for impl, c in summary.items()))
    for r in rows:
        if r["status"] == "wrong":
            print(f"WRONG {r['model']} [{r['impl']}]: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"impl": impls, "backend": args.backend, "mode": args.mode, "torch": torch.__version__,
                       "transformers": transformers.__version__, "python": platform.python_version(),
                       "total_s": total, "summary": summary, "rows": rows}, f, indent=1, default=str)
    counted = [r for r in rows if r["impl"] == "engine"] if args.compare else rows
    if any(r["status"] == "wrong" for r in counted):
        return 1
    if args.strict and any(r["status"] == "error" for r in counted):
        return 1
    return 0
