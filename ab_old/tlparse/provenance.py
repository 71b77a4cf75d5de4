"""Kernels <-> user lines, both ways, from the `kernel_provenance` artifacts the code
generator writes (one per compiled graph: forward, backward or inference).

`kernels.html` lists, for each of the user's lines, every kernel it ended up in (forward and
backward, across compiles), and for each compile, each kernel with the FX nodes, aten nodes
and user lines it fuses. The compile pages link to their part of it."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional


@dataclasses.dataclass
class GraphKernels:
    """One compiled graph's kernels, as the artifact lists them."""
    compile_label: str
    compile_slug: str
    role: str                    # forward | backward | inference
    aot_graph: Optional[int]
    url: str                     # the artifact's page
    kernels: list                # dicts: kernel, kind, op, aten, fx, lines, stacks
    key: str = ""                # the graph's cache key: its output code is output_code_<key>.py


@dataclasses.dataclass
class LineUse:
    """One user line and the kernels that compute it."""
    file: str
    line: int
    code: str
    kernels: list = dataclasses.field(default_factory=list)   # (GraphKernels, kernel dict)


class ProvenanceIndex:
    def __init__(self) -> None:
        self.graphs: list[GraphKernels] = []
        self.bad: list[str] = []       # artifacts that could not be read, with why
        self.code_urls: dict = {}      # output code file name -> its page

    def note_output_code(self, filename: str, url: str) -> None:
        self.code_urls.setdefault(filename, url)

    def code_url(self, g: GraphKernels) -> str:
        """The page of the graph's output code, where a comment above each call names its
        lines; the provenance artifact's own page when the trace has no output code."""
        return self.code_urls.get(f"output_code_{g.key}.py", g.url)

    def add(self, compile_label: str, compile_slug: str, payload: bytes, url: str) -> None:
        try:
            data = json.loads(payload)
            kernels = [k for k in data["kernels"] if isinstance(k, dict) and "kernel" in k]
        except (ValueError, KeyError, TypeError) as exc:
            self.bad.append(f"{compile_label} {url}: {type(exc).__name__}: {exc}")
            return
        self.graphs.append(GraphKernels(compile_label, compile_slug, str(data.get("graph") or "?"),
                                        data.get("aot_graph"), url, kernels, str(data.get("key") or "")))

    def of_compile(self, slug: str) -> list[GraphKernels]:
        return [g for g in self.graphs if g.compile_slug == slug]

    def lines(self) -> list[LineUse]:
        """Every user line that some kernel computes, by file then line."""
        uses: dict = {}
        for g in self.graphs:
            for k in g.kernels:
                for ln in k.get("lines") or ():
                    key = (str(ln.get("file")), int(ln.get("line") or 0))
                    use = uses.get(key)
                    if use is None:
                        use = uses[key] = LineUse(key[0], key[1], str(ln.get("code") or ""))
                    use.kernels.append((g, k))
        return [uses[k] for k in sorted(uses)]


def write_page(index: ProvenanceIndex, out: str, render) -> Optional[str]:
    """kernels.html, or None when the trace has no kernel provenance (no inductor graphs)."""
    import os

    if not index.graphs and not index.bad:
        return None
    lines = index.lines()
    files: dict = {}
    for use in lines:
        files.setdefault(use.file, []).append(use)
    html = render("kernels.html", title="Kernels and your lines", files=files, graphs=index.graphs, code_url=index.code_url,
                  bad=index.bad, n_kernels=sum(len(g.kernels) for g in index.graphs), n_lines=len(lines))
    with open(os.path.join(out, "kernels.html"), "w", encoding="utf-8") as f:
        f.write(html)
    return "kernels.html"
