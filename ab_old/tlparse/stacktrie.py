"""The stack trie: every user stack that triggered a compile, shared prefixes merged, each
frame's compiles linked and colored by outcome (templates/trie.html draws it)."""

from __future__ import annotations

from .model import Compile


class Node:
    __slots__ = ("frame", "loc", "children", "compiles")

    def __init__(self, frame: str = "", loc: str = "") -> None:
        self.frame, self.loc = frame, loc
        self.children: dict[tuple, Node] = {}
        self.compiles: list[Compile] = []


def build(compiles: list[Compile]) -> Node:
    """Compiles without a stack of their own (e.g. a recompile that failed before
    `dynamo_start`) borrow the stack of another compile of the same frame."""
    by_frame = {}
    for c in compiles:
        if c.stack and (c.key[0], c.key[1]) not in by_frame:
            by_frame[(c.key[0], c.key[1])] = c.stack
    root = Node()
    for c in compiles:
        if c.key == (None, None, None):
            continue
        stack = c.stack or by_frame.get((c.key[0], c.key[1])) or [("(no stack in the trace)", "")]
        node = root
        for frame, loc in stack:
            node = node.children.setdefault((frame, loc), Node(frame, loc))
        node.compiles.append(c)
    return root


def render_text(root: Node) -> str:
    out: list[str] = []

    def visit(node: Node, depth: int) -> None:
        for child in node.children.values():
            ids = " ".join(f"{c.label}({c.status()})" for c in child.compiles)
            loc = f"  | {child.loc}" if child.loc else ""
            out.append(f"{'  ' * depth}{child.frame}{loc}{'  ' + ids if ids else ''}")
            visit(child, depth + 1)

    visit(root, 0)
    return "\n".join(out)
