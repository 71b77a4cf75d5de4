"""The trace sink: with `TORCH_TRACE=dir`, every event (but plain log lines) is appended
to one file per process in PyTorch's structured-trace format, so PyTorch's `tlparse`
and ours read it:

    V1122 02:08:22.133000 8673 engine/dynamo:0] {"dynamo_start": {...}, "frame_id": 0, ...}
    <TAB>payload line 1
    <TAB>payload line 2

`has_payload` is the md5 of the payload; file names in stacks are interned through
`{"str": [name, index]}` lines. Each event is one write and one flush, so a crash loses
nothing already emitted; each process gets its own file from `mkstemp`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from typing import IO, Optional

from . import bus

# Events that never go to the trace: plain log lines (they belong to TORCH_LOGS).
NOT_TRACED = frozenset({"log"})


def _rank() -> Optional[int]:
    for var in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    # ranks started without torchrun's variables (torch.multiprocessing.spawn): ask the
    # process group, when the program has made one by the time of the first event
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        return None
    return None


def _glog_prefix(t_ns: int, where: str) -> str:
    t = t_ns / 1e9
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1e6):06d}"
    return f"V{stamp} {os.getpid()} {where}:0]"


class TraceSink:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rank = _rank()
        self.file: Optional[IO[str]] = None
        self.path: Optional[str] = None
        self.strings: dict[str, int] = {}
        self.failed = False

    def _open(self) -> bool:
        if self.file is not None:
            return True
        if self.failed:
            return False
        try:
            os.makedirs(self.directory, exist_ok=True)
            self.rank = _rank()   # now, not at import: the process group may have come since
            prefix = "dedicated_log_torch_trace_" + (f"rank_{self.rank}_" if self.rank is not None else "")
            fd, self.path = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=self.directory)
            self.file = os.fdopen(fd, "a", encoding="utf-8")
        except OSError as exc:
            self.failed = True
            print(f"observe: TORCH_TRACE={self.directory!r} is not writable ({exc}); "
                  "no trace is written, the program runs on.", file=sys.stderr)
            return False
        self._write_header()
        return True

    def _late_rank(self) -> None:
        """The file was opened before the process group existed (an event at import): once
        the rank is known, the file takes its per-rank name and the envelopes carry it."""
        rank = _rank()
        if rank is None or self.path is None:
            return
        head, tail = os.path.split(self.path)
        new = os.path.join(head, tail.replace("dedicated_log_torch_trace_", f"dedicated_log_torch_trace_rank_{rank}_", 1))
        try:
            os.replace(self.path, new)   # the open file keeps being written under its new name
        except OSError:
            return
        self.path, self.rank = new, rank

    def _write_header(self) -> None:
        torch = sys.modules.get("torch")
        versions = {
            "pytorch_version": getattr(torch, "__version__", None),
            "python_version": sys.version.split()[0],
            "engine": "engine",
            "engine_version": _engine_version(),
            "argv": sys.argv,
            "executable": sys.executable,
            "cwd": os.getcwd(),
            # the switches that change what a compile does or shows (PyTorch's names)
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
        }
        self._write("artifact", {"name": "torch_version", "encoding": "json"}, None,
                    json.dumps(versions, indent=1), time.time_ns(), "observe/trace")

    def on_event(self, event: bus.Event) -> None:
        if event.name in NOT_TRACED or not self._open():
            return
        if self.rank is None:
            self._late_rank()
        where = f"engine/{event.stage or 'engine'}"
        if event.name in ("stage_begin", "stage_end"):
            md = event.metadata
            chromium = {
                "name": md["name"],
                "ts": event.time_ns / 1000.0,
                "args": {"compile_id": str(event.compile_id) if event.compile_id else None,
                         **({"ok": md["ok"]} if "ok" in md else {})},
                "ph": "B" if event.name == "stage_begin" else "E",
                "cat": "dynamo_timed",
                "tid": 0,
                "pid": 0,
            }
            self._write("chromium_event", {}, event.compile_id, json.dumps(chromium), event.time_ns, where)
            return
        metadata = self._intern_stacks(event.metadata)
        self._write(event.name, metadata, event.compile_id, event.payload(), event.time_ns, where)

    def _intern_stacks(self, metadata: dict) -> dict:
        stack = metadata.get("stack")
        if not isinstance(stack, list):
            return metadata
        frames = []
        for frame in stack:
            if isinstance(frame, dict) and isinstance(frame.get("filename"), str):
                frame = {**frame, "filename": self._intern(frame["filename"])}
            frames.append(frame)
        return {**metadata, "stack": frames}

    def _intern(self, filename: str) -> int:
        index = self.strings.get(filename)
        if index is None:
            index = self.strings[filename] = len(self.strings)
            line = f"{_glog_prefix(time.time_ns(), 'observe/trace')} " + json.dumps({"str": [filename, index]}) + "\n"
            self._raw_write(line)
        return index

    def _write(self, name: str, metadata: dict, compile_id: Optional[bus.CompileId], payload: Optional[str],
               t_ns: int, where: str) -> None:
        envelope: dict = {name: _jsonable(metadata)}
        if compile_id is not None:
            envelope.update(frame_id=compile_id.frame_id, frame_compile_id=compile_id.frame_compile_id,
                            attempt=compile_id.attempt)
        if self.rank is not None:
            envelope["rank"] = self.rank
        text = _glog_prefix(t_ns, where) + " "
        if payload is not None:
            envelope["has_payload"] = hashlib.md5(payload.encode("utf-8")).hexdigest()
            body = "".join(f"\t{line}\n" for line in payload.split("\n"))
        else:
            body = ""
        self._raw_write(text + json.dumps(envelope) + "\n" + body)

    def _raw_write(self, text: str) -> None:
        assert self.file is not None
        try:
            self.file.write(text)
            self.file.flush()
        except OSError as exc:
            self.failed = True
            print(f"observe: writing the trace to {self.path} failed ({exc}); tracing stops.", file=sys.stderr)
            bus.unsubscribe(self.on_event)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _jsonable(value):
    """Metadata is meant to be JSON already; anything else is shown by str()."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return str(value)


SINK: Optional[TraceSink] = None


_ENV_PREFIXES = ("TORCH_LOGS", "TORCH_TRACE", "TORCH_COMPILE", "TORCHDYNAMO_", "TORCHINDUCTOR_", "TORCH_CPP_LOG")


def _engine_version() -> Optional[str]:
    """The installed version of this project (observe ships in the same distribution)."""
    try:
        from importlib import metadata
        return metadata.version("engine-observe")
    except Exception:
        return None


def start(directory: str) -> TraceSink:
    """Write the trace of this process into `directory` (what TORCH_TRACE does)."""
    global SINK
    stop()
    SINK = TraceSink(directory)
    bus.subscribe(SINK.on_event)
    return SINK


def stop() -> None:
    global SINK
    if SINK is not None:
        bus.unsubscribe(SINK.on_event)
        SINK.close()
        SINK = None


def configure_from_env() -> None:
    directory = os.environ.get("TORCH_TRACE")
    if directory:
        start(directory)
