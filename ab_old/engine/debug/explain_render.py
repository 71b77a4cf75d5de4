"""How an `ExplainOutput` prints. The text follows PyTorch's explain():

    Graph Count: 3
    Graph Break Count: 2
    Op Count: 5
    Break Reasons:
      Break Reason 1:
        Reason: Call to a builtin that cannot be traced: print
        Registry Id: GB0001
        Hint: Move the call out of the compiled function, ...
        User Stack:
          <FrameSummary file toy.py, line 5 in toy_example>
    Ops per Graph:
      Ops 1:
        <built-in method abs of type object at 0x...>
    Out Guards:
      Guard 1:
        ...

plain when piped, styled with `rich` on a terminal (same lines, same order). It reads
the output object by attribute, so any object with those fields renders.
"""

from __future__ import annotations

import io
import sys
from typing import Any, Optional

# (text, style) lines; style is a rich style name or "".
Line = tuple[str, str]


def lines(out: Any) -> list[Line]:
    result: list[Line] = [
        (f"Graph Count: {getattr(out, 'graph_count', 0)}", "bold"),
        (f"Graph Break Count: {getattr(out, 'graph_break_count', 0)}", "bold"),
        (f"Op Count: {getattr(out, 'op_count', 0)}", "bold"),
    ]
    declined = getattr(out, "not_compiled", None)
    if declined:
        result.append(("Not Compiled (runs eagerly):", "bold red"))
        result += [(f"  {d}", "red") for d in declined]
    result.append(("Break Reasons:", "bold cyan"))
    for i, br in enumerate(getattr(out, "break_reasons", None) or [], 1):
        result.append((f"  Break Reason {i}:", "bold"))
        result.append((f"    Reason: {_field(br, 'reason')}", "yellow"))
        registry_id = _field(br, "graph_break_id", None) or _field(br, "registry_id", None) or _field(br, "id", None)
        if registry_id:
            result.append((f"    Registry Id: {registry_id}", "dim"))
        hint = _field(br, "hint", None)
        if hint:
            result.append((f"    Hint: {hint}", "green"))
        result.append(("    User Stack:", ""))
        for frame in _field(br, "user_stack", None) or []:
            result.append((f"      {format_frame(frame)}", "dim"))
            source = _source_line(frame)
            if source:
                result.append((f"        {source}", "dim"))
    ops_per_graph = getattr(out, "ops_per_graph", None)
    if ops_per_graph is not None:
        result.append(("Ops per Graph:", "bold cyan"))
        for i, ops in enumerate(ops_per_graph, 1):
            result.append((f"  Ops {i}:", "bold"))
            result += [(f"    {op}", "") for op in ops]
    out_guards = getattr(out, "out_guards", None)
    if out_guards is not None:
        result.append(("Out Guards:", "bold cyan"))
        for i, guard in enumerate(out_guards, 1):
            result.append((f"  Guard {i}:", "bold"))
            result += [(f"    {text}", "") for text in _guard_text(guard).splitlines() or [""]]
    compile_times = getattr(out, "compile_times", None)
    if compile_times:
        result.append((f"Compile Times: {compile_times}", ""))
    return result


def format_frame(frame: Any) -> str:
    """A user frame as PyTorch shows one: `<FrameSummary file foo.py, line 5 in fn>`.
    Frames may be FrameSummary objects, dicts (filename, line, name) or tuples
    (filename, lineno, name[, source line])."""
    if isinstance(frame, tuple) and len(frame) >= 3:
        return f"<FrameSummary file {frame[0]}, line {frame[1]} in {frame[2]}>"
    if isinstance(frame, dict):
        filename = frame.get("filename")
        lineno = frame.get("line", frame.get("lineno"))
        name = frame.get("name")
        return f"<FrameSummary file {filename}, line {lineno} in {name}>"
    if all(hasattr(frame, a) for a in ("filename", "lineno", "name")):
        return f"<FrameSummary file {frame.filename}, line {frame.lineno} in {frame.name}>"
    return str(frame)


def _source_line(frame: Any) -> str:
    """The frame's source text, shown under it as in a traceback."""
    if isinstance(frame, tuple) and len(frame) >= 4 and frame[3]:
        return str(frame[3]).strip()
    if isinstance(frame, dict):
        return str(frame.get("code") or frame.get("loc") or "").strip()
    return ""


def _guard_text(guard: Any) -> str:
    """The engine's guards render through engine.guards; anything else by str()."""
    if isinstance(guard, str):
        return guard
    try:
        from engine.guards import Guard, render_guard

        if isinstance(guard, Guard):
            return render_guard(guard)
    except ImportError:
        pass
    return str(guard)


def _field(obj: Any, name: str, default: Any = "") -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def render(out: Any, color: Optional[bool] = None, width: Optional[int] = None) -> str:
    """The text of `print(out)`. `color=None` styles it when stdout is a terminal."""
    from observe.tables import wants_color

    if color is None:
        color = wants_color(sys.stdout)
    rendered = lines(out)
    if not color:
        return "\n".join(text for text, _ in rendered) + "\n"
    from rich.console import Console
    from rich.text import Text

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width or 200, highlight=False, soft_wrap=True)
    for text, style in rendered:
        console.print(Text(text, style=style or ""))
    return buf.getvalue()


def print_explain(out: Any, file=None) -> None:
    stream = file or sys.stdout
    from observe.tables import wants_color

    stream.write(render(out, color=wants_color(stream)))
