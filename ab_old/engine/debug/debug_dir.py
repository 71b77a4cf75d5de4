"""TORCH_COMPILE_DEBUG=1 (or `engine.config.compile_debug = True`): a debug folder per run,
written from bus events.

    <engine.config.debug_dir_root>/              (TORCH_COMPILE_DEBUG_DIR, else ./torch_compile_debug)
      run_2026_11_22_03_10_00_123456-pid_4242/
        debug.log                 one line per compile event: ids, stages and their times
        config.json               engine.config when the run folder was made
        fn__0_0/                  one folder per compile id: <function>__<frame>_<compile>[_<attempt>]
          fx_graph_readable.py    the captured graph, with shapes and source lines
          fx_graph_runnable.py    the same graph as a script: `python fx_graph_runnable.py`
          guards.txt, graph_break_reasons.txt, compilation_metrics.json
          aot_forward_graph.py, aot_backward_graph.py, ...       (AOT stage)
          fx_graph_transformed.py, ir_pre_fusion.txt, ir_post_fusion.txt, output_code.py
                                                                  (codegen stage)

The graph module itself arrives in-process as metadata `graph_module` (and
`example_inputs`) of the `backend_compile` stage (the trace writes only a stage's name,
so the object never reaches a file); without it, fx_graph_readable.py comes from the
`dynamo_output_graph` payload and no runnable is written.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from typing import Optional

import observe
from observe.metrics import compiled_function

from . import fx_runnable

# Payload events and artifacts -> the file each becomes in the compile's folder.
EVENT_FILES = {
    "dynamo_cpp_guards_str": "guards.txt",
    "aot_joint_graph": "aot_joint_graph.py",
    "aot_forward_graph": "aot_forward_graph.py",
    "aot_backward_graph": "aot_backward_graph.py",
    "aot_inference_graph": "aot_inference_graph.py",
    "inductor_output_code": "output_code.py",
    "fx_graph_transformed": "fx_graph_transformed.py",
    "ir_pre_fusion": "ir_pre_fusion.txt",
    "ir_post_fusion": "ir_post_fusion.txt",
}
ARTIFACT_FILES = {
    "inductor_post_grad_graph": "fx_graph_transformed.py",
    "fx_graph_transformed": "fx_graph_transformed.py",
    "ir_pre_fusion": "ir_pre_fusion.txt",
    "ir_post_fusion": "ir_post_fusion.txt",
    "dynamo_graph_break_reason": "graph_break_reasons.txt",
}
APPEND = {"graph_break_reasons.txt"}
# Codegen runs once for the forward and once for the backward graph of a compile; the
# backward's files get a `_backward` suffix (told apart by the AOT stage they run in).
PER_GRAPH = {"output_code.py", "fx_graph_transformed.py", "ir_pre_fusion.txt", "ir_post_fusion.txt"}


class DebugDirSink:
    # Listened to only while the folder is on; `dynamo_start` (the first event of every
    # compile) is always listened to and switches the rest on or off, so with the folder
    # off no sink asks for graph payloads or metadata.
    EVENTS = ["dynamo_output_graph", "compilation_metrics", "stage_begin", "stage_end", "artifact", *EVENT_FILES]

    def __init__(self, root: Optional[str] = None, always: bool = False) -> None:
        self.root = root                 # None: engine.config.debug_dir_root at each event
        self.always = always             # True: on regardless of engine.config.compile_debug
        self.run_dirs: dict[str, str] = {}
        self.compile_dirs: dict[str, str] = {}
        self.names: dict[tuple, str] = {}  # (frame id, compile index) -> function name (restarts share it)
        self.readable_from_gm: set[str] = set()
        self.failed = False
        self.active = False               # subscribed to EVENTS (the folder is on)

    def start(self) -> "DebugDirSink":
        observe.subscribe(self.on_compile_start, events=["dynamo_start"])
        return self

    def stop(self) -> None:
        observe.unsubscribe(self.on_compile_start)
        observe.unsubscribe(self.on_event)
        self.active = False

    def on_compile_start(self, event: observe.Event) -> None:
        on = self.enabled()
        if on and not self.active:
            observe.subscribe(self.on_event, events=self.EVENTS)
        elif not on and self.active:
            observe.unsubscribe(self.on_event)
        self.active = on
        if on:
            self.on_event(event)

    def enabled(self) -> bool:
        if self.failed:
            return False
        if self.always:
            return True
        from engine import config

        return bool(config.compile_debug)

    # -- folders -------------------------------------------------------------------------
    def run_dir(self) -> str:
        from engine import config

        root = os.path.abspath(self.root or config.debug_dir_root)
        path = self.run_dirs.get(root)
        if path is None:
            stamp = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S_%f")
            path = os.path.join(root, f"run_{stamp}-pid_{os.getpid()}")
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(config.snapshot(), f, indent=1, default=str)
            self.run_dirs[root] = path
        return path

    def compile_dir(self, compile_id: Optional[observe.CompileId]) -> str:
        cid = str(compile_id) if compile_id is not None else "none"
        path = self.compile_dirs.get(cid)
        if path is None:
            name = _safe(self._name(compile_id))
            suffix = "unknown_compile" if compile_id is None else \
                f"{compile_id.frame_id}_{compile_id.frame_compile_id}" + (f"_{compile_id.attempt}" if compile_id.attempt else "")
            path = _unique(os.path.join(self.run_dir(), f"{name}__{suffix}"), sep="-")
            os.makedirs(path)
            self.compile_dirs[cid] = path
        return path

    def _name(self, compile_id: Optional[observe.CompileId]) -> str:
        if compile_id is None:
            return "graph"
        return self.names.get((compile_id.frame_id, compile_id.frame_compile_id), "graph")

    # -- the subscriber ------------------------------------------------------------------
    def on_event(self, event: observe.Event) -> None:
        if not self.enabled():
            return
        try:
            self._handle(event)
        except OSError as exc:
            self.failed = True
            print(f"engine: writing the compile debug folder failed ({exc}); it is no longer written.", file=sys.stderr)

    def _handle(self, event: observe.Event) -> None:
        md = event.metadata
        cid = event.compile_id
        name = event.name
        if name == "stage_begin":
            if md.get("name") == "backend_compile" and md.get("graph_module") is not None:
                self._write_graph_module(cid, md["graph_module"], md.get("example_inputs"))
            return
        if name == "stage_end":
            if md.get("name") != "trace_function":
                state = "ok" if md.get("ok") else "FAILED"
                self._log(cid, f"stage {md.get('name')} {md.get('duration_ns', 0) / 1e6:.2f} ms {state}")
            return
        if name == "dynamo_start":
            if cid is not None:
                # a new compile: after engine.reset() its id may repeat an earlier one's
                base = f"{cid.frame_id}/{cid.frame_compile_id}"
                for key in [k for k in self.compile_dirs if k.split("_", 1)[0] == base]:
                    del self.compile_dirs[key]
                self.readable_from_gm = {k for k in self.readable_from_gm if k.split("_", 1)[0] != base}
                fn = compiled_function(md.get("stack"))
                self.names[(cid.frame_id, cid.frame_compile_id)] = fn.name if fn else "graph"
                if fn is not None:
                    self._log(cid, f"dynamo_start {fn.name} ({fn.filename}:{fn.lineno})")
            return
        if name == "dynamo_output_graph":
            # the graph's text; replaced by the graph module's own when that arrives
            self._write(cid, "fx_graph_readable.py", event.payload() or "", replace=True)
            self._log(cid, f"dynamo_output_graph ({len(md.get('sizes') or {})} nodes with sizes)")
            return
        if name == "compilation_metrics":
            self._write(cid, "compilation_metrics.json", json.dumps(md, indent=1, default=str), replace=True)
            return
        if name == "artifact":
            filename = ARTIFACT_FILES.get(md.get("name"))
            if filename is None:
                return
        else:
            filename = EVENT_FILES.get(name)
            if filename is None:
                return
        if event.stage and "backward" in event.stage and filename in PER_GRAPH:
            stem, ext = os.path.splitext(filename)   # codegen of the backward graph
            filename = f"{stem}_backward{ext}"
        self._write(cid, filename, event.payload() or "", append=filename in APPEND)
        self._log(cid, f"{md.get('name') if name == 'artifact' else name} -> {filename}")

    def _write_graph_module(self, cid, gm, example_inputs) -> None:
        folder = self.compile_dir(cid)
        title = f"The graph of compile [{cid}] ({self._name(cid)}), as the backend received it."
        readable = gm.print_readable(print_output=False) if hasattr(gm, "print_readable") else str(gm)
        first = str(cid) not in self.readable_from_gm
        self._write(cid, "fx_graph_readable.py", f"# {title}\n{readable}", replace=first)
        path = _unique(os.path.join(folder, "fx_graph_runnable.py"))
        try:
            fx_runnable.write(gm, example_inputs, path, title=title)
        except Exception as exc:  # a graph we cannot render as a script must not stop the compile
            with open(path, "w") as f:
                f.write(f"# fx_graph_runnable could not be written: {type(exc).__name__}: {exc}\n"
                        f"raise SystemExit(1)\n")
        self.readable_from_gm.add(str(cid))
        self._log(cid, f"backend_compile graph -> {os.path.basename(path)}")

    def _write(self, cid, filename: str, text: str, *, replace: bool = False, append: bool = False) -> None:
        folder = self.compile_dir(cid)
        path = os.path.join(folder, filename)
        if append:
            with open(path, "a", encoding="utf-8") as f:
                f.write(text.rstrip("\n") + "\n\n")
            return
        if not replace:
            path = _unique(path)   # a second forward/backward output keeps the first
        with open(path, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def _log(self, cid, line: str) -> None:
        stamp = datetime.datetime.now().strftime("%H:%M:%S.%f")
        with open(os.path.join(self.run_dir(), "debug.log"), "a", encoding="utf-8") as f:
            f.write(f"{stamp} [{cid if cid is not None else '-'}] {line}\n")


def _unique(path: str, sep: str = "_") -> str:
    """`path`, or `stem_1.ext`, `stem_2.ext`, ... if it exists (folders: `name-1`, ...)."""
    if not os.path.exists(path):
        return path
    stem, ext = os.path.splitext(path) if sep == "_" else (path, "")
    n = 1
    while os.path.exists(f"{stem}{sep}{n}{ext}"):
        n += 1
    return f"{stem}{sep}{n}{ext}"


def _safe(name: str) -> str:
    """A folder-friendly function name. Resume functions nest their names
    (`engine_resume_in_engine_resume_in_f_at_9_at_12`): keep the function and the
    line the last break was at (`resume_in_f_at_12`)."""
    m = re.fullmatch(r"(?:(?:engine|torch_dynamo)_resume_in_)+(.+?)(?:_at_\d+)*_at_(\d+)", name)
    if m:
        name = f"resume_in_{m.group(1)}_at_{m.group(2)}"
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:64] or "graph"


SINK: Optional[DebugDirSink] = None


def install() -> DebugDirSink:
    """Listen from now on; the folder is written only while `engine.config.compile_debug`
    is true (TORCH_COMPILE_DEBUG=1 sets it), checked at the start of each compile, so
    installing costs nothing per call and one check per compile."""
    global SINK
    if SINK is None:
        SINK = DebugDirSink().start()
    return SINK


def current_run_dir() -> Optional[str]:
    """The run folder this process writes into (None until something was written)."""
    if SINK is None or not SINK.run_dirs:
        return None
    return next(reversed(SINK.run_dirs.values()))
