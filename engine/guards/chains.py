"""Guard sources that are chains of plain reads from a frame's locals, its globals or a
module (`L['m'].layers[0].weight`), and the walk that reads each object on the way once:
shared by the generated Python guards (check.py) and the C++ program (program.py)."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import torch


# Sources that are chains of plain reads from a frame's locals, its globals or a module:
# L['m'].layers[0].weight, getattr(L['m'].layer, '0').norm, sys.modules['x'].__dict__['y']
_CHAIN_HEAD = re.compile(r"""^(?:[LG]|sys\.modules)\[(?:'[^'\\]*'|"[^"\\]*")\]""")
_CHAIN_STEP = re.compile(r"""\.[A-Za-z_]\w*|\[(?:-?\d+|'[^'\\]*'|"[^"\\]*")\]""")
_NAME_ARG = re.compile(r"""\s*('[^'\\]*'|"[^"\\]*")\s*\)""")


def chain(source: str) -> Optional[list]:
    """[(prefix, render)]: each prefix of a chain source, shortest first, with how to read it
    from the expression of the one before (a function, or for a subscript whose key is a
    chain itself, that key's source); None for any other source."""
    if source.startswith("getattr("):
        inner_end = outside_brackets(source, len("getattr("), ",")
        if inner_end is None:
            return None
        base = chain(source[len("getattr("):inner_end])
        m = _NAME_ARG.match(source, inner_end + 1)
        if base is None or m is None:
            return None
        steps = base + [(source[:m.end()], lambda e, n=m.group(1): f"getattr({e}, {n})")]
        pos = m.end()
    else:
        m = _CHAIN_HEAD.match(source)
        if m is None:
            return None
        steps, pos = [(m.group(0), None)], m.end()
    while pos < len(source):
        step = _CHAIN_STEP.match(source, pos)
        if step is not None:
            pos = step.end()
            steps.append((source[:pos], lambda e, t=step.group(0): e + t))
            continue
        # a key that is itself a chain: an optimizer's `state[<a parameter>]`
        end = outside_brackets(source, pos + 1, "]") if source.startswith("[", pos) else None
        if end is None or chain(source[pos + 1:end]) is None:
            return None
        steps.append((source[:end + 1], source[pos + 1:end]))
        pos = end + 1
    return steps


def outside_brackets(text: str, start: int, char: str) -> Optional[int]:
    """The index of the first `char` at or after start that is outside any brackets and
    quotes opened after start: the comma that ends getattr's first argument, the `]` that
    closes a subscript."""
    depth, quote = 0, None
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
        elif c == char and depth == 0:
            return i
        elif c in "'\"":
            quote = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
    return None


class SharedPrefixes:
    """Each object on the way to a value is read once per call, not once per use: a module's
    parameters share the walk down to their module (Module.__getattr__ costs a microsecond a
    step; BERT's 200 parameters took 1300 of them). The expressions bind the prefixes they
    read first (`(___p0 := L['m'].bert)`) and reuse them after, so they must be evaluated in
    the order they were asked for: guards run in order and return at the first failure, and
    a graph call's arguments are evaluated left to right."""

    def __init__(self, lookup: Optional[Callable[[str], Any]] = None):
        self.names: dict = {}
        self.lookup = lookup     # source -> its value at compile time (to read modules' dicts directly)

    def expression(self, source: str) -> str:
        links = chain(source)
        if links is None:
            return source
        text, prev = None, None
        for prefix, render in links:
            name = self.names.get(prefix)
            if name is not None:
                text = name
            elif render is None:
                text = prefix      # the head: a dict lookup already
            elif isinstance(render, str):      # a key read through its own shared prefixes
                key = self.expression(render)
                name = self.names[prefix] = f"___p{len(self.names)}"
                text = f"({name} := {text}[{key}])"
            else:
                slot = self._module_slot(prev, prefix) if self.lookup is not None else None
                name = self.names[prefix] = f"___p{len(self.names)}"
                text = f"({name} := {text}{slot})" if slot else f"({name} := {render(text)})"
            prev = prefix
        return text

    def _module_slot(self, parent_source: str, source: str) -> Optional[str]:
        """`._modules['layer1']` for the step `.layer1` (`._parameters['weight']`,
        `._buffers[...]`; `getattr(m, '0')` or `[0]` of a ModuleList or Sequential:
        `._modules['0']`) where the parent is an nn.Module that holds the name there and
        nothing shadows it: a dict read instead of Module.__getattr__ (a Python call that
        runs after normal lookup fails), as PyTorch's own guards read modules. A module that
        later holds it elsewhere fails the guard (KeyError), which recompiles."""
        name, index = step_of(parent_source, source)
        if name is None and index is None:
            return None
        try:
            parent = self.lookup(parent_source)
        except Exception:
            return None
        if not isinstance(parent, torch.nn.Module):
            return None
        if index is not None:
            keys = list(parent._modules)
            if not isinstance(parent, (torch.nn.Sequential, torch.nn.ModuleList)) or \
                    keys != [str(i) for i in range(len(keys))] or index >= len(keys):
                return None
            return f"._modules[{str(index)!r}]"
        if name in vars(parent) or hasattr(type(parent), name):
            return None
        for slot in ("_parameters", "_buffers", "_modules"):
            if name in vars(parent).get(slot, {}):
                return f".{slot}[{name!r}]"
        return None


def step_of(parent_source: str, source: str) -> tuple:
    """(attribute name, None) or (None, index) of the last step from parent_source to source
    (`.layer1`, `getattr(..., '0')`, `[2]`); (None, None) for any other step."""
    g = re.fullmatch(r"getattr\((.*), '([^'\\]*)'\)", source)
    if g is not None:
        return (g.group(2), None) if g.group(1) == parent_source else (None, None)
    if not source.startswith(parent_source):
        return None, None
    m = re.fullmatch(r"\.([A-Za-z_]\w*)|\[(\d+)\]", source[len(parent_source):])
    if m is None:
        return None, None
    return (m.group(1), None) if m.group(1) else (None, int(m.group(2)))
