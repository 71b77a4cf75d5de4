"""tlparse on traces written by our own bus (observe.trace): a compile with a graph break
and its resume function, a recompile, AOT graphs, output code and kernels, extra event
keys it has never heard of, and names that look like HTML."""

import json
import os
import re
import subprocess
import sys
import textwrap

import observe
from observe import trace

from tlparse.cli import main

USER = "/home/me/train.py"
EVIL = "<script>alert(1)</script>"


def emit_program():
    """What the engine emits for: f graph-breaks on print() at line 5 and resumes; f
    recompiles once on a new shape; a function named `<script>...` compiles too."""
    def stack(name, line):
        return {"stack": [{"line": 20, "name": "<module>", "filename": USER, "loc": "f(x)"},
                          {"line": line, "name": name, "filename": USER}]}

    with observe.compile_context(observe.CompileId(0, 0)):
        with observe.stage("entire_frame_compile"):
            observe.emit("dynamo_start", stack("f", 3))
            observe.emit("artifact", {"name": "f_ORIGINAL_BYTECODE", "encoding": "string"},
                         lambda: "  3           0 RESUME                   0\n              2 LOAD_FAST                0 (x)")
            with observe.stage("bytecode_tracing"):
                observe.emit("graph_break", {"reason": "Call to a builtin that cannot be traced",
                                             "graph_break_id": "GB0001",
                                             "hint": "Move the call out of the compiled function.",
                                             "user_stack": [{"filename": USER, "line": 5, "name": "f",
                                                             "loc": "print('hi')"}]})
                observe.emit("artifact", {"name": "dynamo_graph_break_reason", "encoding": "string"},
                             lambda: "Graph break in user code\nGraph Break Reason: Call to a builtin that cannot be traced")
            observe.emit("dynamo_output_graph", {"sizes": {"l_x_": [3]}},
                         lambda: "class GraphModule(torch.nn.Module):\n    def forward(self, L_x_):\n        return (L_x_.sin(),)")
            observe.emit("dynamo_cpp_guards_str", {}, lambda: "TREE_GUARD_MANAGER:\n+- TENSOR_MATCH: L['x'] size=[3]")
            observe.emit("artifact", {"name": "f_MODIFIED_BYTECODE", "encoding": "string"},
                         lambda: "  3           0 RESUME                   0")
            with observe.stage("aot"):
                observe.emit("aot_forward_graph", {}, lambda: "def forward(self, primals_1):\n    sin = torch.ops.aten.sin.default(primals_1)")
                observe.emit("aot_backward_graph", {}, lambda: "def forward(self, primals_1, tangents_1):\n    cos = ...")
            with observe.stage("inductor"):
                observe.emit("inductor_output_code", {"filename": "/tmp/out.py"},
                             lambda: "def call(args):\n    cpp_fused_sin_0(args[0])")
                observe.emit("kernel_code", {"name": "cpp_fused_sin_0"},
                             lambda: '#include <cmath>\nextern "C" void kernel(const float* in, float* out) {}')
            observe.emit("my_new_event", {"what": "a key tlparse has never seen"}, lambda: "its payload")
            observe.emit("my_flag_event", {"answer": 42})
        observe.emit("compilation_metrics", {"compile_id": "0/0", "co_name": "f", "co_filename": USER,
                                             "co_firstlineno": 3, "graph_op_count": 1,
                                             "entire_frame_compile_time_s": 0.25})
    with observe.compile_context(observe.CompileId(1, 0)):
        with observe.stage("entire_frame_compile"):
            observe.emit("dynamo_start", stack("engine_resume_in_f_at_5", 5))
            observe.emit("dynamo_output_graph", {}, lambda: "def forward(self, L_y_):\n    return (L_y_.cos(),)")
        observe.emit("compilation_metrics", {"compile_id": "1/0", "co_name": "engine_resume_in_f_at_5",
                                             "co_filename": USER, "co_firstlineno": 5, "graph_op_count": 1,
                                             "entire_frame_compile_time_s": 0.125})
    with observe.compile_context(observe.CompileId(0, 1)):
        observe.emit("artifact", {"name": "recompile_reasons", "encoding": "json"},
                     lambda: json.dumps([{"compile_id": "0/0", "guard": "L['x'].size()[0] == 3",
                                          "expected": 3, "actual": 4, "user_line": f"{USER}:4 in f",
                                          "user_code": "y = x.sin()"}]))
        with observe.stage("entire_frame_compile"):
            observe.emit("dynamo_start", stack("f", 3))
            observe.emit("dynamo_output_graph", {}, lambda: "def forward(self, L_x_):\n    return (L_x_.sin(),)")
        observe.emit("compilation_metrics", {"compile_id": "0/1", "co_name": "f", "co_filename": USER,
                                             "co_firstlineno": 3, "graph_op_count": 1})
    with observe.compile_context(observe.CompileId(2, 0)):
        observe.emit("dynamo_start", {"stack": [{"line": 30, "name": EVIL, "filename": USER}]})
        observe.emit("dynamo_output_graph", {}, lambda: f"# {EVIL}\ndef forward(self):\n    return ()")
        observe.emit("compilation_metrics", {"compile_id": "2/0", "co_name": EVIL, "co_filename": USER,
                                             "co_firstlineno": 30, "graph_op_count": 0,
                                             "fail_type": "BackendCompilerFailed", "fail_reason": f"boom {EVIL}"})


