"""Shape guards in user terms, built from one capture's ShapeEnv.

A compiled graph with symbolic sizes is valid for the inputs that satisfy what the trace
assumed about its symbols. Those assumptions come in four kinds, each rendered as a
Python condition over `L` and `G`:

0. every symbolic size and stride of every input equals the expression the graph used
   for it (`L['x'].stride()[0] == L['x'].size()[1]`);
1. where a size/stride was tied to an earlier one (duck sizing gave two dims the same
   symbol, or a guard such as `x.shape[0] == y.shape[0]` replaced one symbol by another or
   by a constant): `L['y'].size()[0] == L['x'].size()[0]`;
2. each free symbol's range: `2 <= L['x'].size()[0]` (sizes 0 and 1 were specialized);
3. every other guard the trace added (a branch on a size), simplified with sympy
   against the replacements, and dropped when the ranges already imply it.

They become `Guard("SHAPE_ENV", "", text, user_frame)` records after the tensor guards, so
a size is read only once its tensor has passed TENSOR_MATCH."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterable, Optional

import sympy
import torch
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import bound_sympy

from ..guards.guard import Guard, TensorMeta
from .env import EngineShapeEnv
from .printer import python_text
from .sources import source_name


def symbol_names(env: EngineShapeEnv) -> dict:
    """Each symbol -> the source that first produced it."""
    return {sym: source_name(srcs[0]) for sym, srcs in env.var_to_sources.items() if srcs}


def _is_symbolic(v) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not isinstance(
        v.node.expr, sympy.Number)


def dynamic_dims(fake: torch.Tensor) -> tuple:
    """(symbolic size dims, symbolic stride dims) of a fake tensor."""
    return (tuple(i for i, s in enumerate(fake.size()) if _is_symbolic(s)),
            tuple(i for i, s in enumerate(fake.stride()) if _is_symbolic(s)))


def relax_tensor_match(guards: list, inputs: Iterable) -> list:
    """TENSOR_MATCH guards of inputs whose fakes have symbolic dims expect `None` there."""
    holes = {}
    for source, _real, vt in inputs:
        fake = getattr(vt, "fake", None)
        if isinstance(fake, torch.Tensor):
            sizes, strides = dynamic_dims(fake)
            if sizes or strides:
                holes[source.name()] = (sizes, strides)
    if not holes:
        return list(guards)
    out = []
    for g in guards:
        h = holes.get(g.source) if g.kind == "TENSOR_MATCH" else None
        if h is not None:
            m: TensorMeta = g.expected
            sizes = tuple(None if i in h[0] else s for i, s in enumerate(m.sizes))
            strides = tuple(None if i in h[1] else s for i, s in enumerate(m.strides))
            g = dataclasses.replace(g, expected=dataclasses.replace(m, sizes=sizes, strides=strides))
        out.append(g)
    return out


@dataclasses.dataclass(frozen=True)
class ShapeGuardText:
    text: str
    user_frame: Optional[tuple]
    why: str  # "duck sizing", "range", "guard"


def _frame_of(sloc) -> Optional[tuple]:
    return getattr(sloc, "user_frame", None)


def shape_guard_texts(env: EngineShapeEnv) -> list[ShapeGuardText]:
    names = symbol_names(env)
    out: list[ShapeGuardText] = []
    seen: set = set()

    def add(text, frame, why):
        if text not in seen:
            seen.add(text)
            out.append(ShapeGuardText(text, frame, why))

    # 1. every source of a symbol equals the symbol's canonical form
    for sym, srcs in env.var_to_sources.items():
        canon = env.replace(sym)
        frame = env.symbol_frames.get(sym)
        for k, src in enumerate(srcs):
            if canon == sym and k == 0:
                continue
            rhs = python_text(canon, names)
            lhs = source_name(src)
            if lhs != rhs:
                add(f"{lhs} == {rhs}", frame, "duck sizing" if canon == sym else "specialization")
    # 2. ranges of the symbols that stayed free
    for sym in env.var_to_sources:
        if env.replace(sym) != sym:
            continue
        vr = env.var_to_range.get(sym)
        if vr is None:
            continue
        name = names[sym]
        frame = env.symbol_frames.get(sym)
        # sizes and strides are never negative: a lower bound of 0 needs no guard for them
        natural_lower = 0 if any(p in name for p in (".size()[", ".stride()[", ".storage_offset()")) else None
        if vr.lower not in (-int_oo, -sympy.oo) and (natural_lower is None or vr.lower > natural_lower):
            add(f"{vr.lower} <= {name}", frame, "range")
        if vr.upper not in (int_oo, sympy.oo):
            add(f"{name} <= {vr.upper}", frame, "range")
    # 3. the guards the trace added, unless the ranges already imply them
    ranges = {s: r for s, r in env.var_to_range.items()}
    for g in env.guards:
        expr = env.simplify(g.expr)
        if expr is sympy.true or expr == sympy.true:
            continue
        try:
            b = bound_sympy(expr, ranges)
            if b.is_singleton() and bool(b.lower) is True:
                continue
        except Exception:
            pass
        missing = [s for s in expr.free_symbols if s not in names]
        if missing:
            raise ValueError(f"shape guard {expr} uses symbols without a source: {missing}")
        add(python_text(expr, names), _frame_of(g.sloc), "guard")
    return out


def input_guard_texts(env: EngineShapeEnv, inputs: Iterable) -> list[ShapeGuardText]:
    """Each symbolic size and stride of each input, tied to its canonical form
    (`L['x'].stride()[0] == L['x'].size()[1]`, `L['y'].size()[0] == L['x'].size()[0]`).
    Needed beyond the symbols' own sources: a FakeTensor is shared by every source of one
    real tensor (an input that is also another input's view base), and strides that follow
    from sizes have no symbol of their own."""
    names = symbol_names(env)
    out = []
    for source, _real, vt in inputs:
        fake = getattr(vt, "fake", None)
        if not isinstance(fake, torch.Tensor):
            continue
        base = source.name()
        for prop, values in (("size", fake.size()), ("stride", fake.stride())):
            for i, v in enumerate(values):
                if not _is_symbolic(v):
                    continue
                lhs = f"{base}.{prop}()[{i}]"
                rhs = python_text(env.simplify(v.node.expr), names)
                if lhs != rhs:
                    out.append(ShapeGuardText(f"{lhs} == {rhs}", None, prop))
    return out


def shape_guards(env, inputs: Iterable = (), first_use: Optional[dict] = None) -> list[Guard]:
    if not isinstance(env, EngineShapeEnv) or not env.var_to_sources:
        return []
    texts = input_guard_texts(env, inputs) + shape_guard_texts(env)
    seen: set = set()
    texts = [t for t in texts if not (t.text in seen or seen.add(t.text))]
    out = []
    for t in texts:
        frame = t.user_frame
        if first_use and (frame is None or frame is env._entry_frame):
            # made while wrapping the inputs (no line yet): name the first line using the tensor
            # the guard is about (the first one it names: `L['y'].size()[0] == L['x'].size()[0]` ties y to x)
            at = [(t.text.find(src + "."), f) for src, f in first_use.items() if t.text.find(src + ".") >= 0]
            if at:
                frame = min(at, key=lambda p: p[0])[1]
        out.append(Guard("SHAPE_ENV", "", t.text, frame))
    return out


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME_LINE = re.compile(r'File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<name>[^\n]*)\n(?P<code>[^\n]*)')


def _first_use_frames(graph) -> dict:
    """Graph input source -> the user frame of the first graph op that reads it."""
    out = {}
    for node in graph.nodes:
        if node.op != "placeholder" or "source" not in node.meta:
            continue
        for user in node.users:
            frames = [(m["file"], int(m["line"]), m["name"].strip(), m["code"].strip())
                      for m in _FRAME_LINE.finditer(user.meta.get("stack_trace") or "")]
            if frames:
                # the innermost frame of the user's own code, not of torch functions inlined into it
                mine = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
                out[node.meta["source"]] = (mine or frames)[-1]
                break
    return out


def attach_first_use(guards: list, frames: dict) -> list:
    """Inputs are wrapped before tracing starts, so their guards name no user line; give
    each tensor guard the line that first used the tensor (as PyTorch's tree shows)."""
    out = []
    for g in guards:
        if g.user_frame is None and g.kind == "TENSOR_MATCH":
            frame = frames.get(g.source)
            if frame is not None:
                g = dataclasses.replace(g, user_frame=frame)
        out.append(g)
    return out


_ROOT_LOCAL = re.compile(r"L\['(?P<name>[^']+)'\]")
_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW", "LOAD_FAST_BORROW_LOAD_FAST_BORROW",
          "LOAD_DEREF", "LOAD_CLOSURE")


def first_read_frames(code) -> dict:
    """Local name -> the user frame of the first line of `code` that reads it. Arguments are
    wrapped before tracing starts, so the guards made then name no line; this is the line
    the user reads the argument on."""
    import dis
    import linecache
    out: dict = {}
    if code is None:
        return out
    try:
        line = None
        for ins in dis.get_instructions(code):
            pos = getattr(ins, "positions", None)
            line = (pos.lineno if pos is not None and pos.lineno else None) or ins.starts_line or line
            if ins.opname not in _LOADS or line is None or isinstance(line, bool):
                continue
            names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
            for name in names:
                if isinstance(name, str) and name not in out:
                    text = linecache.getline(code.co_filename, line).strip()
                    out[name] = (code.co_filename, line, code.co_name, text)
    except Exception:  # provenance is a nicety
        return out
    return out


def attach_first_read(guards: list, frames: dict) -> list:
    """Guards still without a user line (made when the frame's arguments were wrapped, or a
    shape guard on a size no graph op read) get the first line reading their root local."""
    if not frames:
        return guards
    out = []
    for g in guards:
        if g.user_frame is None:
            m = _ROOT_LOCAL.search(g.source if g.kind != "SHAPE_ENV" else str(g.expected))
            if m and g.kind != "GLOBAL_STATE" and m.group("name") in frames:
                g = dataclasses.replace(g, user_frame=frames[m.group("name")])
        out.append(g)
    return out


def finalize_guards(out) -> list[Guard]:
    """The guard list of a finished capture (an OutputGraph): its guards with tensor
    matches relaxed at symbolic dims and pointed at their first use, then the shape guards;
    a guard made before tracing began names the first line that reads its argument."""
    guards = relax_tensor_match(out.guard_list(), out.inputs)
    try:
        first_use = _first_use_frames(out.graph)
        guards = attach_first_use(guards, first_use)
    except Exception:  # provenance is a nicety: never fail a compile over it
        first_use = {}
    guards = guards + shape_guards(getattr(out.fake_mode, "shape_env", None), out.inputs, first_use)
    return attach_first_read(guards, first_read_frames(getattr(out, "f_code", None)))
