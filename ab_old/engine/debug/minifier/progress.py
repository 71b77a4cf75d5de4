"""Progress while minifying. Each step is a `minifier_progress` event on the bus (and a
line on the `minifier` TORCH_LOGS channel); the minifier's scripts show it with
ProgressDisplay: a rich status line on a terminal, plain lines when piped."""

from __future__ import annotations

import logging
import sys
from typing import IO, Optional

import observe
from observe import logs as _logs
from observe.tables import wants_color


def report(step: str, line: str, **numbers) -> None:
    """One step: "start", "trial", "phase", "done" or "note"."""
    observe.emit("minifier_progress", {"title": line, "step": step, **numbers}, log="minifier",
                 level=logging.INFO)


class ProgressDisplay:
    """Shows minifier_progress events while the minifier runs (`with ProgressDisplay():`)."""

    def __init__(self, stream: Optional[IO[str]] = None) -> None:
        self.stream = stream or sys.stderr
        self.rich = wants_color(self.stream)
        self.status = None

    def __enter__(self) -> "ProgressDisplay":
        if self.rich:
            from rich.console import Console

            self.console = Console(file=self.stream)
            self.status = self.console.status("minifier: starting")
            self.status.start()
        observe.subscribe(self.on_event, events=["minifier_progress"])
        return self

    def __exit__(self, *exc) -> None:
        observe.unsubscribe(self.on_event)
        if self.status is not None:
            self.status.stop()

    def on_event(self, event: observe.Event) -> None:
        md = event.metadata
        line = md.get("title", "")
        if self.status is None:
            if _logs.SINK.levels.get("minifier", 100) <= logging.INFO:
                return   # TORCH_LOGS=minifier prints the same line already
            self.stream.write(f"minifier: {line}\n")
            self.stream.flush()
            return
        if md.get("step") == "trial":   # trials update the status line; the rest stay on screen
            self.status.update(f"minifier: {line}")
        else:
            from rich.markup import escape

            self.console.print(f"minifier: {escape(line)}")
