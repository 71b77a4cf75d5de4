"""The kernel cache's answer for each compiled graph (`kernel_cache_hit` / `_miss` /
`_bypass` artifacts, engine/codegen/cache_explain.py): cache.html lists hit, miss or bypass
per graph and its kernels, the reason for each miss (what differs from the closest entry
in the cache) and the seconds the hits saved; the front page sums them up."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

STATUSES = ("hit", "miss", "bypass")


@dataclasses.dataclass
class CacheResult:
    compile_label: str
    compile_slug: str
    status: str
    graph: str
    kernels: list
    reasons: list
    compile_s: Optional[float]
    saved_s: Optional[float]
    url: str


class CacheIndex:
    def __init__(self) -> None:
        self.results: list[CacheResult] = []
        self.bad: list[str] = []

    def add(self, compile_label: str, compile_slug: str, status: str, payload: bytes, url: str) -> None:
        try:
            data = json.loads(payload)
            result = CacheResult(compile_label, compile_slug, status, str(data.get("graph") or "?"),
                                 [str(k) for k in data.get("kernels") or ()],
                                 [str(r) for r in data.get("reasons") or ()],
                                 _seconds(data.get("compile_s")), _seconds(data.get("saved_s")), url)
        except (ValueError, TypeError, AttributeError) as exc:
            self.bad.append(f"{compile_label} {url}: {type(exc).__name__}: {exc}")
            return
        self.results.append(result)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    def summary(self) -> str:
        """`1 hit, 2 misses, 0 bypasses`."""
        plural = {"hit": "hits", "miss": "misses", "bypass": "bypasses"}
        return ", ".join(f"{self.count(s)} {s if self.count(s) == 1 else plural[s]}" for s in STATUSES)

    @property
    def saved_s(self) -> float:
        return sum(r.saved_s or 0.0 for r in self.results if r.status == "hit")

    @property
    def kernels(self) -> int:
        return sum(len(r.kernels) for r in self.results)


def _seconds(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) else None


def write_page(index: CacheIndex, out: str, render) -> Optional[str]:
    """cache.html, or None when the trace has no kernel cache results."""
    if not index.results and not index.bad:
        return None
    html = render("cache.html", title="Kernel cache", cache=index, statuses=STATUSES)
    with open(os.path.join(out, "cache.html"), "w", encoding="utf-8") as f:
        f.write(html)
    return "cache.html"
