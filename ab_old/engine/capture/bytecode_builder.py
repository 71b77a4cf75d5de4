"""Emit the bytecode of a transformed frame, one labelled region at a time.

The symbolic interpreter describes the code it wants (call the compiled graph, store its
outputs, replay side effects, run the graph-break instruction, call the resume function)
through `BytecodeBuilder`; every instruction carries the region that was current when it
was emitted, and `build()` turns those into offset ranges of the final code object. The
bytecode step debugger and TORCH_LOGS=bytecode label instructions from these ranges.

Stack discipline for calls: a callable takes two slots, the callable and a NULL (or a
method and its self). Which side the NULL is on, and how a call with keywords is written,
depend on the Python version (pyversion.py): use these methods, not raw opcodes.

    b.load_global("f", push_null=True)    # NULL, f (3.11/3.12) or f, NULL (3.13)
    b.load_fast("x"); b.load_const(2)
    b.call(2)                             # f(x, 2)   3.11: PRECALL 2; CALL 2   3.12+: CALL 2
    b.load_fast("o"); b.load_method("m")  # m, o  (or the attribute and a NULL)
    b.load_fast("a"); b.load_const(1)
    b.call(2, kw_names=("k",))            # o.m(a, k=1): KW_NAMES + CALL, or the names + CALL_KW (3.13)
    b.push_callable_const(fn)             # fn with its NULL, on the right side, for call(n)
    b.null_before(); <load a callable>; b.null_after()   # the same for any callable

Labels:  `end = b.new_label(); b.jump_if_false(end); ...; b.place(end)`; a label marks
the next instruction emitted after `place`.
"""

from __future__ import annotations

import contextlib
import dis
import types
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from .bytecode import (FUSED_LOCAL_OPS, AssemblyError, Instruction, assemble_with_layout,
                       create_instruction, decode, format_code)
from .pyversion import V

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
_BINARY_OPS = {sym: i for i, (_, sym) in enumerate(dis._nb_ops)}
_COMPARE_ARGS: dict[str, int] = {}


def _compare_arg(op: str) -> int:
    """COMPARE_OP's argument as this interpreter's compiler writes it (3.12 packs a
    specialisation mask into the low bits), read off a compiled `a <op> b`."""
    if op not in _COMPARE_ARGS:
        if op not in dis.cmp_op:
            raise ValueError(f"unknown comparison {op!r}")
        code = compile(f"a {op} b", "<compare>", "eval")
        _COMPARE_ARGS[op] = next(i.arg for i in dis.get_instructions(code) if i.opname == "COMPARE_OP")
    return _COMPARE_ARGS[op]


class Label:
    """A jump destination; `BytecodeBuilder.place` binds it to the next instruction."""

    __slots__ = ("index", "name")

    def __init__(self, name: str = ""):
        self.index: int | None = None
        self.name = name

    def __repr__(self) -> str:
        return f"Label({self.name or id(self)}, index={self.index})"


@dataclass
class GeneratedCode:
    """The code object, its regions as (start, end, label) byte-offset ranges (end
    exclusive, CACHE entries included) and its instructions decoded from the final code
    with `region` set, so listings show real offsets and labels."""

    code: types.CodeType
    regions: list[tuple[int, int, str]]
    instructions: list[Instruction] = field(repr=False)
    name: str = ""

    def region_at(self, offset: int) -> str | None:
        for start, end, label in self.regions:
            if start <= offset < end:
                return label
        return None

    def format(self, current_offset: int | None = None) -> str:
        return format_code(self, current_offset=current_offset)


def split_fused_locals(insts: Sequence[Instruction]) -> list[Instruction]:
    """3.13's two-local superinstructions as the two plain ones (in place: the first half
    keeps the object, so jump targets and handlers still find it)."""
    out: list[Instruction] = []
    for inst in insts:
        pair = FUSED_LOCAL_OPS.get(inst.opname)
        if pair is None:
            out.append(inst)
            continue
        (op1, op2), (name1, name2) = pair, inst.argval
        inst.opname, inst.argval, inst.arg = op1, name1, None
        out.append(inst)
        out.append(inst.copy(opname=op2, argval=name2, offset=None, starts_line=False))
    return out


