"""Whole-file writes on a background thread.

A big trace becomes thousands of small pages; creating them is mostly system-call time,
during which the GIL is free, so one writer thread overlaps it with parsing. The queue is
bounded, so at most a few pages wait in memory."""

from __future__ import annotations

import queue
import threading
from typing import Optional, Union

from .html_util import write_file


class FileWriter:
    def __init__(self, max_pending: int = 64, thread: bool = True) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="tlparse-writer", daemon=True)
            self._thread.start()

    def submit(self, path: str, data: Union[str, bytes]) -> None:
        if self._error is not None:
            raise self._error
        if isinstance(data, str):   # encoded here: the thread then needs the GIL only between syscalls
            data = data.encode("utf-8", "surrogateescape")
        if self._thread is None:
            write_file(path, data)
        else:
            self._queue.put((path, data))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is None:
                try:
                    write_file(*item)
                except BaseException as exc:  # reported by the next submit() or close()
                    self._error = exc

    def close(self) -> None:
        """Wait for every file to be written; raise the first write error, if any."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error
