"""The transformed frame: generated Python that calls the compiled graph, rebuilds the
values the frame returns (or holds at a graph break) from graph outputs, sources and
constants, replays side effects in order, and at a graph break runs the unsupported
instruction eagerly and calls the resume function.

Generated as Python source (one `exec` per compile) in four labelled regions, matching
PyTorch's layout: call_graph, store_outputs, side_effects, graph_break/resume_call.
Values are all computed (store_outputs) before any side effect is replayed, so a
mutation never changes what another output reads."""

from __future__ import annotations

import collections
import functools
import math
import types
from typing import Any

import torch

from . import numpy_ops, scalars
from .autocast import AutocastExit
from .runtime import GradModeExit, ProfilerRangeExit
from .graph_breaks import GraphBreak
from .source import AttrSource
from ..shapes.symbolic import has_symbolic, python_expr
from .variables import (AutocastVariable, BoundMethodVariable, CellVariable, ConstantVariable, DictVariable,
                        DictViewVariable, ExceptionVariable, FunctionVariable, GradModeVariable, IteratorVariable,
                        ListVariable, NestedFunctionVariable, ObjectVariable, PartialVariable, ProfilerRangeVariable, SetVariable,
                        TensorVariable, TupleVariable, VariableTracker, WithExitVariable)


def _new_object(cls, attrs, items=None):
    """An object the trace built: its attributes and, for a dict subclass, its items, set
    past the class's own __setattr__ / __setitem__ (their effects are in attrs and items)."""
    if items is None:
        obj = object.__new__(cls)
    else:
        obj = dict.__new__(cls)
        setitem = collections.OrderedDict.__setitem__ if isinstance(obj, collections.OrderedDict) else dict.__setitem__
        for k, v in items.items():
            setitem(obj, k, v)
    for k, v in attrs.items():
        object.__setattr__(obj, k, v)
    return obj


def _make_cell(*value):
    return types.CellType(*value)


def _bind(fn, obj):
    return types.MethodType(fn, obj)


_LITERAL_TYPES = (int, str, bool, type(None), bytes)


