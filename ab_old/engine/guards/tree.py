"""The guard tree: a cache entry's guards laid out the way PyTorch prints its
TREE_GUARD_MANAGER for `TORCH_LOGS=guards` and the trace's dynamo_cpp_guards_str:

    TREE_GUARD_MANAGER:
    +- RootGuardManager
    | +- GLOBAL_STATE: ___check_global_state() against {...}
    | +- GuardManager: source=L['x'], accessed_by=FrameLocalsGuardAccessor(key='x'), type=<class 'torch.Tensor'>
    | | +- TENSOR_MATCH: check_tensor(L['x'], Tensor, ..., size=[3, 3], stride=[3, 1])  # return x + 1  # script.py:6 in fn
    | +- GuardManager: source=G, accessed_by=GlobalsGuardAccessor, type=<class 'dict'>
    | | +- GuardManager: source=G['torch'], accessed_by=DictGetItemGuardAccessor('torch'), type=<class 'module'>
    | | | +- ID_MATCH: ...
    +- LAMBDA_GUARD: 2 <= L['x'].size()[0]  # ...

One manager per source, nested by the source's access path (`L['self'].layer.weight`
under `L['self'].layer` under `L['self']`); each guard line is `render_guard`'s text, so
logs, traces and explain show the same words."""

from __future__ import annotations

from typing import Iterable, Optional

from .guard import Guard, TensorMeta
from .render import render_guard, user_suffix


def _unquoted_from_right(text: str, closes: str = ")]", opens: str = "(["):
    """(index, char, depth) for each character of `text` outside quotes, right to left;
    depth is how many brackets are open after reading it (a close opens one, read backwards)."""
    depth, quote = 0, None
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
            continue
        if c in "'\"":
            quote = c
        elif c in closes:
            depth += 1
        elif c in opens:
            depth -= 1
        yield i, c, depth


def _split_last(source: str) -> Optional[tuple[str, str]]:
    """`base[...]` / `base.attr` / `getattr(base, 'x')` -> (base, accessor); None at a root."""
    s = source
    if s.startswith("getattr(") and s.endswith(")"):
        inner = s[len("getattr("):-1]
        for i, c, depth in _unquoted_from_right(inner):
            if c == "," and depth == 0:
                return inner[:i].strip(), f"GetAttrGuardAccessor({inner[i + 1:].strip().strip(chr(39))})"
        return None
    if s.endswith("]"):
        for i, c, depth in _unquoted_from_right(s, closes="]", opens="["):
            if c == "[" and depth == 0:
                base, key = s[:i], s[i + 1:-1]
                if base == "L":
                    return "", f"FrameLocalsGuardAccessor(key={key})"
                if base == "G":
                    return "G", f"DictGetItemGuardAccessor({key})"
                return base, f"GetItemGuardAccessor({key})"
        return None
    for i, c, depth in _unquoted_from_right(s):
        if c == "." and depth == 0:
            return s[:i], f"GetAttrGuardAccessor({s[i + 1:]})"
    return None


def _type_of(guards: list) -> Optional[str]:
    for g in guards:
        if g.kind == "TENSOR_MATCH":
            m: TensorMeta = g.expected
            return f"<class '{m.type.__module__}.{m.type.__qualname__}'>"
        if g.kind == "TYPE_MATCH":
            t = g.expected
            mod = "" if t.__module__ == "builtins" else t.__module__ + "."
            return f"<class '{mod}{t.__qualname__}'>"
        if g.kind == "ID_MATCH":
            t = type(g.expected)
            mod = "" if t.__module__ == "builtins" else t.__module__ + "."
            return f"<class '{mod}{t.__qualname__}'>"
        if g.kind == "EQUALS_MATCH":
            return f"<class '{type(g.expected).__qualname__}'>"
    return None


class _Node:
    def __init__(self, source: str, accessor: str):
        self.source = source
        self.accessor = accessor
        self.guards: list[Guard] = []
        self.children: dict[str, "_Node"] = {}


def build_tree(guards: Iterable[Guard]) -> tuple[_Node, list[Guard]]:
    """(root manager, shape guards): each source's guards hung under its access path."""
    root = _Node("", "")
    shape: list[Guard] = []
    nodes: dict[str, _Node] = {"": root}

    def node_for(source: str) -> _Node:
        n = nodes.get(source)
        if n is not None:
            return n
        split = _split_last(source)
        if split is None:
            parent, accessor = root, ("GlobalsGuardAccessor" if source == "G" else "RootAccessor")
        else:
            parent, accessor = node_for(split[0]), split[1]
        n = nodes[source] = _Node(source, accessor)
        parent.children[source] = n
        return n

    for g in guards:
        if g.kind == "SHAPE_ENV":
            shape.append(g)
        elif not g.source:
            root.guards.append(g)
        else:
            node_for(g.source).guards.append(g)
    return root, shape


def _line(g: Guard) -> str:
    text = render_guard(g, with_user_frame=False)
    suffix = user_suffix(g)
    if not suffix:
        return text
    return f"{text:<80}{suffix}" if len(text) < 80 else text + suffix


def render_guard_tree(guards: Iterable[Guard]) -> str:
    root, shape = build_tree(list(guards))
    lines = ["", "TREE_GUARD_MANAGER:", "+- RootGuardManager"]

    def walk(node: _Node, depth: int) -> None:
        bar = "| " * depth
        for g in node.guards:
            lines.append(f"{bar}+- {_line(g)}")
        for child in node.children.values():
            typ = _type_of(child.guards)
            if child.source == "G":
                typ = "<class 'dict'>"
            head = f"{bar}+- GuardManager: source={child.source}, accessed_by={child.accessor}"
            lines.append(head + (f", type={typ}" if typ else ""))
            walk(child, depth + 1)

    walk(root, 1)
    for g in shape:
        lines.append(f"+- LAMBDA_GUARD: {g.expected}{user_suffix(g)}")
    return "\n".join(lines)
