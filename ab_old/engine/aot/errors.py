"""The one error type of the AOT stage: it names the step that failed and, where there is
one, the node of the captured graph that was being processed."""

from __future__ import annotations

from typing import Optional

import torch.fx

from ..user_frames import user_frames


class AOTAutogradError(RuntimeError):
    def __init__(self, step: str, node: Optional[torch.fx.Node], cause: BaseException):
        self.step = step
        self.node = node
        self.cause = cause
        where = ""
        if node is not None:
            where = f" node {node.name}: {node.format_node()}"
            line = _user_line(node)
            if line:
                where += f"\n  from user code:\n    {line}"
        super().__init__(f"AOT autograd failed while {step}{where}:\n  {type(cause).__name__}: {cause}")


def _user_line(node: torch.fx.Node) -> str:
    """The last frame of the node's stack trace (the user's line), if capture recorded one."""
    frames = user_frames(node)
    if not frames:
        return ""
    f = frames[-1]
    return f'File "{f.file}", line {f.line}, in {f.function}\n    {f.code}'


class BackwardTraceError(AOTAutogradError):
    """Autograd itself refused the program's backward (e.g. a saved tensor modified in
    place): eager would raise the same error, at backward time."""
