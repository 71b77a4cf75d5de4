"""Sources: where a value the capture read came from, as a Python expression over the
frame's locals `L` and globals `G` (`L['x']`, `G['w']`, `L['self'].layer.weight`).
Guards and the generated code both evaluate these strings."""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
import types
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Source:
    def name(self) -> str:  # the expression, valid Python given dicts L and G
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name()

    def graph_input_name(self) -> str:
        """`L['self'].layer.weight` -> `L_self_layer_weight_`, like PyTorch's placeholder names."""
        text = re.sub(r"[^0-9a-zA-Z_]+", "_", self.name())
        return text if text.endswith("_") else text + "_"


def literal(key) -> Optional[str]:
    """A dict key or index as a Python expression where sources are evaluated (`sys` is
    there): str, int, bool and None as themselves, tuples of those, enum members, classes
    and functions by their module path (`GenerationMode.GREEDY_SEARCH` is a str whose repr is
    no expression). None: no such expression (the key is read another way, or breaks)."""
    if key is None or type(key) in (str, int, bool):
        return repr(key)
    if type(key) is tuple:
        parts = [literal(k) for k in key]
        if any(p is None for p in parts):
            return None
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if isinstance(key, enum.Enum):
        owner = _module_path(type(key))
        return f"{owner}.{key.name}" if owner and key.name.isidentifier() and \
            getattr(type(key), key.name, None) is key else None
    if isinstance(key, (type, types.FunctionType, types.BuiltinFunctionType)):
        return _module_path(key)
    return None


def _module_path(obj) -> Optional[str]:
    """`sys.modules['m'].A.B` for an object reachable by its module and qualified name."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    target = sys.modules.get(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return f"sys.modules[{module!r}].{qualname}" if target is obj else None


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    local: str

    def name(self) -> str:
        return f"L[{self.local!r}]"


@dataclasses.dataclass(frozen=True)
class GlobalSource(Source):
    global_name: str

    def name(self) -> str:
        return f"G[{self.global_name!r}]"


@dataclasses.dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    member: str

    def name(self) -> str:
        if self.member.isidentifier():
            return f"{self.base.name()}.{self.member}"
        return f"getattr({self.base.name()}, {self.member!r})"


@dataclasses.dataclass(frozen=True)
class GetItemSource(Source):
    base: Source
    index: object  # a key with a literal() form

    def name(self) -> str:
        return f"{self.base.name()}[{literal(self.index)}]"


@dataclasses.dataclass(frozen=True)
class KeyedItemSource(Source):
    """A dict's value whose key is an object the frame reaches by its own source (an
    optimizer's `state[param]`)."""
    base: Source
    key: Source

    def name(self) -> str:
        return f"{self.base.name()}[{self.key.name()}]"


@dataclasses.dataclass(frozen=True)
class DictValueSource(Source):
    """The value at a position of a dict whose key has no literal form (a class): with the
    DICT_KEYS guard on the dict, the position names the same key."""
    base: Source
    position: int

    def name(self) -> str:
        return f"list({self.base.name()}.values())[{self.position}]"


@dataclasses.dataclass(frozen=True)
class DictItemSource(Source):
    """An item of a dict subclass object read through dict itself (`super().get(k)`),
    past the class's own __getitem__; `method` "__contains__" is whether it is there,
    "keys" the list of all its keys."""
    base: Source
    index: object
    method: str = "__getitem__"

    def name(self) -> str:
        if self.method == "keys":  # all of them, in order
            return f"list(dict.keys({self.base.name()}))"
        return f"dict.{self.method}({self.base.name()}, {literal(self.index)})"


@dataclasses.dataclass(frozen=True)
class ListIteratorSource(Source):
    """What a list iterator (a `for` loop's, passed to a resume function) still holds,
    read without advancing it: `length` is its number of items left, `item` one of
    them (counted from the end of the underlying list, which is where they are)."""
    base: Source
    what: str           # "length" or "item"
    offset: int = 0     # for "item": items left before it

    def name(self) -> str:
        if self.what == "length":
            return f"{self.base.name()}.__length_hint__()"
        return f"{self.base.name()}.__reduce__()[1][0][-{self.offset}]"


@dataclasses.dataclass(frozen=True)
class NumpyTensorSource(Source):
    """The tensor an ndarray input is (sharing its memory), as the graph takes it."""
    base: Source

    def name(self) -> str:
        return f"torch.from_numpy({self.base.name()})"


@dataclasses.dataclass(frozen=True)
class ModuleGlobalSource(Source):
    """A global of another module (a function inlined from it reads its globals)."""

    module: str
    global_name: str

    def name(self) -> str:
        return f"sys.modules[{self.module!r}].__dict__[{self.global_name!r}]"
