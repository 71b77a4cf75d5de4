"""Sources: where a value the capture read came from, as a Python expression over the
frame's locals `L` and globals `G` (`L['x']`, `G['w']`, `L['self'].layer.weight`).
Guards and the generated code both evaluate these strings."""

from __future__ import annotations

import dataclasses
import re


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
    index: object  # int or str (a constant key)

    def name(self) -> str:
        return f"{self.base.name()}[{self.index!r}]"


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
        return f"dict.{self.method}({self.base.name()}, {self.index!r})"


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
