"""What differs between the CPython versions the capture knows: one table per version.

Everything version-specific about bytecode lives here, as data: which opcodes exist, how
their arguments are laid out, where the NULL of a call sits, how a call, a keyword call,
a method load, a closure, a conditional jump and a loop exit are written. The decoder and
assembler (bytecode.py), the code builder (bytecode_builder.py), the symbolic interpreter
(interpreter.py), resume functions (resume.py), routed copies (routed.py), the frame
converter and the bytecode step debugger's evaluator read these fields; none of them
tests `sys.version_info`. Supporting a new Python is one more `PyVersion(...)` entry in
`TABLES` plus handlers for the opcodes it adds (docs/capture.md, "Adding a Python
version").

On a Python with no table the engine still imports (tlparse and observe need nothing of
this): `CURRENT` is None, `V` is the newest table (so listings keep working as far as
they can), and `require()` raises `UnsupportedPython` naming the version and the
supported ones; `engine.compile` calls it before the first compile.

Nothing here imports torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


class UnsupportedPython(RuntimeError):
    """The running CPython has no table here: the capture cannot read its bytecode."""


@dataclass(frozen=True)
class PyVersion:
    version: tuple[int, int]

    # ------------------------------------------------------------------ calls
    # Stack of a call: [callable, NULL|self, *args] when True (3.13+), else
    # [NULL|method, callable|self, *args]. LOAD_GLOBAL's NULL bit, PUSH_NULL and a method
    # load put the NULL on the matching side.
    null_above_callable: bool
    # PRECALL n directly before CALL n (3.11).
    precall: bool
    # How keyword names reach a call: "KW_NAMES" (an instruction with the names tuple,
    # then CALL n; 3.11, 3.12) or "CALL_KW" (the names tuple pushed last, then CALL_KW n).
    kw_call: str
    # obj -> (method, self) | (NULL, attr): "LOAD_METHOD" (3.11) or "LOAD_ATTR" with the
    # method bit set in its argument (3.12+).
    method_load: str
    # Low bits of a name argument that are flags: LOAD_GLOBAL's push-NULL bit, LOAD_ATTR's
    # method bit, LOAD_SUPER_ATTR's (method, two-argument) bits.
    name_flag_bits: dict

    # ------------------------------------------------------------------ functions
    # "oparg": MAKE_FUNCTION's argument says which of defaults, kwdefaults, annotations,
    # closure sit below the code object; "SET_FUNCTION_ATTRIBUTE": MAKE_FUNCTION takes the
    # code alone and each attribute is set after it (SET_FUNCTION_ATTRIBUTE flag, with the
    # attribute below the function).
    make_function: str
    # How a cell object is pushed (to build a closure tuple): "LOAD_CLOSURE" (a real
    # opcode), or "LOAD_FAST" of the cell's slot past the plain locals (3.13: LOAD_CLOSURE
    # is a pseudo-instruction). The decoder reads such a LOAD_FAST back as LOAD_CLOSURE.
    closure_load: str

    # ------------------------------------------------------------------ jumps
    # 3.11 spells conditional jumps POP_JUMP_FORWARD_IF_X / POP_JUMP_BACKWARD_IF_X; later
    # versions have POP_JUMP_IF_X going forward only.
    directional_cond_jumps: bool
    # A bool conversion (TO_BOOL) precedes conditional jumps and UNARY_NOT, which then
    # need an exact bool (3.13+).
    to_bool: bool
    # What FOR_ITER's target holds and the exhausted jump steps over: 3.11 nothing (it
    # pops the iterator itself), 3.12 END_FOR (the interpreter skips it), 3.13 END_FOR,
    # POP_TOP.
    for_iter_exit: tuple

    # ------------------------------------------------------------------ locals
    # LOAD_FAST checks for an unbound local (3.11). Later versions only check in
    # LOAD_FAST_CHECK: code that may read a local it never bound must use that.
    fast_load_checks_unbound: bool
    # Superinstructions over two locals (argval a pair of names; arg = i1 << 4 | i2, both
    # below 16) -> the two plain instructions they do.
    fused_local_ops: dict

    # ------------------------------------------------------------------ other opcodes
    return_const: bool              # RETURN_CONST exists (3.12+)
    compare_shift: int              # COMPARE_OP's arg >> compare_shift indexes dis.cmp_op
    # f-strings: "FORMAT_VALUE" (conversion and spec flags in its argument) or
    # "CONVERT_VALUE" (CONVERT_VALUE, FORMAT_SIMPLE, FORMAT_WITH_SPEC; 3.13+).
    format_ops: str
    # The location table merges adjacent instructions with equal locations (3.12+).
    merge_equal_locations: bool

    @property
    def name(self) -> str:
        return "%d.%d" % self.version


TABLES: dict[tuple[int, int], PyVersion] = {
    (3, 11): PyVersion(
        version=(3, 11),
        null_above_callable=False, precall=True, kw_call="KW_NAMES", method_load="LOAD_METHOD",
        name_flag_bits={"LOAD_GLOBAL": 1},
        make_function="oparg", closure_load="LOAD_CLOSURE",
        directional_cond_jumps=True, to_bool=False, for_iter_exit=(),
        fast_load_checks_unbound=True, fused_local_ops={},
        return_const=False, compare_shift=0, format_ops="FORMAT_VALUE", merge_equal_locations=False,
    ),
    (3, 12): PyVersion(
        version=(3, 12),
        null_above_callable=False, precall=False, kw_call="KW_NAMES", method_load="LOAD_ATTR",
        name_flag_bits={"LOAD_GLOBAL": 1, "LOAD_ATTR": 1, "LOAD_SUPER_ATTR": 2},
        make_function="oparg", closure_load="LOAD_CLOSURE",
        directional_cond_jumps=False, to_bool=False, for_iter_exit=("END_FOR",),
        fast_load_checks_unbound=False, fused_local_ops={},
        return_const=True, compare_shift=4, format_ops="FORMAT_VALUE", merge_equal_locations=True,
    ),
    (3, 13): PyVersion(
        version=(3, 13),
        null_above_callable=True, precall=False, kw_call="CALL_KW", method_load="LOAD_ATTR",
        name_flag_bits={"LOAD_GLOBAL": 1, "LOAD_ATTR": 1, "LOAD_SUPER_ATTR": 2},
        make_function="SET_FUNCTION_ATTRIBUTE", closure_load="LOAD_FAST",
        directional_cond_jumps=False, to_bool=True, for_iter_exit=("END_FOR", "POP_TOP"),
        fast_load_checks_unbound=False,
        fused_local_ops={"LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
                         "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
                         "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST")},
        return_const=True, compare_shift=5, format_ops="CONVERT_VALUE", merge_equal_locations=True,
    ),
}

SUPPORTED = tuple(TABLES)
RUNNING = tuple(sys.version_info[:2])
CURRENT: PyVersion | None = TABLES.get(RUNNING)
# The table the bytecode modules use: the running version's, or (on a version the capture
# does not know, where `require()` refuses to compile) the newest one, so that importing
# the engine and rendering listings still work.
V: PyVersion = CURRENT if CURRENT is not None else TABLES[max(TABLES)]


def supported_names() -> str:
    return ", ".join("%d.%d" % v for v in SUPPORTED)


def unsupported_message(version: tuple[int, int] = RUNNING) -> str:
    return (f"engine.compile cannot capture code on CPython {version[0]}.{version[1]}: its bytecode "
            f"capture knows CPython {supported_names()} (engine/capture/pyversion.py has one table per "
            f"version; docs/capture.md says how to add one). tlparse and observe work on any Python 3.11+.")


def require() -> PyVersion:
    """The running version's table, or UnsupportedPython naming it and the supported ones."""
    if CURRENT is None:
        raise UnsupportedPython(unsupported_message())
    return CURRENT


# ---------------------------------------------------------------------- call layout helpers


def split_call(below_args: list, is_null) -> tuple:
    """The two slots under a call's arguments, bottom first, -> (callable, self or None).
    `is_null(v)` says whether a slot holds NULL. Works for both layouts: the slot that
    is NULL is dropped, and without a NULL the lower slot is the callable (a method) and
    the upper its self."""
    lower, upper = below_args
    if V.null_above_callable:
        return lower, (None if is_null(upper) else upper)
    if is_null(lower):
        return upper, None
    return lower, upper


def call_ex_callable_index() -> int:
    """Index of the callable among [slot0, slot1, args(, kwargs)] of CALL_FUNCTION_EX."""
    return 0 if V.null_above_callable else 1


def null_slot_of_method_load() -> int:
    """A method load whose attribute is not a plain method pushes NULL and the attribute:
    0 when the NULL is below the attribute, 1 when above."""
    return 1 if V.null_above_callable else 0
