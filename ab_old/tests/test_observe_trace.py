"""TORCH_TRACE: PyTorch's structured-trace format, one file per process, flushed per
event, and a clear message (not a crash) when the directory cannot be written."""

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap

import observe
from observe import trace

PREFIX = re.compile(r"^V\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [^\]]+:\d+\] ")


def read_trace(path):
    """[(envelope, payload or None)] as tlparse reads them."""
    entries = []
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.startswith("\t"):
            envelope, payload = entries[-1]
            entries[-1] = (envelope, (payload + "\n" if payload is not None else "") + line[1:])
        elif line:
            assert PREFIX.match(line), line
            entries.append((json.loads(PREFIX.sub("", line)), None))
    return entries


def write_sample(directory):
    sink = trace.start(str(directory))
    try:
        with observe.compile_context(observe.CompileId(0, 0)):
            with observe.stage("entire_frame_compile"):
                observe.emit("dynamo_start", {"stack": [{"line": 4, "name": "fn", "filename": "/u/script.py"},
                                                        {"line": 9, "name": "<module>", "filename": "/u/script.py"}]})
                observe.emit("dynamo_output_graph", {"sizes": {"l_x_": [3]}}, lambda: "def forward(self, L_x_):\n    return (L_x_,)")
                observe.log("dynamo", 20, "plain log lines stay out of the trace")
        return sink.path
    finally:
        trace.stop()


def test_envelopes_payloads_and_string_table(tmp_path):
    path = write_sample(tmp_path)
    assert os.path.basename(path).startswith("dedicated_log_torch_trace_")
    entries = read_trace(path)
    keys = [next(iter(e)) for e, _ in entries]
    assert keys[0] == "artifact" and entries[0][0]["artifact"]["name"] == "torch_version"
    assert "log" not in keys
    assert keys.count("str") == 1  # the file name is interned once
    (start,) = [e for e, _ in entries if "dynamo_start" in e]
    assert start["frame_id"] == 0 and start["frame_compile_id"] == 0 and start["attempt"] == 0
    str_entry = next(e for e, _ in entries if "str" in e)
    assert str_entry["str"] == ["/u/script.py", start["dynamo_start"]["stack"][0]["filename"]]
    graph, payload = next((e, p) for e, p in entries if "dynamo_output_graph" in e)
    assert payload.startswith("def forward")
    assert graph["has_payload"] == hashlib.md5(payload.encode()).hexdigest()
    phases = [json.loads(p)["ph"] for e, p in entries if "chromium_event" in e]
    assert phases == ["B", "E"]


def test_each_process_writes_its_own_file(tmp_path):
    script = textwrap.dedent("""
        import observe
        observe.emit("artifact", {"name": "hello", "encoding": "string"}, lambda: "hi")
    """)
    env = {**os.environ, "TORCH_TRACE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(3)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 3
    for name in files:
        assert [next(iter(e)) for e, _ in read_trace(tmp_path / name)] == ["artifact", "artifact"]


def test_rank_goes_into_file_name_and_envelopes(tmp_path):
    script = "import observe; observe.emit('artifact', {'name': 'x', 'encoding': 'string'}, lambda: 'y')"
    env = {**os.environ, "TORCH_TRACE": str(tmp_path), "RANK": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    (name,) = os.listdir(tmp_path)
    assert name.startswith("dedicated_log_torch_trace_rank_1_")
    assert all(e["rank"] == 1 for e, _ in read_trace(tmp_path / name))


def test_unwritable_directory_is_reported_and_the_program_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    script = "import observe; observe.emit('artifact', {'name': 'x'}, lambda: 'y'); print('still running')"
    env = {**os.environ, "TORCH_TRACE": str(blocker / "trace")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "still running" in out.stdout
    assert "is not writable" in out.stderr and "the program runs on" in out.stderr


def test_payload_that_is_not_text_is_written_as_text(tmp_path):
    sink = trace.start(str(tmp_path))
    try:
        observe.emit("artifact", {"name": "odd", "encoding": "string"}, lambda: b"\xffbytes")
        observe.emit("artifact", {"name": "obj", "encoding": "string", "when": object()}, lambda: 42)
    finally:
        trace.stop()
    entries = read_trace(sink.path)
    assert entries[1][1] == "\ufffdbytes"
    assert entries[2][1] == "42" and entries[2][0]["artifact"]["when"].startswith("<object")


def test_a_crash_loses_nothing_already_emitted(tmp_path):
    script = textwrap.dedent("""
        import os, observe
        observe.emit("artifact", {"name": "before_crash", "encoding": "string"}, lambda: "kept")
        os._exit(3)
    """)
    env = {**os.environ, "TORCH_TRACE": str(tmp_path)}
    assert subprocess.run([sys.executable, "-c", script], env=env, timeout=60).returncode == 3
    (name,) = os.listdir(tmp_path)
    assert read_trace(tmp_path / name)[-1][1] == "kept"
