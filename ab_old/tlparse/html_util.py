"""Small helpers of the report's writers (the pages themselves are templates: templating.py)."""

from __future__ import annotations

import os
from typing import Optional


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


def fmt_seconds(value: Optional[float]) -> str:
    if value is None:
        return ""
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms"
