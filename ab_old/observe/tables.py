"""Text tables for the tools that print summaries (compile_times, the profiler, reports):
plain, aligned columns when piped; a `rich` table on a terminal."""

from __future__ import annotations

import io
import sys
from typing import IO, Optional, Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: Optional[str] = None) -> str:
    """tabulate's "simple" look: a header, a dashed rule, left-aligned text and
    right-aligned numbers (`align` overrides per column: "l" or "r")."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if align is None:
        align = "".join("r" if rows and all(_is_number(r[i]) for r in rows) else "l" for i in range(len(headers)))

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, align)]
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _is_number(value: object) -> bool:
    if isinstance(value, (int, float)):
        return True
    text = str(value).rstrip("%").replace(",", "")
    try:
        float(text)
        return True
    except ValueError:
        return False


def wants_color(stream: IO[str]) -> bool:
    """Rich output only on a terminal, and only where rich is installed."""
    try:
        if not stream.isatty():
            return False
        import rich  # noqa: F401
    except Exception:
        return False
    return True


def render_rich_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]],
                      caption: Optional[str] = None, width: Optional[int] = None) -> str:
    """The same table drawn by rich, returned as terminal text (ANSI styled)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, title_style="bold", header_style="bold cyan")
    for i, h in enumerate(headers):
        numeric = bool(rows) and all(_is_number(r[i]) for r in rows)
        table.add_column(h, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width or _terminal_width())
    console.print(table)
    return buf.getvalue()


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((120, 24)).columns


def write(text: str, stream: Optional[IO[str]] = None) -> None:
    stream = stream or sys.stdout
    stream.write(text if text.endswith("\n") else text + "\n")
    stream.flush()
