"""The user's stack on a graph node: capture writes it as `meta["stack_trace"]` (torch.fx's
format, which make_fx copies onto every aten node made from it and its backward), and every
later stage reads it back here: AOT errors, the kernels' provenance, the report."""

from __future__ import annotations

import dataclasses
import functools
import re

_FRAME = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<fn>\S+)\n?(?P<code>[^\n]*)')


@dataclasses.dataclass(frozen=True)
class UserFrame:
    """One frame of a node's stack: the innermost is the user's line."""
    file: str
    line: int
    function: str
    code: str

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def format_stack(frames) -> str:
    """(filename, lineno, function, source line) tuples, outermost first -> stack_trace text."""
    return "".join(f'  File "{f}", line {n}, in {fn}\n    {code.strip() if code else ""}\n'
                   for f, n, fn, code in frames)


def user_frames(node) -> tuple[UserFrame, ...]:
    """The frames of a node's `stack_trace`, outermost first."""
    return frames_of(node.meta.get("stack_trace") or "")


@functools.lru_cache(maxsize=4096)
def frames_of(trace: str) -> tuple[UserFrame, ...]:
    # cached: make_fx copies one captured node's trace onto every aten node made from it
    # (an optimizer step's thousands of nodes share a few dozen traces)
    return tuple(UserFrame(m["file"], int(m["line"]), m["fn"], m["code"].strip()) for m in _FRAME.finditer(trace))
