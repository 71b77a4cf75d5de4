"""A cache entry's guards as a straight-line program for the C++ checker (native.py's
GuardProgram): each object on the way to a guarded value read once into a register, then
each test, in the order of the generated Python function.

The generated Python spends about 0.1 us a guard on attribute reads, `type(...) is`,
`==` and `len` through the interpreter; a ResNet-50 forward has some 1,300 such guards
besides its tensors, a tenth of a CUDA-graph replay's time. Here they are C API calls in a
loop. Guards whose source is not a chain of plain reads (`L['x'].size()[0]` in a shape
relation), and the global-state and shape guards, stay in the generated Python, which
calls the program where its first guard stood. The program returns True only when every
test in it holds, as the Python it replaces; any error is a failed guard."""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Optional

import torch

from .chains import SharedPrefixes, chain, step_of
from .guard import Guard

OPS = ("LOCAL", "GLOBAL", "SYSMOD", "ATTR", "ITEM", "ITEM_REG", "TYPE_IS", "ID_IS", "EQ", "LEN", "KEYS",
       "HASATTR", "TENSOR", "SAME", "DISTINCT", "MODULE_HASATTR")
OP = {name: i for i, name in enumerate(OPS)}
_HEADS = {"L[": "LOCAL", "G[": "GLOBAL", "sys.modules[": "SYSMOD"}
NATIVE_KINDS = frozenset({"TENSOR_MATCH", "TYPE_MATCH", "ID_MATCH", "EQUALS_MATCH", "LENGTH_CHECK", "DICT_KEYS",
                          "HASATTR", "DUPLICATE_INPUT", "NO_TENSOR_ALIASING"})


@dataclasses.dataclass
class Program:
    code: list                 # (op, dst, src, src2, n, a, b, regs) per instruction
    registers: int
    tensors: list              # the TensorMeta of each TENSOR instruction, in order
    native: list               # indices of the guards it checks; the rest stay Python


class _Builder:
    def __init__(self, shared: SharedPrefixes):
        self.shared = shared   # for its module-slot lookup (`._modules['layer1']` for `.layer1`)
        self.code: list = []
        self.regs: dict = {}   # source prefix (or a prefix with its module slot) -> register

    def emit(self, op: str, dst: int = -1, src: int = -1, src2: int = -1, n: int = 0, a: Any = None, b: Any = None,
             regs: tuple = ()) -> None:
        self.code.append((OP[op], dst, src, src2, n, a, b, list(regs)))

    def steps(self, source: str, known: Optional[set] = None) -> Optional[list]:
        """The reads that bring `source` into a register, as (key, op, parent key, argument)
        for the prefixes not read yet (`known`: those read already); None where a step is
        not a plain read."""
        links = chain(source)
        if links is None:
            return None
        out, prev = [], None
        known = set(self.regs) if known is None else known
        for prefix, render in links:
            if prefix in known:
                prev = prefix
                continue
            if render is None:                       # L['x'], G['x'], sys.modules['x']
                head = next((h for h in _HEADS if prefix.startswith(h)), None)
                if head is None:
                    return None
                out.append((prefix, _HEADS[head], None, ast.literal_eval(prefix[len(head):-1])))
            elif isinstance(render, str):            # [<a chain>]: the key is read first
                key = self.steps(render, known)
                if key is None:
                    return None
                out.extend(key)
                out.append((prefix, "ITEM_REG", prev, render))
            else:
                slot = self.shared._module_slot(prev, prefix) if self.shared.lookup is not None else None
                if slot:                            # ._modules['layer1']: two plain reads
                    attr, key = slot[1:slot.index("[")], ast.literal_eval(slot[slot.index("[") + 1:-1])
                    holder = f"{prev}.{attr}"
                    if holder not in known:
                        out.append((holder, "ATTR", prev, attr))
                        known.add(holder)
                    out.append((prefix, "ITEM", holder, key))
                else:
                    name, index = step_of(prev, prefix)
                    if name is not None:
                        out.append((prefix, "ATTR", prev, name))
                    elif index is not None or prefix[len(prev):].startswith("["):
                        try:
                            key = ast.literal_eval(prefix[len(prev) + 1:-1])
                        except (ValueError, SyntaxError):
                            return None
                        out.append((prefix, "ITEM", prev, key))
                    else:
                        return None
            known.add(prefix)
            prev = prefix
        return out

    def register(self, source: str) -> Optional[int]:
        if source in self.regs:
            return self.regs[source]
        steps = self.steps(source)
        if steps is None:
            return None
        for key, op, parent, arg in steps:
            dst = self.regs[key] = len(self.regs)
            if op in ("LOCAL", "GLOBAL", "SYSMOD"):
                self.emit(op, dst, a=arg)
            elif op == "ITEM_REG":
                self.emit(op, dst, self.regs[parent], self.regs[arg])
            else:
                self.emit(op, dst, self.regs[parent], a=arg)
        return self.regs[source]


