"""The minifier: from a failing graph to the smallest graph that fails the same way, written
as repro.py. Nodes first (delta.Search over the graph's units), then inputs (non-tensor
inputs folded into constants where the failure stays)."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

import observe

from ..fx_runnable import describe_inputs, make_inputs
from . import check, scripts
from .backend_ref import BackendRef
from .check import Failure
from .delta import Search
from .progress import ProgressDisplay, report
from .subgraph import GraphCase


@dataclasses.dataclass
class MinifyResult:
    reproduced: bool            # the failure was seen again (and minified)
    failure: Optional[Failure]  # what the trials looked for
    repro_path: str
    nodes_before: int
    nodes_after: int
    trials: int
    seconds: float
    note: str = ""

    def summary(self) -> str:
        if not self.reproduced:
            return f"{self.note}; {self.repro_path} holds the whole graph ({self.nodes_before} nodes)"
        return (f"{self.nodes_before} nodes -> {self.nodes_after} in {self.trials} trials, {self.seconds:.1f} s: "
                f"{self.repro_path} ({self.failure})")


def inputs_maker(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[[], list]:
    """Fresh random inputs of the recorded shapes, strides and dtypes on every call (the
    same values each time: mutating graphs see the same inputs on every run)."""
    specs = describe_inputs(gm, example_inputs)
    return lambda: make_inputs(specs)


def minify(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], ref: BackendRef, *,
           expected: Optional[Failure], accuracy_check: bool, tolerance: float, out_dir: str,
           compile_id: Optional[str] = None) -> MinifyResult:
    start = time.time()
    make = inputs_maker(gm, example_inputs)
    case = GraphCase.of(gm, make())
    every = tuple(range(len(case.units)))
    total = case.node_count(every)
    repro_path = os.path.join(out_dir, "repro.py")
    trials = [0]

    def attempt(sub: torch.fx.GraphModule) -> Optional[Failure]:
        trials[0] += 1
        failure, _ = check.trial(ref.fn, sub, inputs_maker(sub, case.inputs_of(sub)),
                                 accuracy_check=accuracy_check, tolerance=tolerance, aten_graph=ref.stage == "aot")
        return failure

    def give_up(note: str) -> MinifyResult:
        # the user's error is never lost: the whole graph's repro stays
        report("note", note)
        scripts.write_repro(gm, example_inputs, repro_path, ref, expected or Failure("error", "?", "?", "?"),
                            accuracy_check=accuracy_check, tolerance=tolerance, minimized=False)
        result = MinifyResult(False, expected, repro_path, total, total, trials[0], time.time() - start, note)
        report("done", result.summary(), trials=trials[0], seconds=result.seconds)
        _emit_repro(repro_path, compile_id)
        return result

    report("start", f"{total} nodes ({len(case.units)} ops) after {ref.stage}, backend {ref.name}: "
                    f"checking that the whole graph fails", nodes=total)
    full = case.build(every)
    first = attempt(full) if full is not None else None
    if first is None:
        return give_up("the whole graph compiled and ran here without failing: cannot minify "
                       f"(expected {expected})" if expected else "the whole graph did not fail")
    loose = False
    if expected is not None and not expected.same_as(first):
        if not expected.same_as(first, loose=True):
            return give_up(f"the whole graph fails differently here ({first}; expected {expected}): not minified")
        loose = True
        report("note", f"the message differs ({first.message!r}); matching on {first.error_type} alone")
    target = expected or first
    report("note", f"trial 1, the whole graph: fails with {first}")

    def fails(kept: tuple[int, ...], folded: frozenset = frozenset()) -> bool:
        sub = case.build(kept, folded)
        if sub is None:
            return False
        failure = attempt(sub)
        same = target.same_as(failure, loose)
        report("trial", f"trial {trials[0]}: {case.node_count(kept)} of {total} nodes: "
                        f"{'still fails' if same else 'passes' if failure is None else 'fails differently'}",
               trial=trials[0], nodes=case.node_count(kept), fails=same)
        return same

    report("phase", "shrinking nodes")
    kept = Search(len(case.units), fails).run()
    folded = _fold_inputs(case, kept, fails)
    final = case.build(kept, folded)
    scripts.write_repro(final, case.inputs_of(final), repro_path, ref, target, accuracy_check=accuracy_check,
                        tolerance=tolerance, minimized=True)
    result = MinifyResult(True, target, repro_path, total, case.node_count(kept), trials[0], time.time() - start)
    report("done", result.summary(), trials=trials[0], seconds=result.seconds, nodes=result.nodes_after)
    _emit_repro(repro_path, compile_id)
    return result


def _fold_inputs(case: GraphCase, kept: tuple[int, ...], fails) -> frozenset:
    """Delta debugging over the non-tensor inputs (sizes, flags): the fewest that must stay
    inputs, the rest folded into the graph as constants."""
    scalars = case.scalar_inputs(kept)
    if not scalars:
        return frozenset()
    report("phase", f"shrinking inputs ({len(scalars)} non-tensor)")
    everything = frozenset(scalars)
    if fails(kept, everything):
        return everything
    search = Search(len(scalars), lambda keep: fails(kept, everything - {scalars[i] for i in keep}))
    search.tried[tuple(range(len(scalars)))] = True
    keep = search.run()
    return everything - {scalars[i] for i in keep}


def _emit_repro(path: str, compile_id: Optional[str]) -> None:
    """The repro as an artifact of the compile that failed (tlparse lists it there)."""
    def payload() -> str:
        with open(path, encoding="utf-8") as f:
            return f.read()

    cid = _parse_compile_id(compile_id) if compile_id else observe.current_compile_id()
    with observe.compile_context(cid):
        observe.emit("artifact", {"name": "minifier_repro", "encoding": "string", "path": path}, payload)


def _parse_compile_id(text: str) -> Optional[observe.CompileId]:
    try:
        frame, _, rest = text.partition("/")
        compile_index, _, attempt = rest.partition("_")
        return observe.CompileId(int(frame), int(compile_index), int(attempt or 0))
    except ValueError:
        return None


def minify_script(module: torch.nn.Module, make_script_inputs: Callable[[], list], backend: Callable, *,
                  stage: str, backend_name: str, backend_setup: str, expected: dict, accuracy_check: bool,
                  tolerance: float, out_dir: str, compile_id: Optional[str] = None) -> MinifyResult:
    """What minifier_launcher.py runs: its graph, traced again from the script's code."""
    gm = check.as_graph_module(module)
    ref = BackendRef(stage, backend_name, backend, backend_setup)
    with ProgressDisplay():
        return minify(gm, make_script_inputs(), ref, expected=Failure(**expected), accuracy_check=accuracy_check,
                      tolerance=tolerance, out_dir=out_dir, compile_id=compile_id)
