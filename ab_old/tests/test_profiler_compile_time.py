"""The compile-time profiler: compile time per traced user function (cumulative, own,
calls, share), a pstats file that pstats and snakeviz open, its own overhead reported,
and nothing subscribed when it is off."""

import os
import pstats
import subprocess
import sys
import textwrap

import pytest
import torch

import observe
from observe import bus, profiler
from compile_events import busy, compile_graph, compiling, inline

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.fixture
def sink():
    s = profiler.ProfilerSink().start()
    yield s
    s.stop()


def forward(x):
    return torch.relu(x) * 2


def rows_by_name(sink):
    return {r.key[2]: r for r in sink.rows()}


def test_user_functions_get_cumulative_and_own_time(sink):
    # forward inlines block twice; block inlines act each time
    with compiling(0, 0, "forward", "/u/model.py", 5):
        with observe.stage("bytecode_tracing"):
            busy(1)
            for _ in range(2):
                with inline("block", "/u/layers.py", 10):
                    busy(1)
                    with inline("act", "/u/layers.py", 30):
                        busy(1)
        with observe.stage("backend_compile"):
            busy(1)
    rows = rows_by_name(sink)
    fwd, block, act = rows["forward"], rows["block"], rows["act"]
    assert (fwd.calls, block.calls, act.calls) == (1, 2, 2)
    assert fwd.key == ("/u/model.py", 5, "forward") and fwd.is_user
    # own = cumulative minus the children's cumulative, exactly (same stage timers)
    assert fwd.own_s == pytest.approx(fwd.cum_s - block.cum_s, abs=1e-9)
    assert block.own_s == pytest.approx(block.cum_s - act.cum_s, abs=1e-9)
    assert act.own_s == pytest.approx(act.cum_s, abs=1e-9)
    assert fwd.cum_s >= 0.005 and act.cum_s >= 0.002
    engine_rows = {r.key[2] for r in sink.rows() if not r.is_user}
    assert engine_rows == {"<entire_frame_compile>", "<backend_compile>"}
    assert sink.total_ns / 1e9 == pytest.approx(rows["<entire_frame_compile>"].cum_s)


def test_root_timed_twice_is_one_call_and_recursion_counts_primitive_calls(sink):
    # An interpreter may wrap the root in trace_function too: still one call of forward.
    with compiling(0, 0, "forward", "/u/model.py", 5):
        with observe.stage("bytecode_tracing"):
            with inline("forward", "/u/model.py", 5):
                with inline("fact", "/u/m.py", 1):
                    with inline("fact", "/u/m.py", 1):
                        busy(1)
    rows = rows_by_name(sink)
    assert rows["forward"].calls == 1
    fact = rows["fact"]
    assert (fact.calls, fact.primitive_calls) == (2, 1)
    # cumulative counts the outer (primitive) call only, as cProfile does
    assert fact.cum_s == pytest.approx(rows["forward"].cum_s - rows["forward"].own_s, abs=1e-9)


def test_report_table_has_shares_and_overhead(sink):
    compile_graph(forward, [torch.randn(3)], inlined=[("helper", "/u/h.py", 3)], trace_ms=1)
    text = sink.report()
    assert text.startswith("Compile time per traced user function:")
    header = text.splitlines()[1]
    assert header.split() == ["Function", "Calls", "Cumulative", "(ms)", "Own", "(ms)", "Share"]
    assert f"forward (test_profiler_compile_time.py:{forward.__code__.co_firstlineno})" in text
    assert "helper (h.py:3)" in text
    assert "Profiler overhead" in text and f"in {sink.events} events" in text
    assert sink.events > 0 and sink.overhead_ns > 0
    share = next(line for line in text.splitlines() if line.startswith("forward")).split()[-1]
    assert share.endswith("%") and 0 < float(share[:-1]) <= 100


def test_rich_table_on_a_terminal(sink):
    compile_graph(forward, [torch.randn(3)])
    text = sink.report(color=True, width=120)
    assert "\x1b[" in text and "┃" in text and "forward" in text