class CodeGen:
    def __init__(self, out, output_index: dict, shared=None):
        self.out = out
        self.output_index = output_index  # fx node -> index in the graph's output tuple
        # the graph call's SharedPrefixes (guards/chains.py): a source its arguments read is a
        # name bound there (`___p17`), not its attribute path walked again
        self.shared = shared
        self.ns: dict[str, Any] = {"___new_object": _new_object, "___make_cell": _make_cell, "___bind": _bind,
                                   "___FunctionType": types.FunctionType, "___identity": lambda v: v,
                                   "___always": lambda v: True, "torch": torch}
        self.lines: dict[str, list[str]] = {"prologue": [], "call_graph": [], "store_outputs": [], "side_effects": [],
                                            "graph_break": [], "resume_call": []}
        self.memo: dict[int, str] = {}
        self.loop_iterators: set = set()  # ids of iterators on the value stack at a break
        self._n = 0
        self._consts: dict[int, str] = {}

    def tmp(self) -> str:
        self._n += 1
        return f"__t{self._n}"

    def const(self, value: Any, hint: str = "const") -> str:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.constant(value)  # never embed a symbol: recompute it from the inputs
        key = id(value)
        name = self._consts.get(key)
        if name is None:
            base = "".join(c if c.isalnum() else "_" for c in (getattr(value, "__name__", None) or hint))[:30]
            name = f"___{hint}_{base}_{len(self._consts)}"
            self._consts[key] = name
            self.ns[name] = value
        return name

    def emit(self, region: str, line: str) -> None:
        self.lines[region].append(line)

    def assign(self, expr: str) -> str:
        t = self.tmp()
        self.emit("store_outputs", f"{t} = {expr}")
        return t

    # ------------------------------------------------------------------ values

    def expr(self, vt: VariableTracker) -> str:
        """An expression (usually a temp) for `vt`, evaluated in store_outputs."""
        key = id(vt)
        if key in self.memo:
            return self.memo[key]
        text = self._build(vt)
        if not _is_simple(text):
            text = self.assign(text)
        self.memo[key] = text
        return text

    def _build(self, vt) -> str:
        if isinstance(vt, ConstantVariable):
            node = self.out.sym_outputs.get(id(vt))
            if node is not None:  # a captured scalar: computed by the graph
                if node not in self.output_index:
                    raise GraphBreak("GB0018", "a captured scalar that is not a graph output")
                return f"__o[{self.output_index[node]}]"
            return self.constant(vt.value)
        if isinstance(vt, CellVariable) and vt.source is not None:
            # a cell of the compiled function's closure: the cell object itself, not its contents
            local = getattr(vt.source, "local", None)
            freevars = self.out.f_code.co_freevars
            if local in freevars:
                return f"F.__closure__[{freevars.index(local)}]"
            raise GraphBreak("GB0018", "a cell of the compiled function's closure")
        if vt.source is not None and not isinstance(vt, (NestedFunctionVariable,)):
            return vt.source.name()
        if isinstance(vt, numpy_ops.NumpyVariable):  # an ndarray computed by the graph, handed back as NumPy's
            self.ns["___numpy_out"] = numpy_ops.to_numpy_output
            return f"___numpy_out({self.expr(vt.tensor)})"
        if isinstance(vt, TensorVariable):
            node = vt.proxy.node
            if node.op == "get_attr":
                return self.const(self.out.constant_tensors[node.target], "tensor")
            if node not in self.output_index:
                raise GraphBreak("GB0018", "a tensor that is not a graph output")
            return f"__o[{self.output_index[node]}]"
        if isinstance(vt, DictViewVariable):
            return f"{self.expr(vt.dict_vt)}.{vt.kind}()"
        if isinstance(vt, ListVariable):
            return "[" + ", ".join(self.expr(x) for x in vt.items) + "]"
        if isinstance(vt, TupleVariable):
            items = ", ".join(self.expr(x) for x in vt.items)
            if vt.cls is tuple:
                return f"({items}{',' if len(vt.items) == 1 else ''})"
            if vt.is_namedtuple():
                return f"{self.const(vt.cls, 'cls')}({items})"
            return f"{self.const(vt.cls, 'cls')}(({items}{',' if len(vt.items) == 1 else ''}))"
        if isinstance(vt, DictVariable):
            body = ", ".join(f"{self.constant(k)}: {self.expr(v)}" for k, v in vt.items.items())
            if vt.cls is dict:
                return "{" + body + "}"
            return f"{self.const(vt.cls, 'cls')}({{{body}}})"
        if isinstance(vt, SetVariable):
            return f"{vt.cls.__name__}([{', '.join(self.constant(x) for x in vt.items)}])"
        if isinstance(vt, IteratorVariable):
            items = "[" + ", ".join(self.expr(x) for x in vt.items[vt.index:]) + "]"
            if vt.pytype is types.GeneratorType:
                return f"(__v for __v in {items})"  # the values were computed by the graph already
            if vt.pytype is map:
                return f"map(___identity, {items})"
            if vt.pytype is filter:
                return f"filter(___always, {items})"
            if vt.pytype is not type(iter([])) and id(vt) not in self.loop_iterators:
                # only a loop's own iterator may change type (nobody can observe it)
                raise GraphBreak("GB0018", f"a live {vt.pytype.__name__} object")
            return f"iter({items})"
        if isinstance(vt, FunctionVariable):
            return self.const(vt.fn, "fn")
        if isinstance(vt, WithExitVariable) and isinstance(vt.ctx, GradModeVariable):
            # the exit of a grad-mode with block split by the break: restores the mode from before it
            self.ns["___GradModeExit"] = GradModeExit
            return f"___GradModeExit({bool(vt.ctx.prev)!r})"
        if isinstance(vt, PartialVariable):
            self.ns["___partial"] = functools.partial
            parts = [self.expr(vt.func)] + [self.expr(a) for a in vt.args] + \
                [f"{k}={self.expr(v)}" for k, v in vt.kwargs.items()]
            return f"___partial({', '.join(parts)})"
        if isinstance(vt, WithExitVariable) and isinstance(vt.ctx, ProfilerRangeVariable):
            self.ns["___ProfilerRangeExit"] = ProfilerRangeExit
            return "___ProfilerRangeExit()"
        if isinstance(vt, WithExitVariable) and isinstance(vt.ctx, AutocastVariable):
            # the exit of a split autocast block: back to the state from before it
            self.ns["___AutocastExit"] = AutocastExit
            return (f"___AutocastExit({self.const(vt.ctx.block, 'autocast_state')}, "
                    f"{self.const(vt.ctx.prev, 'autocast_state')})")
        if isinstance(vt, ObjectVariable):
            if vt.is_new:
                attrs = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in vt.attrs.items())
                if vt.dict_vt is not None:
                    return f"___new_object({self.const(vt.cls, 'cls')}, {{{attrs}}}, {self.expr(vt.dict_vt)})"
                return f"___new_object({self.const(vt.cls, 'cls')}, {{{attrs}}})"
            if vt.value is not None or vt.cls is type(None):
                return self.const(vt.value, "obj")
        if isinstance(vt, BoundMethodVariable):
            if vt.fn is not None:
                return f"___bind({self.const(vt.fn, 'fn')}, {self.expr(vt.obj)})"
            return f"{self.expr(vt.obj)}.{vt.name}"
        if isinstance(vt, ExceptionVariable):
            return f"{self.const(vt.cls, 'cls')}({', '.join(self.expr(a) for a in vt.args)})"
        if isinstance(vt, CellVariable):
            if vt.source is not None:
                raise GraphBreak("GB0018", "a cell of the compiled function's closure")
            return f"___make_cell({self.expr(vt.value) if vt.value is not None else ''})"
        if isinstance(vt, NestedFunctionVariable):
            closure = "None"
            if vt.closure:
                closure = "(" + ", ".join(self.expr(c) for c in vt.closure) + ",)"
            defaults = "None" if vt.defaults is None else self.expr(vt.defaults)
            t = (f"___FunctionType({self.const(vt.code, 'code')}, {self.const(vt.f_globals, 'globals')}, "
                 f"{vt.code.co_name!r}, {defaults}, {closure})")
            if vt.kwdefaults is not None:
                name = self.assign(t)
                self.emit("store_outputs", f"{name}.__kwdefaults__ = {self.expr(vt.kwdefaults)}")
                self.emit("store_outputs", f"{name}.__qualname__ = {vt.qualname!r}")
                return name
            name = self.assign(t)
            self.emit("store_outputs", f"{name}.__qualname__ = {vt.qualname!r}")
            return name
        raise GraphBreak("GB0018", f"{type(vt).__name__}")

    def constant(self, value) -> str:
        if has_symbolic(value) and scalars.is_unbacked(value):
            raise GraphBreak("GB0018", f"a captured scalar inside a {type(value).__name__}")
        if has_symbolic(value):  # a size computed from symbols: recomputed from the inputs (engine/shapes)
            self.ns["___torch_Size"] = torch.Size
            text = python_expr(value)
            if text is None:
                raise GraphBreak("GB0018", f"a symbolic size inside a {type(value).__name__}")
            # read from the inputs on entry: the graph may change an input's shape in place (unsqueeze_)
            t = self.tmp()
            self.emit("prologue", f"{t} = {text}")
            return t
        # exact types only: a subclass's repr is not its literal (np.float64(8.0), <Color.RED: 1>)
        if type(value) in _LITERAL_TYPES and (type(value) is not int or abs(value) < 2 ** 62):
            return repr(value)
        if type(value) is float and math.isfinite(value):
            return repr(value)
        if type(value) is tuple and all(type(x) in _LITERAL_TYPES for x in value):
            return repr(value)
        return self.const(value, "const")

    # ------------------------------------------------------------------ side effects

    def side_effects(self) -> None:
        out = self.out
        plans = []
        for vt in out.mutated:
            src = vt.source.name()
            if isinstance(vt, ListVariable):
                plans.append(f"{src}[:] = {self.expr_fresh(ListVariable(vt.items))}")
            elif isinstance(vt, DictVariable):
                new = self.expr_fresh(DictVariable(vt.items))
                plans.append(f"{src}.clear()")
                plans.append(f"{src}.update({new})")
            elif isinstance(vt, ObjectVariable):
                for name, v in vt.attrs.items():
                    plans.append(f"setattr({src}, {name!r}, {self.expr(v)})")
                for name in vt.deleted:
                    plans.append(f"delattr({src}, {name!r})")
            else:
                raise GraphBreak("GB0017", f"mutation of {type(vt).__name__}")
        for leaf, v in out.grads.values():    # .grad set by the frame (a backward in the graph, `p.grad = None`)
            if not (isinstance(v, TensorVariable) and v.source is not None
                    and v.source.name() == AttrSource(leaf.source, "grad").name()):
                target = self.shared.expression(leaf.source.name()) if self.shared else leaf.source.name()
                plans.append(f"{target}.grad = {self.expr(v)}")
        for (_, _name), (src, v) in out.global_stores.items():
            plans.append(f"{src.name()} = {self.expr(v)}")
        for fn, args, kwargs in out.deferred_calls:
            call_args = [self.expr(a) for a in args] + [f"{k}={self.expr(v)}" for k, v in kwargs.items()]
            plans.append(f"{self.const(fn, 'fn')}({', '.join(call_args)})")
        for p in plans:
            self.emit("side_effects", p)

    def expr_fresh(self, vt) -> str:
        # a new container holding the final items (the mutated original keeps its identity)
        return self.assign(self._build(vt))

    # ------------------------------------------------------------------ assembly

    def source(self, name: str) -> str:
        body = []
        for region in ("prologue", "call_graph", "store_outputs", "side_effects", "graph_break", "resume_call"):
            lines = self.lines[region]
            if lines:
                body.append(f"    # -- {region}")
                body.extend("    " + ln for ln in lines)
        return f"def {name}(L, G, F):\n" + ("\n".join(body) if body else "    pass") + "\n"


def _is_simple(text: str) -> bool:
    # a mutable literal ([], {}) is not simple: every use of it would build another object
    return text.isidentifier() or (text.startswith("__o[") and text.endswith("]") and text.count("[") == 1) or \
        (_is_literal(text) and not text.startswith(("[", "{")))


def _is_literal(text: str) -> bool:
    try:
        import ast
        ast.literal_eval(text)
        return True
    except Exception:
        return False
