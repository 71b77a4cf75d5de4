"""Where the minifier meets the compiler: `engine.config.repro_after` ("dynamo": the
captured graph's backend call; "aot": each AOT graph our codegen compiles). A backend that
raises, a compiled graph that raises when run, or (level 4) one that computes a wrong
result has its graph written as minifier_launcher.py in the debug folder, and the error
says where. Levels: 1 writes the launcher and runs the graph eagerly instead; 2 writes it
and raises; 3 also minifies right away; 4 is 3 plus the accuracy check."""

from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Any, Callable, Optional

import torch

import observe

from . import accuracy, scripts
from .backend_ref import BackendRef, for_backend, for_codegen
from .check import AccuracyFailure, Failure, failure_of
from .minify import inputs_maker, minify
from .progress import ProgressDisplay

_minifying = [False]   # no hooks inside the minifier's own trials


def call_backend(backend: Callable, name: str, gm: torch.fx.GraphModule, example_inputs: list):
    """The captured graph's backend call (convert_frame), watched when repro_after="dynamo"."""
    from engine import config

    if config.repro_after != "dynamo" or _minifying[0]:
        return backend(gm, example_inputs)
    return _watched_compile(for_backend(backend, name), gm, example_inputs)


def watch_codegen(compile_fn: Callable) -> Callable:
    """Our codegen's compile of an AOT graph (the inductor backend), watched when
    repro_after="aot"."""
    def compile_aot_graph(gm: torch.fx.GraphModule, example_inputs: list):
        from engine import config

        if config.repro_after != "aot" or _minifying[0]:
            return compile_fn(gm, example_inputs)
        return _watched_compile(for_codegen(compile_fn), gm, example_inputs)
    return compile_aot_graph


def _watched_compile(ref: BackendRef, gm: torch.fx.GraphModule, example_inputs: list):
    from engine import config

    saved = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))   # the backend may rewrite gm's graph
    try:
        compiled = ref.fn(gm, example_inputs)
    except Exception as exc:
        eager = _on_failure(ref, saved, example_inputs, failure_of(exc, "compile"), exc)
        if eager is not None:
            return eager
        raise
    if config.repro_level >= 4:
        make = inputs_maker(saved, example_inputs)
        outputs = compiled(*make())     # with grad mode as the user's calls have it: the same compiled entry
        wrong = accuracy.compare(saved, outputs, make, config.repro_tolerance)
        if wrong:
            exc = AccuracyFailure(f"compiled result differs from eager: {wrong}")
            _on_failure(ref, saved, example_inputs, failure_of(exc, "run"), exc)
            raise exc
    return WatchedCall(compiled, ref, saved, example_inputs)


class WatchedCall:
    """A compiled graph whose first error when run is reported like a compile error."""

    def __init__(self, compiled: Callable, ref: BackendRef, gm: torch.fx.GraphModule, example_inputs: list):
        self.compiled, self.ref, self.gm, self.example_inputs = compiled, ref, gm, example_inputs
        self.reported = False

    def __call__(self, *args):
        try:
            return self.compiled(*args)
        except Exception as exc:
            if self.reported or _minifying[0]:
                raise
            self.reported = True
            eager = _on_failure(self.ref, self.gm, self.example_inputs, failure_of(exc, "run"), exc)
            if eager is not None:
                return eager(*args)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


def _on_failure(ref: BackendRef, gm: torch.fx.GraphModule, example_inputs: list, failure: Failure,
                exc: BaseException) -> Optional[Callable]:
    """Write the launcher (and, at level 3+, minify); tell the user on the exception, the
    minifier log and the trace. Returns the eager graph to run instead at level 1. The
    minifier's own failure never replaces the user's error: it becomes a note on it."""
    try:
        return _report_failure(ref, gm, example_inputs, failure, exc)
    except Exception as own:
        message = f"minifier: could not write a launcher for this failure: {type(own).__name__}: {own}"
        observe.log("minifier", logging.WARNING, "%s", message)
        exc.add_note(message)
        return None


def _report_failure(ref: BackendRef, gm: torch.fx.GraphModule, example_inputs: list, failure: Failure,
                    exc: BaseException) -> Optional[Callable]:
    from engine import config

    level = config.repro_level
    accuracy_check = failure.kind == "accuracy"
    folder = _minifier_dir()
    launcher = scripts.write_launcher(gm, example_inputs, os.path.join(folder, "minifier_launcher.py"), ref,
                                      failure, accuracy_check=accuracy_check, tolerance=config.repro_tolerance,
                                      compile_id=str(observe.current_compile_id() or "") or None)
    _emit_launcher(launcher)
    message = (f"minifier: {ref.name} failed after {ref.stage} ({failure}); the graph is in {launcher}: "
               f"`python {launcher}` shrinks it to repro.py")
    if level >= 3:
        _minifying[0] = True
        try:
            with ProgressDisplay():
                result = minify(gm, example_inputs, ref, expected=failure, accuracy_check=accuracy_check,
                                tolerance=config.repro_tolerance, out_dir=folder)
        finally:
            _minifying[0] = False
        done = "minified" if result.reproduced else "not minified"
        message = f"minifier: {ref.name} failed after {ref.stage}; {done}: {result.summary()}"
    observe.log("minifier", logging.WARNING, "%s", message)
    exc.add_note(message)
    if level == 1:
        warnings.warn(f"{message}. TORCHDYNAMO_REPRO_LEVEL=1: this graph runs eagerly instead", RuntimeWarning)
        return gm
    return None


def _minifier_dir() -> str:
    from ..debug_dir import _unique, install

    folder = _unique(os.path.join(install().run_dir(), "minifier"), sep="-")
    os.makedirs(folder)
    return folder


def _emit_launcher(path: str) -> None:
    def payload() -> str:
        with open(path, encoding="utf-8") as f:
            return f.read()
    observe.emit("artifact", {"name": "minifier_launcher", "encoding": "string", "path": path}, payload)
