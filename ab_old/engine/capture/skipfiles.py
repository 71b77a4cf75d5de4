"""Which code compiles: the one rule, by where a code object's file lives.

Compiled: user code anywhere, every installed library (site-packages and dist-packages of a
venv, conda, user and editable installs), code made by exec/compile. Skipped: the standard
library, torch's own internals (but for module forwards and optimizer steps), and the
engine itself. In a venv the standard library's folder (`<venv>/lib/python3.X`) is a
prefix of `site-packages`, so library folders are looked up before the standard library.

`skip_reason(code)` answers from the code alone; `TORCH_LOGS=+dynamo` logs each skipped
function once, with the reason."""

from __future__ import annotations

import logging
import os
import site
import sys
import sysconfig
from typing import Optional

import torch

import observe

_HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(_HERE)), d) + os.sep for d in ("engine", "observe"))
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# the engine's own Python that the capture traces like user code (stand-ins for torch's
# higher-order ops: engine/capture/scan.py)
TRACED_ENGINE_FILES = (os.path.join(_HERE, "scan.py"),)
TORCH_NN_MODULES = os.path.join(TORCH_DIR, "nn", "modules") + os.sep
OPTIM_DIR = os.path.join(TORCH_DIR, "optim") + os.sep
# torch's decorators that wrap user code (`@torch.no_grad()`, `@torch.autocast(...)`): a
# function they decorate compiles as the user wrote it
TORCH_DECORATOR_FILES = tuple(os.path.join(TORCH_DIR, *p) for p in (("utils", "_contextlib.py"),
                                                                     ("amp", "autocast_mode.py")))

_dirs: dict = {}


def _both(paths) -> set:
    out = set()
    for p in paths:
        if p:
            out.add(os.path.abspath(p) + os.sep)
            out.add(os.path.realpath(p) + os.sep)
    return out


def library_dirs() -> tuple:
    """Folders where installed libraries live: user code, however deep under the stdlib folder."""
    if "lib" not in _dirs:
        paths = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
        try:
            paths += site.getsitepackages()
        except AttributeError:  # an old virtualenv's site.py
            pass
        if site.ENABLE_USER_SITE:
            paths.append(site.getusersitepackages())
        paths += [p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")]
        _dirs["lib"] = tuple(sorted(_both(paths) - _both([TORCH_DIR[:-1]])))
    return _dirs["lib"]


def stdlib_dirs() -> tuple:
    if "std" not in _dirs:
        _dirs["std"] = tuple(sorted(_both(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib"))))
    return _dirs["std"]


def is_engine_file(filename: str) -> bool:
    """The engine's own code, which is never traced (but for TRACED_ENGINE_FILES)."""
    return filename.startswith(ENGINE_DIRS) and filename not in TRACED_ENGINE_FILES


def skip_reason(code, force: bool = False) -> Optional[str]:
    """None when `code` compiles; otherwise why not. `force`: a frame inside torch that
    compiles anyway (an optimizer's inner step, a resume function)."""
    filename = code.co_filename
    if filename.startswith("<"):
        return "the engine's generated code" if filename.startswith("<engine") else None
    if is_engine_file(filename):
        return "the engine itself"
    if filename.startswith(TORCH_DIR):
        if force or filename.startswith(TORCH_NN_MODULES) or filename in TORCH_DECORATOR_FILES:
            return None  # module forwards compile, as PEP 523 would see them
        return "torch internals"
    if filename.startswith(library_dirs()):
        return None
    if filename.startswith(stdlib_dirs()):
        return "the standard library"
    return None


def is_internal_file(filename: str) -> bool:
    """Not the user's code: the engine, torch or the standard library (for user stacks)."""
    if filename.startswith(ENGINE_DIRS) or filename.startswith(TORCH_DIR) or filename.startswith("<engine"):
        return True
    return filename.startswith(stdlib_dirs()) and not filename.startswith(library_dirs())


def log_skip(code, reason: str) -> None:
    """`TORCH_LOGS=+dynamo` shows each skipped function (the caller asks once per code)."""
    observe.log("dynamo", logging.DEBUG, "skipping %s (%s:%s): %s", code.co_qualname if hasattr(code, "co_qualname")
                else code.co_name, code.co_filename, code.co_firstlineno, reason)
