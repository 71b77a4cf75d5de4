"""The backend at fault, as a callable here and as source lines that define `backend` in a
written script (a registered name, an importable function, or a function's own source)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import textwrap
import types
from typing import Callable

# engine.config knobs that change what a backend does: the scripts set them again.
REPLAYED_CONFIG = ("inject_relu_bug_TESTING_ONLY", "triton_interpret", "max_autotune", "capture_scalar_outputs")


@dataclasses.dataclass
class BackendRef:
    stage: str           # "dynamo" (backend(gm, example_inputs) on the captured graph) or "aot" (our codegen)
    name: str
    fn: Callable
    setup: str           # script lines defining `backend`

    def config_lines(self) -> str:
        """Script lines: the knobs of the failing run, and repro_after (codegen errors raise
        instead of falling back to aten ops)."""
        from engine import config

        lines = [f"engine.config.repro_after = {self.stage!r}"]
        for knob in REPLAYED_CONFIG:
            value = getattr(config, knob, None)
            if value:
                lines.append(f"engine.config.{knob} = {value!r}")
        return "\n".join(lines)


def for_codegen(fn: Callable) -> BackendRef:
    return BackendRef("aot", "codegen", fn, "from engine.codegen import compile_fx_graph as backend")


def for_backend(fn: Callable, name: str) -> BackendRef:
    from engine.backends import list_backends

    if name in list_backends():
        setup = f"from engine.backends import lookup_backend\nbackend = lookup_backend({name!r})"
        return BackendRef("dynamo", name, fn, setup)
    return BackendRef("dynamo", name, fn, _user_backend_setup(fn))


def _user_backend_setup(fn: Callable) -> str:
    """Import a user's backend from its module; one defined in the main script is copied
    (its source) since the script cannot be imported without running it."""
    target = getattr(fn, "__wrapped__", fn)
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    paths = {os.getcwd(), os.path.dirname(os.path.abspath(sys.argv[0] or "."))}
    root = _import_root(module)
    if root:
        paths.add(root)
    path_line = f"sys.path[:0] = {sorted(paths)!r}  # where the failing program ran and imported the backend from"
    if module and module != "__main__" and qualname and "<" not in qualname:
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            if obj is target:
                head, _, tail = qualname.partition(".")
                line = f"from {module} import {head}\nbackend = {head}{'.' + tail if tail else ''}"
                return f"import sys\n{path_line}\n{line}"
        except Exception:
            pass
    try:
        source = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        why = (f"the backend {module}.{qualname} cannot be imported or copied here: "
               "define backend(gm, example_inputs) above this line")
        return f"raise ImportError({why!r})"
    where = f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    return (f"# the backend, copied from {where} (it was defined in the main script)\n"
            f"{_globals_it_reads(target)}{source.rstrip()}\n\nbackend = {target.__name__}")


def _globals_it_reads(fn) -> str:
    """Imports for the modules a copied function reads by a global name, and a note naming
    its other globals (they must be defined in the script too)."""
    code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is None:
        return ""
    lines, others = [], []
    for name in code.co_names:
        if name not in scope:
            continue
        value = scope[name]
        if isinstance(value, types.ModuleType):
            lines.append(f"import {value.__name__}" + (f" as {name}" if name != value.__name__ else ""))
        elif name != fn.__name__:
            others.append(name)
    if others:
        lines.append(f"# it also reads {', '.join(others)} from the main script: define them here")
    return "".join(line + "\n" for line in lines)


def _import_root(module_name) -> str:
    """The sys.path entry a module was imported from (the folder above its top package)."""
    module = sys.modules.get(module_name or "")
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    folder = os.path.dirname(os.path.abspath(path))
    depth = module_name.count(".") + (os.path.basename(path) == "__init__.py")
    for _ in range(depth):
        folder = os.path.dirname(folder)
    return folder
