"""Importing this lets engine.capture load on a bare interpreter (no torch): the bytecode
tests then run on any CPython, e.g. `python3.12 -m pytest tests/test_capture_bytecode.py`.
With torch installed it does nothing."""

import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
try:
    import torch  # noqa: F401
except ImportError:  # a bare interpreter: load engine.capture without engine/__init__ (torch)
    for name, path in (("engine", ROOT / "engine"), ("engine.capture", ROOT / "engine" / "capture")):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(path)]
            sys.modules[name] = pkg