def test_prof_file_opens_in_pstats_with_user_functions_and_call_edges(sink, tmp_path):
    compile_graph(forward, [torch.randn(3)], inlined=[("helper", "/u/h.py", 3)], trace_ms=1)
    path = tmp_path / "compile.prof"
    sink.dump(str(path))
    stats = pstats.Stats(str(path))
    fwd_key = (forward.__code__.co_filename, forward.__code__.co_firstlineno, "forward")
    helper_key = ("/u/h.py", 3, "helper")
    assert fwd_key in stats.stats and helper_key in stats.stats
    cc, nc, tt, ct, callers = stats.stats[helper_key]
    assert (cc, nc) == (1, 1) and tt == pytest.approx(ct)
    assert fwd_key in callers                        # helper was inlined from forward
    assert ("<engine>", 0, "<entire_frame_compile>") in stats.stats[fwd_key][4]
    # every caller is itself an entry (what snakeviz and gprof2dot need)
    for _, (_, _, _, _, cs) in stats.stats.items():
        assert all(c in stats.stats for c in cs)
    assert ("<engine>", 0, "<profiler overhead>") in stats.stats


def test_snakeviz_reads_the_file(sink, tmp_path):
    snakeviz_stats = pytest.importorskip("snakeviz.stats")
    compile_graph(forward, [torch.randn(3)])
    path = tmp_path / "c.prof"
    sink.dump(str(path))
    rows = snakeviz_stats.table_rows(pstats.Stats(str(path)))
    assert any("forward" in row[-1] for row in rows)
    tree = snakeviz_stats.json_stats(pstats.Stats(str(path)))
    assert any("forward" in str(k) for k in tree)


def test_engine_internals_merge_a_real_cprofile(tmp_path):
    sink = profiler.ProfilerSink(internals=True).start()
    try:
        compile_graph(forward, [torch.randn(3)])
    finally:
        sink.stop()
    stats = sink.stats()
    names = {k[2] for k in stats.stats}
    assert "forward" in names                      # synthetic, from the stage tree
    assert "symbolic_trace" in names               # real, from cProfile of the compile


def test_off_means_not_subscribed():
    assert profiler.parse_env(None) == (False, None)
    assert profiler.parse_env("0") == (False, None)
    assert profiler.parse_env("1") == (True, None)
    assert profiler.parse_env("/tmp/x.prof") == (True, "/tmp/x.prof")
    sink = profiler.ProfilerSink()
    assert sink.on_event not in bus._subscribers.get("stage_begin", ())
    compile_graph(forward, [torch.randn(3)])
    assert sink.events == 0


SCRIPT = textwrap.dedent("""
    import observe, torch, sys
    sys.path.insert(0, {tests!r})
    from compile_events import compile_graph
    def forward(x):
        return x.sin()
    compile_graph(forward, [torch.randn(3)], inlined=[("helper", "/u/h.py", 3)])
""")


def run_script(tmp_path, value):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(tests=HERE))
    env = {**os.environ, "TORCH_COMPILE_DYNAMO_PROFILER": value, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)


def test_env_var_prints_the_table_at_exit_plain_when_piped(tmp_path):
    proc = run_script(tmp_path, "1")
    assert proc.returncode == 0, proc.stderr
    assert "Compile time per traced user function:" in proc.stdout
    assert "forward (script.py:5)" in proc.stdout and "helper (h.py:3)" in proc.stdout
    assert "\x1b[" not in proc.stdout               # piped: no terminal styling


def test_env_var_path_writes_a_prof_file(tmp_path):
    out = tmp_path / "compile.prof"
    proc = run_script(tmp_path, str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"snakeviz {out}" in proc.stderr
    names = {k[2] for k in pstats.Stats(str(out)).stats}
    assert {"forward", "helper", "<entire_frame_compile>", "<backend_compile>"} <= names


def test_finish_says_why_no_profile_was_written(capsys, tmp_path):
    profiler.ProfilerSink(output=str(tmp_path / "c.prof")).start().finish()
    assert "nothing was compiled" in capsys.readouterr().err
    sink = profiler.ProfilerSink(output=str(tmp_path / "missing" / "c.prof")).start()
    compile_graph(forward, [torch.randn(3)])
    sink.finish()
    err = capsys.readouterr().err
    assert "could not write the compile profile" in err and "missing" in err
