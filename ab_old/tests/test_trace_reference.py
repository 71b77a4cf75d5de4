"""A trace written through our bus opens in PyTorch's own tlparse (the PyPI package, Rust)
with no failures: its glog prefix, JSON envelopes, payload md5s and string table are
PyTorch's format. Skipped where the reference tool is not installed (CI installs it and
sets REFERENCE_TLPARSE)."""

import os
import re
import subprocess

import pytest

import observe
from observe import trace

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.environ.get("REFERENCE_TLPARSE") or os.path.join(
    os.path.dirname(HERE), ".venv", "reference-tlparse", "bin", "tlparse")
pytestmark = pytest.mark.skipif(not os.path.exists(REFERENCE), reason="reference tlparse not installed")


def emit_compiles():
    """What a compile with a graph break, a resume function and a recompile puts on the bus."""
    stack = [{"line": 12, "name": "<module>", "filename": "/u/train.py", "loc": "step(x)"},
             {"line": 3, "name": "step", "filename": "/u/train.py"}]
    with observe.compile_context(observe.CompileId(0, 0)):
        with observe.stage("entire_frame_compile"):
            observe.emit("dynamo_start", {"stack": stack})
            with observe.stage("bytecode_tracing"):
                observe.emit("artifact", {"name": "dynamo_graph_break_reason", "encoding": "string"},
                             lambda: "Graph break in user code at /u/train.py:5\nGraph Break Reason: print()")
            observe.emit("dynamo_output_graph", {"sizes": {"l_x_": [3]}},
                         lambda: "def forward(self, L_x_: \"f32[3]\"):\n\tsin = L_x_.sin()\n    return (sin,)")
            observe.emit("dynamo_cpp_guards_str", {}, lambda: "TREE_GUARD_MANAGER:\n+- TENSOR_MATCH: L['x']")
            observe.emit("aot_forward_graph", {}, lambda: "def forward(self, primals_1):\n    return (primals_1,)")
            observe.emit("inductor_output_code", {"filename": "/tmp/x.py"}, lambda: "# übersetzt ✓\ndef call(args): pass")
            observe.emit("artifact", {"name": "step_MODIFIED_BYTECODE", "encoding": "string"}, lambda: "")
        observe.emit("compilation_metrics", {"compile_id": "0/0", "co_name": "step", "co_filename": "/u/train.py",
                                             "co_firstlineno": 3, "graph_op_count": 1, "fail_type": None,
                                             "restart_reasons": [], "entire_frame_compile_time_s": 0.01})
    with observe.compile_context(observe.CompileId(1, 0)):
        with observe.stage("entire_frame_compile"):
            observe.emit("dynamo_start", {"stack": [*stack[:1], {"line": 5, "name": "engine_resume_in_step_at_5",
                                                                 "filename": "/u/train.py"}]})
            observe.emit("dynamo_output_graph", {}, lambda: "def forward(self):\n    return ()")
        observe.emit("compilation_metrics", {"compile_id": "1/0", "co_name": "engine_resume_in_step_at_5"})
    with observe.compile_context(observe.CompileId(0, 1)):
        observe.emit("artifact", {"name": "recompile_reasons", "encoding": "json"},
                     lambda: '["0/0: tensor \'x\' size mismatch at index 0. expected 3, actual 4"]')
        observe.emit("dynamo_start", {"stack": stack})
        observe.emit("compilation_metrics", {"compile_id": "0/1", "co_name": "step"})


def trace_compiles(tmp_path) -> str:
    """emit_compiles() under TORCH_TRACE=tmp_path/trace; the trace file's path."""
    sink = trace.start(str(tmp_path / "trace"))
    try:
        emit_compiles()
        return sink.path
    finally:
        trace.stop()


def reference_stats(tmp_path, log, *flags):
    out = tmp_path / "ref_out"
    proc = subprocess.run([REFERENCE, str(log), "-o", str(out), "--no-browser", "--overwrite", *flags],
                          capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    m = re.search(r"Stats \{([^}]*)\}", text)
    assert m, text
    stats = dict((k.strip(), int(v)) for k, v in (kv.split(":") for kv in m.group(1).split(",") if kv.strip()))
    return proc.returncode, stats, out


def test_reference_tlparse_parses_our_trace_without_failures(tmp_path):
    log = trace_compiles(tmp_path)
    rc, stats, out = reference_stats(tmp_path, log, "--strict")
    assert rc == 0
    assert not {k: v for k, v in stats.items() if k.startswith("fail")}, stats
    assert stats.get("unknown", 0) == 0, stats
    assert stats["ok"] >= 20
    # it found our compiles, including the restart-free resume frame and the recompile
    index = (out / "index.html").read_text()
    for cid in ("[0/0]", "[1/0]", "[0/1]"):
        assert cid in index, cid


def test_reference_tlparse_reads_ranked_traces(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    log = trace_compiles(tmp_path)
    assert "_rank_1_" in os.path.basename(log)
    rc, stats, _ = reference_stats(tmp_path, log, "--strict")
    assert rc == 0 and not {k: v for k, v in stats.items() if k.startswith("fail")}, stats
