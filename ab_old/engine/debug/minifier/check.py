"""One trial: compile a graph with the backend at fault, run it, and say how it failed.

The same function runs in the minifier's trials and in the written repro.py, so a repro
fails exactly as the trial that produced it did."""

from __future__ import annotations

import dataclasses
import re
import traceback
from typing import Callable, Optional

import torch

from . import accuracy


class AccuracyFailure(RuntimeError):
    """A compiled graph computed a wrong result (the numbers are in the message)."""


@dataclasses.dataclass(frozen=True)
class Failure:
    kind: str            # "error" or "accuracy"
    error_type: str      # the exception's class name ("AccuracyFailure" for a wrong result)
    message: str         # its first line
    when: str            # "compile" or "run"

    def __str__(self) -> str:
        what = "a wrong result" if self.kind == "accuracy" else self.error_type
        return f"{what} at {self.when}: {self.message}"

    def same_as(self, other: Optional["Failure"], loose: bool = False) -> bool:
        """The same failure: the same kind and exception class and, unless `loose`, the
        same first line of the message up to numbers (node and kernel names carry
        counters that change as the graph shrinks). A wrong result is a wrong result."""
        if other is None or other.kind != self.kind or other.error_type != self.error_type:
            return False
        return self.kind == "accuracy" or loose or _normalized(self.message) == _normalized(other.message)


def failure_of(exc: BaseException, when: str) -> Failure:
    kind = "accuracy" if isinstance(exc, AccuracyFailure) else "error"
    return Failure(kind, type(exc).__name__, first_line(exc), when)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _normalized(message: str) -> str:
    return re.sub(r"\d+", "N", message)


def reproduce(backend: Callable, module: torch.nn.Module, make_inputs: Callable[[], list], *,
              accuracy_check: bool = False, tolerance: float = 1e-3, aten_graph: bool = False) -> None:
    """Compile `module` (a graph module, or a script's Repro, traced again) with
    `backend(gm, example_inputs)` and run it on fresh inputs; raises what the backend or the
    compiled graph raises, or AccuracyFailure with the numbers. `aten_graph`: the backend is
    our codegen, which reads each node's FakeTensor (`meta["val"]`)."""
    gm = as_graph_module(module)
    if aten_graph:
        _fill_fake_values(gm, make_inputs())
    compiled = _compile(backend, gm, make_inputs)
    outputs = _run(compiled, make_inputs)
    if accuracy_check:
        wrong = accuracy.compare(gm, outputs, make_inputs, tolerance)
        if wrong:
            raise AccuracyFailure(f"compiled result differs from eager: {wrong}")


class _KeepModules(torch.fx.Tracer):
    """Traces a script's Repro again with its submodules as calls (as the graph had them)."""

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return True


def as_graph_module(module: torch.nn.Module) -> torch.fx.GraphModule:
    if isinstance(module, torch.fx.GraphModule):
        return module
    return torch.fx.GraphModule(module, _KeepModules().trace(module))


def _fill_fake_values(gm: torch.fx.GraphModule, inputs: list) -> None:
    """meta["val"] on every node, where a traced-again graph has none."""
    if all("val" in n.meta for n in gm.graph.nodes if n.op != "output"):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)


def _compile(backend, gm, make_inputs):
    try:
        return backend(gm, make_inputs())
    except Exception as exc:
        exc._minifier_when = "compile"
        raise


def _run(compiled, make_inputs):
    try:
        return compiled(*make_inputs())
    except Exception as exc:
        exc._minifier_when = "run"
        raise


def trial(backend: Callable, gm: torch.fx.GraphModule, make_inputs: Callable[[], list], *,
          accuracy_check: bool, tolerance: float, aten_graph: bool) -> tuple[Optional[Failure], str]:
    """`reproduce`, with what went wrong as a Failure (None: it worked) and its traceback."""
    try:
        reproduce(backend, gm, make_inputs, accuracy_check=accuracy_check, tolerance=tolerance,
                  aten_graph=aten_graph)
    except Exception as exc:
        return failure_of(exc, getattr(exc, "_minifier_when", "run")), traceback.format_exc()
    return None, ""
