"""Resume functions: continue a frame at a bytecode offset after a graph break.

`make_resume_code(code, offset, stack_depth, live_locals)` builds a code object whose
arguments are the value stack at `offset` (bottom first) and the live locals; called,
it behaves as the original frame continuing at `offset`. Its layout:

    COPY_FREE_VARS n          (when the original has cells or free variables)
    RESUME 0
    LOAD_FAST __stack0 ...    (PUSH_NULL for stack slots declared NULL)
    JUMP_FORWARD  -> the original instruction at `offset`
    <every original instruction, prologue dropped, exception table kept>

All original instructions are kept, so a break inside a loop can jump back to the loop
header (the `for` iterator arrives as a stack argument). Locals that are not passed are
unbound, exactly as if they had never been assigned.

Cells. The original's free variables *and* cell variables become the resume code's
`co_freevars` (original freevars first, then cellvars): the frame that calls the resume
function passes its own cell objects (LOAD_CLOSURE each name in `code.co_freevars`, then
MAKE_FUNCTION with a closure; `BytecodeBuilder.make_resume_function` emits exactly that),
so closures created before the break keep sharing variables with the code after it.
Cell variables are therefore never in `argnames`, even when listed in `live_locals`.

NULL on the stack (a break in the middle of a call's arguments): pass the NULL slots'
indices in `null_stack_indices`; the prologue pushes NULL there and no argument is taken.

Refused with ResumeUnsupported: generators and coroutines; offsets inside a try/with
block or an except handler (exception-table entry), and right after KW_NAMES.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Sequence

from .bytecode import (FUSED_LOCAL_OPS, Instruction, assemble_with_layout, create_instruction, decode,
                       offset_map, retarget, stack_depths)
from .bytecode_builder import split_fused_locals
from .pyversion import V

_REFUSED_FLAGS = {
    inspect.CO_GENERATOR: "generator",
    inspect.CO_COROUTINE: "coroutine",
    inspect.CO_ASYNC_GENERATOR: "async generator",
    inspect.CO_ITERABLE_COROUTINE: "iterable coroutine",
}
CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
CO_NESTED = 0x10
_PROLOGUE_OPS = ("COPY_FREE_VARS", "MAKE_CELL", "RESUME")


class ResumeUnsupported(Exception):
    """This frame cannot be resumed at this offset; the caller must run it eagerly."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ResumeCode:
    code: types.CodeType
    argnames: list[str]            # what a caller passes, in order: stack slots then locals
    name: str
    offset: int                    # offset in the original code where execution resumes
    stack_depth: int
    live_locals: list[str]         # the non-cell live locals, as passed
    closure_names: list[str] = field(default_factory=list)  # original cellvars, now free vars
    null_stack_indices: tuple[int, ...] = ()
    # (start, end, label) byte ranges: "prologue" (stack rebuild + jump), "original"
    regions: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def freevars(self) -> tuple[str, ...]:
        return self.code.co_freevars

    @property
    def instructions(self) -> list[Instruction]:
        """Decoded with region labels, so `format_code(resume)` labels the prologue."""
        insts = decode(self.code)
        for inst in insts:
            inst.region = next((lab for s, e, lab in self.regions if s <= inst.offset < e), None)
        return insts


_cache: dict[tuple, ResumeCode] = {}


def clear_cache() -> None:
    _cache.clear()


def make_resume_code(code: types.CodeType, offset: int, stack_depth: int,
                     live_locals: Sequence[str], *, name: str | None = None,
                     null_stack_indices: Sequence[int] = (), inside_handlers: bool = False) -> ResumeCode:
    """`inside_handlers=True`: the caller knows `offset` is inside with-blocks whose exit
    functions it passes on the stack (the kept exception table then runs them)."""
    key = (code, offset, stack_depth, tuple(live_locals), name, tuple(null_stack_indices), inside_handlers)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    resume = _make(code, offset, stack_depth, list(live_locals), name, tuple(sorted(null_stack_indices)),
                   inside_handlers)
    _cache[key] = resume
    return resume


