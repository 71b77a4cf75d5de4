"""The report's pages come from Jinja2 templates (tlparse/templates/) rendered with
autoescaping on: every value a template prints is escaped unless it is `Markup`, and
the one place that makes Markup is `code_text` below."""

from __future__ import annotations

import html
import os
from typing import Optional

import jinja2
from markupsafe import Markup

from .html_util import fmt_seconds


def code_text(text: Optional[str]) -> Markup:
    """Payload text for a <pre>: the one place the report marks a string safe. It is
    safe because html.escape has just escaped it; quotes are left as they are (they need
    no escaping outside attributes, and big code pages stay smaller)."""
    return Markup(html.escape("" if text is None else str(text), quote=False))


def thousands(n: int) -> str:
    return f"{n:,}"


def _bytecode_cache() -> Optional[jinja2.BytecodeCache]:
    """Compiled templates kept between runs (compiling them all costs ~0.2 s a run), in the
    user's cache folder; none when it cannot be written."""
    folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tlparse-templates")
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            return None
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(folder)


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("tlparse", "templates"),
    bytecode_cache=_bytecode_cache(),
    autoescape=jinja2.select_autoescape(["html", "svg"], default_for_string=True, default=True),
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    auto_reload=False,          # a report is one process: templates do not change under it
    undefined=jinja2.StrictUndefined,
)
ENV.filters.update(code_text=code_text, seconds=fmt_seconds, thousands=thousands)
ENV.globals.update(zip=zip)


_LOADED: dict = {}


def render(template: str, depth: int = 0, **context) -> str:
    """Render templates/<template>; `depth` is how many folders below the report root the
    page lives (links to the stylesheet and the front page go up that many)."""
    t = _LOADED.get(template)
    if t is None:       # a big trace renders thousands of pages: look each template up once
        t = _LOADED[template] = ENV.get_template(template)
    return t.render(up="../" * depth, **context)
