"""No frame is lost: a frame the capture gives up on runs a routed copy of its code.

Without PEP 523 the engine sees a call only if it makes it. A frame that is not captured
(it cannot resume after a break, it hit the cache limit, the compiler failed under
`suppress_errors`, or it is a generator or comprehension) would run its original
bytecode, and nothing it calls would compile. Its routed copy is the same bytecode with
every call going through the engine's trampoline, so its callees compile as a
frame-evaluation hook would have seen them.

How: a call's two slots become `[trampoline, callable]`, so `CALL n` on
`[trampoline, callable, *args]` runs `trampoline(callable, *args)` on every version (a
method call's [method, self] reads the same way):
- `PUSH_NULL` pushes the trampoline instead (before 3.13 it comes before the callable;
  from 3.13 after it, so the trampoline is swapped below it), and `LOAD_GLOBAL`'s NULL
  becomes the trampoline pushed before the global;
- method loads (`LOAD_METHOD`, 3.12's method `LOAD_ATTR` / `LOAD_SUPER_ATTR`) load the
  bound attribute with the trampoline below it;
- `CALL_FUNCTION_EX` (which drops the slot below without releasing it) becomes a `CALL`
  of the trampoline with a spreading helper.
Calls that C code makes (`map`'s, `sorted`'s callbacks, `__init__` run by a class call,
operators' dunder methods, properties) are not routed: docs/capture.md lists them."""

from __future__ import annotations

import functools
import types

from . import bytecode as bc
from .bytecode import create_instruction
from .pyversion import V

_CODES: dict = {}   # (code, options key) -> routed code


def clear_cache() -> None:
    _CODES.clear()


def spread_call(trampoline, fn, args, kwargs):
    """What `fn(*args, **kwargs)` (CALL_FUNCTION_EX) does in a routed frame."""
    return trampoline(fn, *args, **(kwargs or {}))


def routed_function(fn: types.FunctionType, trampoline, key) -> types.FunctionType:
    """`fn` running its routed code; `key` names `trampoline` (routed code is cached with it)."""
    code = _CODES.get((fn.__code__, key))
    if code is None:
        code = _CODES[(fn.__code__, key)] = routed_code(fn.__code__, trampoline)
    g = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    g.__kwdefaults__ = fn.__kwdefaults__
    g.__qualname__ = fn.__qualname__
    return g


def routed_code(code: types.CodeType, trampoline) -> types.CodeType:
    insts = bc.decode(code)
    spread = functools.partial(spread_call, trampoline)
    out: list = []
    replaced: dict = {}   # id(original) -> its first replacement (jump targets, handlers)

    def emit(new_insts, like):
        for n in new_insts:
            n.lineno, n.positions, n.exn_tab_entry = like.lineno, like.positions, like.exn_tab_entry
        replaced[id(like)] = new_insts[0]
        out.extend(new_insts)

    def const(v):
        return create_instruction("LOAD_CONST", argval=v)

    def call(n):
        return ([create_instruction("PRECALL", arg=n)] if V.precall else []) + [create_instruction("CALL", arg=n)]

    for inst in insts:
        op = inst.opname
        if op == "PUSH_NULL" and V.null_above_callable:
            emit([const(trampoline), create_instruction("SWAP", arg=2)], inst)
        elif op == "PUSH_NULL":
            emit([const(trampoline)], inst)
        elif op == "LOAD_GLOBAL" and inst.flags & 1:
            emit([const(trampoline), inst.copy(flags=inst.flags & ~1)], inst)
        elif op == "LOAD_METHOD":
            emit([const(trampoline), create_instruction("SWAP", arg=2),
                  inst.copy(opname="LOAD_ATTR", flags=0)], inst)
        elif op == "LOAD_ATTR" and inst.is_method_load:
            emit([const(trampoline), create_instruction("SWAP", arg=2), inst.copy(flags=inst.flags & ~1)], inst)
        elif op == "LOAD_SUPER_ATTR" and inst.flags & 1:
            emit([inst.copy(flags=inst.flags & ~1), const(trampoline), create_instruction("SWAP", arg=2)], inst)
        elif op == "CALL_FUNCTION_EX":
            # [t, fn, args(, kwargs)] -> [t, spread, fn, args, kwargs]: t(spread, fn, args, kwargs)
            seq = [] if inst.arg & 1 else [const(None)]
            seq += [const(spread), create_instruction("SWAP", arg=4),         # [t, spread, args, kw, fn]
                    create_instruction("SWAP", arg=3),                         # [t, spread, fn, kw, args]
                    create_instruction("SWAP", arg=2)]                         # [t, spread, fn, args, kw]
            emit(seq + call(3), inst)
        else:
            new = inst.copy()
            replaced[id(inst)] = new
            out.append(new)
    bc.retarget(out, lambda inst: replaced[id(inst)])
    return bc.assemble(out, template=code)
