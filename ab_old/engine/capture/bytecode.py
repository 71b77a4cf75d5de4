"""Decode and assemble CPython bytecode (the versions pyversion.py has a table for).

`decode(code)` turns a code object into a list of `Instruction`s: no CACHE entries,
EXTENDED_ARG folded into the argument, jump targets and exception-table handlers
resolved to Instruction objects (so they survive insertions and re-assembly).
`assemble(instructions, template=code, **fields)` does the reverse: it lays the
instructions out (EXTENDED_ARG where an argument needs it, inline CACHE entries, relative
jump arguments), rebuilds the name/const/local tables from each instruction's `argval`,
and writes the 3.11+ location table, exception table and stack size. Unmodified input
re-assembles to the same co_code, co_linetable and co_exceptiontable.

`format_code` is the one listing renderer (TORCH_LOGS=bytecode, traces, the bytecode step
debugger): offset, line, opname, argument and the region label set by the code generator.
What differs between Python versions is read from `pyversion.V` (one table per
version), never from `sys.version_info`. On 3.13 the fused two-local instructions
(LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST, STORE_FAST_STORE_FAST) decode as one
Instruction whose `argval` is the pair of names, and a LOAD_FAST that pushes a cell (to
build a closure) decodes as LOAD_CLOSURE, which assembles back to that LOAD_FAST.
Nothing here imports torch.
"""

from __future__ import annotations

import bisect
import dis
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .pyversion import V

# Kept for old callers (tests): the engine reads the table `V`, not these.
PY311 = V.version == (3, 11)
PY312 = V.version >= (3, 12)

_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_HASJREL = frozenset(dis.hasjrel)
_HASCONST = frozenset(dis.hasconst)
_HASNAME = frozenset(dis.hasname)
_HASLOCAL = frozenset(dis.haslocal)
_HASFREE = frozenset(dis.hasfree)
# Opcodes that take an argument (3.13 has argument-less opcodes above HAVE_ARGUMENT).
_HASARG = frozenset(getattr(dis, "hasarg", range(dis.HAVE_ARGUMENT, 256)))