def _make(code, offset, stack_depth, live_locals, name, nulls, inside_handlers=False) -> ResumeCode:
    for flag, what in _REFUSED_FLAGS.items():
        if code.co_flags & flag:
            raise ResumeUnsupported(f"cannot resume a {what} ({code.co_name}) after a graph break")
    insts = decode(code)
    where = offset_map(insts).get(offset)
    if where is None:
        raise ValueError(f"offset {offset} is not in {code.co_name} (size {len(code.co_code)})")
    if where.offset != offset:
        offset = where.offset  # an EXTENDED_ARG prefix: resume at its instruction
    at = f"{code.co_name} offset {offset} (line {where.lineno})"
    if where.exn_tab_entry is not None and not inside_handlers:
        raise ResumeUnsupported(f"{at} is inside a try/with block or exception handler; "
                                "resuming there would lose the active handler")
    pos = insts.index(where)
    if pos > 0 and insts[pos - 1].opname == "KW_NAMES":
        raise ResumeUnsupported(f"{at} is between KW_NAMES and its call")
    depth = stack_depths(code).get(offset)
    if depth is None:
        raise ValueError(f"{at} is unreachable in the original code")
    if depth != stack_depth:
        raise ValueError(f"{at}: the original stack holds {depth} values there, not {stack_depth}")
    if any(not 0 <= i < stack_depth for i in nulls):
        raise ValueError(f"null_stack_indices {nulls} out of range for depth {stack_depth}")
    cellvars = list(code.co_cellvars)
    freevars = list(code.co_freevars)
    for v in live_locals:
        if v not in code.co_varnames and v not in cellvars and v not in freevars:
            raise ValueError(f"{v!r} is not a local variable of {code.co_name}")
    plain_live = [v for v in live_locals if v not in cellvars and v not in freevars]
    argnames = [f"__stack{i}" for i in range(stack_depth) if i not in nulls] + plain_live
    varnames = argnames + [v for v in code.co_varnames if v not in argnames and v not in cellvars]
    new_freevars = freevars + cellvars
    if name is None:
        name = f"engine_resume_in_{code.co_name}_at_{where.lineno}"

    # copy the body, remapping jump targets and exception entries to the copies
    body_src = insts
    while body_src and body_src[0].opname in _PROLOGUE_OPS:
        body_src = body_src[1:]
    copies = {id(i): i.copy() for i in body_src}
    retarget(copies.values(), lambda inst: copies[id(inst)])
    if id(where) not in copies:
        raise ValueError(f"{at} is in the frame prologue ({where.opname}); nothing to resume yet")
    target = copies[id(where)]
    # 3.13's fused two-local loads do not check for unbound locals, and the arguments
    # put more locals before them (a fused index must stay below 16): split them.
    body = split_fused_locals([copies[id(i)] for i in body_src])
    for new in body:
        # 3.12+'s LOAD_FAST does not check for an unbound local; anything not passed may be
        if not V.fast_load_checks_unbound and new.opname == "LOAD_FAST" and new.argval not in argnames:
            new.opname = "LOAD_FAST_CHECK"

    prologue: list[Instruction] = []
    if new_freevars:
        prologue.append(create_instruction("COPY_FREE_VARS", arg=len(new_freevars), region="prologue"))
    prologue.append(create_instruction("RESUME", arg=0, region="prologue"))
    for i in range(stack_depth):
        if i in nulls:
            prologue.append(create_instruction("PUSH_NULL", region="prologue"))
        else:
            prologue.append(create_instruction("LOAD_FAST", argval=f"__stack{i}", region="prologue"))
    prologue.append(create_instruction("JUMP", target=target, region="prologue"))

    flags = code.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    if new_freevars:
        flags |= CO_NESTED
    for inst in body:
        inst.region = "original"
    insts = prologue + body
    new_code, layout = assemble_with_layout(
        insts, template=code, co_name=name, co_qualname=name,
        co_argcount=len(argnames), co_posonlyargcount=0, co_kwonlyargcount=0, co_flags=flags,
        co_varnames=tuple(varnames), co_cellvars=(), co_freevars=tuple(new_freevars),
    )
    return ResumeCode(code=new_code, argnames=argnames, name=name, offset=offset,
                      stack_depth=stack_depth, live_locals=plain_live,
                      closure_names=cellvars, null_stack_indices=nulls,
                      regions=[(0, layout.starts[len(prologue)], "prologue"),
                               (layout.starts[len(prologue)], layout.ends[-1], "original")])


def make_function(resume: ResumeCode, original_fn_or_globals: Any,
                  closure: tuple | None = None, *, cells: Sequence[Any] = ()) -> types.FunctionType:
    """A function running `resume.code`.

    `original_fn_or_globals`: the original function (its globals, and its __closure__
    for the original free variables) or a globals dict. `closure` overrides that
    __closure__ part; `cells` are the frame's cell objects for `resume.closure_names`
    (types.CellType), appended after it. Outside generated bytecode, a frame's cells are
    not reachable from Python, so a caller with cell variables should prefer
    `BytecodeBuilder.make_resume_function`."""
    if isinstance(original_fn_or_globals, types.FunctionType):
        globs = original_fn_or_globals.__globals__
        base = original_fn_or_globals.__closure__ or ()
    elif isinstance(original_fn_or_globals, dict):
        globs, base = original_fn_or_globals, ()
    else:
        raise TypeError("make_function needs the original function or a globals dict")
    if closure is not None:
        base = tuple(closure)
    full = tuple(base) + tuple(cells)
    if len(full) != len(resume.code.co_freevars):
        raise ValueError(f"{resume.name} needs {len(resume.code.co_freevars)} cells for "
                         f"{resume.code.co_freevars}, got {len(full)}")
    return types.FunctionType(resume.code, globs, resume.name, None, full or None)


