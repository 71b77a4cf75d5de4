"""Sources on torch's side of the fence: the ShapeEnv names each symbol after a
`torch._guards.Source`; ours are plain strings (`L['x']`), so this adapts one to the other,
and names the graph input that carries a symbol (`L['x'].size()[0]`)."""

from __future__ import annotations

import dataclasses
import functools
import re

from torch._guards import GuardSource, Source as TorchSource


@dataclasses.dataclass(frozen=True)
class NamedSource(TorchSource):
    """A torch Source whose name is one of our source expressions."""

    text: str

    @property
    def _name_template(self) -> str:
        return self.text

    @functools.cached_property
    def guard_source(self) -> GuardSource:
        return GuardSource.GLOBAL if self.text.startswith("G[") else GuardSource.LOCAL


@dataclasses.dataclass(frozen=True)
class SymbolInputSource:
    """The source of a graph input that carries a symbol's value: an expression such as
    `L['x'].size()[0]`. Quacks like engine.capture.source.Source (name, graph_input_name)."""

    text: str

    def name(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def graph_input_name(self) -> str:
        text = re.sub(r"[^0-9a-zA-Z_]+", "_", self.text).strip("_")
        return text + "_"


def source_name(src) -> str:
    """Name of a torch Source (a property in torch >= 2.10, a method before)."""
    n = src.name
    return n() if callable(n) else n
