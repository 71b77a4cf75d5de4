"""compile_times() and CompileProfiler on programs compiled by engine.compile."""

import warnings

import pytest
import torch

import engine
from engine.debug import CompileProfiler
from observe import metrics


@pytest.fixture(autouse=True)
def fresh():
    engine.reset()
    sink = metrics.MetricsSink().start()
    yield sink
    sink.stop()
    engine.reset()


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    if b.sum() < 0:
        b = b * -1
    return x * b


def scale(x, c):
    return x * c


def test_compile_times_has_a_value_per_compile_and_a_row_per_function(fresh, capsys):
    f = engine.compile(scale, backend="eager")
    f(torch.randn(3), 0.5)
    f(torch.randn(3), 0.5)            # cached: no new compile, no new values
    f(torch.randn(3), 1.5)            # a recompile
    headers, values = fresh.compile_times(repr="csv")
    by_stage = dict(zip(headers, values))
    assert len(by_stage["entire_frame_compile"].split(", ")) == 2
    assert len(by_stage["bytecode_tracing"].split(", ")) == 2
    (summary,) = fresh.per_function()
    assert summary.function.name == "scale" and summary.compiles == 2
    assert summary.function.lineno == scale.__code__.co_firstlineno
    assert "scale (test_metrics_engine.py:" in fresh.compile_times()


def test_a_restart_after_a_graph_break_is_not_a_second_compile(fresh, capsys):
    f = engine.compile(toy_example, backend="eager")
    f(torch.randn(10), torch.ones(10))
    by_name = {s.function.name: s for s in fresh.per_function()}
    assert by_name["toy_example"].compiles == 1
    assert by_name["toy_example"].graph_breaks >= 1
    records = [r for r in fresh.compiles.values() if r.function and r.function.name == "toy_example"]
    assert any(r.metrics.get("co_name") == "toy_example" for r in records)


def test_compile_profiler_counts_what_the_engine_did(capsys):
    prof = CompileProfiler()
    with prof:
        f = engine.compile(toy_example, backend=prof)
        g = engine.compile(scale, backend=prof)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for n in (10, 10, 12):
                f(torch.randn(n), torch.ones(n))
            for i in range(3):
                g(torch.randn(3), 0.5 + i)
    m = prof.get_metrics()
    # toy_example: 3 graphs per shape (2 shapes); scale: 3 values of c
    assert m["graphs"] == 6 + 3
    assert m["graph_breaks"] == 4          # print and the tensor branch, for each shape
    report = prof.report()
    assert "Call to a builtin that cannot be traced" in report and "Data-dependent control flow" in report
    recompiles = prof.recompiles()
    scale_key = next(k for k in recompiles if k.startswith("scale "))
    assert len(recompiles[scale_key]) == 2 and "0.5" in recompiles[scale_key][0]
    assert any("size mismatch" in r for k, rs in recompiles.items() if k.startswith("toy_example ") for r in rs)
    prof.close()