def write_trace(directory):
    sink = trace.start(str(directory))
    try:
        emit_program()
        return sink.path
    finally:
        trace.stop()


def render(tmp_path, *flags):
    log = write_trace(tmp_path / "trace")
    out = tmp_path / "report"
    assert main([log, "-o", str(out), "--no-browser", *flags]) == 0
    return out


def test_our_trace_renders_breaks_resumes_recompiles(tmp_path):
    out = render(tmp_path)
    index = (out / "index.html").read_text()
    breaks = index.split('id="breaks"')[1].split('id="recompiles"')[0]
    # the structured event and the text artifact are one break, at the user's line, with its hint
    assert breaks.count('<b id="break-') == 1
    assert "Call to a builtin that cannot be traced" in breaks and "/home/me/train.py:5" in breaks
    assert "Move the call out of the compiled function." in breaks and "print(&#39;hi&#39;)" in breaks
    assert "[1/0]" in breaks and "375.0 ms" not in breaks and "125.0 ms" in breaks  # cost: the resume compile
    recompiles = index.split('id="recompiles"')[1].split('id="failures"')[0]
    assert "L[&#39;x&#39;].size()[0] == 3" in recompiles
    assert "<td>3</td><td>4</td>" in recompiles and "y = x.sin()" in recompiles
    trie = index.split('id="trie"')[1]
    assert 'status-ok" href="compiles/0_0.html"' in trie and 'status-resumed" href="compiles/1_0.html"' in trie
    assert 'status-error" href="compiles/2_0.html"' in trie


def test_compile_page_has_every_stage_output(tmp_path):
    out = render(tmp_path)
    page = (out / "compiles" / "0_0.html").read_text()
    for label in ("graph", "guards", "original bytecode", "modified bytecode", "AOT forward", "AOT backward",
                  "output code", "kernels", "metrics"):
        assert re.search(rf'<a href="[^"]+">{label}</a>', page), label
    kernel = next(out.glob("artifacts/0_0-*_kernel_code.html")).read_text()
    assert '<pre data-lang="cpp">' in kernel and "extern &#34;C&#34;" not in kernel and 'extern "C"' in kernel
    stages = page.split("Time per stage")[1]
    for stage in ("entire_frame_compile", "bytecode_tracing", "aot", "inductor"):
        assert stage in stages


def test_unknown_event_keys_are_shown_generically(tmp_path):
    out = render(tmp_path)
    page = (out / "compiles" / "0_0.html").read_text()
    assert ">my_new_event</a>" in page
    assert "its payload" in next(out.glob("artifacts/0_0-*_my_new_event.html")).read_text()
    assert "my_flag_event" in page and "42" in page.split("my_flag_event", 1)[1]
    about = (out / "index.html").read_text().split("About this report")[1]
    assert "my_new_event: 1 (unknown, shown generically)" in about


def test_names_from_the_trace_stay_text(tmp_path):
    """A function named `<script>` is shown, never run."""
    out = render(tmp_path)
    for path in out.rglob("*.html"):
        html = path.read_text()
        assert EVIL not in html, path
        assert "<img" not in html
    index = (out / "index.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in index
    assert "boom &lt;script&gt;" in index


def test_timeline_from_stages(tmp_path):
    out = render(tmp_path)
    events = json.loads((out / "chromium_events.json").read_text())
    names = {e["name"] for e in events}
    assert {"entire_frame_compile", "bytecode_tracing", "aot", "inductor"} <= names
    assert sum(e["ph"] == "B" for e in events) == sum(e["ph"] == "E" for e in events)
    assert all(isinstance(e["ts"], (int, float)) for e in events)


PROGRAM = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_tlparse_ours import write_trace
    write_trace({out!r})
""")


def test_plain_text_diffs_cleanly_between_runs(tmp_path):
    """Two runs (different processes, times and pids) give identical text reports."""
    reports = []
    for run in ("a", "b"):
        tdir = tmp_path / f"trace_{run}"
        subprocess.run([sys.executable, "-c", PROGRAM.format(tests=os.path.dirname(__file__), out=str(tdir))],
                       check=True, env={**os.environ, "TORCH_TRACE": ""})
        out = tmp_path / f"plain_{run}"
        assert main([str(tdir), "-o", str(out), "--plain-text"]) == 0
        reports.append(out)
    a, b = reports
    files_a = sorted(p.relative_to(a) for p in a.rglob("*.txt"))
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*.txt"))
    assert "index.txt" in map(str, files_a) and not (a / "index.html").exists()
    for rel in files_a:
        if rel.name == "timings.txt":
            continue
        assert (a / rel).read_text() == (b / rel).read_text(), rel
    index = (a / "index.txt").read_text()
    assert "Call to a builtin that cannot be traced" in index and "L['x'].size()[0] == 3" in index
    assert not re.search(r"\b\d\d:\d\d:\d\d\b", index) and str(os.getpid()) not in index
    assert "entire_frame_compile" in (a / "timings.txt").read_text()
