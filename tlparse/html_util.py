"""HTML building blocks. Everything that came from a trace goes through `esc` (a function
named `<script>` stays text); pages link one local stylesheet and script."""

from __future__ import annotations

import html
import os
from typing import Iterable, Optional


def write_file(path: str, data) -> None:
    """Write a whole file with bare os calls: on traces with thousands of artifacts the
    buffered-file machinery of open() costs more than the bytes."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, depth: int = 0, search: bool = True, head_extra: str = "", nav: bool = True) -> str:
    """A whole page. `depth` is how many folders below the report root it lives."""
    up = "../" * depth
    form = (f'<form action="{up}search.html" method="get"><input type="search" name="q" '
            f'placeholder="search frames, reasons, code"></form>') if search else ""
    links = (f"<a href=\"{up}index.html#breaks\">graph breaks</a><a href=\"{up}index.html#recompiles\">recompiles</a>"
             f"<a href=\"{up}index.html#failures\">failures</a><a href=\"{up}index.html#trie\">stack trie</a>"
             f"<a href=\"{up}search.html\">search</a>") if nav else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><link rel=\"stylesheet\" href=\"{up}assets/report.css\">{head_extra}</head>\n"
        f"<body><header class=\"top\"><span class=\"brand\"><a href=\"{up}index.html\">tlparse report</a></span>"
        f"{links}{form}</header>\n"
        f"<main>\n{body}\n</main><script src=\"{up}assets/report.js\"></script></body></html>\n"
    )


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], numeric: Optional[set[int]] = None,
          cls: str = "") -> str:
    """Cells are already HTML (escape before)."""
    numeric = numeric or set()
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{h}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>' for i, c in enumerate(row)) + "</tr>\n"
        for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>'


def code_block(text: str, lang: str = "text", wrap: bool = False) -> str:
    cls = ' class="wrap"' if wrap else ""
    # quotes need no escaping outside attributes; leaving them makes big pages smaller
    return f'<pre data-lang="{esc(lang)}"{cls}>{html.escape(text, quote=False)}</pre>'


def fmt_seconds(value: Optional[float]) -> str:
    if value is None:
        return ""
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms"