class BytecodeBuilder:
    def __init__(self, lineno: int | None = None):
        self.instructions: list[Instruction] = []
        self._region: str | None = None
        self.lineno = lineno
        self._labels: list[Label] = []

    # ------------------------------------------------------------------ bookkeeping
    @contextlib.contextmanager
    def region(self, label: str) -> Iterator[None]:
        saved = self._region
        self._region = label
        try:
            yield
        finally:
            self._region = saved

    @contextlib.contextmanager
    def line(self, lineno: int | None) -> Iterator[None]:
        """Instructions emitted inside carry this source line (tracebacks, listings)."""
        saved = self.lineno
        self.lineno = lineno
        try:
            yield
        finally:
            self.lineno = saved

    def add(self, inst: Instruction) -> Instruction:
        if inst.region is None:
            inst.region = self._region
        self.instructions.append(inst)
        return inst

    def emit(self, opname: str, arg: int | None = None, argval: Any = None, *,
             target: "Label | Instruction | None" = None, **kw) -> Instruction:
        inst = create_instruction(opname, arg=arg, argval=argval, lineno=self.lineno,
                                  region=self._region, **kw)
        inst.target = target  # a Label is resolved in build()
        return self.add(inst)

    def new_label(self, name: str = "") -> Label:
        label = Label(name)
        self._labels.append(label)
        return label

    def place(self, label: Label) -> None:
        if label.index is not None:
            raise ValueError(f"{label!r} placed twice")
        label.index = len(self.instructions)

    def append_original(self, inst: Instruction, *, target: "Label | Instruction | None" = None,
                        **changes) -> Instruction:
        """Copy an instruction of the original code (the unsupported CALL at a graph break,
        a POP_JUMP_IF with its target replaced by a label). It keeps its source position,
        drops its try-block membership, and takes the current region."""
        new = inst.copy(offset=None, region=self._region, exn_tab_entry=None, target=target, **changes)
        if inst.is_jump() and target is None:
            raise ValueError(f"{inst.opname}: give the copied jump a target (a Label)")
        return self.add(new)

    # ------------------------------------------------------------------ locals, consts, names
    def load_fast(self, name: str) -> Instruction:
        return self.emit("LOAD_FAST", argval=name)

    def store_fast(self, name: str) -> Instruction:
        return self.emit("STORE_FAST", argval=name)

    def delete_fast(self, name: str) -> Instruction:
        return self.emit("DELETE_FAST", argval=name)

    def load_deref(self, name: str) -> Instruction:
        return self.emit("LOAD_DEREF", argval=name)

    def store_deref(self, name: str) -> Instruction:
        return self.emit("STORE_DEREF", argval=name)

    def load_closure(self, name: str) -> Instruction:
        return self.emit("LOAD_CLOSURE", argval=name)

    def load_const(self, value: Any) -> Instruction:
        return self.emit("LOAD_CONST", argval=value)

    def load_global(self, name: str, push_null: bool = False) -> Instruction:
        return self.emit("LOAD_GLOBAL", argval=name, push_null=push_null)

    def push_callable_global(self, name: str) -> Instruction:
        """NULL + the global `name`, ready for its arguments and `call(n)`."""
        return self.load_global(name, push_null=True)

    def push_callable_const(self, fn: Any) -> Instruction:
        """A constant callable (a compiled graph, a helper) and its NULL, for `call(n)`."""
        if V.null_above_callable:
            inst = self.load_const(fn)
            self.push_null()
            return inst
        self.push_null()
        return self.load_const(fn)

    def store_global(self, name: str) -> Instruction:
        return self.emit("STORE_GLOBAL", argval=name)

    def delete_global(self, name: str) -> Instruction:
        return self.emit("DELETE_GLOBAL", argval=name)

    def load_attr(self, name: str) -> Instruction:
        return self.emit("LOAD_ATTR", argval=name)

    def load_method(self, name: str) -> Instruction:
        """obj -> (method, obj) or (NULL, attr): the two slots `call(n)` expects."""
        if V.method_load == "LOAD_ATTR":
            return self.emit("LOAD_ATTR", argval=name, method=True)
        return self.emit(V.method_load, argval=name)

    def store_attr(self, name: str) -> Instruction:
        """Stack: value, obj -> (obj.name = value)."""
        return self.emit("STORE_ATTR", argval=name)

    def delete_attr(self, name: str) -> Instruction:
        return self.emit("DELETE_ATTR", argval=name)

    # ------------------------------------------------------------------ calls and functions
    def push_null(self) -> Instruction:
        """A raw PUSH_NULL: it belongs below the callable before 3.13, above it from 3.13
        (`push_callable_const` picks the side)."""
        return self.emit("PUSH_NULL")

    def null_before(self) -> None:
        """Around any code that loads a callable: `null_before(); <load it>; null_after()`
        puts its NULL on the side this Python wants (below before 3.13, above from 3.13)."""
        if not V.null_above_callable:
            self.push_null()

    def null_after(self) -> None:
        if V.null_above_callable:
            self.push_null()

    def call(self, nargs: int, kw_names: Sequence[str] | None = None) -> Instruction:
        """Call with the callable's two slots and `nargs` arguments on the stack
        (`nargs` counts keyword arguments too; their names, last ones, in `kw_names`)."""
        if kw_names and V.kw_call == "CALL_KW":
            self.load_const(tuple(kw_names))
            return self.emit("CALL_KW", nargs)
        if kw_names:
            self.emit("KW_NAMES", argval=tuple(kw_names))
        if V.precall:
            self.emit("PRECALL", nargs)
        return self.emit("CALL", nargs)

    def call_function_ex(self, has_kwargs: bool) -> Instruction:
        """Stack: NULL, callable, args tuple[, kwargs dict]."""
        return self.emit("CALL_FUNCTION_EX", int(has_kwargs))

    def make_function(self, code: types.CodeType, closure_names: Sequence[str] = ()) -> Instruction:
        """Push a new function for `code`; its closure is built from this frame's cells
        and free variables named `closure_names` (in `code.co_freevars` order)."""
        flags = 0
        if closure_names:
            for n in closure_names:
                self.load_closure(n)
            self.build_tuple(len(closure_names))
            flags |= 0x08
        self.load_const(code)
        if V.make_function == "SET_FUNCTION_ATTRIBUTE":
            inst = self.emit("MAKE_FUNCTION")
            if flags:
                self.emit("SET_FUNCTION_ATTRIBUTE", flags)
            return inst
        return self.emit("MAKE_FUNCTION", flags)

    def make_resume_function(self, resume) -> Instruction:
        """Push the function of a `resume.ResumeCode`, sharing this frame's cells."""
        return self.make_function(resume.code, resume.code.co_freevars)

    # ------------------------------------------------------------------ containers and ops
    def build_tuple(self, n: int) -> Instruction:
        return self.emit("BUILD_TUPLE", n)

    def build_list(self, n: int) -> Instruction:
        return self.emit("BUILD_LIST", n)

    def build_set(self, n: int) -> Instruction:
        return self.emit("BUILD_SET", n)

    def build_map(self, n: int) -> Instruction:
        """n key/value pairs: k0, v0, k1, v1, ..."""
        return self.emit("BUILD_MAP", n)

    build_dict = build_map

    def build_const_key_map(self, n: int) -> Instruction:
        """n values then a tuple of n keys."""
        return self.emit("BUILD_CONST_KEY_MAP", n)

    def build_slice(self, n: int) -> Instruction:
        return self.emit("BUILD_SLICE", n)

    def list_extend(self, i: int = 1) -> Instruction:
        return self.emit("LIST_EXTEND", i)

    def list_append(self, i: int = 1) -> Instruction:
        return self.emit("LIST_APPEND", i)

    def dict_update(self, i: int = 1) -> Instruction:
        return self.emit("DICT_UPDATE", i)

    def unpack_sequence(self, n: int) -> Instruction:
        """TOS iterable -> n values, the first on top."""
        return self.emit("UNPACK_SEQUENCE", n)

    def binary_subscr(self) -> Instruction:
        return self.emit("BINARY_SUBSCR")

    def store_subscr(self) -> Instruction:
        """Stack: value, container, key -> (container[key] = value)."""
        return self.emit("STORE_SUBSCR")

    def delete_subscr(self) -> Instruction:
        return self.emit("DELETE_SUBSCR")

    def binary_op(self, op: str) -> Instruction:
        """`op` as written in Python: "+", "*", "//", "+=" (in-place), ..."""
        if op not in _BINARY_OPS:
            raise ValueError(f"unknown binary operator {op!r}")
        return self.emit("BINARY_OP", _BINARY_OPS[op])

    def compare_op(self, op: str) -> Instruction:
        return self.emit("COMPARE_OP", _compare_arg(op))

    def is_op(self, invert: bool = False) -> Instruction:
        return self.emit("IS_OP", int(invert))

    def contains_op(self, invert: bool = False) -> Instruction:
        return self.emit("CONTAINS_OP", int(invert))

    def get_iter(self) -> Instruction:
        return self.emit("GET_ITER")

    # ------------------------------------------------------------------ stack shuffles
    def pop_top(self) -> Instruction:
        return self.emit("POP_TOP")

    def copy(self, n: int = 1) -> Instruction:
        """Push a copy of the n-th item (1 = top)."""
        return self.emit("COPY", n)

    dup_top = copy

    def swap(self, n: int) -> Instruction:
        return self.emit("SWAP", n)

    def rot_n(self, n: int) -> None:
        """Move the top item down to position n (the old ROT_N), with SWAPs."""
        for i in range(n, 1, -1):
            self.swap(i)

    def nop(self) -> Instruction:
        return self.emit("NOP")

    # ------------------------------------------------------------------ control flow
    def return_value(self) -> Instruction:
        return self.emit("RETURN_VALUE")

    def return_const(self, value: Any) -> Instruction:
        if V.return_const:
            return self.emit("RETURN_CONST", argval=value)
        self.load_const(value)
        return self.return_value()

    def raise_varargs(self, n: int = 1) -> Instruction:
        return self.emit("RAISE_VARARGS", n)

    def jump(self, label: Label) -> Instruction:
        return self.emit("JUMP", target=label)

    def _cond_jump(self, cond: str, label: Label) -> Instruction:
        if V.to_bool and cond in ("FALSE", "TRUE"):
            self.emit("TO_BOOL")  # 3.13+: the jump itself reads only an exact bool
        if not V.directional_cond_jumps and label.index is not None:
            # 3.12+'s conditional jumps only go forward: skip over a JUMP_BACKWARD instead
            inverse = {"FALSE": "TRUE", "TRUE": "FALSE", "NONE": "NOT_NONE", "NOT_NONE": "NONE"}[cond]
            skip = self.new_label()
            inst = self.emit(f"POP_JUMP_IF_{inverse}", target=skip)
            self.jump(label)
            self.place(skip)
            return inst
        return self.emit(f"POP_JUMP_IF_{cond}", target=label)

    def jump_if_false(self, label: Label) -> Instruction:
        """Pop TOS; jump when false."""
        return self._cond_jump("FALSE", label)

    def jump_if_true(self, label: Label) -> Instruction:
        return self._cond_jump("TRUE", label)

    def jump_if_none(self, label: Label) -> Instruction:
        return self._cond_jump("NONE", label)

    def jump_if_not_none(self, label: Label) -> Instruction:
        return self._cond_jump("NOT_NONE", label)

    def for_iter(self, exhausted: Label) -> Instruction:
        """Iterator on TOS: push its next item, or jump to `exhausted` when done. On 3.12+
        the instructions at `exhausted` must be the loop exit (`b.end_for()`), on 3.11 any."""
        return self.emit("FOR_ITER", target=exhausted)

    def end_for(self) -> None:
        """The loop exit after FOR_ITER, which the exhausted jump steps over: 3.12 END_FOR,
        3.13 END_FOR + POP_TOP; 3.11's FOR_ITER pops the iterator itself, so nothing."""
        for op in V.for_iter_exit:
            self.emit(op)

    # ------------------------------------------------------------------ build
    def build(self, template: types.CodeType, name: str, argnames: Sequence[str] | None = None, *,
              qualname: str | None = None, firstlineno: int | None = None,
              cellvars: Sequence[str] | None = None, freevars: Sequence[str] | None = None,
              varnames: Sequence[str] = (), argcount: int | None = None,
              posonlyargcount: int | None = None, kwonlyargcount: int | None = None,
              flags: int | None = None, consts: Sequence[Any] | None = None) -> GeneratedCode:
        """Assemble the emitted instructions into a function body.

        Arguments default to the template's signature (so `argnames=None` keeps
        co_argcount, keyword-only and *args/**kwargs); a different `argnames` makes a
        plain positional signature. Cells and free variables default to the template's;
        a prologue (COPY_FREE_VARS, MAKE_CELL, RESUME) is emitted for them in region
        "prologue". On 3.12+ loads of non-argument locals become LOAD_FAST_CHECK, since a
        plain LOAD_FAST of an unbound local is undefined behaviour there (3.13's fused
        two-local instructions are split for that)."""
        tmpl_nargs = template.co_argcount + template.co_kwonlyargcount + \
            bool(template.co_flags & CO_VARARGS) + bool(template.co_flags & CO_VARKEYWORDS)
        tmpl_args = list(template.co_varnames[:tmpl_nargs])
        if argnames is None or list(argnames) == tmpl_args:
            argnames = tmpl_args
            sig = dict(co_argcount=template.co_argcount, co_posonlyargcount=template.co_posonlyargcount,
                       co_kwonlyargcount=template.co_kwonlyargcount, co_flags=template.co_flags)
        else:
            argnames = list(argnames)
            sig = dict(co_argcount=len(argnames), co_posonlyargcount=0, co_kwonlyargcount=0,
                       co_flags=template.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS))
        if argcount is not None:
            sig["co_argcount"] = argcount
        if posonlyargcount is not None:
            sig["co_posonlyargcount"] = posonlyargcount
        if kwonlyargcount is not None:
            sig["co_kwonlyargcount"] = kwonlyargcount
        if flags is not None:
            sig["co_flags"] = flags
        cellvars = tuple(template.co_cellvars if cellvars is None else cellvars)
        freevars = tuple(template.co_freevars if freevars is None else freevars)
        all_varnames = list(argnames)
        for v in list(varnames):
            if v not in all_varnames:
                all_varnames.append(v)

        prologue: list[Instruction] = []
        first_line = firstlineno if firstlineno is not None else template.co_firstlineno
        if freevars:
            prologue.append(create_instruction("COPY_FREE_VARS", arg=len(freevars), region="prologue"))
        for c in cellvars:
            prologue.append(create_instruction("MAKE_CELL", argval=c, region="prologue"))
        prologue.append(create_instruction("RESUME", arg=0, region="prologue", lineno=first_line))

        body = list(self.instructions)
        for inst in body:
            if isinstance(inst.target, Label):
                lab = inst.target
                if lab.index is None:
                    raise AssemblyError(f"{inst.opname} jumps to a label that was never placed: {lab!r}")
                if lab.index >= len(body):
                    raise AssemblyError(f"label {lab!r} placed after the last instruction")
                inst.target = body[lab.index]
        body = split_fused_locals(body)
        for inst in body:
            if not V.fast_load_checks_unbound and inst.opname == "LOAD_FAST" and inst.argval not in argnames:
                inst.opname = "LOAD_FAST_CHECK"
        insts = prologue + body
        code, layout = assemble_with_layout(
            insts, template=template, co_name=name, co_qualname=qualname or name,
            co_firstlineno=first_line, co_varnames=tuple(all_varnames),
            co_cellvars=cellvars, co_freevars=freevars,
            **({"co_consts": tuple(consts)} if consts is not None else {}), **sig)

        regions: list[tuple[int, int, str]] = []
        for inst, start, end in zip(insts, layout.starts, layout.ends):
            if inst.region is None:
                continue
            if regions and regions[-1][2] == inst.region and regions[-1][1] == start:
                regions[-1] = (regions[-1][0], end, inst.region)
            else:
                regions.append((start, end, inst.region))
        decoded = decode(code)
        by_op_offset = {off: inst.region for inst, off in zip(insts, layout.op_offsets)}
        for d in decoded:
            d.region = by_op_offset.get(d.offset)
        return GeneratedCode(code=code, regions=regions, instructions=decoded, name=name)
