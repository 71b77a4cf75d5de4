"""A stand-in for the capture engine in tests of the observability tools: it emits the
events a compile emits (compile id, dynamo_start, timed stages, the graph, the backend
call, compilation_metrics) in the order the engine does, around a real FX graph."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional, Sequence

import torch
import torch.fx

import observe


def busy(ms: float) -> None:
    """Spend `ms` of wall time (a stand-in for tracing work)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


@contextlib.contextmanager
def compiling(frame_id: int, compile_idx: int, fn_name: str, filename: str, lineno: int, attempt: int = 0):
    """The outer frame of one compile: compile id, dynamo_start, entire_frame_compile."""
    with observe.compile_context(observe.CompileId(frame_id, compile_idx, attempt)):
        observe.emit("dynamo_start", {"stack": [{"line": lineno, "name": fn_name, "filename": filename}]})
        with observe.stage("entire_frame_compile"):
            yield


def inline(fn_name: str, filename: str, lineno: int):
    """The hook the interpreter wraps around tracing one inlined user function."""
    return observe.stage("trace_function", fn_name=fn_name, filename=filename, lineno=lineno)


def compile_graph(fn: Callable, example_inputs: Sequence, backend: Optional[Callable] = None, *,
                  frame_id: int = 0, compile_idx: int = 0, attempt: int = 0,
                  inlined: Sequence[tuple[str, str, int]] = (), breaks: Sequence[dict] = (),
                  recompile_reason: Optional[str] = None, trace_ms: float = 0.0):
    """Capture `fn` with torch.fx and report it as the engine would; returns the backend's
    compiled callable (or the graph module)."""
    code = fn.__code__
    with observe.compile_context(observe.CompileId(frame_id, compile_idx, attempt)):
        observe.emit("dynamo_start", {"stack": [{"line": code.co_firstlineno, "name": code.co_name,
                                                 "filename": code.co_filename}]})
        if recompile_reason is not None:
            observe.emit("artifact", {"name": "recompile_reasons", "encoding": "json"}, lambda: recompile_reason)
        with observe.stage("entire_frame_compile"):
            with observe.stage("bytecode_tracing"):
                busy(trace_ms)
                gm = torch.fx.symbolic_trace(fn)
                for name, filename, lineno in inlined:
                    with inline(name, filename, lineno):
                        busy(trace_ms)
                for br in breaks:
                    observe.emit("graph_break", dict(br))
                    observe.emit("artifact", {"name": "dynamo_graph_break_reason", "encoding": "string"},
                                 lambda br=br: f"Graph break in user code\nGraph Break Reason: {br['reason']}")
            observe.emit("dynamo_output_graph", {"sizes": {}}, lambda: gm.print_readable(print_output=False))
            observe.emit("dynamo_cpp_guards_str", {}, lambda: "TREE_GUARD_MANAGER:\n+- GuardManager: source=L['x']")
            with observe.stage("backend_compile", graph_module=gm, example_inputs=list(example_inputs)):
                compiled = backend(gm, list(example_inputs)) if backend is not None else gm
        observe.emit("compilation_metrics", {"compile_id": f"{frame_id}/{compile_idx}", "co_name": code.co_name,
                                             "co_filename": code.co_filename, "co_firstlineno": code.co_firstlineno,
                                             "graph_op_count": len(gm.graph.nodes) - 2})
    return compiled
