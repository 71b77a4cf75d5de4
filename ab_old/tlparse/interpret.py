"""Read meaning out of trace text: graph-break reasons, recompile reasons, stack frames.

PyTorch writes these as human text; we also accept the structured forms our own compiler
emits (a `graph_break` envelope key, JSON recompile reasons). Each function takes plain
values and returns plain data, so each is tested alone.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional

_AT = re.compile(r"Graph break in user code at (?P<file>.+):(?P<line>\d+)\s*$", re.M)
_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')
_RESUME = re.compile(r"resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
_EXPECTED = re.compile(r"expected (?P<expected>[^,]+?),\s*actual (?P<actual>\S+?)\.?$", re.M)
# ours: `L['c'] == 2.5: expected 2.5, got 3.0` (the guard, then what it expected and what it saw)
_EXPECTED_GOT = re.compile(r"^(?P<guard>.+?):\s+expected (?P<expected>.+?), got (?P<actual>.+?)$")
_GUARD_COMPARE = re.compile(r"^(?P<lhs>.+?)\s*(?P<op>==|!=|is not|is|<=|>=|<|>)\s*(?P<rhs>[^#]+?)\s*$")
_LITERAL = re.compile(r"^(-?\d[\d._e+-]*|True|False|None|'[^']*'|\"[^\"]*\")$")
_WHERE = re.compile(r"\S+:\d+ in \S+$")
_CID_PREFIX = re.compile(r"^\s*(?:-\s+)?(?P<cid>!?\d+/\d+(?:_\d+)?|!?\d+/\d+/\d+(?:_\d+)?):\s+")
_GB_ID = re.compile(r"^(?P<id>GB\d+):\s*")


@dataclasses.dataclass
class BreakInfo:
    """One graph break as the trace tells it."""

    reason: str                      # the one-line reason (the graph-break title)
    explanation: str = ""
    hints: list[str] = dataclasses.field(default_factory=list)
    user_file: Optional[str] = None
    user_line: Optional[int] = None
    user_code: str = ""              # the source line, when the trace has it
    user_stack: list[str] = dataclasses.field(default_factory=list)
    break_id: Optional[str] = None   # e.g. PyTorch's gb0059


@dataclasses.dataclass
class RecompileReason:
    """One failing guard of one earlier cache entry."""

    entry: str                       # the compile id whose guard failed, e.g. "0/0"
    guard: str
    expected: Optional[str] = None
    actual: Optional[str] = None
    user_line: Optional[str] = None  # "file:line in fn" of the code that created the guard
    user_code: str = ""
    note: str = ""                   # extra words from the guard's comment


def parse_graph_break_text(text: str) -> BreakInfo:
    """PyTorch's `dynamo_graph_break_reason` artifact -> BreakInfo."""
    at = _AT.search(text)
    body = text
    marker = "Graph Break Reason:"
    if marker in body:
        body = body.split(marker, 1)[1]
    body = body.split("User code traceback:", 1)[0]
    lines = [ln.rstrip() for ln in body.strip("\n").splitlines()]
    # "Encountered graph break when attempting to trace CALL: ...:" is a preamble; the
    # title is the first line of the block after it.
    blocks: list[list[str]] = [[]]
    for ln in lines:
        if ln.strip():
            blocks[-1].append(ln)
        elif blocks[-1]:
            blocks.append([])
    if len(blocks) > 1 and blocks[0] and blocks[0][0].strip().startswith("Encountered graph break") and len(blocks[0]) == 1:
        blocks = blocks[1:]
    head = blocks[0] if blocks and blocks[0] else [""]
    reason = head[0].strip()
    gb_id = _GB_ID.match(reason)
    if gb_id:   # ours: "GB0001: Call to a builtin ..."
        reason = reason[gb_id.end():]
    explanation, hints = _explanation_and_hints(lines)
    info = BreakInfo(reason=reason or "(no reason given)", explanation=explanation, hints=hints)
    if at:
        info.user_file, info.user_line = at.group("file"), int(at.group("line"))
    tb = text.split("User code traceback:", 1)
    if len(tb) == 2:
        info.user_stack, info.user_code = _traceback_frames(tb[1])
    gb = re.search(r"/gb/(gb\d+)\.html", text)
    if gb:
        info.break_id = gb.group(1)
    elif gb_id:
        info.break_id = gb_id.group("id")
    return info


def _explanation_and_hints(lines: list[str]) -> tuple[str, list[str]]:
    explanation, hints = "", []
    for ln in lines:
        s = ln.strip()
        if s.startswith("Explanation:"):
            explanation = s[len("Explanation:"):].strip()
        elif s.startswith("Hint:"):
            hints.append(s[len("Hint:"):].strip())
    return explanation, hints


def _traceback_frames(text: str) -> tuple[list[str], str]:
    """`File "x.py", line 6, in f` / `    code` pairs -> (["x.py:6 in f", ...], last code)."""
    frames, code = [], ""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        m = _FILE_LINE.search(ln)
        if not m:
            if ln.startswith("Traceback") or ln.strip().startswith("NoneType"):
                break
            continue
        frames.append(f"{m.group('file')}:{m.group('line')} in {m.group('name')}")
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        code = nxt if nxt and not _FILE_LINE.search(nxt) and not set(nxt) <= set("^~ ") else ""
    return frames, code


