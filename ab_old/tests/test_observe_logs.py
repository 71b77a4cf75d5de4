"""TORCH_LOGS and set_logs(): the names from PyTorch's troubleshooting guide select what
is printed; unknown names get a clear message instead of an exception."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import observe
from observe import logs, registry

GUIDE_NAMES = ["+all", "+dynamo", "+aot", "+inductor", "dynamic", "graph_code", "graph_sizes", "trace_bytecode",
               "trace_source", "bytecode", "guards", "recompiles", "recompiles_verbose", "graph_breaks",
               "aot_graphs", "aot_joint_graphs", "output_code", "kernel_code", "schedule", "perf_hints", "fusion"]


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_every_name_from_the_guide_is_known(name):
    levels, unknown = logs.parse(name)
    assert unknown == [] and levels


def test_levels_and_signs():
    levels, _ = logs.parse("+dynamo,aot,-inductor,graph_breaks")
    assert levels["dynamo"] == logging.DEBUG
    assert levels["aot"] == logging.INFO
    assert levels["inductor"] == logging.ERROR
    assert levels["graph_breaks"] == logging.INFO
    # +dynamo also shows the dynamo artifacts, but not the ones off by default
    assert "guards" in levels and "recompiles_verbose" not in levels
    levels, _ = logs.parse("all,-graph_code")
    assert "graph_code" not in levels and levels["aot"] == logging.INFO


def test_unknown_name_lists_valid_names():
    _, unknown = logs.parse("graph_breaks,grpah_code")
    assert unknown == ["grpah_code"]
    msg = logs.unknown_names_message(unknown)
    assert "'grpah_code'" in msg and "graph_code" in msg and "recompiles" in msg


def test_set_logs_routes_events_to_python_logging(caplog):
    observe.set_logs(graph_breaks=True, dynamo=logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger="engine"):
            logging.getLogger("engine").addHandler(caplog.handler)
            with observe.compile_context(observe.CompileId(0, 0)):
                observe.emit("artifact", {"name": "dynamo_graph_break_reason", "title": "Graph break"},
                             lambda: "Reason: print", log="graph_breaks")
                observe.log("dynamo", logging.DEBUG, "tracing %s", "fn")
                observe.log("aot", logging.INFO, "not selected")
    finally:
        observe.set_logs()
        logging.getLogger("engine").removeHandler(caplog.handler)
    messages = [r.getMessage() for r in caplog.records]
    assert "Graph break\nReason: print" in messages
    assert "tracing fn" in messages
    assert "not selected" not in messages
    record = next(r for r in caplog.records if r.getMessage().startswith("Graph break"))
    assert str(record.compile_id) == "0/0" and record.artifact == "graph_breaks"


def test_set_logs_rejects_typos_in_code():
    with pytest.raises(ValueError, match="Valid names"):
        observe.set_logs(graph_brakes=True)


def test_set_logs_off_unsubscribes():
    observe.set_logs(graph_breaks=True)
    assert observe.enabled("anything", log="graph_breaks")
    observe.set_logs()
    assert not observe.enabled("anything", log="graph_breaks")


def test_formatter_prefix_matches_pytorch_shape():
    record = logging.LogRecord("engine.__graph_breaks", logging.INFO, __file__, 1, "msg", (), None)
    record.compile_id = observe.CompileId(1, 0)
    record.artifact = "graph_breaks"
    record.stage = "dynamo"
    text = logs.Formatter().format(record)
    assert text.startswith("I") and text.endswith("dynamo] [1/0] [__graph_breaks] msg")


def test_env_var_with_names_only_we_know_works_and_torch_stays_quiet(tmp_path):
    """torch itself rejects unknown TORCH_LOGS names; importing engine first must not."""
    script = textwrap.dedent("""
        import logging, engine, observe, torch
        observe.emit("artifact", {"name": "x"}, lambda: "from the bus", log="schedule")
        torch.randn(2) + 1
    """)
    env = {**os.environ, "TORCH_LOGS": "schedule,graph_breaks,not_a_name"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "from the bus" in out.stderr
    assert "ignoring unknown TORCH_LOGS name(s) 'not_a_name'" in out.stderr
    assert out.stderr.count("from the bus") == 1


def test_docs_page_matches_the_registry():
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "logging.md")
    text = open(path).read()
    assert registry.render_markdown() in text, "regenerate with: python -m observe"
