"""compile_times(): time per compiler stage and per compiled function, from the bus's
stage timers, reading like PyTorch's `torch._dynamo.utils.compile_times()`."""

import pytest
import torch

import engine
import observe
from observe import metrics
from compile_events import compile_graph, compiling, inline


@pytest.fixture
def sink():
    s = metrics.MetricsSink().start()
    yield s
    s.stop()


def toy(x):
    return torch.sin(x) + 1


def other(x):
    return x * 2


def test_one_value_per_stage_occurrence_and_outer_stages_first(sink):
    compile_graph(toy, [torch.randn(3)], frame_id=0, compile_idx=0)
    compile_graph(toy, [torch.randn(4)], frame_id=0, compile_idx=1, recompile_reason="0/0: size mismatch")
    text = sink.compile_times()
    lines = text.splitlines()
    assert lines[0] == "TorchDynamo compilation metrics:"
    assert lines[1].split() == ["Function", "Runtimes", "(s)"]
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines[3:] if line and not line.startswith("-")}
    # two compiles -> two comma-separated values per stage, 4 decimals like PyTorch
    for stage in ("entire_frame_compile", "bytecode_tracing", "backend_compile"):
        values = rows[stage].split(", ")
        assert len(values) == 2 and all(len(v.split(".")[1]) == 4 for v in values)
    # entire_frame_compile started first, so it is listed first
    assert lines[3].startswith("entire_frame_compile")


def test_aggregate_sums_and_csv_matches_pytorch_shape(sink):
    compile_graph(toy, [torch.randn(3)], frame_id=0, compile_idx=0)
    compile_graph(other, [torch.randn(3)], frame_id=1, compile_idx=0)
    headers, values = sink.compile_times(repr="csv")
    assert headers[0] == "entire_frame_compile" and "backend_compile" in headers
    assert all(len(v.split(", ")) == 2 for v in values)
    headers2, totals = sink.compile_times(repr="csv", aggregate=True)
    assert headers2 == headers
    for many, total in zip(values, totals):
        assert abs(sum(float(v) for v in many.split(", ")) - float(total)) < 2e-6


def test_per_function_rows_group_recompiles_of_one_function(sink):
    compile_graph(toy, [torch.randn(3)], frame_id=0, compile_idx=0)
    compile_graph(toy, [torch.randn(4)], frame_id=0, compile_idx=1)
    compile_graph(other, [torch.randn(3)], frame_id=1, compile_idx=0)
    by_name = {s.function.name: s for s in sink.per_function()}
    assert by_name["toy"].compiles == 2 and by_name["other"].compiles == 1
    assert by_name["toy"].function.lineno == toy.__code__.co_firstlineno
    toy_records = [r for r in sink.compiles.values() if r.function.name == "toy"]
    assert by_name["toy"].total_s == pytest.approx(sum(r.stage_s["entire_frame_compile"] for r in toy_records))
    text = sink.compile_times()
    assert "Per compiled function:" in text
    assert f"toy (test_metrics_compile_times.py:{toy.__code__.co_firstlineno})" in text


def test_compile_records_keep_compilation_metrics_and_failures(sink):
    compile_graph(toy, [torch.randn(3)], frame_id=0, compile_idx=0,
                  breaks=[{"reason": "print", "graph_break_id": "GB0001", "user_stack": []}])
    with pytest.raises(RuntimeError):
        with compiling(2, 0, "broken", "b.py", 1):
            with observe.stage("backend_compile"):
                raise RuntimeError("backend failed")
    ok, bad = sink.compiles["0/0"], sink.compiles["2/0"]
    assert ok.metrics["graph_op_count"] == 2 and ok.graph_breaks == 1
    assert ok.stage_s["entire_frame_compile"] >= ok.stage_s["bytecode_tracing"] + ok.stage_s["backend_compile"]
    assert bad.failed_stages == ["backend_compile", "entire_frame_compile"]
    assert bad.function.name == "broken"


def test_inlined_functions_are_not_stage_rows(sink):
    with compiling(0, 0, "f", "f.py", 1):
        with observe.stage("bytecode_tracing"):
            for _ in range(50):
                with inline("helper", "h.py", 3):
                    pass
    headers, _ = sink.compile_times(repr="csv")
    assert "trace_function" not in headers


def test_engine_exports_compile_times_from_the_always_on_sink():
    before = len(metrics.SINK.stage_times.get("entire_frame_compile", []))
    compile_graph(toy, [torch.randn(3)], frame_id=7, compile_idx=0)
    assert len(metrics.SINK.stage_times["entire_frame_compile"]) == before + 1
    assert engine.compile_times is metrics.compile_times
    assert "entire_frame_compile" in engine.compile_times()
    with pytest.raises(ValueError, match="'str' or 'csv'"):
        engine.compile_times(repr="html")


def test_costs_nothing_when_no_compile_happens(sink):
    # A cached call emits no compile event: the sink sees nothing and keeps nothing.
    observe.emit("some_runtime_event", {"x": 1})
    assert sink.stage_times == {} and sink.compiles == {}


def test_compile_ids_repeated_after_a_reset_stay_separate_records(sink):
    compile_graph(toy, [torch.randn(3)], frame_id=0, compile_idx=0)
    compile_graph(other, [torch.randn(3)], frame_id=0, compile_idx=0)   # engine.reset() restarted the ids
    names = sorted(r.function.name for r in sink.compiles.values())
    assert names == ["other", "toy"]
    assert {s.function.name: s.compiles for s in sink.per_function()} == {"toy": 1, "other": 1}