def live_locals(code: types.CodeType, offset: int) -> list[str]:
    """Plain (non-cell) locals that may be read, before being written, on some path from
    `offset` (exception handlers included), in co_varnames order."""
    insts = decode(code)
    index = {id(i): k for k, i in enumerate(insts)}
    n = len(insts)
    succ: list[list[int]] = []
    reads: list[set] = []
    kills: list[set] = []
    terminal = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"}
    for k, inst in enumerate(insts):
        s = []
        if inst.opname not in terminal and k + 1 < n:
            s.append(k + 1)
        if inst.target is not None:
            s.append(index[id(inst.target)])
        if inst.exn_tab_entry is not None:
            s.append(index[id(inst.exn_tab_entry.target)])
        succ.append(s)
        r, w = set(), set()
        ops = FUSED_LOCAL_OPS.get(inst.opname)
        for op, name in zip(ops, inst.argval) if ops else [(inst.opname, inst.argval)]:
            if op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"):
                if name not in w:  # STORE_FAST_LOAD_FAST (q, q) reads what it just wrote
                    r.add(name)
            elif op == "STORE_FAST":
                w.add(name)
        reads.append(r)
        kills.append(w)
    live_in: list[set] = [set() for _ in range(n)]
    changed = True
    while changed:
        changed = False
        for k in range(n - 1, -1, -1):
            out = set()
            for s in succ[k]:
                out |= live_in[s]
            new = reads[k] | (out - kills[k])
            if new != live_in[k]:
                live_in[k] = new
                changed = True
    where = offset_map(insts)[offset]
    live = live_in[index[id(where)]]
    cells = set(code.co_cellvars)
    return [v for v in code.co_varnames if v in live and v not in cells]


# ---------------------------------------------------------------------- breaks at any instruction

# Instructions a graph break can split the frame after: each reads its operands from the
# stack only and pushes at most one value (a method load pushes [NULL, attribute]). Not
# GET_ITER: iter(it) can be the caller's own iterator, which a resume function must not
# take for its private loop iterator (builder.wrap_list_iterator).
# opname -> operands popped (None: from the argument, see _operands).
STEP_OPERANDS = {
    "LOAD_ATTR": 1, "LOAD_METHOD": 1, "BINARY_SUBSCR": 2, "BINARY_OP": 2, "COMPARE_OP": 2, "CONTAINS_OP": 2,
    "IS_OP": 2, "UNARY_NEGATIVE": 1, "UNARY_POSITIVE": 1, "UNARY_INVERT": 1, "UNARY_NOT": 1,
    "STORE_ATTR": 2, "STORE_SUBSCR": 3, "DELETE_SUBSCR": 2, "DELETE_ATTR": 1, "BINARY_SLICE": 3, "STORE_SLICE": 4,
    "BUILD_STRING": None, "FORMAT_VALUE": None, "LIST_TO_TUPLE": 1,
    # 3.13+: bool conversion before a jump or `not`, and f-string pieces
    "TO_BOOL": 1, "CONVERT_VALUE": 1, "FORMAT_SIMPLE": 1, "FORMAT_WITH_SPEC": 2,
}
_PUSHES_NOTHING = ("STORE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR", "DELETE_ATTR", "STORE_SLICE")
_STEP_FUNCTIONS: dict = {}


def step_operands(inst: Instruction) -> int:
    n = STEP_OPERANDS[inst.opname]
    if n is not None:
        return n
    if inst.opname == "BUILD_STRING":
        return inst.arg
    return 2 if inst.arg & 0x04 else 1  # FORMAT_VALUE with a format spec


def step_pushes(inst: Instruction) -> int:
    """Values the instruction leaves on the stack (a method load: NULL and the attribute)."""
    if inst.opname in _PUSHES_NOTHING:
        return 0
    return 2 if inst.is_method_load else 1


def step_function(inst: Instruction) -> types.FunctionType:
    """A function running just `inst` on its arguments (the operands, bottom first) and
    returning what it pushed (None when nothing; a method load returns the attribute).
    The generated code runs it eagerly at a graph break on that instruction."""
    key = (inst.opname, inst.arg, inst.argval if inst.opname != "LOAD_METHOD" else inst.argval, inst.flags)
    fn = _STEP_FUNCTIONS.get(key)
    if fn is not None:
        return fn
    n = step_operands(inst)
    names = tuple(f"a{i}" for i in range(n))
    body = [create_instruction("RESUME", arg=0)] + [create_instruction("LOAD_FAST", argval=a) for a in names]
    if inst.is_method_load:
        body.append(inst.copy(opname="LOAD_ATTR", flags=0, exn_tab_entry=None, target=None))
    else:
        body.append(inst.copy(exn_tab_entry=None, target=None))
    if inst.opname in _PUSHES_NOTHING:
        body.append(create_instruction("LOAD_CONST", argval=None))
    body.append(create_instruction("RETURN_VALUE"))
    template = (lambda: None).__code__
    name = f"engine_step_{inst.opname.lower()}"
    code = assemble_with_layout(body, template=template, co_name=name, co_qualname=name, co_argcount=n,
                                co_posonlyargcount=0, co_kwonlyargcount=0, co_varnames=names,
                                co_flags=template.co_flags & ~CO_NESTED, co_freevars=(), co_cellvars=(),
                                co_consts=(None,), co_names=())[0]
    fn = _STEP_FUNCTIONS[key] = types.FunctionType(code, {"__builtins__": __builtins__}, name)
    return fn