def _plain_module_class(shared: SharedPrefixes, source: str) -> Optional[type]:
    """The class of the nn.Module at `source` when it reads attributes as nn.Module does
    (object's __getattribute__, then Module.__getattr__): MODULE_HASATTR answers hasattr
    for it without a Python call, for as long as the class is not changed."""
    if shared.lookup is None:
        return None
    try:
        obj = shared.lookup(source)
    except Exception:
        return None
    return type(obj) if isinstance(obj, torch.nn.Module) and module_class_is_plain(type(obj)) else None


def module_class_is_plain(cls: type) -> bool:
    """Whether an nn.Module class reads attributes as nn.Module does (no `__getattr__` or
    `__getattribute__` of its own): the capture reads such a module's attributes from its
    dicts, and the C++ checker answers hasattr on it the same way."""
    return cls.__getattr__ is torch.nn.Module.__getattr__ and cls.__getattribute__ is object.__getattribute__


def build(guards: list[Guard], shared: SharedPrefixes) -> Optional[Program]:
    """The program for the guards it can check (None when there are none); `shared` holds
    the compile-time lookup of sources."""
    b = _Builder(shared)
    tensors, native = [], []
    for i, g in enumerate(guards):
        if g.kind not in NATIVE_KINDS:
            continue
        sources = list(g.expected) if g.kind == "NO_TENSOR_ALIASING" else \
            [g.source, g.expected] if g.kind == "DUPLICATE_INPUT" else [g.source]
        # (a guard of several sources whose later one is not a chain leaves the earlier
        # ones' reads in the program: reads only, which its Python test makes too)
        regs = [b.register(s) if isinstance(s, str) else None for s in sources]
        if None in regs:
            continue
        e, r = g.expected, regs[0]
        if g.kind == "TENSOR_MATCH":
            b.emit("TENSOR", src=r)
            tensors.append(e)
        elif g.kind == "TYPE_MATCH":
            b.emit("TYPE_IS", src=r, a=e)
        elif g.kind == "ID_MATCH" or (g.kind == "EQUALS_MATCH" and (e is None or e is True or e is False
                                                                   or e is Ellipsis)):
            b.emit("ID_IS", src=r, a=e)
        elif g.kind == "EQUALS_MATCH":
            b.emit("EQ", src=r, a=e, b=type(e))
        elif g.kind == "LENGTH_CHECK":
            b.emit("LEN", src=r, n=int(e))
        elif g.kind == "DICT_KEYS":
            b.emit("KEYS", src=r, a=list(e))
        elif g.kind == "HASATTR":
            cls = _plain_module_class(shared, g.source)
            if cls is not None:
                b.emit("MODULE_HASATTR", src=r, a=e[0], b=cls, n=int(bool(e[1])))
            else:
                b.emit("HASATTR", src=r, a=e[0], n=int(bool(e[1])))
        elif g.kind == "DUPLICATE_INPUT":
            b.emit("SAME", src=r, src2=regs[1])
        else:
            b.emit("DISTINCT", regs=regs)
        native.append(i)
    if not native:
        return None
    return Program(b.code, len(b.regs), tensors, native)