# Instructions after which control never falls through to the next one.
_TERMINAL = frozenset(
    op for op in ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE",
                  "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT",
                  "INTERPRETER_EXIT", "JUMP")
)
# Names an instruction may carry that the code generator resolves at assembly time:
# "JUMP" becomes JUMP_FORWARD/JUMP_BACKWARD; on 3.11 "POP_JUMP_IF_X" becomes the
# FORWARD/BACKWARD variant that matches where the target ends up.
_VIRTUAL_JUMPS = frozenset(
    {"JUMP", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE"}
)

# How many low bits of a name-index argument are flags (NULL push, method load, ...).
_NAME_FLAG_BITS = V.name_flag_bits
# Two-local superinstructions (3.13+): opname -> the two plain instructions it does.
FUSED_LOCAL_OPS = V.fused_local_ops
# The pseudo-instruction LOAD_CLOSURE becomes this real one (3.13: LOAD_FAST of the cell's slot).
_CLOSURE_LOAD = V.closure_load

REGIONS = ("prologue", "call_graph", "store_outputs", "side_effects", "graph_break",
           "resume_call", "original")


class AssemblyError(ValueError):
    """The instruction list cannot be laid out as valid bytecode (a bug in its producer)."""


def cache_entries(opname_or_code: str | int) -> int:
    """Inline CACHE code units that follow this opcode on the running interpreter."""
    op = opname_or_code if isinstance(opname_or_code, int) else dis.opmap[opname_or_code]
    entries = dis._inline_cache_entries
    if isinstance(entries, dict):  # 3.13+ keys by name
        return entries.get(dis.opname[op], 0)
    return entries[op]


@dataclass(eq=False)
class ExnTabEntry:
    """One 3.11+ exception-table entry: instructions that share this object (identity)
    and are adjacent form one protected range."""

    target: "Instruction"
    depth: int
    lasti: bool

    def __repr__(self) -> str:
        return f"ExnTabEntry(target@{self.target.offset}, depth={self.depth}, lasti={self.lasti})"


@dataclass(eq=False)
class Instruction:
    """One bytecode instruction. Equality is identity: jump targets point at objects.

    For name/const/local/free opcodes `argval` is authoritative and `arg` is recomputed
    at assembly; `flags` holds the low bits packed into a name argument (LOAD_GLOBAL's
    push-NULL bit; on 3.12 LOAD_ATTR's method bit and LOAD_SUPER_ATTR's two bits)."""

    opname: str
    arg: int | None = None
    argval: Any = None
    offset: int | None = None  # offset in the code it was decoded from; None when new
    lineno: int | None = None
    target: "Instruction | None" = None
    region: str | None = None
    exn_tab_entry: ExnTabEntry | None = None
    positions: Any = None  # dis.Positions of the original, kept for exact location tables
    starts_line: bool = False
    flags: int = 0
    argrepr: str = ""

    @property
    def opcode(self) -> int:
        return _resolve_opcode(self.opname, backward=False)

    @property
    def push_null(self) -> bool:
        return self.opname == "LOAD_GLOBAL" and bool(self.flags & 1)

    @property
    def is_method_load(self) -> bool:
        return self.opname == "LOAD_METHOD" or (V.method_load == "LOAD_ATTR" and self.opname == "LOAD_ATTR"
                                                 and bool(self.flags & 1))

    def is_jump(self) -> bool:
        return self.opname in _VIRTUAL_JUMPS or self.opcode in _HASJREL

    def copy(self, **changes) -> "Instruction":
        new = Instruction(**{f: getattr(self, f) for f in self.__dataclass_fields__})
        for k, v in changes.items():
            setattr(new, k, v)
        return new

    def __repr__(self) -> str:
        tgt = f", target@{self.target.offset if self.target.offset is not None else id(self.target)}" if self.target else ""
        return (f"Instruction({self.opname}, arg={self.arg}, argval={_short_repr(self.argval)}, "
                f"offset={self.offset}, line={self.lineno}{tgt}, region={self.region})")


def create_instruction(opname: str, *, arg: int | None = None, argval: Any = None,
                       target: Instruction | None = None, push_null: bool = False,
                       method: bool = False, lineno: int | None = None,
                       region: str | None = None) -> Instruction:
    """A new instruction (offset None). `argval` gives names/consts/locals; `arg` only for
    opcodes whose argument is a plain number (BUILD_TUPLE, CALL, BINARY_OP, ...)."""
    flags = 0
    if push_null:
        if opname != "LOAD_GLOBAL":
            raise ValueError("push_null only applies to LOAD_GLOBAL")
        flags |= 1
    if method:
        if not (V.method_load == "LOAD_ATTR" and opname == "LOAD_ATTR"):
            raise ValueError(f"method=True is LOAD_ATTR's flag on 3.12+ (on {V.name} use {V.method_load})")
        flags |= 1
    if arg is None and isinstance(argval, int) and not isinstance(argval, bool) and \
            _uses_plain_arg(opname):
        arg = argval
    if argval is None and arg is not None and _uses_plain_arg(opname):
        argval = arg
    return Instruction(opname=opname, arg=arg, argval=argval, target=target, flags=flags,
                       lineno=lineno, region=region)


def _uses_plain_arg(opname: str) -> bool:
    if opname in _VIRTUAL_JUMPS:
        return False
    op = dis.opmap[opname]
    return op in _HASARG and op not in _HASCONST | _HASNAME | _HASLOCAL | _HASFREE | _HASJREL


def _resolve_opcode(opname: str, backward: bool) -> int:
    return dis.opmap[_resolve_opname(opname, backward)]


def _resolve_opname(opname: str, backward: bool) -> str:
    """Pick the concrete jump opcode for a target that lies before (backward) or after."""
    if opname in ("JUMP", "JUMP_FORWARD", "JUMP_BACKWARD"):
        return "JUMP_BACKWARD" if backward else "JUMP_FORWARD"
    if opname.startswith("POP_JUMP_"):
        cond = opname.split("_IF_", 1)[1]
        if V.directional_cond_jumps:
            return f"POP_JUMP_{'BACKWARD' if backward else 'FORWARD'}_IF_{cond}"
        if backward:
            raise AssemblyError(f"{opname} cannot jump backward on Python {V.name} "
                                "(BytecodeBuilder.jump_if_* rewrites such jumps)")
        return f"POP_JUMP_IF_{cond}"
    if opname == "JUMP_BACKWARD_NO_INTERRUPT" and not backward:
        raise AssemblyError("JUMP_BACKWARD_NO_INTERRUPT needs a target before it")
    if opname in ("FOR_ITER", "SEND", "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP") and backward:
        raise AssemblyError(f"{opname} can only jump forward")
    return opname


def retarget(copies: Sequence["Instruction"], copy_of) -> None:
    """Point the jump targets and exception-table handlers of copied instructions at the
    copies (`copy_of(original) -> copy`), one new entry per original entry."""
    entries: dict = {}
    for new in copies:
        if new.target is not None:
            new.target = copy_of(new.target)
        e = new.exn_tab_entry
        if e is not None:
            if id(e) not in entries:
                entries[id(e)] = type(e)(copy_of(e.target), e.depth, e.lasti)
            new.exn_tab_entry = entries[id(e)]


# --------------------------------------------------------------------------- decode


def _parse_exception_table(code: types.CodeType) -> list[tuple[int, int, int, int, bool]]:
    """(start, end, target, depth, lasti) in byte offsets, end exclusive."""
    table = code.co_exceptiontable
    out, i = [], 0

    def varint() -> int:
        nonlocal i
        b = table[i]
        i += 1
        val = b & 63
        while b & 64:
            b = table[i]
            i += 1
            val = (val << 6) | (b & 63)
        return val

    while i < len(table):
        start = varint() * 2
        length = varint() * 2
        target = varint() * 2
        dl = varint()
        out.append((start, start + length, target, dl >> 1, bool(dl & 1)))
    return out


def decode(code: types.CodeType) -> list[Instruction]:
    """The instructions of `code`, CACHEs dropped, EXTENDED_ARG folded, targets resolved."""
    insts: list[Instruction] = []
    by_offset: dict[int, Instruction] = {}
    pending: list[int] = []  # offsets of EXTENDED_ARG prefixes that belong to the next op
    jump_offsets: list[tuple[Instruction, int]] = []
    for d in dis.get_instructions(code):
        if d.opname == "EXTENDED_ARG":
            pending.append(d.offset)
            continue
        if d.opname == "CACHE":
            continue
        pos = d.positions
        inst = Instruction(
            opname=d.opname, arg=d.arg, argval=d.argval, offset=d.offset,
            lineno=pos.lineno if pos is not None else d.starts_line,
            positions=pos, starts_line=d.starts_line is not None and d.starts_line is not False,
            argrepr=d.argrepr,
        )
        if d.opcode in _HASCONST:  # 3.11's dis leaves KW_NAMES' tuple as <unknown>
            inst.argval = code.co_consts[d.arg]
        if _CLOSURE_LOAD != "LOAD_CLOSURE" and d.opname == _CLOSURE_LOAD and \
                (d.argval in code.co_cellvars or d.argval in code.co_freevars):
            inst.opname = "LOAD_CLOSURE"  # pushes the cell itself (3.13's closure building)
        elif d.opname in FUSED_LOCAL_OPS:
            inst.argval = tuple(d.argval)
        bits = _NAME_FLAG_BITS.get(d.opname)
        if bits:
            inst.flags = d.arg & ((1 << bits) - 1)
        if d.opcode in _HASJREL:
            jump_offsets.append((inst, d.argval))
        for o in pending:
            by_offset[o] = inst
        pending.clear()
        by_offset[d.offset] = inst
        insts.append(inst)
    for inst, target in jump_offsets:
        inst.target = by_offset[target]
    offsets = [inst.offset for inst in insts]
    for start, end, target, depth, lasti in _parse_exception_table(code):
        entry = ExnTabEntry(by_offset[target], depth, lasti)
        for k in range(bisect.bisect_left(offsets, start), bisect.bisect_left(offsets, end)):
            insts[k].exn_tab_entry = entry
    return insts


def offset_map(code_or_instructions) -> dict[int, Instruction]:
    """Every byte offset of an instruction (its EXTENDED_ARG prefix and CACHEs included)
    -> the Instruction decoded there, so a frame's f_lasti or a dis offset finds it."""
    insts = decode(code_or_instructions) if isinstance(code_or_instructions, types.CodeType) \
        else list(code_or_instructions)
    out: dict[int, Instruction] = {}
    for i, inst in enumerate(insts):
        out[inst.offset] = inst
        end = insts[i + 1].offset if i + 1 < len(insts) else inst.offset + 2 * (1 + cache_entries(inst.opname))
        o = inst.offset + 2
        while o < end and o < inst.offset + 2 * (1 + cache_entries(inst.opname)):
            out.setdefault(o, inst)  # CACHE entries
            o += 2
    # EXTENDED_ARG prefixes: the gap before an instruction that no one else claims
    prev_end = 0
    for inst in insts:
        for o in range(prev_end, inst.offset, 2):
            out.setdefault(o, inst)
        prev_end = inst.offset + 2 * (1 + cache_entries(inst.opname))
    return out


# --------------------------------------------------------------------------- assemble


def _const_key(v: Any):
    """Constants are shared only when they are the same object or equal of the same
    type (1, 1.0, True and -0.0/0.0 stay distinct)."""
    t = type(v)
    if t in (float, complex):
        return (t, repr(v))
    if t is tuple:
        return (t, tuple(_const_key(x) for x in v))
    if t is frozenset:
        return (t, frozenset(_const_key(x) for x in v))
    if t in (int, str, bytes, bool, type(None), type(Ellipsis)):
        return (t, v)
    return ("id", id(v))


class _Tables:
    def __init__(self, consts, names, varnames, cellvars, freevars):
        self.consts = list(consts)
        self.names = list(names)
        self.varnames = list(varnames)
        self.cellvars = tuple(cellvars)
        self.freevars = tuple(freevars)
        self._const_ids = {}
        self._const_keys = {}
        for i, c in enumerate(self.consts):
            self._const_ids.setdefault(id(c), i)
            self._const_keys.setdefault(_const_key(c), i)
        self._name_idx = {}
        for i, n in enumerate(self.names):
            self._name_idx.setdefault(n, i)

    def const(self, v) -> int:
        i = self._const_ids.get(id(v))
        if i is not None and self.consts[i] is v:
            return i
        key = _const_key(v)
        i = self._const_keys.get(key)
        if i is None:
            i = len(self.consts)
            self.consts.append(v)
            self._const_keys[key] = i
            self._const_ids[id(v)] = i
        return i

    def name(self, n: str) -> int:
        i = self._name_idx.get(n)
        if i is None:
            i = self._name_idx[n] = len(self.names)
            self.names.append(n)
        return i

    def local(self, n: str) -> int:
        if not isinstance(n, str):
            raise AssemblyError(f"local variable name must be a str, got {n!r}")
        if n in self.cellvars and n not in self.varnames:
            raise AssemblyError(f"{n!r} is a cell variable: use LOAD_DEREF/STORE_DEREF")
        try:
            return self.varnames.index(n)
        except ValueError:
            self.varnames.append(n)
            return len(self.varnames) - 1

    def localsplus(self) -> list[str]:
        # 3.11+ frame layout: locals, then cells that are not arguments/locals, then frees.
        return self.varnames + [c for c in self.cellvars if c not in self.varnames] + list(self.freevars)


def _varint_exn(out: bytearray, value: int, msb: int) -> None:
    # exception table varints: 6-bit groups, most significant first, 0x40 = more follows
    groups = []
    while True:
        groups.append(value & 63)
        value >>= 6
        if not value:
            break
    groups.reverse()
    for k, g in enumerate(groups):
        b = g | (64 if k < len(groups) - 1 else 0)
        if k == 0:
            b |= msb
        out.append(b)


def _varint_loc(out: bytearray, value: int) -> None:
    # location table varints: 6-bit groups, least significant first
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


def _svarint_loc(out: bytearray, value: int) -> None:
    _varint_loc(out, ((-value) << 1) | 1 if value < 0 else value << 1)


def _location(inst: Instruction):
    p = inst.positions
    if p is not None and p.lineno is not None and p.lineno == inst.lineno:
        return (p.lineno, p.end_lineno, p.col_offset, p.end_col_offset)
    if inst.lineno is None:
        return None
    return (inst.lineno, inst.lineno, None, None)


def _write_location(out: bytearray, loc, size: int, prev_line: int) -> int:
    """One entry (size <= 8 code units) in CPython's own choice of form; returns the new
    current line."""
    if loc is None:
        out.append(0x80 | (15 << 3) | (size - 1))
        return prev_line
    line, end_line, col, end_col = loc
    end_line = line if end_line is None else end_line
    delta = line - prev_line
    if col is None or end_col is None:
        if end_line == line:
            out.append(0x80 | (13 << 3) | (size - 1))
            _svarint_loc(out, delta)
            return line
        col = -1 if col is None else col
        end_col = -1 if end_col is None else end_col
    elif end_line == line:
        if delta == 0 and col < 80 and 0 <= end_col - col < 16:
            out.append(0x80 | ((col // 8) << 3) | (size - 1))
            out.append(((col % 8) << 4) | (end_col - col))
            return prev_line
        if 0 <= delta < 3 and col < 128 and end_col < 128:
            out.append(0x80 | ((10 + delta) << 3) | (size - 1))
            out.append(col)
            out.append(end_col)
            return line
    out.append(0x80 | (14 << 3) | (size - 1))
    _svarint_loc(out, delta)
    _varint_loc(out, end_line - line)
    _varint_loc(out, col + 1)
    _varint_loc(out, end_col + 1)
    return line


def _ext_count(arg: int) -> int:
    n = 0
    while arg > 0xFF:
        arg >>= 8
        n += 1
    return n


@dataclass
class Layout:
    """Where each instruction landed in the assembled code."""

    starts: list[int]       # byte offset of the first code unit (EXTENDED_ARG prefix included)
    op_offsets: list[int]   # byte offset of the opcode itself (what dis and f_lasti show)
    ends: list[int]         # byte offset after the instruction and its CACHE entries
    opnames: list[str]      # concrete opnames (virtual jumps resolved)
    args: list[int]


def assemble(instructions: Sequence[Instruction], *, template: types.CodeType,
             **code_fields) -> types.CodeType:
    """A code object running `instructions`. Fields (co_name, co_argcount, co_varnames,
    co_cellvars, co_freevars, co_consts, co_names, co_flags, co_firstlineno, co_qualname,
    ...; the co_ prefix is optional) default to the template's; consts, names and
    varnames are extended with whatever the instructions need."""
    return assemble_with_layout(instructions, template=template, **code_fields)[0]


def assemble_with_layout(instructions: Sequence[Instruction], *, template: types.CodeType,
                         **code_fields) -> tuple[types.CodeType, Layout]:
    fields = {(k if k.startswith("co_") else "co_" + k): v for k, v in code_fields.items()}
    insts = list(instructions)
    if not insts:
        raise AssemblyError("no instructions")
    tables = _Tables(
        fields.pop("co_consts", template.co_consts), fields.pop("co_names", template.co_names),
        fields.pop("co_varnames", template.co_varnames), fields.pop("co_cellvars", template.co_cellvars),
        fields.pop("co_freevars", template.co_freevars),
    )
    index = {id(inst): i for i, inst in enumerate(insts)}
    n = len(insts)
    opnames = [inst.opname for inst in insts]
    args = [0] * n
    is_jump = [False] * n
    target_idx = [-1] * n
    for i, inst in enumerate(insts):
        name = inst.opname
        if name in _VIRTUAL_JUMPS or dis.opmap.get(name, -1) in _HASJREL:
            if inst.target is None:
                raise AssemblyError(f"jump {name} at #{i} has no target")
            t = index.get(id(inst.target))
            if t is None:
                raise AssemblyError(f"jump {name} at #{i} targets an instruction not in the list: {inst.target!r}")
            is_jump[i], target_idx[i] = True, t
            continue
        if name not in dis.opmap:
            raise AssemblyError(f"unknown opcode {name!r}")
        op = dis.opmap[name]
        if name == "LOAD_CLOSURE":
            args[i] = -1  # a localsplus index, like a free variable's: filled in below
        elif name in FUSED_LOCAL_OPS:
            first, second = inst.argval
            i1, i2 = tables.local(first), tables.local(second)
            if i1 > 15 or i2 > 15:
                raise AssemblyError(f"{name} {inst.argval!r}: locals past the 16th cannot be fused "
                                    f"(split it into {' and '.join(FUSED_LOCAL_OPS[name])})")
            args[i] = (i1 << 4) | i2
        elif op in _HASCONST:
            args[i] = tables.const(inst.argval)
        elif op in _HASNAME:
            bits = _NAME_FLAG_BITS.get(name, 0)
            args[i] = (tables.name(inst.argval) << bits) | (inst.flags & ((1 << bits) - 1))
        elif op in _HASLOCAL:
            args[i] = tables.local(inst.argval)
        elif op in _HASFREE:
            args[i] = -1  # a localsplus index: filled in once varnames is final
        elif op in _HASARG:
            arg = inst.arg if inst.arg is not None else inst.argval
            if not isinstance(arg, int):
                raise AssemblyError(f"{name} at #{i} needs an integer arg, got {arg!r}")
            args[i] = arg
    _check_adjacency(insts)
    # Free/cell indices count past every local, so compute them once varnames is final.
    lp = tables.localsplus()
    for i, inst in enumerate(insts):
        if args[i] == -1 and (inst.opname == "LOAD_CLOSURE" or dis.opmap[inst.opname] in _HASFREE):
            try:
                args[i] = lp.index(inst.argval)
            except ValueError:
                raise AssemblyError(f"{inst.opname} {inst.argval!r}: not a cell or free variable "
                                    f"(cellvars={tables.cellvars}, freevars={tables.freevars})") from None

    caches = [0] * n
    ext = [0] * n
    for i in range(n):
        if not is_jump[i]:
            opnames[i] = _CLOSURE_LOAD if insts[i].opname == "LOAD_CLOSURE" else insts[i].opname
            caches[i] = cache_entries(opnames[i])
            ext[i] = _ext_count(args[i])
        else:
            opnames[i] = _resolve_opname(insts[i].opname, backward=False) if insts[i].opname != "JUMP_BACKWARD_NO_INTERRUPT" else insts[i].opname
            caches[i] = cache_entries(opnames[i])
    # Jump arguments depend on offsets which depend on EXTENDED_ARG counts: iterate to a
    # fixed point (counts only grow, so it terminates).
    while True:
        starts, off = [], 0
        for i in range(n):
            starts.append(off)
            off += 2 * (1 + ext[i] + caches[i])
        total = off
        changed = False
        for i in range(n):
            if not is_jump[i]:
                continue
            end = starts[i] + 2 * (1 + ext[i] + caches[i])
            tgt = starts[target_idx[i]]
            backward = tgt < end
            name = _resolve_opname(insts[i].opname, backward)
            opnames[i] = name
            caches_i = cache_entries(name)
            if caches_i != caches[i]:  # pragma: no cover - variants share cache sizes
                caches[i] = caches_i
                changed = True
            args[i] = (end - tgt) // 2 if backward else (tgt - end) // 2
            need = _ext_count(args[i])
            if need > ext[i]:
                ext[i] = need
                changed = True
        if not changed:
            break

    code = bytearray()
    op_offsets, ends = [], []
    for i in range(n):
        op = dis.opmap[opnames[i]]
        arg = args[i]
        for k in range(ext[i], 0, -1):
            code += bytes((_EXTENDED_ARG, (arg >> (8 * k)) & 0xFF))
        op_offsets.append(len(code))
        code += bytes((op, arg & 0xFF if op in _HASARG else 0))
        code += bytes(2 * caches[i])
        ends.append(len(code))
    assert len(code) == total

    # exception table: maximal runs of adjacent instructions sharing one entry object
    exn = bytearray()
    i = 0
    while i < n:
        entry = insts[i].exn_tab_entry
        if entry is None:
            i += 1
            continue
        j = i
        while j + 1 < n and insts[j + 1].exn_tab_entry is entry:
            j += 1
        t = index.get(id(entry.target))
        if t is None:
            raise AssemblyError(f"exception handler target not in the instruction list: {entry.target!r}")
        _varint_exn(exn, starts[i] // 2, 0x80)
        _varint_exn(exn, (ends[j] - starts[i]) // 2, 0)
        _varint_exn(exn, starts[t] // 2, 0)
        _varint_exn(exn, (entry.depth << 1) | int(entry.lasti), 0)
        i = j + 1

    firstlineno = fields.get("co_firstlineno", template.co_firstlineno)
    if firstlineno is None:
        firstlineno = template.co_firstlineno
    linetable = bytearray()
    prev_line = firstlineno
    i = 0
    while i < n:
        loc = _location(insts[i])
        j = i
        # 3.12+'s assembler merges equal adjacent locations into one entry; 3.11's writes
        # one entry per instruction. Doing the same keeps unmodified code byte-identical.
        while V.merge_equal_locations and j + 1 < n and _location(insts[j + 1]) == loc:
            j += 1
        size = (ends[j] - starts[i]) // 2
        while size > 8:
            prev_line = _write_location(linetable, loc, 8, prev_line)
            size -= 8
        prev_line = _write_location(linetable, loc, size, prev_line)
        i = j + 1

    layout = Layout(starts, op_offsets, ends, opnames, args)
    stacksize = _max_stack_depth(insts, layout, target_idx, index)

    replace = dict(
        co_code=bytes(code), co_consts=tuple(tables.consts), co_names=tuple(tables.names),
        co_varnames=tuple(tables.varnames), co_cellvars=tables.cellvars,
        co_freevars=tables.freevars, co_nlocals=len(tables.varnames),
        co_stacksize=stacksize, co_linetable=bytes(linetable),
        co_exceptiontable=bytes(exn), co_firstlineno=firstlineno,
    )
    for k, v in fields.items():
        if k in ("co_code", "co_linetable", "co_exceptiontable", "co_nlocals"):
            raise AssemblyError(f"{k} is computed by assemble, not given")
        replace[k] = v
    try:
        new = template.replace(**replace)
    except (TypeError, ValueError) as e:
        raise AssemblyError(f"invalid code fields: {e}") from e
    return new, layout


def _check_adjacency(insts: Sequence[Instruction]) -> None:
    """Pairs the specialising interpreter assumes are adjacent (it skips over the second)."""
    exit_ops = V.for_iter_exit
    pos = None
    for k, inst in enumerate(insts):
        if V.precall and inst.opname == "PRECALL":
            nxt = insts[k + 1] if k + 1 < len(insts) else None
            if nxt is None or nxt.opname != "CALL":
                raise AssemblyError(f"PRECALL at #{k} must be followed directly by CALL on {V.name}")
        if exit_ops and inst.opname == "FOR_ITER" and inst.target is not None:
            if pos is None:
                pos = {id(x): j for j, x in enumerate(insts)}
            t = pos.get(id(inst.target))
            found = tuple(x.opname for x in insts[t:t + len(exit_ops)]) if t is not None else ()
            if found != exit_ops:
                raise AssemblyError(f"FOR_ITER at #{k} must jump to {', '.join(exit_ops)} on {V.name} "
                                    f"(it targets {', '.join(found) or inst.target.opname})")


def _stack_effect(opname: str, arg: int, jump: bool) -> int:
    if opname == "RETURN_GENERATOR":
        return 1  # the frame resumes with the first sent value pushed (popped by POP_TOP)
    op = dis.opmap[opname]
    if op not in _HASARG:
        return dis.stack_effect(op, jump=jump)
    return dis.stack_effect(op, arg, jump=jump)


def _analyse_depths(insts, layout: Layout, target_idx, index) -> tuple[list[int | None], int]:
    n = len(insts)
    depths: list[int | None] = [None] * n
    maxd = 0
    work = [0]
    depths[0] = 0

    def reach(i: int, d: int, frm: int) -> None:
        nonlocal maxd
        if d < 0:
            raise AssemblyError(f"stack underflow after #{frm} {layout.opnames[frm]} (offset {layout.op_offsets[frm]})")
        if i >= n:
            raise AssemblyError(f"control falls off the end after #{frm} {layout.opnames[frm]}")
        maxd = max(maxd, d)
        if depths[i] is None:
            depths[i] = d
            work.append(i)
        elif depths[i] != d:
            raise AssemblyError(
                f"inconsistent stack depth at #{i} {layout.opnames[i]} (offset {layout.op_offsets[i]}): "
                f"{depths[i]} vs {d} from #{frm} {layout.opnames[frm]}")

    while work:
        i = work.pop()
        d = depths[i]
        name, arg = layout.opnames[i], layout.args[i]
        entry = insts[i].exn_tab_entry
        if entry is not None:
            reach(index[id(entry.target)], entry.depth + int(entry.lasti) + 1, i)
        if target_idx[i] >= 0:
            reach(target_idx[i], d + _stack_effect(name, arg, True), i)
        if name not in _TERMINAL:
            reach(i + 1, d + _stack_effect(name, arg, False), i)
    return depths, maxd


def _max_stack_depth(insts, layout, target_idx, index) -> int:
    return _analyse_depths(insts, layout, target_idx, index)[1]


def stack_depths(code: types.CodeType) -> dict[int, int]:
    """Value-stack depth before each reachable instruction, keyed by its offset."""
    insts = decode(code)
    _, layout = assemble_with_layout(insts, template=code)
    index = {id(inst): i for i, inst in enumerate(insts)}
    target_idx = [index[id(inst.target)] if inst.target is not None else -1 for inst in insts]
    depths, _ = _analyse_depths(insts, layout, target_idx, index)
    return {inst.offset: d for inst, d in zip(insts, depths) if d is not None}


# --------------------------------------------------------------------------- listing


def _short_repr(v: Any, limit: int = 60) -> str:
    if isinstance(v, types.CodeType):
        return f"<code {v.co_name}>"
    try:
        r = repr(v)
    except Exception:  # a user object with a broken __repr__ must not break a listing
        r = f"<{type(v).__name__} object>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _argrepr(inst: Instruction) -> str:
    if inst.target is not None:
        t = inst.target.offset
        return f"to {t}" if t is not None else "to <new>"
    name = inst.opname
    if name in dis.opmap:
        op = dis.opmap[name]
        if op in _HASCONST:
            return _short_repr(inst.argval)
        if op in _HASNAME:
            s = str(inst.argval)
            if inst.push_null:
                return f"{s} + NULL" if V.null_above_callable else f"NULL + {s}"
            if inst.is_method_load and inst.opname == "LOAD_ATTR":
                return f"{s} + NULL|self"
            return s
        if op in _HASLOCAL or op in _HASFREE:
            if isinstance(inst.argval, tuple):
                return ", ".join(map(str, inst.argval))
            return str(inst.argval)
    if inst.argrepr:
        return inst.argrepr
    if name == "BINARY_OP" and inst.arg is not None:
        return dis._nb_ops[inst.arg][1]
    if name == "COMPARE_OP" and isinstance(inst.argval, str):
        return inst.argval
    return ""


def format_instruction(inst: Instruction, *, regions: bool = True, current: bool = False,
                       is_target: bool = False) -> str:
    mark = "-->" if current else ("  >>" if is_target else "")
    line = "" if inst.lineno is None else str(inst.lineno)
    off = "" if inst.offset is None else str(inst.offset)
    arg = "" if inst.arg is None else str(inst.arg)
    text = f"{mark:>4} {line:>5} {off:>6} {inst.opname:<26} {arg:>5} {_argrepr(inst)}"
    if regions and inst.region:
        text = f"{text:<84} [{inst.region}]"
    return text.rstrip()


def format_code(obj, regions: bool = True, *, current_offset: int | None = None,
                labels: Iterable[tuple[int, int, str]] | None = None) -> str:
    """A dis-like listing: marker, line, offset, opname, arg, argument, [region].

    `obj` is a code object, a GeneratedCode (anything with `.instructions`) or a list of
    Instructions. `labels` ((start, end, label) offset ranges) label a plain code object;
    `current_offset` draws `-->` at the instruction about to run."""
    if isinstance(obj, types.CodeType):
        insts = decode(obj)
        header = f"{obj.co_qualname} ({obj.co_filename}:{obj.co_firstlineno})"
    elif hasattr(obj, "instructions"):
        insts = list(obj.instructions)
        header = getattr(obj, "name", "") or ""
    else:
        insts = list(obj)
        header = ""
    if labels is not None:
        labels = list(labels)
        insts = [inst.copy() for inst in insts]
        for inst in insts:
            if inst.offset is None:
                continue
            for start, end, label in labels:
                if start <= inst.offset < end:
                    inst.region = label
                    break
    targets = {id(i.target) for i in insts if i.target is not None}
    targets |= {id(i.exn_tab_entry.target) for i in insts if i.exn_tab_entry is not None}
    lines = [header] if header else []
    lines += [format_instruction(i, regions=regions,
                                 current=current_offset is not None and i.offset == current_offset,
                                 is_target=id(i) in targets) for i in insts]
    return "\n".join(lines)
