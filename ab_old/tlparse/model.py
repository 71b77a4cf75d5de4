"""What the report keeps in memory while streaming: small summaries and indexes only.
Payloads are written out as they are read and dropped."""

from __future__ import annotations

import dataclasses
from typing import Optional

from .interpret import BreakInfo, RecompileReason, resume_target

# (compiled_autograd_id, frame_id, frame_compile_id); None parts print as "-".
CompileKey = tuple


def compile_label(key: CompileKey, attempt: int = 0) -> str:
    """PyTorch's spelling: [0/0], [0/0_1], [!1/0/0]."""
    caid, fid, fcid = key
    if key == (None, None, None):
        return "[-/-]"
    base = f"{'-' if fid is None else fid}/{'-' if fcid is None else fcid}"
    if caid is not None:
        base = f"!{caid}/{base}"
    return f"[{base}{'_' + str(attempt) if attempt else ''}]"


def compile_slug(key: CompileKey) -> str:
    caid, fid, fcid = key
    if key == (None, None, None):
        return "global"
    parts = [f"ca{caid}"] if caid is not None else []
    parts += [str("x" if fid is None else fid), str("x" if fcid is None else fcid)]
    return "_".join(parts)


@dataclasses.dataclass(slots=True)   # thousands of these: no per-instance __dict__
class Artifact:
    attempt: int
    name: str
    url: str            # relative to the report root
    size: int
    lineno: int
    md5: Optional[str]


@dataclasses.dataclass(slots=True)
class Compile:
    key: CompileKey
    order: int                                   # first appearance in the trace
    label: str = ""
    slug: str = ""
    attempts: set = dataclasses.field(default_factory=set)
    stack: list = dataclasses.field(default_factory=list)    # [(frame text, loc)] from dynamo_start
    co_name: Optional[str] = None
    co_filename: Optional[str] = None
    co_firstlineno: Optional[int] = None
    artifacts: list = dataclasses.field(default_factory=list)   # [Artifact]
    events: list = dataclasses.field(default_factory=list)      # [(attempt, name, lineno, spool ref of its JSON)]
    events_dropped: int = 0
    metrics: dict = dataclasses.field(default_factory=dict)     # the compilation_metrics fields we show
    metrics_text: Optional[tuple] = None                        # spool ref: every field, one a line
    bwd_metrics_text: Optional[tuple] = None
    fail_type: Optional[str] = None
    fail_reason: Optional[str] = None
    fail_where: Optional[str] = None
    restart_reasons: list = dataclasses.field(default_factory=list)
    breaks: list = dataclasses.field(default_factory=list)      # [break group key]
    recompile: list = dataclasses.field(default_factory=list)   # [RecompileReason]
    stages: dict = dataclasses.field(default_factory=dict)      # stage name -> microseconds
    top_us: float = 0.0                                          # outermost stages, summed
    graph_md5: Optional[str] = None
    graph_url: Optional[str] = None
    has_graph: bool = False
    error_artifacts: list = dataclasses.field(default_factory=list)  # [url] of dynamo_error etc.

    @property
    def frame_id(self):
        return self.key[1]

    def compile_time_s(self) -> Optional[float]:
        t = self.metrics.get("entire_frame_compile_time_s")
        if isinstance(t, (int, float)):
            return float(t)
        return self.top_us / 1e6 if self.top_us else None

    def status(self) -> str:
        """The outcome the stack trie colors: ok (dark green); resumed (light green: a resume
        function, the frame reached through a graph break, compiled fine); restart and
        error (red: analysis restarted, or the compile failed); empty (no ops in the graph);
        missing (neither metrics nor a graph in the trace)."""
        if self.fail_type:
            return "error"
        if self.restart_reasons:
            return "restart"
        if resume_target(self.co_name):
            return "resumed"
        ops = self.metrics.get("graph_op_count")
        if ops == 0 or (not self.has_graph and self.metrics):
            return "empty"
        if not self.metrics and not self.has_graph:
            return "missing"
        return "ok"


@dataclasses.dataclass
class BreakGroup:
    """One distinct graph break (same user line and reason), over all its occurrences."""

    info: BreakInfo
    compiles: list = dataclasses.field(default_factory=list)    # [CompileKey], each once
    frames_caused: int = 0
    time_caused_s: float = 0.0
    resume_compiles: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Unparsed:
    lineno: int
    error: str
    text: str


__all__ = ["Artifact", "BreakGroup", "BreakInfo", "Compile", "CompileKey", "RecompileReason", "Unparsed",
           "compile_label", "compile_slug"]
