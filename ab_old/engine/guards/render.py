"""The one renderer of guards: used by the `guards` log, the trace's
dynamo_cpp_guards_str payload, recompile reasons and explain."""

from __future__ import annotations

import os
from typing import Iterable

from .guard import Guard, TensorMeta


def _short_type(t: type) -> str:
    return t.__name__


def expression(g: Guard) -> str:
    """The guard as a Python-like condition over L and G."""
    s, e = g.source, g.expected
    if g.kind == "TENSOR_MATCH":
        m: TensorMeta = e
        return (f"check_tensor({s}, {_short_type(m.type)}, {m.dtype}, device={m.device}, "
                f"requires_grad={m.requires_grad}, size={list(m.sizes)}, stride={list(m.strides)})")
    if g.kind == "TYPE_MATCH":
        return f"type({s}) is {e.__module__}.{e.__qualname__}" if e.__module__ != "builtins" else f"type({s}) is {e.__qualname__}"
    if g.kind == "ID_MATCH":
        return f"{s} is <{type(e).__name__} {getattr(e, '__qualname__', getattr(e, '__name__', ''))} at {hex(id(e))}>"
    if g.kind == "EQUALS_MATCH":
        return f"{s} is None" if e is None else f"{s} == {e!r}"
    if g.kind == "LENGTH_CHECK":
        return f"len({s}) == {e}"
    if g.kind == "DICT_KEYS":
        return f"list({s}.keys()) == {list(e)!r}"
    if g.kind == "HASATTR":
        name, present = e
        return f"hasattr({s}, {name!r}) == {present}"
    if g.kind == "GLOBAL_STATE":
        return "___check_global_state() against " + ",".join(f"{k}={v}" for k, v in e.items())
    if g.kind == "DUPLICATE_INPUT":
        return f"{s} is {e}"
    if g.kind == "NO_TENSOR_ALIASING":
        return f"check_no_aliasing({', '.join(e)})"
    if g.kind == "SHAPE_ENV":
        return str(e)
    return f"{g.kind}({s}, {e!r})"


def user_suffix(g: Guard) -> str:
    if not g.user_frame:
        return ""
    filename, lineno, name, line = g.user_frame
    short = os.path.basename(filename)
    code = f"  # {line.strip()}" if line else ""
    return f"{code}  # {short}:{lineno} in {name}"


def render_guard(g: Guard, with_user_frame: bool = True) -> str:
    return f"{g.kind}: {expression(g)}" + (user_suffix(g) if with_user_frame else "")


def render_guards(guards: Iterable[Guard]) -> str:
    """The guard tree (PyTorch's TREE_GUARD_MANAGER layout; engine/guards/tree.py)."""
    from .tree import render_guard_tree
    return render_guard_tree(guards)
