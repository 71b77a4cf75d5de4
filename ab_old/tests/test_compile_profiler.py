"""engine.debug.CompileProfiler as a backend: counts graphs, ops, graph breaks and
recompiles of the frames it compiled, and prints a report like PyTorch's guide shows."""

import gc

import torch

import engine
import observe
from engine.debug import CompileProfiler
from compile_events import compile_graph


def toy_example(a):
    x = a / (torch.abs(a) + 1)
    return x * 2


def other(a):
    return a.cos()


PRINT_BREAK = {"reason": "Call to a builtin that cannot be traced: print", "graph_break_id": "GB0001",
               "hint": "Move the call out", "user_stack": [{"filename": "/u/toy.py", "line": 5, "name": "toy_example"}]}


def test_counts_graphs_ops_breaks_and_recompiles():
    prof = CompileProfiler()
    x = torch.randn(10)
    compiled = compile_graph(toy_example, [x], prof, frame_id=0, breaks=[PRINT_BREAK])
    assert torch.equal(compiled(x), toy_example(x))       # observation only: runs the graph as is
    compile_graph(toy_example, [torch.randn(4)], prof, frame_id=0, compile_idx=1,
                  recompile_reason="0/0: tensor 'a' size mismatch at index 0. expected 10, actual 4")
    compile_graph(toy_example, [torch.randn(5)], prof, frame_id=0, compile_idx=2,
                  recompile_reason="0/1: tensor 'a' size mismatch at index 0. expected 4, actual 5")
    assert prof.get_metrics() == {"graphs": 3, "ops": 12, "graph_breaks": 1, "recompiles": 2}
    report = prof.report()
    assert report.startswith("Compile Profiler Report\n=======================")
    assert "Call to a builtin that cannot be traced: print" in report and "toy.py:5 in toy_example" in report
    fn = f"toy_example (test_compile_profiler.py:{toy_example.__code__.co_firstlineno})"
    assert fn in report and "expected 10, actual 4" in report and "expected 4, actual 5" in report
    assert "Set engine.config.cache_size_limit to 3" in report
    prof.close()


def test_ignores_frames_compiled_by_other_backends():
    prof = CompileProfiler()
    compile_graph(toy_example, [torch.randn(3)], prof, frame_id=10)
    compile_graph(other, [torch.randn(3)], lambda gm, ex: gm, frame_id=11, breaks=[PRINT_BREAK])
    compile_graph(other, [torch.randn(4)], lambda gm, ex: gm, frame_id=11, compile_idx=1, recompile_reason="x")
    assert prof.get_metrics() == {"graphs": 1, "ops": 4, "graph_breaks": 0, "recompiles": 0}
    report = prof.report()
    assert "No graph breaks detected." in report and "No recompilation detected." in report
    prof.close()


def test_with_block_counts_breaks_of_frames_without_a_graph_and_lifts_the_cache_limit():
    prof = CompileProfiler()
    limit = engine.config.cache_size_limit
    with prof:
        assert engine.config.cache_size_limit > limit
        # a break before any op: no graph reaches the backend, the break still counts
        with observe.compile_context(observe.CompileId(20, 0)):
            observe.emit("graph_break", PRINT_BREAK)
    assert engine.config.cache_size_limit == limit
    assert prof.get_metrics()["graph_breaks"] == 1
    prof.close()


def test_reads_the_trace_artifact_when_no_in_process_break_event_is_emitted():
    prof = CompileProfiler()
    with observe.compile_context(observe.CompileId(30, 0)):
        observe.emit("artifact", {"name": "dynamo_graph_break_reason", "encoding": "string"},
                     lambda: "Graph break in user code at t.py:3\nGraph Break Reason: Data-dependent branching\n  more")
        prof(torch.fx.symbolic_trace(other), [torch.randn(2)])
    assert prof.graph_breaks() == [("Data-dependent branching", "")]
    prof.close()


def test_a_forgotten_profiler_leaves_the_bus():
    prof = CompileProfiler()
    before = len(observe.bus._subscribers.get("graph_break", ()))
    del prof
    gc.collect()
    observe.emit("graph_break", {"reason": "x"})   # the dead subscriber removes itself
    assert len(observe.bus._subscribers.get("graph_break", ())) == before - 1
