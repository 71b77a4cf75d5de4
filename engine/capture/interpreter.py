"""The symbolic interpreter: runs a frame's bytecode over variable trackers, putting
tensor operations into the OutputGraph and inlining user function calls.

One `Frame` per code object being traced (the compiled frame at the top, inlined
callees below it). A `GraphBreak` raised anywhere reaches the top frame, which records
where it happened; the frame converter then restarts and stops there (convert_frame.py).
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import dis
import functools
import inspect
import linecache
import logging
import operator
import sys
import types
from typing import Any, Optional

import torch

import observe

from ..guards.program import module_class_is_plain
from ..shapes.symbolic import TYPE_FUNCTIONS, as_plain_types, has_symbolic, needs_specializing, specialize
from .. import config
from . import bytecode as bc
from . import backward, higher_order, numpy_ops, optimizers, scalars
from .pyversion import V, split_call
from .builder import CONSTANT_TYPES, is_constant_value, wrap_constant
from .graph_breaks import GraphBreak
from .source import (AttrSource, DictItemSource, GetItemSource, GlobalSource, LocalSource, ModuleGlobalSource, Source,
                     literal)
from .tensor_ops import (BINARY_OPS, COMPARE_OPS, INPLACE_TO_OUT, PURE_BUILTINS, PURE_MODULES, TENSOR_CONSTANT_ATTRS,
                         TENSOR_GRAPH_ATTRS, TENSOR_METADATA_METHODS, TENSOR_METHOD_BREAKS, convertible, has_tensor,
                         is_torch_op)
from .variables import (NULL, AutocastVariable, BoundMethodVariable, CellVariable, ConstantVariable, DictVariable,
                        DictViewVariable, ExceptionVariable, FunctionVariable, GradModeVariable, IteratorVariable,
                        ListVariable, NestedFunctionVariable, NullVariable, ObjectVariable, PartialVariable,
                        ProfilerRangeVariable, SetVariable, SuperVariable, TensorVariable, TupleVariable,
                        VariableTracker, WithExitVariable)
from .variables import ClassStatementVariable, UnbuiltClassVariable

MAX_INLINE_DEPTH = 48
MAX_STEPS = 300_000

_code_cache: dict = {}

# engine.debug.replay's Recorder while it records (replay_record.py): each traced
# instruction then runs through it. None: the main loop's only cost is one `is None` test.
recorder = None


def instructions_of(code):
    hit = _code_cache.get(code)
    if hit is None:
        insts = bc.decode(code)
        index = {id(i): k for k, i in enumerate(insts)}
        hit = _code_cache[code] = (insts, index)
    return hit


class TracedException(Exception):
    """An exception raised by the traced program (not by the compiler)."""

    def __init__(self, exc: ExceptionVariable):
        super().__init__(exc.cls.__name__)
        self.exc = exc

    @property
    def user_stack(self):
        """Where the traced code first raised it (kept on the exception value across re-raises)."""
        return self.exc.user_stack

    @user_stack.setter
    def user_stack(self, stack):
        self.exc.user_stack = stack

    def describe(self) -> str:
        args = self.exc.args
        msg = args[0].value if len(args) == 1 and isinstance(args[0], ConstantVariable) else ""
        return f"{self.exc.cls.__name__}{': ' + str(msg) if msg else ''}"


class _Return(Exception):
    pass


@dataclasses.dataclass
class BreakPoint:
    """Where the top frame must stop on the restarted trace."""

    offset: int
    arrival: int
    gb: GraphBreak


class StopAtBreak(Exception):
    """Raised by the top frame when it reaches the recorded break point."""

    def __init__(self, frame: "Frame", inst):
        self.frame = frame
        self.inst = inst


class TopLevelBreak(Exception):
    def __init__(self, gb: GraphBreak, inst, arrival: int, frame: "Frame"):
        self.gb = gb
        self.inst = inst
        self.arrival = arrival
        self.frame = frame


def _is_torch_function(fn) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    return mod == "torch" or mod.startswith("torch.")


class Frame:
    def __init__(self, out, code, f_globals: dict, globals_source, local_vars: dict, cells: dict,
                 parent: Optional["Frame"] = None, breakpoint: Optional[BreakPoint] = None, fn_name: str = ""):
        self.out = out
        self.code = code
        self.f_globals = f_globals
        self.globals_source = globals_source  # callable name -> Source | None
        self.locals = local_vars
        self.cells = cells
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.breakpoint = breakpoint
        self.insts, self.index = instructions_of(code)
        self.stack: list = []
        self.ip = 0
        self.kw_names: tuple = ()
        self.arrivals: dict[int, int] = {}
        self.return_value: Optional[VariableTracker] = None
        self.generator_values: Optional[list] = [] if code.co_flags & inspect.CO_GENERATOR else None
        self.exc_stack: list = []  # exceptions being handled (PUSH_EXC_INFO)
        self.current_inst = None
        self.steps = 0
        self.log_source = observe.enabled("log", "trace_source")
        self.log_bytecode = observe.enabled("log", "trace_bytecode")
        self.last_line = None

    # ------------------------------------------------------------------ helpers

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def user_frame(self, inst=None):
        inst = inst or self.current_inst
        lineno = inst.lineno if inst is not None and inst.lineno is not None else self.code.co_firstlineno
        return (self.code.co_filename, lineno, self.code.co_name,
                linecache.getline(self.code.co_filename, lineno).rstrip("\n"))

    def user_stack(self):
        frames = []
        f = self
        while f is not None:
            frames.append(f.user_frame())
            f = f.parent
        return list(reversed(frames))

    # ------------------------------------------------------------------ main loop

    def run(self) -> VariableTracker:
        insts = self.insts
        rec = recorder
        while True:
            inst = insts[self.ip]
            self.current_inst = inst
            self.ip += 1
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise GraphBreak("GB0011", "trace too long (an unbounded loop?)")
            out = self.out
            out.current_frame = self
            if self.log_source and inst.lineno != self.last_line and inst.lineno is not None:
                self.last_line = inst.lineno
                observe.log("trace_source", logging.DEBUG, "TRACE starts_line %s:%s in %s (inline depth: %s)\n    %s",
                            self.code.co_filename, inst.lineno, self.code.co_name, self.depth,
                            linecache.getline(self.code.co_filename, inst.lineno).strip())
            if self.log_bytecode:
                observe.log("trace_bytecode", logging.DEBUG, "TRACE %s %s %s", inst.opname,
                            inst.argrepr or (inst.argval if inst.argval is not None else ""), self.stack)
            if self.parent is None:
                n = self.arrivals.get(inst.offset, 0) + 1
                self.arrivals[inst.offset] = n
                bp = self.breakpoint
                if bp is not None and bp.offset == inst.offset and bp.arrival == n:
                    raise StopAtBreak(self, inst)
            handler = getattr(self, inst.opname, None)
            try:
                if handler is None:
                    raise GraphBreak("GB0011", f"bytecode {inst.opname} is not supported")
                if rec is None:
                    handler(inst)
                else:
                    rec.step(self, inst, handler)
                out.current_frame = self
            except _Return:
                return self.return_value
            except TracedException as exc:
                if exc.user_stack is None:
                    exc.user_stack = self.user_stack()
                if not self.handle_exception(inst, exc):
                    if self.parent is None:
                        gb = GraphBreak("GB0015", f"{exc.describe()} raised in traced code")
                        gb.user_stack = exc.user_stack
                        raise TopLevelBreak(gb, inst, self.arrivals[inst.offset], self) from None
                    raise
            except (StopAtBreak, TopLevelBreak):
                raise
            except GraphBreak as gb:
                self._on_break(gb, inst)
            except scalars.GuardOnDataDependentSymNode as exc:
                # Python needs the value of a captured .item(): only known when the graph runs
                self._on_break(GraphBreak("GB0019", (str(exc).splitlines() or [""])[0].split(" (unhinted")[0]), inst)
            except Exception as exc:
                if not config.capture_errors_as_graph_breaks:
                    raise
                import traceback
                observe.log("dynamo", logging.DEBUG, "internal error while tracing %s, treated as a graph break:\n%s",
                            inst.opname, traceback.format_exc())
                self._on_break(GraphBreak("GB0011", f"internal error while tracing {inst.opname}: "
                                                    f"{type(exc).__name__}: {exc}"), inst)

    def _on_break(self, gb: GraphBreak, inst):
        if self.parent is None:
            if not gb.user_stack:
                gb.user_stack = self.user_stack()
            raise TopLevelBreak(gb, inst, self.arrivals[inst.offset], self) from None
        if not gb.user_stack:
            gb.user_stack = self.user_stack()
        raise gb

    def handle_exception(self, inst, exc: TracedException) -> bool:
        entry = inst.exn_tab_entry
        if entry is None:
            return False
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ConstantVariable(inst.offset))
        self.push(exc.exc)
        self.ip = self.index[id(entry.target)]
        return True

    def jump(self, inst):
        self.ip = self.index[id(inst.target)]

    # ------------------------------------------------------------------ simple opcodes

    def NOP(self, inst): pass
    RESUME = NOP
    PRECALL = NOP
    EXTENDED_ARG = NOP
    CACHE = NOP

    def RETURN_GENERATOR(self, inst):
        self.push(ConstantVariable(None))

    def POP_TOP(self, inst):
        self.pop()

    def PUSH_NULL(self, inst):
        self.push(NULL)

    def COPY(self, inst):
        self.push(self.stack[-inst.arg])

    def SWAP(self, inst):
        i = inst.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    def END_FOR(self, inst):
        self.popn(-dis.stack_effect(dis.opmap["END_FOR"]))  # 3.12: iterator and item; 3.13: one

    def LOAD_CONST(self, inst):
        self.push(wrap_constant(inst.argval))

    def RETURN_VALUE(self, inst):
        self.return_value = self.pop()
        raise _Return()

    def RETURN_CONST(self, inst):
        self.return_value = wrap_constant(inst.argval)
        raise _Return()

    def LOAD_FAST(self, inst):
        name = inst.argval
        if name not in self.locals:
            raise self.exception(UnboundLocalError, f"local variable '{name}' referenced before assignment")
        self.push(self.locals[name])

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_LOAD_FAST(self, inst):  # 3.13+: the fused forms run as their two halves
        first, second = inst.argval
        self.LOAD_FAST(inst.copy(opname="LOAD_FAST", argval=first))
        self.LOAD_FAST(inst.copy(opname="LOAD_FAST", argval=second))

    def STORE_FAST_LOAD_FAST(self, inst):
        first, second = inst.argval
        self.STORE_FAST(inst.copy(opname="STORE_FAST", argval=first))
        self.LOAD_FAST(inst.copy(opname="LOAD_FAST", argval=second))

    def STORE_FAST_STORE_FAST(self, inst):
        first, second = inst.argval
        self.STORE_FAST(inst.copy(opname="STORE_FAST", argval=first))
        self.STORE_FAST(inst.copy(opname="STORE_FAST", argval=second))

    def LOAD_FAST_AND_CLEAR(self, inst):
        self.push(self.locals.pop(inst.argval, NULL))

    def STORE_FAST(self, inst):
        v = self.pop()
        if isinstance(v, NullVariable):
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = v

    def DELETE_FAST(self, inst):
        self.locals.pop(inst.argval, None)

    def MAKE_CELL(self, inst):
        name = inst.argval
        if name not in self.cells:
            self.cells[name] = CellVariable(self.locals.pop(name, None))

    def COPY_FREE_VARS(self, inst):
        pass  # cells were installed when the frame was set up

    def LOAD_CLOSURE(self, inst):
        self.push(self.cells[inst.argval])

    def LOAD_DEREF(self, inst):
        cell = self.cells.get(inst.argval)
        if cell is None or cell.value is None:
            raise self.exception(NameError, f"free variable '{inst.argval}' referenced before assignment")
        self.push(cell.value)

    def STORE_DEREF(self, inst):
        cell = self.cells[inst.argval]
        if cell.source is not None:
            raise GraphBreak("GB0017", f"assignment to the closure variable {inst.argval!r} of the compiled function")
        cell.value = self.pop()

    def DELETE_DEREF(self, inst):
        cell = self.cells[inst.argval]
        if cell.source is not None:
            raise GraphBreak("GB0017", f"deleting the closure variable {inst.argval!r}")
        cell.value = None

    def LOAD_GLOBAL(self, inst):
        v = self.load_global(inst.argval)
        if inst.push_null:
            self.push_with_null(v)
        else:
            self.push(v)

    def push_with_null(self, v):
        """A callable and its NULL, on the side this Python puts it (pyversion)."""
        if V.null_above_callable:
            self.push(v)
            self.push(NULL)
        else:
            self.push(NULL)
            self.push(v)

    def load_global(self, name: str) -> VariableTracker:
        key = (id(self.f_globals), name)
        pending = self.out.global_stores.get(key)
        if pending is not None:
            if pending[1] is None:
                raise self.exception(NameError, f"name '{name}' is not defined")
            return pending[1]
        if name in self.f_globals:
            value = self.f_globals[name]
            src = self.globals_source(name)
            return self.out.builder.wrap(value, src)
        b = self.f_globals.get("__builtins__", builtins)
        bdict = b if isinstance(b, dict) else vars(b)
        if name in bdict:
            return wrap_constant(bdict[name]) if not isinstance(bdict[name], type) else ObjectVariable(bdict[name])
        raise self.exception(NameError, f"name '{name}' is not defined")

    def IMPORT_NAME(self, inst):
        """`import x` / `from x import y` of a module already imported: no code runs, the
        module object is a constant (a first import, with its side effects, breaks)."""
        level, fromlist = self.as_python(self.stack[-2]), self.as_python(self.stack[-1])
        name = inst.argval
        if level:
            import importlib.util
            package = self.f_globals.get("__package__") or self.f_globals.get("__name__", "")
            try:
                absolute = importlib.util.resolve_name("." * level + name, package)
            except (ImportError, ValueError):
                raise GraphBreak("GB0011", f"relative import of {name!r}") from None
        else:
            absolute = name
        loaded = [absolute] + [f"{absolute}.{f}" for f in (fromlist or ())
                               if not hasattr(sys.modules.get(absolute), f)]
        if not all(m in sys.modules for m in loaded) and absolute.startswith("torch."):
            # torch's own lazy imports (F.linear_cross_entropy imports its implementation on
            # first use): importing registers ops, which eager would do at the same point
            import importlib
            importlib.import_module(absolute)
            loaded = [m for m in loaded if m == absolute or not hasattr(sys.modules[absolute], m.rpartition(".")[2])]
        if not all(m in sys.modules for m in loaded):
            raise GraphBreak("GB0011", f"import of {absolute!r}, not yet imported (its first import runs code)")
        self.popn(2)
        module = sys.modules[absolute] if fromlist or level else sys.modules[absolute.partition(".")[0]]
        self.push(ObjectVariable(module))

    def IMPORT_FROM(self, inst):
        self.push(self.getattr(self.stack[-1], inst.argval))

    def STORE_GLOBAL(self, inst):
        src = self.globals_source(inst.argval)
        if src is None:
            raise GraphBreak("GB0017", f"assignment to global {inst.argval!r} of a module without a source")
        self.out.global_stores[(id(self.f_globals), inst.argval)] = (src, self.pop())

    def DELETE_GLOBAL(self, inst):
        raise GraphBreak("GB0017", f"del of global {inst.argval!r}")

    def LOAD_BUILD_CLASS(self, inst):
        if self.parent is None:
            raise GraphBreak("GB0011", "a class statement in the compiled function itself")
        self.push(ClassStatementVariable())

    def LOAD_ASSERTION_ERROR(self, inst):
        self.push(ObjectVariable(AssertionError))

    # ------------------------------------------------------------------ containers

    def BUILD_TUPLE(self, inst):
        self.push(TupleVariable(self.popn(inst.arg)))

    def BUILD_LIST(self, inst):
        self.push(ListVariable(self.popn(inst.arg)))

    def BUILD_SET(self, inst):
        items = self.popn(inst.arg)
        s = SetVariable([])
        for it in items:
            self.set_add(s, it)
        self.push(s)

    def BUILD_MAP(self, inst):
        items = self.popn(2 * inst.arg)
        d = DictVariable({})
        for i in range(0, len(items), 2):
            d.items[self.dict_key(items[i])] = items[i + 1]
        self.push(d)

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop()
        values = self.popn(inst.arg)
        keyvals = self.as_python(keys)
        self.push(DictVariable(dict(zip(keyvals, values))))

    def BUILD_STRING(self, inst):
        parts = self.popn(inst.arg)
        self.push(ConstantVariable("".join(self.as_python(p) for p in parts)))

    def FORMAT_VALUE(self, inst):
        flags = inst.arg
        spec = self.as_python(self.pop()) if flags & 0x04 else ""
        value = self.pop()
        v = self._convert(specialize(self.as_python(value, what="an f-string value")), flags & 0x03)
        self.push(ConstantVariable(format(v, spec)))

    @staticmethod
    def _convert(v, conv: int):
        return str(v) if conv == 1 else repr(v) if conv == 2 else ascii(v) if conv == 3 else v

    def CONVERT_VALUE(self, inst):  # 3.13+: f"{x!r}"
        v = specialize(self.as_python(self.pop(), what="an f-string value"))
        self.push(ConstantVariable(self._convert(v, inst.arg)))

    def FORMAT_SIMPLE(self, inst):
        v = specialize(self.as_python(self.pop(), what="an f-string value"))
        self.push(ConstantVariable(v if isinstance(v, str) else format(v, "")))

    def FORMAT_WITH_SPEC(self, inst):
        spec = self.as_python(self.pop())
        v = specialize(self.as_python(self.pop(), what="an f-string value"))
        self.push(ConstantVariable(format(v, spec)))

    def LIST_APPEND(self, inst):
        v = self.pop()
        self.stack[-inst.arg].items.append(v)

    def SET_ADD(self, inst):
        v = self.pop()
        self.set_add(self.stack[-inst.arg], v)

    def MAP_ADD(self, inst):
        v = self.pop()
        k = self.pop()
        self.stack[-inst.arg].items[self.dict_key(k)] = v

    def LIST_EXTEND(self, inst):
        v = self.pop()
        self.stack[-inst.arg].items.extend(self.unpack(v))

    def SET_UPDATE(self, inst):
        v = self.pop()
        for it in self.unpack(v):
            self.set_add(self.stack[-inst.arg], it)

    def DICT_UPDATE(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        target.items.update(self.dict_items(v))

    def DICT_MERGE(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        for k, x in self.dict_items(v).items():
            if k in target.items:
                raise self.exception(TypeError, f"got multiple values for keyword argument '{k}'")
            target.items[k] = x

    def LIST_TO_TUPLE(self, inst):
        self.push(TupleVariable(self.pop().items))

    def CALL_INTRINSIC_1(self, inst):
        name = inst.argrepr
        v = self.pop()
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVariable(v.items))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.push(self.unary(operator.pos, v))
        elif name == "INTRINSIC_STOPITERATION_ERROR":
            raise GraphBreak("GB0011", "StopIteration inside a generator")
        else:
            raise GraphBreak("GB0011", f"intrinsic {name}")

    def UNPACK_SEQUENCE(self, inst):
        items = self.unpack(self.pop())
        if len(items) != inst.arg:
            raise self.exception(ValueError, f"expected {inst.arg} values to unpack, got {len(items)}")
        for it in reversed(items):
            self.push(it)

    def UNPACK_EX(self, inst):
        items = self.unpack(self.pop())
        before, after = inst.arg & 0xFF, inst.arg >> 8
        if len(items) < before + after:
            raise self.exception(ValueError, "not enough values to unpack")
        head = items[:before]
        mid = items[before:len(items) - after]
        tail = items[len(items) - after:]
        for it in reversed(tail):
            self.push(it)
        self.push(ListVariable(mid))
        for it in reversed(head):
            self.push(it)

    def BUILD_SLICE(self, inst):
        parts = self.popn(inst.arg)
        self.push(self.make_slice(parts))

    def make_slice(self, parts):
        vals = []
        for p in parts:
            if isinstance(p, ConstantVariable):
                vals.append(p.value)
            else:
                raise GraphBreak("GB0011", "slice with a non-constant bound")
        return ConstantVariable(slice(*vals))

    def BINARY_SUBSCR(self, inst):
        idx = self.pop()
        obj = self.pop()
        self.push(self.getitem(obj, idx))

    def BINARY_SLICE(self, inst):
        stop = self.pop()
        start = self.pop()
        obj = self.pop()
        self.push(self.getitem(obj, self.make_slice([start, stop])))

    def STORE_SUBSCR(self, inst):
        idx = self.pop()
        obj = self.pop()
        value = self.pop()
        self.setitem(obj, idx, value)

    def STORE_SLICE(self, inst):
        stop = self.pop()
        start = self.pop()
        obj = self.pop()
        value = self.pop()
        self.setitem(obj, self.make_slice([start, stop]), value)

    def DELETE_SUBSCR(self, inst):
        idx = self.pop()
        obj = self.pop()
        if isinstance(obj, ListVariable):
            i = self.as_python(idx)
            del obj.items[i]
            self.out.note_mutation(obj)
        elif isinstance(obj, DictVariable):
            k = self.dict_key(idx)
            if k not in obj.items:
                raise self.exception(KeyError, repr(k))
            del obj.items[k]
            self.out.note_mutation(obj)
        else:
            raise GraphBreak("GB0011", f"del on {type(obj).__name__}")

    # ------------------------------------------------------------------ attributes

    def LOAD_ATTR(self, inst):
        obj = self.pop()
        attr = self.getattr(obj, inst.argval)
        if inst.is_method_load:  # the bound attribute and a NULL (never [function, self])
            self.push_with_null(attr)
        else:
            self.push(attr)

    def LOAD_METHOD(self, inst):
        obj = self.pop()
        self.push_with_null(self.getattr(obj, inst.argval))

    def LOAD_SUPER_ATTR(self, inst):
        self_vt = self.pop()
        cls = self.pop()
        self.pop()  # the global `super`
        sup = SuperVariable(self.as_python(cls), self_vt)
        attr = self.getattr(sup, inst.argval)
        if inst.flags & 1:
            self.push_with_null(attr)
        else:
            self.push(attr)

    def STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        self.setattr(obj, inst.argval, value)

    def DELETE_ATTR(self, inst):
        self.delattr(self.pop(), inst.argval)

    def delattr(self, obj, name: str):
        if isinstance(obj, ObjectVariable) and (obj.is_new or obj.source is not None) and \
                not isinstance(obj.value, torch.nn.Module) and obj.cls.__delattr__ is object.__delattr__:
            if obj.is_new and name not in obj.attrs:
                raise self.exception(AttributeError, f"'{obj.cls.__name__}' object has no attribute '{name}'")
            obj.attrs.pop(name, None)
            obj.deleted.add(name)
            self.out.note_mutation(obj)
            return
        raise GraphBreak("GB0017", f"del of attribute {name!r}")

    # ------------------------------------------------------------------ operators

    def BINARY_OP(self, inst):
        b = self.pop()
        a = self.pop()
        sym = dis._nb_ops[inst.arg][1]
        self.push(self.binary(BINARY_OPS[sym], a, b))

    def COMPARE_OP(self, inst):
        b = self.pop()
        a = self.pop()
        r = self.binary(COMPARE_OPS[inst.argval], a, b)
        if V.to_bool and inst.arg & 16 and not isinstance(r, TensorVariable):
            r = ConstantVariable(self.truth(r))  # 3.13: a TO_BOOL folded into the compare
        self.push(r)

    def IS_OP(self, inst):
        b = self.pop()
        a = self.pop()
        r = self.is_same(a, b)
        self.push(ConstantVariable(r != bool(inst.arg)))

    def CONTAINS_OP(self, inst):
        container = self.pop()
        item = self.pop()
        r = self.contains(container, item)
        self.push(ConstantVariable(r != bool(inst.arg)))

    def UNARY_NEGATIVE(self, inst):
        self.push(self.unary(operator.neg, self.pop()))

    def UNARY_POSITIVE(self, inst):
        self.push(self.unary(operator.pos, self.pop()))

    def UNARY_INVERT(self, inst):
        self.push(self.unary(operator.invert, self.pop()))

    def UNARY_NOT(self, inst):
        self.push(ConstantVariable(not self.truth(self.pop())))

    def TO_BOOL(self, inst):
        """3.13+: bool(TOS) before a conditional jump or `not`. A tensor stays as it is, so
        the jump (or `not`) that reads it breaks the graph with the value in hand, as on
        3.12; anything else is converted here (a break here runs bool() eagerly)."""
        v = self.stack[-1]
        if isinstance(v, TensorVariable):
            return
        self.pop()
        self.push(ConstantVariable(self.truth(v)))

    def GET_LEN(self, inst):
        self.push(ConstantVariable(len(self.unpack(self.stack[-1]))))

    # ------------------------------------------------------------------ control flow

    def JUMP_FORWARD(self, inst):
        self.jump(inst)

    JUMP_BACKWARD = JUMP_FORWARD
    JUMP_BACKWARD_NO_INTERRUPT = JUMP_FORWARD
    JUMP = JUMP_FORWARD
    JUMP_NO_INTERRUPT = JUMP_FORWARD

    def _pop_jump(self, inst, when: bool):
        v = self.pop()
        if self.truth(v) == when:
            self.jump(inst)

    def POP_JUMP_IF_FALSE(self, inst):
        self._pop_jump(inst, False)

    def POP_JUMP_IF_TRUE(self, inst):
        self._pop_jump(inst, True)

    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE

    def POP_JUMP_IF_NONE(self, inst):
        v = self.pop()
        if self.is_none(v):
            self.jump(inst)

    def POP_JUMP_IF_NOT_NONE(self, inst):
        v = self.pop()
        if not self.is_none(v):
            self.jump(inst)

    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_IF_FALSE_OR_POP(self, inst):
        if not self.truth(self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def JUMP_IF_TRUE_OR_POP(self, inst):
        if self.truth(self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def GET_ITER(self, inst):
        self.push(self.get_iter(self.pop()))

    def FOR_ITER(self, inst):
        it = self.stack[-1]
        if not isinstance(it, IteratorVariable):
            raise GraphBreak("GB0011", f"iteration over {type(it).__name__}")
        v = it.next()
        if v is None:
            self.pop()
            self.jump(inst)
            exit_ops = V.for_iter_exit  # the loop exit the exhausted jump steps over (3.12+)
            if exit_ops and self.insts[self.ip].opname == exit_ops[0]:
                self.ip += len(exit_ops)
        else:
            self.push(v)

    def YIELD_VALUE(self, inst):
        if self.generator_values is None:
            raise GraphBreak("GB0011", "yield outside a generator being inlined")
        self.generator_values.append(self.pop())
        self.push(ConstantVariable(None))

    # ------------------------------------------------------------------ exceptions

    def exception(self, cls, msg=""):
        exc = TracedException(ExceptionVariable(cls, [ConstantVariable(msg)]))
        exc.user_stack = self.user_stack()
        return exc

    def RAISE_VARARGS(self, inst):
        if inst.arg == 0:
            if not self.exc_stack:
                raise GraphBreak("GB0011", "bare raise outside an except block")
            raise TracedException(self.exc_stack[-1])
        if inst.arg == 2:
            self.pop()  # the `from` cause
        exc = self.pop()
        if isinstance(exc, ObjectVariable) and isinstance(exc.value, type) and issubclass(exc.value, BaseException):
            exc = ExceptionVariable(exc.value, [])
        if not isinstance(exc, ExceptionVariable):
            raise GraphBreak("GB0011", f"raise of {type(exc).__name__}")
        raise TracedException(exc)

    def PUSH_EXC_INFO(self, inst):
        exc = self.pop()
        self.push(self.exc_stack[-1] if self.exc_stack else ConstantVariable(None))
        self.exc_stack.append(exc)
        self.push(exc)

    def POP_EXCEPT(self, inst):
        self.pop()
        if self.exc_stack:
            self.exc_stack.pop()

    def CHECK_EXC_MATCH(self, inst):
        typ = self.pop()
        exc = self.stack[-1]
        types_ = self.as_python(typ, what="an except clause")
        self.push(ConstantVariable(isinstance(exc, ExceptionVariable) and issubclass(exc.cls, types_)))

    def RERAISE(self, inst):
        exc = self.pop()
        if inst.arg:
            self.pop()  # lasti
        if not isinstance(exc, ExceptionVariable):
            raise GraphBreak("GB0011", "re-raise of an unknown exception")
        raise TracedException(exc)

    def BEFORE_WITH(self, inst):
        ctx = self.pop()
        if isinstance(ctx, GradModeVariable):
            self.push(WithExitVariable(ctx))
            if not ctx.applied_on_create:
                ctx.prev = self.out.grad_enabled
                self.out.set_grad_enabled(ctx.target)
            self.push(ConstantVariable(None))
            return
        if isinstance(ctx, ProfilerRangeVariable):
            self.push(WithExitVariable(ctx))
            self.push(ctx)  # record_function.__enter__ returns the object
            return
        if isinstance(ctx, AutocastVariable):
            entered = AutocastVariable(ctx.block, self.out.enter_autocast(ctx.block), entered_in_graph=True)
            self.push(WithExitVariable(entered))
            self.push(ConstantVariable(None))  # torch.autocast.__enter__ returns the object: rarely bound
            return
        if isinstance(ctx, ObjectVariable) and not _is_torch_function(ctx.cls):
            enter = self.getattr(ctx, "__enter__")
            exit_ = self.getattr(ctx, "__exit__")
            if isinstance(enter, BoundMethodVariable) and enter.fn is not None and exit_.fn is not None:
                self.push(exit_)
                self.push(self.call(enter, [], {}))
                return
        raise GraphBreak("GB0011", f"with-statement on {type(ctx).__name__} "
                                   f"{getattr(getattr(ctx, 'value', None), '__class__', type(None)).__name__}")

    def WITH_EXCEPT_START(self, inst):
        exc = self.stack[-1]
        exit_fn = self.stack[-4]
        r = self.call(exit_fn, [ObjectVariable(exc.cls), exc, ConstantVariable(None)], {})
        self.push(r)

    # ------------------------------------------------------------------ functions

    def MAKE_FUNCTION(self, inst):
        code = self.pop()
        code = code.value if isinstance(code, (ConstantVariable, ObjectVariable)) else code
        fn = NestedFunctionVariable(code, self.f_globals, self.globals_source, code.co_qualname,
                                    None, None, None, self.f_globals.get("__name__"))
        if V.make_function == "oparg":  # the attributes sit below the code object
            for flag in (0x08, 0x04, 0x02, 0x01):
                if inst.arg & flag:
                    self._set_function_attribute(fn, flag, self.pop())
        self.push(fn)

    def SET_FUNCTION_ATTRIBUTE(self, inst):  # 3.13+: [attribute, function] -> function
        fn = self.pop()
        self._set_function_attribute(fn, inst.arg, self.pop())
        self.push(fn)

    @staticmethod
    def _set_function_attribute(fn, flag: int, value):
        if flag == 0x08:
            fn.closure = tuple(value.items) if value.items else None
        elif flag == 0x02:
            fn.kwdefaults = value
        elif flag == 0x01:
            fn.defaults = value
        elif flag != 0x04:  # annotations are not used by the trace
            raise GraphBreak("GB0011", f"function attribute {flag:#x}")

    def KW_NAMES(self, inst):
        self.kw_names = tuple(inst.argval)

    def CALL(self, inst):
        args = self.popn(inst.arg)
        fn, self_vt = split_call(self.popn(2), lambda v: isinstance(v, NullVariable))
        if self_vt is not None:
            args = [self_vt] + args
        kw = self.kw_names
        self.kw_names = ()
        kwargs = {}
        if kw:
            kwargs = dict(zip(kw, args[len(args) - len(kw):]))
            args = args[:len(args) - len(kw)]
        self.push(self.call(fn, args, kwargs))

    def CALL_KW(self, inst):  # 3.13+: the keyword names are a tuple pushed last
        self.kw_names = tuple(self.as_python(self.pop()))
        self.CALL(inst)

    def CALL_FUNCTION_EX(self, inst):
        slots = self.stack[len(self.stack) - 3 - (inst.arg & 1):][:2]
        fn, self_vt = split_call(slots, lambda v: isinstance(v, NullVariable))
        if self_vt is not None:  # not something CPython's compiler emits
            raise GraphBreak("GB0011", "CALL_FUNCTION_EX without NULL")
        kwargs = self.dict_items(self.pop()) if inst.arg & 1 else {}
        args = self.unpack(self.pop())
        self.popn(2)
        self.push(self.call(fn, list(args), {str(k): v for k, v in kwargs.items()}))

    # ================================================================== semantics

    def as_python(self, v, what="a value"):
        """A Python constant for `v`, or a graph break if it is not one."""
        if isinstance(v, ConstantVariable):
            return v.value
        if isinstance(v, TupleVariable):
            items = [self.as_python(x, what) for x in v.items]
            if v.cls is tuple:
                return tuple(items)
            if v.is_namedtuple():
                return v.cls(*items)
            return v.cls(items)
        if isinstance(v, ListVariable):
            return [self.as_python(x, what) for x in v.items]
        if isinstance(v, DictVariable):
            return {k: self.as_python(x, what) for k, x in v.items.items()}
        if isinstance(v, SetVariable):
            return v.cls(v.items)
        if isinstance(v, ObjectVariable) and v.value is not None and not v.attrs and not v.is_new:
            return v.value
        if isinstance(v, FunctionVariable):
            return v.fn
        if isinstance(v, TensorVariable):
            raise GraphBreak("GB0010", f"a tensor used as {what}")
        raise GraphBreak("GB0011", f"{type(v).__name__} used as {what}")

    def is_python_constant(self, v) -> bool:
        try:
            self.as_python(v)
            return True
        except GraphBreak:
            return False

    def dict_key(self, k):
        if isinstance(k, ConstantVariable):
            return k.value
        if isinstance(k, TupleVariable) and all(isinstance(x, ConstantVariable) for x in k.items):
            return tuple(x.value for x in k.items)
        if isinstance(k, ObjectVariable) and k.value is not None and (isinstance(k.value, type) or callable(k.value)):
            return k.value
        raise GraphBreak("GB0011", f"dict key of type {type(k).__name__}")

    def key_to_vt(self, k):
        if isinstance(k, (type, types.FunctionType, types.BuiltinFunctionType)):
            return ObjectVariable(k)
        return wrap_constant(k)

    def dict_items(self, v) -> dict:
        if isinstance(v, DictVariable):
            return dict(v.items)
        if isinstance(v, ObjectVariable) and isinstance(v.value, torch.nn.Module):
            raise GraphBreak("GB0011", "** of a module")
        raise GraphBreak("GB0011", f"** of {type(v).__name__}")

    def set_add(self, s: SetVariable, v):
        val = self.dict_key(v)
        if val not in s.items:
            s.items.append(val)

    def unpack(self, v) -> list:
        """The items of an iterable variable, as a list of variables."""
        if isinstance(v, (ListVariable, TupleVariable)):
            return list(v.items)
        if isinstance(v, IteratorVariable):
            items = v.items[v.index:]
            v.index = len(v.items)
            return items
        if isinstance(v, DictVariable):
            return [self.key_to_vt(k) for k in v.items]
        if isinstance(v, SetVariable):
            return [wrap_constant(x) for x in v.items]
        if isinstance(v, ConstantVariable):
            val = v.value
            if isinstance(val, (str, range, tuple, torch.Size, bytes, frozenset)):
                return [wrap_constant(x) for x in val]
            raise self.exception(TypeError, f"'{type(val).__name__}' object is not iterable")
        if isinstance(v, TensorVariable):
            if v.fake.dim() == 0:
                raise self.exception(TypeError, "iteration over a 0-d tensor")
            return [self.getitem(v, ConstantVariable(i)) for i in range(v.fake.shape[0])]
        if isinstance(v, ObjectVariable):
            val = v.value
            if isinstance(val, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
                self.guard_module_structure(v)
                if v.source is None:   # items get the sources registered for the module tree, if any
                    return [self.out.builder.wrap_sourceless(x) for x in val]
                # by name, as the module tree registers them (getattr(L['self'], '0')): a plain attribute
                # read, where indexing a Sequential runs its Python __getitem__ in every guard check
                table = val._parameters if isinstance(val, torch.nn.ParameterList) else val._modules
                return [self.out.builder.wrap(x, AttrSource(v.source, k)) for k, x in table.items()]
            if isinstance(val, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
                self.guard_module_structure(v)
                return [ConstantVariable(k) for k in val.keys()]
            if hasattr(val, "_fields") and isinstance(val, tuple):
                return [wrap_constant(x) for x in val]
            if v.dict_vt is not None and v.cls.__iter__ is dict.__iter__:
                return self.unpack(v.dict_vt)
            meth = getattr(v.cls, "__iter__", None)
            if isinstance(meth, types.FunctionType) and not isinstance(val, torch.nn.Module):
                return self.unpack(self.get_iter(self.inline_function(meth, [v], {}, None)))
        raise GraphBreak("GB0011", f"iteration over {type(v).__name__} "
                                   f"{type(getattr(v, 'value', None)).__name__ if isinstance(v, ObjectVariable) else ''}")

    def get_iter(self, v):
        if isinstance(v, IteratorVariable):
            return v
        try:
            pytype = type(iter(v.python_type()()))
        except Exception:
            pytype = object
        if isinstance(v, ListVariable) and not isinstance(v, DictViewVariable):
            pytype = type(iter([]))
        return IteratorVariable(self.unpack(v), pytype)

    def truth(self, v) -> bool:
        if isinstance(v, ConstantVariable):
            return bool(v.value)
        if isinstance(v, TensorVariable):
            raise GraphBreak("GB0003", "if/while on a tensor value")
        if isinstance(v, (ListVariable, TupleVariable)):
            return len(v.items) > 0
        if isinstance(v, DictVariable):
            return len(v.items) > 0
        if isinstance(v, SetVariable):
            return len(v.items) > 0
        if isinstance(v, (FunctionVariable, NestedFunctionVariable, BoundMethodVariable, ExceptionVariable)):
            return True
        if isinstance(v, ObjectVariable):
            if v.value is not None and isinstance(v.value, (type, types.ModuleType, types.BuiltinFunctionType)):
                return True
            cls = v.cls
            if isinstance(v.value, torch.nn.Module):
                if isinstance(v.value, MODULE_CONTAINERS):
                    self.guard_module_structure(v)
                    return len(v.value) > 0
                return True
            if getattr(cls, "__bool__", None) is None and getattr(cls, "__len__", None) is None:
                return True
            if v.dict_vt is not None and getattr(cls, "__bool__", None) is None and cls.__len__ is dict.__len__:
                return len(v.dict_vt.items) > 0
            for name in ("__bool__", "__len__"):  # as Python asks: __bool__, else __len__
                meth = getattr(cls, name, None)
                if isinstance(meth, types.FunctionType) and not isinstance(v.value, torch.nn.Module):
                    return self.truth(self.inline_function(meth, [v], {}, None))
                if meth is not None:
                    break
            if v.value is not None and not v.attrs and (v.value is None or is_constant_value(v.value)):
                return bool(v.value)
        raise GraphBreak("GB0011", f"truth value of {type(v).__name__}")

    def is_none(self, v) -> bool:
        return isinstance(v, ConstantVariable) and v.value is None

    def is_same(self, a, b) -> bool:
        if a is b:
            return True
        if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
            return a.value is b.value
        if isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable):
            c, o = (a, b) if isinstance(a, ConstantVariable) else (b, a)
            if isinstance(o, ObjectVariable) and o.value is not None:
                return o.value is c.value
            return False  # a constant is never a tensor / container built in the trace
        if isinstance(a, ObjectVariable) and isinstance(b, ObjectVariable):
            if a.value is not None and b.value is not None:
                return a.value is b.value
            return False
        if isinstance(a, FunctionVariable) and isinstance(b, FunctionVariable):
            return a.fn is b.fn
        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
            return a.proxy.node is b.proxy.node
        return False

    def contains(self, container, item) -> bool:
        if isinstance(container, DictVariable):
            return container.has(self.dict_key(item))
        if isinstance(container, SetVariable):
            return self.dict_key(item) in container.items
        if isinstance(container, ConstantVariable) and isinstance(item, ConstantVariable):
            return item.value in container.value
        if isinstance(container, (ListVariable, TupleVariable)):
            for x in container.items:
                if self.is_same(x, item):
                    return True
                r = self.binary(operator.eq, x, item)
                if self.truth(r):
                    return True
            return False
        if isinstance(container, ObjectVariable) and isinstance(container.value, torch.nn.ModuleDict):
            self.guard_module_structure(container)
            return self.as_python(item) in container.value
        if isinstance(container, ObjectVariable):
            meth = getattr(container.cls, "__contains__", None)
            if isinstance(meth, types.FunctionType):
                return self.truth(self.inline_function(meth, [container, item], {}, None))
            if container.dict_vt is not None:
                return self.contains(container.dict_vt, item)
        raise GraphBreak("GB0011", f"`in` on {type(container).__name__}")

    # ------------------------------------------------------------------ operators

    def unary(self, op, v):
        if isinstance(v, numpy_ops.NumpyVariable):
            return numpy_ops.unary(self, op, v)
        if isinstance(v, TensorVariable):
            return self.tensor_call("call_function", op, [v], {})
        if isinstance(v, ConstantVariable):
            return self.const_apply(op, [v.value])
        raise GraphBreak("GB0011", f"unary {op.__name__} on {type(v).__name__}")

    def const_apply(self, fn, args, kwargs=None):
        if fn in TYPE_FUNCTIONS and has_symbolic(list(args)):  # a symbolic int is an int (engine/shapes)
            args = as_plain_types(list(args))
        elif needs_specializing(fn, args, kwargs):  # str(x.shape) must see sizes, not symbols (engine/shapes)
            args, kwargs = specialize(list(args)), specialize(kwargs or {})
        try:
            return wrap_constant(fn(*args, **(kwargs or {})))
        except Exception as exc:
            raise TracedException(ExceptionVariable(type(exc), [ConstantVariable(str(exc))])) from None

    def binary(self, op, a, b):
        if isinstance(a, numpy_ops.NumpyVariable) or isinstance(b, numpy_ops.NumpyVariable):
            return numpy_ops.binary(self, op, a, b)  # NumPy semantics, traced through torch._numpy
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            other = b if isinstance(a, TensorVariable) else a
            if isinstance(other, (ConstantVariable, TensorVariable)) or \
                    (isinstance(other, (ListVariable, TupleVariable)) and self.is_python_constant(other)):
                if op in INPLACE_TO_OUT and not isinstance(a, TensorVariable):
                    op = INPLACE_TO_OUT[op]
                return self.tensor_call("call_function", op, [a, b], {})
            if op in (operator.eq, operator.ne) and not has_tensor(other):
                return ConstantVariable(op is operator.ne)
            raise GraphBreak("GB0011", f"{op.__name__} of a tensor and {type(other).__name__}")
        if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
            return self.const_apply(op, [a.value, b.value])
        base = INPLACE_TO_OUT.get(op, op)
        inplace = op in INPLACE_TO_OUT
        # sequences
        if isinstance(a, ListVariable) and isinstance(b, (ListVariable, TupleVariable)) and inplace and base is operator.add:
            a.items.extend(b.items)  # list += iterable mutates the list in place
            self.out.note_mutation(a)
            return a
        if isinstance(a, (ListVariable, TupleVariable)) and isinstance(b, type(a)) and base is operator.add:
            if isinstance(a, TupleVariable):
                return TupleVariable(a.items + b.items)
            return ListVariable(a.items + b.items)
        if isinstance(a, (ListVariable, TupleVariable)) and isinstance(b, ConstantVariable) and base is operator.mul:
            n = b.value
            if isinstance(a, TupleVariable):
                return TupleVariable(a.items * n)
            if inplace:
                a.items[:] = a.items * n
                self.out.note_mutation(a)
                return a
            return ListVariable(a.items * n)
        if isinstance(b, (ListVariable, TupleVariable)) and isinstance(a, ConstantVariable) and base is operator.mul:
            return self.binary(op, b, a)
        if op in (operator.eq, operator.ne):
            if isinstance(a, (ListVariable, TupleVariable)) and isinstance(b, (ListVariable, TupleVariable)):
                if type(a) is not type(b) or len(a.items) != len(b.items):
                    return ConstantVariable(op is operator.ne)
                if all(self.truth(self.binary(operator.eq, x, y)) for x, y in zip(a.items, b.items)):
                    return ConstantVariable(op is operator.eq)
                return ConstantVariable(op is operator.ne)
            if isinstance(a, ConstantVariable) and isinstance(b, TupleVariable) and isinstance(a.value, tuple) or \
                    isinstance(b, ConstantVariable) and isinstance(a, TupleVariable) and isinstance(b.value, tuple):
                if self.is_python_constant(a) and self.is_python_constant(b):
                    return self.const_apply(op, [self.as_python(a), self.as_python(b)])
            if self.is_python_constant(a) and self.is_python_constant(b):
                return self.const_apply(op, [self.as_python(a), self.as_python(b)])
            if isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable):
                return ConstantVariable((op is operator.ne) != self.is_same(a, b)) if \
                    not isinstance(a, ObjectVariable) and not isinstance(b, ObjectVariable) else \
                    self._obj_compare(op, a, b)
            if isinstance(a, ObjectVariable) and isinstance(b, ObjectVariable):
                return self._obj_compare(op, a, b)
        if isinstance(a, DictVariable) and isinstance(b, DictVariable) and base is operator.or_:
            if inplace:
                a.items.update(b.items)
                self.out.note_mutation(a)
                return a
            return DictVariable({**a.items, **b.items})
        if isinstance(a, SetVariable) and isinstance(b, SetVariable):
            r = op(set(a.items), set(b.items))
            return SetVariable(list(r)) if isinstance(r, set) else wrap_constant(r)
        if self.is_python_constant(a) and self.is_python_constant(b):
            pa, pb = self.as_python(a), self.as_python(b)
            if all(is_constant_value(x) or isinstance(x, (list, dict, set)) for x in (pa, pb)):
                return self.const_apply(op, [pa, pb])
        # user-defined operators
        if isinstance(a, ObjectVariable):
            name = {operator.add: "__add__", operator.sub: "__sub__", operator.mul: "__mul__",
                    operator.truediv: "__truediv__", operator.matmul: "__matmul__", operator.eq: "__eq__",
                    operator.lt: "__lt__"}.get(base)
            meth = getattr(a.cls, name, None) if name else None
            if isinstance(meth, types.FunctionType):
                return self.inline_function(meth, [a, b], {}, None)
        raise GraphBreak("GB0011", f"operator {op.__name__} on {type(a).__name__} and {type(b).__name__}")

    def _obj_compare(self, op, a, b):
        va = a.value if isinstance(a, (ObjectVariable, ConstantVariable)) else None
        vb = b.value if isinstance(b, (ObjectVariable, ConstantVariable)) else None
        if isinstance(a, ObjectVariable) and a.value is None or isinstance(b, ObjectVariable) and b.value is None:
            return ConstantVariable((op is operator.ne) != (a is b))
        if type(va).__eq__ is object.__eq__ or type(vb).__eq__ is object.__eq__ or isinstance(va, type):
            return ConstantVariable(op(va, vb))
        if isinstance(va, (torch.dtype, torch.device)) or isinstance(vb, (torch.dtype, torch.device)):
            return ConstantVariable(op(va, vb))
        raise GraphBreak("GB0011", f"comparison of {type(va).__name__} objects")

    # ------------------------------------------------------------------ items

    def getitem(self, obj, idx):
        if isinstance(obj, TensorVariable):
            if isinstance(idx, (ConstantVariable, TensorVariable)) or \
                    (isinstance(idx, (TupleVariable, ListVariable)) and all(
                        isinstance(x, (ConstantVariable, TensorVariable)) or self.is_python_constant(x)
                        for x in idx.items)):
                return self.tensor_call("call_function", operator.getitem, [obj, idx], {})
            raise GraphBreak("GB0011", f"tensor indexed by {type(idx).__name__}")
        if isinstance(obj, (ListVariable, TupleVariable)):
            i = self.as_python(idx, "an index")
            if isinstance(i, slice):
                items = obj.items[i]
                return ListVariable(items) if isinstance(obj, ListVariable) else TupleVariable(items)
            if isinstance(i, TensorVariable):
                raise GraphBreak("GB0010", "list indexed by a tensor")
            try:
                return obj.items[i]
            except IndexError:
                raise self.exception(IndexError, f"{type(obj).__name__} index out of range") from None
            except TypeError as exc:
                raise self.exception(TypeError, str(exc)) from None
        if isinstance(obj, DictVariable):
            k = self.dict_key(idx)
            if not obj.has(k):
                raise self.exception(KeyError, repr(k))
            return obj.item(k)
        if isinstance(obj, ConstantVariable):
            return self.const_apply(operator.getitem, [obj.value, self.as_python(idx, "an index")])
        if isinstance(obj, ObjectVariable) and isinstance(obj.value, torch.nn.Module):
            m = obj.value
            i = self.as_python(idx, "an index")
            if isinstance(m, MODULE_CONTAINERS):
                self.guard_module_structure(obj)
                try:
                    result = m[i]
                except Exception as exc:
                    raise self.exception(type(exc), str(exc)) from None
                if isinstance(i, slice):
                    # a new container of this module's layers, with no source to rebuild it from:
                    # the code after a break would hold it as a constant, so this entry is for
                    # this very module (another instance of its type compiles its own)
                    if obj.source is not None:
                        self.out.add_guard("ID_MATCH", obj.source, m)
                    vt = ObjectVariable(result)
                    self.out.remember(result, vt)
                    return vt
                src = None
                if obj.source is not None:
                    if isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
                        src = GetItemSource(obj.source, i)
                    else:
                        n = len(m)
                        src = GetItemSource(obj.source, i if i >= 0 else i + n)
                return self.out.builder.wrap(result, src)
        if isinstance(obj, ObjectVariable) and isinstance(obj.value, type):
            # typing generics, e.g. list[int]
            return self.const_apply(operator.getitem, [obj.value, self.as_python(idx)])
        if isinstance(obj, ObjectVariable):
            meth = getattr(obj.cls, "__getitem__", None)
            if isinstance(meth, types.FunctionType):
                return self.inline_function(meth, [obj, idx], {}, None)
            if obj.dict_vt is not None:
                return self.getitem(obj.dict_vt, idx)
            if isinstance(idx, TensorVariable):
                item = optimizers.keyed_item(self, obj, idx)  # opt.state[p]
                if item is not None:
                    return item
        raise GraphBreak("GB0011", f"subscript of {type(obj).__name__}")

    def setitem(self, obj, idx, value):
        if isinstance(obj, TensorVariable):
            self.tensor_call("call_function", operator.setitem, [obj, idx, value], {})
            return
        if isinstance(obj, ListVariable):
            i = self.as_python(idx, "an index")
            if isinstance(i, slice):
                obj.items[i] = self.unpack(value)
            else:
                try:
                    obj.items[i] = value
                except IndexError:
                    raise self.exception(IndexError, "list assignment index out of range") from None
            self.out.note_mutation(obj)
            return
        if isinstance(obj, DictVariable):
            obj.items[self.dict_key(idx)] = value
            self.out.note_mutation(obj)
            return
        if isinstance(obj, ObjectVariable) and obj.is_new:
            meth = getattr(obj.cls, "__setitem__", None)
            if isinstance(meth, types.FunctionType):
                self.inline_function(meth, [obj, idx, value], {}, None)
                return
            if obj.dict_vt is not None:
                self.setitem(obj.dict_vt, idx, value)
                return
        raise GraphBreak("GB0017", f"item assignment on {type(obj).__name__}")

    # ------------------------------------------------------------------ attributes

    def getattr(self, obj, name: str):
        if isinstance(obj, UnbuiltClassVariable):
            raise GraphBreak("GB0013", f"class {obj.name}, defined in traced code, is used ({obj.name}.{name}; "
                                       "classes are not built while tracing)")
        if isinstance(obj, TensorVariable):
            return self.tensor_getattr(obj, name)
        if isinstance(obj, numpy_ops.NumpyVariable):
            return numpy_ops.getattr_(self, obj, name)
        if isinstance(obj, ConstantVariable):
            val = obj.value
            try:
                attr = getattr(val, name)
            except AttributeError as exc:
                raise self.exception(AttributeError, str(exc)) from None
            if callable(attr) and not isinstance(attr, type) and not is_constant_value(attr):
                return BoundMethodVariable(obj, name)
            return wrap_constant(attr)
        if isinstance(obj, (ListVariable, TupleVariable, DictVariable, SetVariable, IteratorVariable)):
            if isinstance(obj, TupleVariable) and obj.field_index(name) is not None:
                return obj.items[obj.field_index(name)]
            if isinstance(obj, TupleVariable) and obj.is_namedtuple() and not hasattr(tuple, name):
                attr = inspect.getattr_static(obj.cls, name, None)
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVariable(obj, name, attr)
                if isinstance(attr, classmethod):
                    return BoundMethodVariable(ObjectVariable(obj.cls), name, attr.__func__)
                if attr is not None and is_constant_value(attr):
                    return wrap_constant(attr)
                if name == "_fields":
                    return wrap_constant(obj.cls._fields)
            if not hasattr(obj.python_type(), name):
                raise self.exception(AttributeError, f"'{obj.python_type().__name__}' object has no attribute '{name}'")
            return BoundMethodVariable(obj, name)
        if isinstance(obj, ExceptionVariable):
            if name == "args":
                return TupleVariable(obj.args)
            raise GraphBreak("GB0011", f"attribute {name} of an exception")
        if isinstance(obj, (FunctionVariable, NestedFunctionVariable)):
            if isinstance(obj, FunctionVariable):
                if name in ("__name__", "__qualname__", "__module__", "__doc__"):
                    return wrap_constant(getattr(obj.fn, name))
                if name == "__globals__":
                    raise GraphBreak("GB0011", "function __globals__")
                return self.out.builder.wrap(getattr(obj.fn, name),
                                             AttrSource(obj.source, name) if obj.source else None)
            if name in ("__name__", "__qualname__"):
                return ConstantVariable(obj.qualname.rsplit(".", 1)[-1] if name == "__name__" else obj.qualname)
            raise GraphBreak("GB0011", f"attribute {name} of a nested function")
        if isinstance(obj, BoundMethodVariable):
            if name == "__self__":
                return obj.obj
            if name == "__func__" and obj.fn is not None:
                return FunctionVariable(obj.fn)
            if name == "__name__":
                return ConstantVariable(obj.name)
            raise GraphBreak("GB0011", f"attribute {name} of a bound method")
        if isinstance(obj, SuperVariable):
            return self.super_getattr(obj, name)
        if isinstance(obj, ObjectVariable):
            return self.object_getattr(obj, name)
        if isinstance(obj, GradModeVariable):
            raise GraphBreak("GB0011", f"attribute {name} of a grad-mode context")
        raise GraphBreak("GB0011", f"attribute {name} of {type(obj).__name__}")

    def tensor_getattr(self, t: TensorVariable, name: str):
        if name in TENSOR_CONSTANT_ATTRS:
            if name == "requires_grad" or name == "is_leaf":
                return ConstantVariable(getattr(t.fake, name))
            return wrap_constant(getattr(t.fake, name))
        if name in TENSOR_GRAPH_ATTRS:
            return self.tensor_call("call_function", getattr, [t, ConstantVariable(name)], {})
        if name == "grad":
            return backward.grad_of(self, t)
        if name in ("grad_fn", "_base", "_version", "output_nr", "_cdata"):
            raise GraphBreak("GB0011", f"Tensor.{name}")
        if name == "__class__":
            return ObjectVariable(t.ptype)
        if not hasattr(torch.Tensor, name):
            if t.source is not None:
                real = self._real_of(t)
                if name in getattr(real, "__dict__", {}):
                    return self.out.builder.wrap(getattr(real, name), AttrSource(t.source, name))
            raise self.exception(AttributeError, f"'Tensor' object has no attribute '{name}'")
        return BoundMethodVariable(t, name)

    def _real_of(self, t: TensorVariable):
        for src, real, vt in self.out.inputs:
            if vt is t:
                return real
        raise GraphBreak("GB0011", "attribute of a tensor without a real value")

    def super_getattr(self, sup: SuperVariable, name: str):
        mro = sup.obj.python_type().__mro__
        i = mro.index(sup.cls)
        for klass in mro[i + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVariable(sup.obj, name, attr)
                if attr is object.__init__:
                    return BoundMethodVariable(sup.obj, "__init__", _object_init)
                if attr is object.__getattribute__:
                    return BoundMethodVariable(sup.obj, "__getattribute__", _object_getattribute)
                if attr is object.__setattr__:
                    return BoundMethodVariable(sup.obj, "__setattr__", _object_setattr)
                if klass in (dict, collections.OrderedDict) and isinstance(sup.obj, ObjectVariable):
                    return self.dict_items_method(sup.obj, name)
                break
        raise GraphBreak("GB0011", f"super().{name}")

    def object_getattr(self, obj: ObjectVariable, name: str, generic: bool = False):
        try:
            return self._object_getattr(obj, name, generic)
        except TracedException as exc:
            if obj.source is not None and issubclass(exc.exc.cls, AttributeError) and name not in obj.deleted:
                self.out.add_guard("HASATTR", obj.source, (name, False))
            raise

    def _object_getattr(self, obj: ObjectVariable, name: str, generic: bool = False):
        """`generic`: object.__getattribute__'s lookup, past a class's own __getattribute__ / __getattr__."""
        if name in obj.attrs:
            return obj.attrs[name]
        if name in obj.deleted:
            raise self.exception(AttributeError, f"'{obj.cls.__name__}' object has no attribute '{name}'")
        value = obj.value
        # an nn.Module whose class reads attributes its own way (a `__getattr__` that makes up
        # or forwards names, as PEFT's wrappers do): its lookup is traced, not nn.Module's
        if not generic and (not isinstance(value, _GENERIC_GETATTR)
                            or isinstance(value, torch.nn.Module) and not module_class_is_plain(type(value))):
            custom = obj.cls.__getattribute__
            if isinstance(custom, types.FunctionType) and not _is_torch_function(obj.cls):
                # a Python __getattribute__ (a config's alias map, ...) is traced like any method; a
                # C type's own slot (code objects, OrderedDict) is the generic lookup
                return self.call_python_function(custom, [obj, ConstantVariable(name)], {}, None)
            fallback = getattr(obj.cls, "__getattr__", None)
            if fallback is not None and not _is_torch_function(obj.cls):
                if not isinstance(fallback, types.FunctionType):
                    raise GraphBreak("GB0011", f"attribute of an object with a C __getattr__ ({obj.cls.__name__})")
                try:
                    return self._object_getattr(obj, name, generic=True)
                except TracedException as exc:  # as Python does: __getattr__ after a failed lookup
                    if not issubclass(exc.exc.cls, AttributeError):
                        raise
                return self.call_python_function(fallback, [obj, ConstantVariable(name)], {}, None)
        builder = self.out.builder
        src = AttrSource(obj.source, name) if obj.source is not None else None
        if isinstance(value, types.ModuleType):
            try:
                attr = getattr(value, name)
            except AttributeError as exc:
                raise self.exception(AttributeError, str(exc)) from None
            if value.__name__ == "torch" or value.__name__.startswith("torch.") or \
                    value.__name__ in ("math", "operator", "functools", "itertools", "collections", "dataclasses",
                                       "typing", "numpy", "builtins", "inspect", "time", "random", "os", "sys"):
                return builder.wrap_sourceless(attr) if not isinstance(attr, type) else ObjectVariable(attr)
            return builder.wrap(attr, src)
        if obj.is_new:
            cls = obj.cls
            if name == "__dict__":  # a snapshot: reads (dataclass __post_init__ & co), not stores
                return DictVariable(dict(obj.attrs))
            if name == "__class__":
                return ObjectVariable(cls)
            try:
                static = inspect.getattr_static(cls, name)
            except AttributeError:
                raise self.exception(AttributeError, f"'{cls.__name__}' object has no attribute '{name}'") from None
            return self._class_attr(obj, name, static, None)
        if isinstance(value, type):
            try:
                static = inspect.getattr_static(value, name)
            except AttributeError:
                raise self.exception(AttributeError, f"type object '{value.__name__}' has no attribute '{name}'") from None
            if isinstance(static, classmethod):
                return BoundMethodVariable(obj, name, static.__func__)
            if isinstance(static, staticmethod):
                return builder.wrap(static.__func__, None) if obj.source is None else \
                    builder.wrap(getattr(value, name), src)
            attr = getattr(value, name)
            if obj.source is None or _is_torch_function(value):
                return builder.wrap_sourceless(attr) if not isinstance(attr, type) else ObjectVariable(attr)
            return builder.wrap(attr, src)
        if isinstance(value, torch.nn.Module):
            return self.module_getattr(obj, name)
        cls = type(value)
        try:
            static = inspect.getattr_static(value, name)
        except AttributeError:
            raise self.exception(AttributeError, f"'{cls.__name__}' object has no attribute '{name}'") from None
        inst_dict = getattr(value, "__dict__", None)
        if isinstance(inst_dict, dict) and name in inst_dict and not _is_data_descriptor(type(value), name):
            return builder.wrap(inst_dict[name], src) if src is not None else builder.wrap_sourceless(inst_dict[name])
        return self._class_attr(obj, name, static, src)

    def _class_attr(self, obj, name, static, src):
        builder = self.out.builder
        if isinstance(static, _C_METHODS) and issubclass(obj.cls, dict) and \
                any(k.__dict__.get(name) is static for k in (dict, collections.OrderedDict)):
            return self.dict_items_method(obj, name)
        if isinstance(static, types.FunctionType):
            return BoundMethodVariable(obj, name, static)
        if isinstance(static, staticmethod):
            return builder.wrap_sourceless(static.__func__)
        if isinstance(static, classmethod):
            return BoundMethodVariable(ObjectVariable(obj.cls), name, static.__func__)
        if isinstance(static, property):
            if static.fget is None:
                raise self.exception(AttributeError, f"unreadable attribute {name}")
            return self.inline_function(static.fget, [obj], {}, None)
        if isinstance(static, functools.cached_property):
            raise GraphBreak("GB0011", "cached_property")
        if obj.value is None:
            if is_constant_value(static) or isinstance(static, type):
                return wrap_constant(static) if not isinstance(static, type) else ObjectVariable(static)
            if type(static) in (dict, list, tuple, set, frozenset):  # a class-level table, read
                return builder.wrap_sourceless(static)
            raise GraphBreak("GB0011", f"class attribute {name} of type {type(static).__name__}")
        attr = getattr(obj.value, name)
        if src is not None:
            return builder.wrap(attr, src)
        return builder.wrap_sourceless(attr)

    def module_getattr(self, obj: ObjectVariable, name: str):
        m = obj.value
        builder = self.out.builder
        src = AttrSource(obj.source, name) if obj.source is not None else None
        d = m.__dict__
        if name in d["_parameters"]:
            p = d["_parameters"][name]
            if p is None:
                return ConstantVariable(None)
            return builder.wrap(p, src) if src is not None else builder.wrap_sourceless(p)
        if name in d["_buffers"]:
            b = d["_buffers"][name]
            if b is None:
                return ConstantVariable(None)
            return builder.wrap(b, src) if src is not None else builder.wrap_sourceless(b)
        if name in d["_modules"]:
            sub = d["_modules"][name]
            if sub is None:
                return ConstantVariable(None)
            return builder.wrap(sub, src) if src is not None else builder.wrap_sourceless(sub)
        try:
            static = inspect.getattr_static(m, name)
        except AttributeError:
            raise self.exception(AttributeError, f"'{type(m).__name__}' object has no attribute '{name}'") from None
        if name in d and not _is_data_descriptor(type(m), name):
            return builder.wrap(d[name], src) if src is not None else builder.wrap_sourceless(d[name])
        return self._class_attr(obj, name, static, src)

    def guard_module_structure(self, obj: ObjectVariable) -> None:
        """A ModuleList / Sequential / ModuleDict / Parameter{List,Dict} read for its length,
        keys or items: guarded on the names it holds, so that a layer appended after the
        compile recompiles (modules are guarded by type, not identity: builder.py)."""
        m = obj.value
        if obj.source is None or not isinstance(m, MODULE_CONTAINERS):
            return
        table = "_parameters" if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) else "_modules"
        self.out.add_guard("DICT_KEYS", AttrSource(obj.source, table), tuple(m.__dict__[table].keys()))

    def dict_items_method(self, obj: ObjectVariable, name: str):
        """`dict.<name>` of a dict subclass object, on its items (not its Python overrides)."""
        if obj.dict_vt is not None:
            return BoundMethodVariable(obj.dict_vt, name)
        if obj.source is not None and isinstance(obj.value, dict):
            if name in ("get", "__getitem__", "__contains__"):
                return BoundMethodVariable(obj, name, _dict_read)   # one key read, one key guarded
            if name in ("keys", "items", "values", "__len__", "__iter__", "copy"):
                return BoundMethodVariable(self.existing_dict_items(obj), name)
        raise GraphBreak("GB0011", f"dict.{name} of an existing {obj.cls.__name__} object")

    def existing_dict_items(self, obj: ObjectVariable):
        """The items of a dict subclass object from outside the frame, read through dict itself
        and guarded on its keys: a copy to read (a mutation method breaks before reaching it)."""
        keys = list(dict.keys(obj.value))
        if not all(isinstance(k, (str, int)) and literal(k) is not None for k in keys):
            raise GraphBreak("GB0011", f"items of a {obj.cls.__name__} with non-constant keys")
        self.out.add_guard("EQUALS_MATCH", DictItemSource(obj.source, None, "keys"), keys)
        wrap = self.out.builder.wrap
        return DictVariable({k: wrap(dict.__getitem__(obj.value, k), DictItemSource(obj.source, k)) for k in keys})

    def existing_dict_read(self, obj: ObjectVariable, name: str, args, kwargs):
        """get / [] / in on a dict subclass object from outside the frame: one key read,
        guarded on that key being there (and on its value)."""
        key = self.dict_key(args[0])
        if literal(key) is None:
            raise GraphBreak("GB0011", f"a read of a {obj.cls.__name__} with a key of no literal form ({type(key).__name__})")
        present = dict.__contains__(obj.value, key)
        self.out.add_guard("EQUALS_MATCH", DictItemSource(obj.source, key, "__contains__"), present)
        if name == "__contains__":
            return ConstantVariable(present)
        if not present:
            if name == "get":
                return args[1] if len(args) > 1 else ConstantVariable(None)
            raise self.exception(KeyError, repr(key))
        return self.out.builder.wrap(dict.__getitem__(obj.value, key), DictItemSource(obj.source, key))

    def setattr(self, obj, name, value, generic: bool = False):
        """`generic`: object.__setattr__'s store, past a class's own __setattr__."""
        if isinstance(obj, ObjectVariable) and (obj.is_new or obj.source is not None) and \
                not isinstance(obj.value, (type, types.ModuleType)):
            custom = obj.cls.__setattr__
            if not generic and custom is not object.__setattr__ and not isinstance(obj.value, torch.nn.Module):
                if isinstance(custom, types.FunctionType) and not _is_torch_function(obj.cls):
                    self.call_python_function(custom, [obj, ConstantVariable(name), value], {}, None)
                    return
                raise GraphBreak("GB0017", f"attribute store on {obj.cls.__name__} with a C __setattr__")
            if isinstance(obj.value, torch.nn.Module):
                m = obj.value
                if name in m._modules and isinstance(value, ObjectVariable) and value.value is m._modules[name]:
                    return      # `self.classifier = self.classifier.to(self.dtype)`, which converted nothing
                if name in m._parameters or name in m._modules:
                    raise GraphBreak("GB0017", f"assignment to module parameter/submodule {name!r}")
                if name in m._buffers:
                    current = self.module_getattr(obj, name)
                    if current is value:
                        return
                    raise GraphBreak("GB0017", f"assignment of a new tensor to buffer {name!r}")
            if name in obj.attrs and obj.attrs[name] is value:
                return
            obj.attrs[name] = value
            obj.deleted.discard(name)
            self.out.note_mutation(obj)
            return
        if isinstance(obj, TensorVariable):
            if name == "grad":
                backward.set_grad(self.out, obj, value)
                return
            raise GraphBreak("GB0017", f"attribute store Tensor.{name}")
        raise GraphBreak("GB0017", f"attribute store on {type(obj).__name__}")

    # ------------------------------------------------------------------ tensors

    def tensor_call(self, kind, target, args, kwargs):
        proxy, result = self.out.call_op(kind, target, tuple(args), dict(kwargs))
        return self.wrap_result(proxy, result, args, kwargs)

    def wrap_result(self, proxy, result, args=(), kwargs=None):
        if isinstance(result, torch.Tensor):
            for a in list(args) + list((kwargs or {}).values()):
                if isinstance(a, TensorVariable) and a.fake is result:
                    return a  # in-place op: the same tensor
            return TensorVariable(proxy, result)
        if isinstance(result, (tuple, list)):
            if all(not isinstance(x, torch.Tensor) for x in _flatten(result)):
                self._drop_node(proxy)
                return wrap_constant(result)
            items = [self.wrap_result(proxy[i], r) if isinstance(r, (torch.Tensor, tuple, list))
                     else wrap_constant(r) for i, r in enumerate(result)]
            if isinstance(result, list):
                return ListVariable(items)
            cls = type(result)
            return TupleVariable(items, cls=cls)
        if isinstance(result, (int, float, bool, torch.dtype, torch.device, torch.Size, type(None), complex, str)):
            self._drop_node(proxy)
            return wrap_constant(result)
        if scalars.is_unbacked(result):  # .item() under capture_scalar_outputs: the node computes it
            scalars.register(proxy, result)
            return ConstantVariable(result)
        self._drop_node(proxy)
        raise GraphBreak("GB0011", f"torch op returned {type(result).__name__}")

    def captured_scalars(self, t: TensorVariable, name: str):
        """config.capture_scalar_outputs: `.item()` is a graph node whose value is an unbacked
        symbol; `.tolist()` is one per element (static shapes, small tensors only)."""
        if name == "item":
            return self.tensor_call("call_method", "item", [t], {})
        if has_symbolic(tuple(t.fake.shape)) or t.fake.numel() > 256:
            raise GraphBreak("GB0004", "Tensor.tolist() of a tensor with symbolic or large shape")
        if t.fake.dim() == 0:
            return self.tensor_call("call_method", "item", [t], {})
        return ListVariable([self.captured_scalars(self.getitem(t, ConstantVariable(i)), "tolist")
                             for i in range(t.fake.shape[0])])

    def _drop_node(self, proxy):
        from .output_graph import _is_mutating
        node = proxy.node
        if not node.users and not _is_mutating(node):
            try:
                self.out.graph.erase_node(node)
            except Exception:
                pass

    def tensor_method(self, t: TensorVariable, name: str, args, kwargs):
        if name == "requires_grad_" and len(args) + len(kwargs) <= 1:
            flag = self.as_python(args[0] if args else kwargs.get("requires_grad", ConstantVariable(True)))
            if bool(flag) == t.fake.requires_grad:
                return t   # already so (a hook's output.requires_grad_(True) on an activation): nothing happens
        if name == "backward":
            return backward.trace(self, t, args, kwargs)
        if name in TENSOR_METHOD_BREAKS:
            gb = TENSOR_METHOD_BREAKS[name]
            if name in ("item", "tolist") and config.capture_scalar_outputs and not args and not kwargs:
                return self.captured_scalars(t, name)
            if name == "numpy" and numpy_ops.available():
                return numpy_ops.tensor_to_numpy(self, t, args, kwargs)
            raise GraphBreak(gb, f"Tensor.{name}()")
        if name in TENSOR_METADATA_METHODS:
            cargs = [self.as_python(a) for a in args]
            ckw = {k: self.as_python(v) for k, v in kwargs.items()}
            return self.const_apply(getattr(t.fake, name), cargs, ckw)
        if name == "type" and not args and not kwargs:
            return ConstantVariable(_type_string(t.fake))
        if name in ("__setitem__",):
            self.setitem(t, args[0], args[1])
            return ConstantVariable(None)
        if name == "__getitem__":
            return self.getitem(t, args[0])
        if name in _METADATA_IN_PLACE and t.fake.requires_grad and self._has_other_views(t.fake):
            # functionalization replays the earlier views on the new sizes and strides, so their
            # gradients go to the wrong elements (fuzz 313345: `t1 = t0.select(1, -1)`, then
            # `t0.transpose_(0, 1)`; torch.compile gets it wrong too); eager keeps them apart
            raise GraphBreak("GB0017", f"Tensor.{name}() on a tensor that requires grad and has views")
        if not convertible(args, kwargs):
            raise GraphBreak("GB0011", f"Tensor.{name} with unsupported arguments")
        scaled = optimizers.scaled_by_tensor(self, name, [t] + list(args), kwargs)
        if scaled is not None:
            return scaled
        return self.tensor_call("call_method", name, [t] + list(args), kwargs)

    def _has_other_views(self, fake: torch.Tensor) -> bool:
        """Whether a tensor made in this graph other than `fake` shares its memory."""
        storage = fake.untyped_storage()._cdata
        for node in self.out.graph.nodes:
            v = node.meta.get("example_value")
            if isinstance(v, torch.Tensor) and v is not fake and v.untyped_storage()._cdata == storage:
                return True
        return False

    # ------------------------------------------------------------------ calls

    def call(self, fn, args: list, kwargs: dict):
        try:
            return self._call(fn, args, kwargs)
        except RecursionError:
            raise GraphBreak("GB0011", "recursion too deep while tracing") from None

    def _call(self, fn, args, kwargs):
        if isinstance(fn, ClassStatementVariable):    # class C(...): in an inlined function
            name = self.as_python(args[1]) if len(args) > 1 and self.is_python_constant(args[1]) else "?"
            return UnbuiltClassVariable(str(name))
        if isinstance(fn, UnbuiltClassVariable):
            raise GraphBreak("GB0013", f"class {fn.name}, defined in traced code, is called (classes are not built "
                                       "while tracing)")
        if isinstance(fn, NestedFunctionVariable):
            return self.inline_nested(fn, args, kwargs)
        if isinstance(fn, FunctionVariable):
            return self.call_python_function(fn.fn, args, kwargs, fn.source)
        if isinstance(fn, BoundMethodVariable):
            return self.call_method(fn, args, kwargs)
        if isinstance(fn, numpy_ops.NumpyMethodVariable):
            return numpy_ops.call_method(self, fn, args, kwargs)
        if isinstance(fn, PartialVariable):
            return self.call(fn.func, fn.args + list(args), {**fn.kwargs, **kwargs})
        if isinstance(fn, WithExitVariable):
            ctx = fn.ctx
            if isinstance(ctx, GradModeVariable):
                self.out.set_grad_enabled(ctx.prev)
                return ConstantVariable(None)
            if isinstance(ctx, AutocastVariable):
                self.out.exit_autocast(ctx.block, ctx.prev, ctx.entered_in_graph)
                return ConstantVariable(None)
            if isinstance(ctx, ProfilerRangeVariable):
                return ConstantVariable(None)
            raise GraphBreak("GB0011", "__exit__ of an unknown context manager")
        if higher_order.is_call_variable(fn):  # torch.func.grad(f)(x), vjp_fn(ct)
            return fn.call(self, args, kwargs)
        if isinstance(fn, ObjectVariable):
            return self.call_object(fn, args, kwargs)
        if isinstance(fn, TensorVariable):
            raise self.exception(TypeError, "'Tensor' object is not callable")
        if isinstance(fn, ConstantVariable):
            if callable(fn.value):
                return self.call_object(ObjectVariable(fn.value), args, kwargs)
            raise self.exception(TypeError, f"'{type(fn.value).__name__}' object is not callable")
        raise GraphBreak("GB0013", f"call of {type(fn).__name__}")

    def call_method(self, m: BoundMethodVariable, args, kwargs):
        obj = m.obj
        if isinstance(obj, TupleVariable) and obj.is_namedtuple() and m.name in ("_replace", "_asdict"):
            from .containers import container_method
            return container_method(self, obj, m.name, args, kwargs)
        if isinstance(obj, ObjectVariable) and isinstance(obj.value, torch.nn.Module) and m.name in _MODULE_ITERATORS \
                and getattr(torch.nn.Module, m.name) is m.fn:
            real = getattr(obj.value, m.name)(*[self.as_python(a) for a in args],
                                              **{k: self.as_python(v) for k, v in kwargs.items()})
            wrap = self.out.builder.wrap_sourceless
            items = [TupleVariable([wrap(x) for x in item]) if isinstance(item, tuple) else wrap(item)
                     for item in real]
            return IteratorVariable(items, types.GeneratorType)
        if m.fn is _object_getattribute and isinstance(obj, ObjectVariable) and len(args) == 1 and not kwargs:
            return self.object_getattr(obj, self.as_python(args[0]), generic=True)
        if m.fn is _object_setattr and isinstance(obj, ObjectVariable) and len(args) == 2 and not kwargs:
            self.setattr(obj, self.as_python(args[0]), args[1], generic=True)
            return ConstantVariable(None)
        if m.fn is _dict_read and isinstance(obj, ObjectVariable):
            return self.existing_dict_read(obj, m.name, args, kwargs)
        if isinstance(obj, ObjectVariable) and isinstance(obj.value, (logging.Logger, logging.LoggerAdapter)):
            from .calls import defer_logging_call, is_logging_call
            real = getattr(obj.value, m.name)
            if is_logging_call(real):
                return defer_logging_call(self, real, args, kwargs)
        if m.fn is not None:
            return self.call_python_function(m.fn, [obj] + list(args), kwargs, None, bound_self=obj)
        if isinstance(obj, TensorVariable):
            return self.tensor_method(obj, m.name, args, kwargs)
        if isinstance(obj, ConstantVariable):
            cargs = [self.as_python(a, "an argument") for a in args]
            ckw = {k: self.as_python(v, "an argument") for k, v in kwargs.items()}
            return self.const_apply(getattr(obj.value, m.name), cargs, ckw)
        from .containers import container_method
        return container_method(self, obj, m.name, args, kwargs)

    def call_python_function(self, fn, args, kwargs, source, bound_self=None):
        from .calls import call_python_function
        return call_python_function(self, fn, args, kwargs, source)

    def call_object(self, fnv: ObjectVariable, args, kwargs):
        from .calls import call_object
        return call_object(self, fnv, args, kwargs)

    def inline_function(self, fn, args, kwargs, source):
        from .calls import inline_user_function
        return inline_user_function(self, fn, args, kwargs, source)

    def inline_nested(self, fn: NestedFunctionVariable, args, kwargs):
        from .calls import inline_code
        return inline_code(self, fn.code, fn.f_globals, fn.globals_source, fn.defaults, fn.kwdefaults,
                           fn.closure, args, kwargs, fn.qualname)


# in-place ops that change a tensor's sizes or strides, not its data
_METADATA_IN_PLACE = frozenset({"transpose_", "t_", "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_",
                                "as_strided_"})

_MODULE_ITERATORS = {"parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
                     "modules", "named_modules"}


def _flatten(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from _flatten(y)
    else:
        yield x


def _type_string(t) -> str:
    names = {torch.float32: "FloatTensor", torch.float64: "DoubleTensor", torch.float16: "HalfTensor",
             torch.bfloat16: "BFloat16Tensor", torch.int64: "LongTensor", torch.int32: "IntTensor",
             torch.int16: "ShortTensor", torch.int8: "CharTensor", torch.uint8: "ByteTensor", torch.bool: "BoolTensor"}
    prefix = "torch." if t.device.type == "cpu" else f"torch.{t.device.type}."
    return prefix + names.get(t.dtype, "Tensor")


def _is_data_descriptor(cls, name) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")
    return False


# modules whose length, keys and items the trace reads (guarded: guard_module_structure)
MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict, torch.nn.ParameterList,
                     torch.nn.ParameterDict)

# objects whose attribute reads the capture models itself (or that have C lookups)
_GENERIC_GETATTR = (types.ModuleType, type, torch.nn.Module, types.BuiltinFunctionType, types.MethodType,
                    functools.partial)
_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)


def _object_init(self, *args, **kwargs):
    return None


def _object_getattribute(self, name):
    """Stands for object.__getattribute__ reached through super(): the generic lookup."""
    return object.__getattribute__(self, name)


def _object_setattr(self, name, value):
    """Stands for object.__setattr__ reached through super(): the generic store."""
    object.__setattr__(self, name, value)


def _dict_read(self, *args):
    """Stands for a read-only dict method of an existing dict subclass object."""