def break_from_event(meta: Any, strings: dict[int, str]) -> BreakInfo:
    """Our compiler's structured `graph_break` event -> BreakInfo (any missing key is fine)."""
    if not isinstance(meta, dict):
        return BreakInfo(reason=str(meta))
    reason = str(meta.get("reason") or meta.get("msg") or "(no reason given)")
    hint = meta.get("hint") or meta.get("hints") or []
    hints = [str(h) for h in (hint if isinstance(hint, list) else [hint]) if h]
    info = BreakInfo(reason=reason.splitlines()[0] if reason.strip() else reason,
                     explanation=str(meta.get("explanation") or ""), hints=hints)
    if "\n" in reason.strip():
        exp, more = _explanation_and_hints(reason.splitlines())
        info.explanation = info.explanation or exp
        info.hints += [h for h in more if h not in info.hints]
    stack = meta.get("user_stack") or meta.get("stack") or []
    frames = [f for f in (format_frame(fr, strings) for fr in stack if fr) if f]
    info.user_stack = [f[0] for f in frames]
    if frames:
        last = stack[-1]
        if isinstance(last, dict):
            info.user_file = resolve_filename(last.get("filename"), strings)
            line = last.get("line", last.get("lineno"))
            info.user_line = int(line) if isinstance(line, int) or (isinstance(line, str) and line.isdigit()) else None
            info.user_code = str(last.get("loc") or last.get("code") or "").strip()
    if meta.get("graph_break_id") is not None:
        info.break_id = str(meta["graph_break_id"])
    return info


def resolve_filename(value: Any, strings: dict[int, str]) -> Optional[str]:
    if isinstance(value, int):
        return strings.get(value, f"<string {value}>")
    return None if value is None else str(value)


def format_frame(frame: Any, strings: dict[int, str]) -> Optional[tuple[str, str]]:
    """A stack frame dict ({filename, line, name, loc}) -> ("file:line in name", loc)."""
    if isinstance(frame, str):
        return frame, ""
    if not isinstance(frame, dict):
        return None
    filename = resolve_filename(frame.get("filename"), strings) or "?"
    line = frame.get("line", frame.get("lineno", "?"))
    return f"{filename}:{line} in {frame.get('name', '?')}", str(frame.get("loc") or frame.get("code") or "").strip()


def parse_recompile_reasons(text: str) -> list[RecompileReason]:
    """The `recompile_reasons` payload: plain text, or JSON (a list of strings or dicts)."""
    items: list[Any]
    try:
        value = json.loads(text)
        items = value if isinstance(value, list) else [value]
    except ValueError:
        items = _split_text_reasons(text)
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append(RecompileReason(
                entry=str(item.get("compile_id") or item.get("entry") or ""),
                guard=str(item.get("guard") or item.get("reason") or json.dumps(item)),
                expected=None if item.get("expected") is None else str(item.get("expected")),
                actual=None if item.get("actual") is None else str(item.get("actual")),
                user_line=item.get("user_line") and str(item.get("user_line")),
                user_code=str(item.get("user_code") or "")))
        elif isinstance(item, str) and item.strip():
            out.append(_reason_from_text(item))
    return out


def _split_text_reasons(text: str) -> list[str]:
    """Plain-text reasons: a new reason starts at each `<compile id>: ` line (PyTorch's),
    or `- <compile id>: ` under a `Recompiling function ...` preamble (ours)."""
    items: list[str] = []
    for ln in text.splitlines():
        if _CID_PREFIX.match(ln):
            items.append(ln.strip().lstrip("- ").strip() if ln.lstrip().startswith("- ") else ln)
        elif items:
            items[-1] += "\n" + ln
    return items or [text]


def _reason_from_text(text: str) -> RecompileReason:
    first, _, rest = text.partition("\n")
    entry = ""
    m = _CID_PREFIX.match(first)
    if m:
        entry, first = m.group("cid"), first[m.end():]
    guard, _, comment = first.partition("  #")
    guard = guard.strip()
    r = RecompileReason(entry=entry, guard=guard)
    e = _EXPECTED.search(guard)
    g = _EXPECTED_GOT.match(guard)
    if g:
        r.guard, r.expected, r.actual = g.group("guard").strip(), g.group("expected"), g.group("actual")
    elif e:
        r.expected, r.actual = e.group("expected").strip(), e.group("actual").strip()
    else:
        c = _GUARD_COMPARE.match(guard)
        if c and c.group("op") in ("==", "is") and _LITERAL.match(c.group("rhs").strip()):
            r.expected = c.group("rhs").strip()
    frames, code = _traceback_frames(rest)
    if frames:
        r.user_line, r.user_code = frames[-1], code
    elif comment:
        # `# return x * c  # path/file.py:13 in g`: the code, then where it is
        parts = [p.strip().lstrip("# ").strip() for p in comment.split("  #")]
        if len(parts) > 1 and _WHERE.search(parts[-1]):
            r.user_code, r.user_line = parts[0], parts[-1]
        else:
            r.note = " ".join(parts)
    return r


def base_entry(entry: str) -> str:
    """"0/0_1" -> "0/0": the cache entry of a compile, whichever attempt made it."""
    return re.sub(r"_\d+$", "", entry or "")


def resume_target(co_name: Optional[str]) -> Optional[tuple[str, int]]:
    """`torch_dynamo_resume_in_f_at_6` -> ("f", 6): the function and line it resumes."""
    if not co_name:
        return None
    m = _RESUME.search(co_name)
    return (m.group("fn"), int(m.group("line"))) if m else None
