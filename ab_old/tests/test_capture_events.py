"""What the capture reports on the bus: PyTorch's event names and fields, so TORCH_LOGS,
TORCH_TRACE and tlparse show a compile the way they show PyTorch's."""

import logging

import torch

import engine
import observe
from engine_helpers import events, fresh_engine  # noqa: F401 (fresh_engine: autouse)


def program(x):
    y = torch.sin(x)
    print("debug", y.shape)
    return y + 1


def test_a_graph_break_compile_reports_like_pytorch(events, capsys):
    engine.compile(program, backend="eager")(torch.randn(3, 3))
    names = [e.name for e in events]
    starts = [e for e in events if e.name == "dynamo_start"]
    assert len(starts) == 2  # the function and its resume function
    assert starts[0].metadata["stack"][-1] == {"line": program.__code__.co_firstlineno, "name": "program",
                                               "filename": __file__}
    caller = starts[0].metadata["stack"][-2]  # the user's frame that made the call, as PyTorch shows it
    assert caller["name"] == "test_a_graph_break_compile_reports_like_pytorch" and "engine.compile" in caller["loc"]
    assert starts[1].metadata["stack"][-1]["line"] == program.__code__.co_firstlineno + 2  # resumes after print
    assert [str(e.compile_id) for e in starts] == ["0/0", "1/0"]

    graphs = [e for e in events if e.name == "dynamo_output_graph"]
    assert graphs[0].metadata["sizes"] == {"l_x_": [3, 3], "sin": [3, 3]}  # as PyTorch names them
    text = graphs[0].payload()
    assert 'def forward(self, L_x_: "f32[3, 3][3, 1]cpu")' in text
    assert f"# File: {__file__}:{program.__code__.co_firstlineno + 1} in program, code: y = torch.sin(x)" in text
    assert graphs[0].metadata["title"] == "TRACED GRAPH\n ===== __compiled_fn_1 ====="
    assert str(graphs[0].compile_id) == "0/0_1"  # traced again after the break was found

    [reason] = [e for e in events if e.name == "artifact" and e.metadata["name"] == "dynamo_graph_break_reason"]
    body = reason.payload()
    assert body.startswith(f"Graph break in user code at {__file__}:{program.__code__.co_firstlineno + 2}")
    assert "Graph Break Reason: GB0001" in body and "User code traceback:" in body
    [gb] = [e for e in events if e.name == "graph_break"]
    assert gb.metadata["graph_break_id"] == "GB0001" and gb.metadata["user_stack"][-1]["name"] == "program"

    artifacts = {e.metadata["name"] for e in events if e.name == "artifact"}
    assert "engine_resume_in_program_at_8_ORIGINAL_BYTECODE" in artifacts or \
        any(a.endswith("_MODIFIED_BYTECODE") and a.startswith("engine_resume_in_program") for a in artifacts)
    guards = [e for e in events if e.name == "dynamo_cpp_guards_str"]
    assert len(guards) == 2 and "TENSOR_MATCH" in guards[0].payload()

    metrics = [e.metadata for e in events if e.name == "compilation_metrics"]
    assert [m["co_name"] for m in metrics][0] == "program"
    m = metrics[0]
    for field in ("compile_id", "co_filename", "co_firstlineno", "cache_size", "guard_count", "graph_op_count",
                  "graph_node_count", "graph_input_count", "start_time", "entire_frame_compile_time_s",
                  "backend_compile_time_s", "fail_type", "fail_reason", "fail_user_frame_filename",
                  "fail_user_frame_lineno", "restart_reasons", "dynamo_time_before_restart_s", "has_guarded_code"):
        assert field in m, field
    assert m["graph_op_count"] == 1 and m["has_guarded_code"] and m["restart_reasons"]

    stages = {e.metadata["name"] for e in events if e.name == "stage_begin"}
    assert {"entire_frame_compile", "bytecode_tracing", "backend_compile"} <= stages


def test_recompile_reasons_name_the_failing_guard(events):
    compiled = engine.compile(lambda t: t * 2, backend="eager")
    compiled(torch.randn(2))
    compiled(torch.randn(3))
    [rec] = [e for e in events if e.name == "artifact" and e.metadata["name"] == "recompile_reasons"]
    assert "tensor 'L['t']' size mismatch at index 0. expected 2, actual 3" in rec.payload()


def test_nothing_is_formatted_without_a_sink(monkeypatch):
    import engine.capture.convert_frame as cf

    def boom(*a, **k):
        raise AssertionError("formatted with no sink")

    monkeypatch.setattr(cf, "render_guards", boom)
    engine.compile(lambda t: t + 1, backend="eager")(torch.randn(2))


def test_graph_breaks_log_shows_the_user_line(caplog):
    observe.set_logs(graph_breaks=True)
    try:
        with caplog.at_level(logging.INFO, logger="engine"):
            logging.getLogger("engine").propagate = True
            engine.compile(program, backend="eager")(torch.randn(2))
    finally:
        observe.set_logs()
        logging.getLogger("engine").propagate = False
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"Graph break in user code at {__file__}:{program.__code__.co_firstlineno + 2}" in text
