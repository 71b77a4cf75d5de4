"""The compile-time profiler on programs compiled by engine.compile."""

import os
import pstats
import subprocess
import sys
import textwrap

import pytest
import torch

import engine
from observe import profiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def helper(x):
    return torch.relu(x) * 2


def model(a, b):
    return helper(a) + helper(b).sum()


@pytest.fixture
def sink():
    engine.reset()
    s = profiler.ProfilerSink().start()
    yield s
    s.stop()
    engine.reset()


def test_compiled_function_is_a_row_and_engine_stages_are_rows(sink):
    engine.compile(model, backend="eager")(torch.randn(4), torch.randn(4))
    rows = {r.key: r for r in sink.rows()}
    root = (model.__code__.co_filename, model.__code__.co_firstlineno, "model")
    assert root in rows and rows[root].calls == 1 and rows[root].is_user
    assert ("<engine>", 0, "<entire_frame_compile>") in rows
    assert ("<engine>", 0, "<backend_compile>") in rows
    assert sink.total_ns > 0 and sink.overhead_ns > 0
    helper_key = (helper.__code__.co_filename, helper.__code__.co_firstlineno, "helper")
    if helper_key not in rows:
        pytest.skip("the interpreter does not emit trace_function stages yet")
    assert rows[helper_key].calls == 2
    assert rows[root].cum_s >= rows[helper_key].cum_s


def test_cached_calls_add_nothing(sink):
    f = engine.compile(model, backend="eager")
    f(torch.randn(4), torch.randn(4))
    events = sink.events
    for _ in range(20):
        f(torch.randn(4), torch.randn(4))
    assert sink.events == events


def test_env_var_with_engine_compile_writes_a_prof_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, engine
        def step(x):
            return (x.sin() + 1).sum()
        f = engine.compile(step, backend="eager")
        f(torch.randn(8))
    """))
    out = tmp_path / "compile.prof"
    env = {**os.environ, "TORCH_COMPILE_DYNAMO_PROFILER": str(out), "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    stats = pstats.Stats(str(out)).stats
    assert (str(script), 3, "step") in stats
