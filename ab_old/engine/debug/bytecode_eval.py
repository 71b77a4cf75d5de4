"""A small concrete evaluator for the code objects the engine generates, so the bytecode
step debugger can show the *real* value stack (CPython gives no access to a running
frame's stack from Python).

`EvalFrame(fn, args, kwargs)` binds the arguments the way CPython would; `step()` runs
one instruction with real values and real calls (the compiled graph, the trampoline, a
resume function, `print`, ...). It supports the opcodes the engine's code generators emit
and the common ones of copied original code on the CPython versions the capture knows
(engine/capture/pyversion.py says how they differ; this module reads that table); `check_supported`
says up front when a code object uses anything else (generators, unknown opcodes),
so the caller can run that frame with a real call instead. try/except/with blocks follow
the exception table as CPython does; `sys.exc_info()` inside a handler still reports the
caller's state (the evaluator's handled exception is its own).

Nothing here imports torch or the capture engine: it is plain bytecode semantics.
"""

from __future__ import annotations

import builtins
import dis
import inspect
import operator
import sys
import types
from typing import Any, Optional

from ..capture.bytecode import FUSED_LOCAL_OPS, Instruction, decode
from ..capture.pyversion import V, split_call


class _Null:
    """The NULL CPython pushes beside a callable (PUSH_NULL, LOAD_GLOBAL's low bit)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


class NotSteppable(Exception):
    """This code object uses something the evaluator does not model; run it for real."""


class Returned:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_BINARY = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_, "**": operator.pow,
    ">>": operator.rshift, "-": operator.sub, "/": operator.truediv, "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv, "<<=": operator.ilshift,
    "@=": operator.imatmul, "*=": operator.imul, "%=": operator.imod, "|=": operator.ior,
    "**=": operator.ipow, ">>=": operator.irshift, "-=": operator.isub, "/=": operator.itruediv,
    "^=": operator.ixor,
}
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}
_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}
# Callables that read the *calling* frame; from this evaluator they would see the wrong one.
_FRAME_READERS = {locals, vars, dir, sys._getframe, inspect.currentframe}
_METHOD_TYPES = (types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)


def _with_null(v) -> list:
    """A callable and its NULL, on the side this Python puts it."""
    return [v, NULL] if V.null_above_callable else [NULL, v]


def _load_method(obj, name):
    """What LOAD_METHOD / 3.12+ LOAD_ATTR(method) push: (function, self) when the attribute
    is a plain method found on the type, else the attribute and a NULL."""
    tattr = inspect.getattr_static(type(obj), name, None) if not isinstance(obj, type) else None
    if isinstance(tattr, _METHOD_TYPES):
        inst_dict = getattr(obj, "__dict__", None)
        if not (isinstance(inst_dict, dict) and name in inst_dict) and \
                type(obj).__getattribute__ is object.__getattribute__:
            return [tattr, obj]
    return _with_null(getattr(obj, name))


class EvalFrame:
    """One frame of a code object being evaluated instruction by instruction."""

    def __init__(self, fn: types.FunctionType, args=(), kwargs=None, *, name: str | None = None):
        self.fn = fn
        self.code: types.CodeType = fn.__code__
        self.name = name or self.code.co_name
        self.instructions: list[Instruction] = decode(self.code)
        check_supported(self.code, self.instructions)
        self.index_of = {id(inst): k for k, inst in enumerate(self.instructions)}
        self.globals = fn.__globals__
        b = self.globals.get("__builtins__", builtins)
        self.builtins = b if isinstance(b, dict) else b.__dict__
        self.fast: dict[str, Any] = self._bind(fn, args, kwargs or {})
        self.cells: dict[str, types.CellType] = {}
        self.stack: list[Any] = []
        self.pc = 0  # index into self.instructions of the next instruction to run
        self.kw_names: tuple = ()
        self.done = False
        self.return_value: Any = None
        self.last: Optional[Instruction] = None  # the instruction run last (an outer frame: the call)
        self.handled_exc: Optional[BaseException] = sys.exc_info()[1]  # what a bare `raise` re-raises

    @staticmethod
    def _bind(fn, args, kwargs) -> dict:
        sig = inspect.signature(fn, follow_wrapped=False)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    # ------------------------------------------------------------------ inspection
    @property
    def current(self) -> Optional[Instruction]:
        return None if self.done else self.instructions[self.pc]

    def visible_locals(self) -> dict:
        """Locals and cell contents by name, as `locals()` would show them."""
        out = dict(self.fast)
        for name, cell in self.cells.items():
            try:
                out[name] = cell.cell_contents
            except ValueError:
                out.pop(name, None)
        return out

    # ------------------------------------------------------------------ running
    def step(self) -> Optional[Returned]:
        """Run the next instruction; a `Returned` when the frame returned."""
        if self.done:
            raise RuntimeError("the frame has already returned")
        inst = self.instructions[self.pc]
        self.last = inst
        self.pc += 1
        try:
            getattr(self, "op_" + inst.opname)(inst)
        except NotSteppable:
            raise
        except BaseException as exc:
            entry = inst.exn_tab_entry
            if entry is None:
                raise
            # unwind to the handler as CPython does: stack to its depth, [lasti], exception
            del self.stack[entry.depth:]
            if entry.lasti:
                self.push(inst.offset)
            self.push(exc)
            self.pc = self.index_of[id(entry.target)]
        if self.done:
            return Returned(self.return_value)
        return None

    def run_to_end(self) -> Any:
        while True:
            r = self.step()
            if r is not None:
                return r.value

    # ------------------------------------------------------------------ helpers
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n: int) -> list:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump_to(self, inst: Instruction):
        self.pc = self.index_of[id(inst.target)]

    def _return(self, value):
        self.return_value = value
        self.done = True

    def load_global(self, name: str):
        if name in self.globals:
            return self.globals[name]
        if name in self.builtins:
            return self.builtins[name]
        raise NameError(f"name {name!r} is not defined")

    def call(self, fn, args: list, kwargs: dict):
        if fn is super and not args and not kwargs:
            # zero-argument super() finds __class__ and self in the calling frame: give them
            cls = self.cells["__class__"].cell_contents
            first = self.code.co_varnames[0]
            this = self.cells[first].cell_contents if first in self.cells else self.fast[first]
            return super(cls, this)
        if fn in _FRAME_READERS and not args:
            raise NotSteppable(f"{getattr(fn, '__name__', fn)}() reads the calling frame")
        return fn(*args, **kwargs)

    # ------------------------------------------------------------------ opcodes: frame setup
    def op_RESUME(self, inst): pass
    def op_NOP(self, inst): pass
    def op_EXTENDED_ARG(self, inst): pass
    def op_PRECALL(self, inst): pass  # 3.11: the call happens in CALL

    def op_MAKE_CELL(self, inst):
        name = inst.argval
        if name in self.fast:
            self.cells[name] = types.CellType(self.fast.pop(name))
        else:
            self.cells[name] = types.CellType()

    def op_COPY_FREE_VARS(self, inst):
        for name, cell in zip(self.code.co_freevars, self.fn.__closure__ or ()):
            self.cells[name] = cell

    # ------------------------------------------------------------------ stack
    def op_PUSH_NULL(self, inst): self.push(NULL)
    def op_POP_TOP(self, inst): self.pop()

    def op_COPY(self, inst):
        self.push(self.stack[-inst.arg])

    def op_SWAP(self, inst):
        n = inst.arg
        self.stack[-1], self.stack[-n] = self.stack[-n], self.stack[-1]

    def op_END_FOR(self, inst):
        self.popn(-dis.stack_effect(dis.opmap["END_FOR"]))  # 3.12: iterator and item; 3.13: one

    # ------------------------------------------------------------------ locals, cells, globals
    def op_LOAD_CONST(self, inst): self.push(inst.argval)

    def op_LOAD_FAST(self, inst):
        name = inst.argval
        if name not in self.fast:
            raise UnboundLocalError(f"cannot access local variable {name!r} where it is not associated with a value")
        self.push(self.fast[name])

    op_LOAD_FAST_CHECK = op_LOAD_FAST

    def _fused(self, inst):  # 3.13+: LOAD_FAST_LOAD_FAST & co run as their two halves
        for op, name in zip(FUSED_LOCAL_OPS[inst.opname], inst.argval):
            getattr(self, "op_" + op)(inst.copy(opname=op, argval=name))

    op_LOAD_FAST_LOAD_FAST = op_STORE_FAST_LOAD_FAST = op_STORE_FAST_STORE_FAST = _fused

    def op_LOAD_FAST_AND_CLEAR(self, inst):
        self.push(self.fast.pop(inst.argval, NULL))

    def op_STORE_FAST(self, inst):
        v = self.pop()
        if v is NULL:  # 3.12 restores a comprehension variable that was unbound
            self.fast.pop(inst.argval, None)
        else:
            self.fast[inst.argval] = v

    def op_DELETE_FAST(self, inst):
        if inst.argval not in self.fast:
            raise UnboundLocalError(f"cannot access local variable {inst.argval!r} where it is not associated with a value")
        del self.fast[inst.argval]

    def op_LOAD_CLOSURE(self, inst):
        self.push(self.cells[inst.argval])

    def op_LOAD_DEREF(self, inst):
        try:
            self.push(self.cells[inst.argval].cell_contents)
        except ValueError:
            raise NameError(f"cannot access free variable {inst.argval!r} where it is not associated with a value"
                            ) from None

    def op_STORE_DEREF(self, inst):
        self.cells[inst.argval].cell_contents = self.pop()

    def op_DELETE_DEREF(self, inst):
        del self.cells[inst.argval].cell_contents

    def op_LOAD_GLOBAL(self, inst):
        v = self.load_global(inst.argval)
        if inst.flags & 1:
            self.stack.extend(_with_null(v))
        else:
            self.push(v)

    def op_STORE_GLOBAL(self, inst):
        self.globals[inst.argval] = self.pop()

    def op_DELETE_GLOBAL(self, inst):
        del self.globals[inst.argval]

    def op_LOAD_ASSERTION_ERROR(self, inst):
        self.push(AssertionError)

    # ------------------------------------------------------------------ attributes and items
    def op_LOAD_ATTR(self, inst):
        obj = self.pop()
        if inst.is_method_load:
            self.stack.extend(_load_method(obj, inst.argval))
        else:
            self.push(getattr(obj, inst.argval))

    def op_LOAD_METHOD(self, inst):
        self.stack.extend(_load_method(self.pop(), inst.argval))

    def op_LOAD_SUPER_ATTR(self, inst):
        self_obj = self.pop()
        cls = self.pop()
        global_super = self.pop()
        sup = global_super(cls, self_obj) if inst.flags & 2 else self.call(global_super, [], {})
        attr = getattr(sup, inst.argval)
        if inst.flags & 1:
            self.stack.extend(_with_null(attr))
        else:
            self.push(attr)

    def op_STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        setattr(obj, inst.argval, value)

    def op_DELETE_ATTR(self, inst):
        delattr(self.pop(), inst.argval)

    def op_BINARY_SUBSCR(self, inst):
        key = self.pop()
        self.push(self.pop()[key])

    def op_STORE_SUBSCR(self, inst):
        key = self.pop()
        container = self.pop()
        container[key] = self.pop()

    def op_DELETE_SUBSCR(self, inst):
        key = self.pop()
        del self.pop()[key]

    def op_BINARY_SLICE(self, inst):
        end = self.pop()
        start = self.pop()
        self.push(self.pop()[start:end])

    def op_STORE_SLICE(self, inst):
        end = self.pop()
        start = self.pop()
        container = self.pop()
        container[start:end] = self.pop()

    # ------------------------------------------------------------------ building values
    def op_BUILD_TUPLE(self, inst): self.push(tuple(self.popn(inst.arg)))
    def op_BUILD_LIST(self, inst): self.push(self.popn(inst.arg))
    def op_BUILD_SET(self, inst): self.push(set(self.popn(inst.arg)))

    def op_BUILD_MAP(self, inst):
        items = self.popn(2 * inst.arg)
        self.push({items[i]: items[i + 1] for i in range(0, len(items), 2)})

    def op_BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop()
        self.push(dict(zip(keys, self.popn(inst.arg))))

    def op_BUILD_STRING(self, inst):
        self.push("".join(self.popn(inst.arg)))

    def op_BUILD_SLICE(self, inst):
        self.push(slice(*self.popn(inst.arg)))

    def op_LIST_APPEND(self, inst):
        v = self.pop()
        self.stack[-inst.arg].append(v)

    def op_SET_ADD(self, inst):
        v = self.pop()
        self.stack[-inst.arg].add(v)

    def op_MAP_ADD(self, inst):
        value = self.pop()
        key = self.pop()
        self.stack[-inst.arg][key] = value

    def op_LIST_EXTEND(self, inst):
        v = self.pop()
        self.stack[-inst.arg].extend(v)

    def op_SET_UPDATE(self, inst):
        v = self.pop()
        self.stack[-inst.arg].update(v)

    def op_DICT_UPDATE(self, inst):
        v = self.pop()
        self.stack[-inst.arg].update(v)

    def op_DICT_MERGE(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        for k in v.keys():
            if k in target:
                raise TypeError(f"got multiple values for keyword argument {k!r}")
        target.update(v)

    def op_LIST_TO_TUPLE(self, inst):
        self.push(tuple(self.pop()))

    def op_CALL_INTRINSIC_1(self, inst):
        v = self.pop()
        if inst.arg == 5:      # INTRINSIC_UNARY_POSITIVE
            self.push(+v)
        elif inst.arg == 6:    # INTRINSIC_LIST_TO_TUPLE
            self.push(tuple(v))
        else:
            self.push(v)
            raise NotSteppable(f"CALL_INTRINSIC_1 {inst.arg}")

    def op_UNPACK_SEQUENCE(self, inst):
        items = list(self.pop())
        if len(items) != inst.arg:
            raise ValueError(f"expected {inst.arg} values to unpack, got {len(items)}")
        self.stack.extend(reversed(items))

    def op_UNPACK_EX(self, inst):
        before, after = inst.arg & 0xFF, inst.arg >> 8
        items = list(self.pop())
        if len(items) < before + after:
            raise ValueError(f"not enough values to unpack (expected at least {before + after}, got {len(items)})")
        middle = items[before:len(items) - after]
        parts = items[:before] + [middle] + items[len(items) - after:]
        self.stack.extend(reversed(parts))

    def op_FORMAT_VALUE(self, inst):
        spec = self.pop() if inst.arg & 4 else ""
        v = self.pop()
        conv = _CONVERSIONS[inst.arg & 3]
        if conv is not None:
            v = conv(v)
        self.push(format(v, spec))

    def op_CONVERT_VALUE(self, inst):  # 3.13+ f-strings: CONVERT_VALUE, FORMAT_SIMPLE, FORMAT_WITH_SPEC
        self.push(_CONVERSIONS[inst.arg](self.pop()))

    def op_FORMAT_SIMPLE(self, inst):
        v = self.pop()
        self.push(v if type(v) is str else format(v, ""))

    def op_FORMAT_WITH_SPEC(self, inst):
        spec = self.pop()
        self.push(format(self.pop(), spec))

    # ------------------------------------------------------------------ operators
    def op_BINARY_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(_BINARY[dis._nb_ops[inst.arg][1]](a, b))

    def op_COMPARE_OP(self, inst):
        b = self.pop()
        a = self.pop()
        op = inst.argval if isinstance(inst.argval, str) else dis.cmp_op[inst.arg >> V.compare_shift]
        r = _COMPARE[op](a, b)
        self.push(bool(r) if V.to_bool and inst.arg & 16 else r)  # 3.13: a TO_BOOL folded in

    def op_IS_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push((a is not b) if inst.arg else (a is b))

    def op_CONTAINS_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push((a not in b) if inst.arg else (a in b))

    def op_UNARY_NEGATIVE(self, inst): self.push(-self.pop())
    def op_UNARY_POSITIVE(self, inst): self.push(+self.pop())
    def op_UNARY_INVERT(self, inst): self.push(~self.pop())
    def op_UNARY_NOT(self, inst): self.push(not self.pop())
    def op_TO_BOOL(self, inst): self.push(bool(self.pop()))

    def op_GET_LEN(self, inst):
        self.push(len(self.stack[-1]))

    # ------------------------------------------------------------------ control flow
    def op_RETURN_VALUE(self, inst): self._return(self.pop())
    def op_RETURN_CONST(self, inst): self._return(inst.argval)

    def op_JUMP_FORWARD(self, inst): self.jump_to(inst)
    op_JUMP_BACKWARD = op_JUMP_FORWARD
    op_JUMP_BACKWARD_NO_INTERRUPT = op_JUMP_FORWARD

    def _pop_jump(self, inst, test):
        if test(self.pop()):
            self.jump_to(inst)

    def op_POP_JUMP_IF_TRUE(self, inst): self._pop_jump(inst, lambda v: bool(v))
    def op_POP_JUMP_IF_FALSE(self, inst): self._pop_jump(inst, lambda v: not v)
    def op_POP_JUMP_IF_NONE(self, inst): self._pop_jump(inst, lambda v: v is None)
    def op_POP_JUMP_IF_NOT_NONE(self, inst): self._pop_jump(inst, lambda v: v is not None)
    op_POP_JUMP_FORWARD_IF_TRUE = op_POP_JUMP_BACKWARD_IF_TRUE = op_POP_JUMP_IF_TRUE
    op_POP_JUMP_FORWARD_IF_FALSE = op_POP_JUMP_BACKWARD_IF_FALSE = op_POP_JUMP_IF_FALSE
    op_POP_JUMP_FORWARD_IF_NONE = op_POP_JUMP_BACKWARD_IF_NONE = op_POP_JUMP_IF_NONE
    op_POP_JUMP_FORWARD_IF_NOT_NONE = op_POP_JUMP_BACKWARD_IF_NOT_NONE = op_POP_JUMP_IF_NOT_NONE

    def op_JUMP_IF_TRUE_OR_POP(self, inst):
        if self.stack[-1]:
            self.jump_to(inst)
        else:
            self.pop()

    def op_JUMP_IF_FALSE_OR_POP(self, inst):
        if not self.stack[-1]:
            self.jump_to(inst)
        else:
            self.pop()

    def op_GET_ITER(self, inst):
        self.push(iter(self.pop()))

    def op_FOR_ITER(self, inst):
        try:
            self.push(next(self.stack[-1]))
        except StopIteration:
            self.pop()
            self.jump_to(inst)
            exit_ops = V.for_iter_exit  # 3.12+ pops the iterator and steps over the loop exit
            if exit_ops and self.instructions[self.pc].opname == exit_ops[0]:
                self.pc += len(exit_ops)

    def op_RAISE_VARARGS(self, inst):
        if inst.arg == 0:
            if self.handled_exc is None:
                raise RuntimeError("No active exception to reraise")
            raise self.handled_exc
        cause = self.pop() if inst.arg == 2 else None
        exc = self.pop()
        if inst.arg == 2:
            raise exc from cause
        raise exc

    # ------------------------------------------------------------------ exception handlers, with
    def op_PUSH_EXC_INFO(self, inst):
        exc = self.pop()
        self.push(self.handled_exc)
        self.push(exc)
        self.handled_exc = exc

    def op_POP_EXCEPT(self, inst):
        self.handled_exc = self.pop()

    def op_CHECK_EXC_MATCH(self, inst):
        match = self.pop()
        self.push(isinstance(self.stack[-1], match))

    def op_RERAISE(self, inst):
        exc = self.pop()
        if inst.arg:
            self.pop()  # the saved lasti
        raise exc

    def op_BEFORE_WITH(self, inst):
        mgr = self.pop()
        enter, exit_ = type(mgr).__enter__, type(mgr).__exit__
        self.push(types.MethodType(exit_, mgr))
        self.push(enter(mgr))

    def op_WITH_EXCEPT_START(self, inst):
        exc = self.stack[-1]
        exit_fn = self.stack[-4]
        self.push(exit_fn(type(exc), exc, exc.__traceback__))

    # ------------------------------------------------------------------ calls and functions
    def op_KW_NAMES(self, inst):
        self.kw_names = tuple(inst.argval)

    def op_CALL(self, inst):
        args = self.popn(inst.arg)
        fn, self_obj = split_call(self.popn(2), lambda v: v is NULL)
        if self_obj is not None:
            args = [self_obj] + args
        kw, self.kw_names = self.kw_names, ()
        kwargs = {}
        if kw:
            kwargs = dict(zip(kw, args[len(args) - len(kw):]))
            args = args[:len(args) - len(kw)]
        self.push(self.call(fn, args, kwargs))

    def op_CALL_KW(self, inst):  # 3.13+: the keyword names are a tuple pushed last
        self.kw_names = tuple(self.pop())
        self.op_CALL(inst)

    def op_CALL_FUNCTION_EX(self, inst):
        kwargs = self.pop() if inst.arg & 1 else {}
        args = self.pop()
        fn, self_obj = split_call(self.popn(2), lambda v: v is NULL)
        if self_obj is not None:  # not emitted by CPython's compiler; keep the slot as found
            self.push(fn)
            fn = self_obj
        self.push(self.call(fn, list(args), dict(kwargs)))

    def op_MAKE_FUNCTION(self, inst):
        code = self.pop()
        # empty cells until the closure is set (a function of free variables needs one)
        f = types.FunctionType(code, self.globals, code.co_name, None,
                               tuple(types.CellType() for _ in code.co_freevars) or None)
        f.__qualname__ = code.co_qualname
        if V.make_function == "oparg":  # the attributes sit below the code object
            for flag in (0x08, 0x04, 0x02, 0x01):
                if inst.arg & flag:
                    f = _set_function_attribute(f, flag, self.pop())
        self.push(f)

    def op_SET_FUNCTION_ATTRIBUTE(self, inst):  # 3.13+: [attribute, function] -> function
        f = self.pop()
        self.push(_set_function_attribute(f, inst.arg, self.pop()))


def _set_function_attribute(f: types.FunctionType, flag: int, value) -> types.FunctionType:
    if flag == 0x08:  # a closure can only be given at creation
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, value)
        g.__qualname__, g.__kwdefaults__, g.__annotations__ = f.__qualname__, f.__kwdefaults__, f.__annotations__
        return g
    if flag == 0x04:
        f.__annotations__ = dict(zip(value[::2], value[1::2])) if isinstance(value, tuple) else value
    elif flag == 0x02:
        f.__kwdefaults__ = value
    elif flag == 0x01:
        f.__defaults__ = value
    return f


_HANDLED = frozenset(name[3:] for name in dir(EvalFrame) if name.startswith("op_"))


def check_supported(code: types.CodeType, instructions=None) -> None:
    """Raise NotSteppable when `code` uses something the evaluator does not model."""
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                        inspect.CO_ITERABLE_COROUTINE):
        raise NotSteppable("generators and coroutines run for real")
    for inst in instructions if instructions is not None else decode(code):
        if inst.opname not in _HANDLED:
            raise NotSteppable(f"opcode {inst.opname} at offset {inst.offset} is not modelled")
