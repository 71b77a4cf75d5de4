"""What the AOT stage shows: the joint, forward, backward and inference aten graphs as
events (TORCH_LOGS=aot_graphs / aot_joint_graphs, TORCH_TRACE), saved-activation bytes in
+aot logs, and errors that name the stage and the graph node."""

import json
import logging

import pytest
import torch
import torch.fx

import observe
from engine.aot import AOTAutogradError, aot_compile
from engine.backends.aot_eager import aot_eager, aot_eager_decomp_partition, run_graph
from engine_helpers import events


def named(events, name):
    return [e for e in events if e.name == name]


def mlp_graph():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    return torch.fx.symbolic_trace(model)


def test_training_compile_shows_joint_forward_and_backward_graphs(events):
    aot_eager(mlp_graph(), [torch.randn(3, 4)])
    (joint,) = named(events, "aot_joint_graph")
    (fw,) = named(events, "aot_forward_graph")
    (bw,) = named(events, "aot_backward_graph")
    assert joint.log == "aot_joint_graph" and fw.log == bw.log == "aot_graphs"
    assert fw.metadata["title"].startswith("===== Forward graph")
    # readable aten graphs with shapes, strides and devices
    assert "primals_1" in joint.payload() and "tangents_1" in joint.payload()
    assert 'torch.ops.aten.addmm.default' in fw.payload()
    assert '"f32[3, 8][8, 1]cpu"' in fw.payload()
    assert "tangents_1" in bw.payload() and "primals" not in bw.payload().split("tangents_1")[0].split("forward(")[0]
    assert fw.metadata["saved_bytes"] > 0 and set(fw.metadata["saved_bytes_by_partitioner"]) == {"default", "min_cut"}
    assert not named(events, "aot_inference_graph")


def test_inference_compile_shows_one_inference_graph(events):
    with torch.no_grad():
        aot_eager(mlp_graph(), [torch.randn(3, 4)])
    (inf,) = named(events, "aot_inference_graph")
    assert inf.log == "aot_graphs" and "aten.gelu" in inf.payload()
    assert not named(events, "aot_joint_graph")


def test_stages_are_timed(events):
    aot_eager(mlp_graph(), [torch.randn(3, 4)])
    begun = [e.metadata["name"] for e in named(events, "stage_begin")]
    for stage in ("aot", "aot_collect_metadata", "aot_trace_joint_graph", "aot_partition",
                  "aot_compile_forward", "aot_compile_backward"):
        assert stage in begun
    assert all(e.metadata["ok"] for e in named(events, "stage_end"))


def test_debug_logs_report_saved_bytes_of_both_partitioners(events):
    aot_eager_decomp_partition(mlp_graph(), [torch.randn(3, 4)])
    lines = [e.metadata["msg"] % e.metadata["args"] for e in named(events, "log") if e.metadata["channel"] == "aot"]
    (summary,) = [ln for ln in lines if "saved for backward" in ln]
    assert "partitioner=min_cut" in summary and "default:" in summary and "min_cut:" in summary
    (stats,) = [e for e in named(events, "artifact") if e.metadata["name"] == "aot_partition_stats"]
    data = json.loads(stats.payload())
    assert data["saved"]["min_cut"]["bytes"] <= data["saved"]["default"]["bytes"]


def test_logs_sink_prints_aot_graphs(capsys):
    observe.set_logs(aot_graphs=True)
    try:
        handler_stream = []
        logger = logging.getLogger("engine")
        h = logging.StreamHandler()
        h.emit = lambda record: handler_stream.append(record.getMessage())
        logger.addHandler(h)
        aot_eager(mlp_graph(), [torch.randn(3, 4)])
        logger.removeHandler(h)
    finally:
        observe.set_logs()
    text = "\n".join(handler_stream)
    assert "===== Forward graph" in text and "===== Backward graph" in text and "class forward" in text


def test_nothing_is_formatted_when_nobody_listens(monkeypatch):
    import engine.aot.compile as compile_mod

    def boom(gm):
        raise AssertionError("formatted a graph nobody asked for")

    monkeypatch.setattr(compile_mod, "readable", boom)
    aot_eager(mlp_graph(), [torch.randn(3, 4)])


def branch_on_data(x):
    return x if x.sum() > 0 else -x          # Python control flow on a tensor's value


torch.fx.wrap("branch_on_data")


def test_a_failure_names_the_stage_and_the_node():
    def f(x):
        return branch_on_data(x * 2) + 1

    gm = torch.fx.symbolic_trace(f)
    with pytest.raises(AOTAutogradError) as info:
        aot_compile(gm, [torch.randn(4)], fw_compiler=run_graph)
    message = str(info.value)
    assert message.startswith("AOT autograd failed while")
    assert "branch_on_data" in message and info.value.node.name == "branch_on_data"


def test_unsupported_input_metadata_mutation_runs_eagerly_and_says_why(events):
    def f(x):
        x.t_()                      # changes the input's strides: not compiled, run as is
        return x + 1

    compiled = aot_eager(torch.fx.symbolic_trace(f), [torch.randn(2, 3)])
    a = torch.randn(2, 3)
    b = a.clone()
    torch.testing.assert_close(compiled(a), f(b))
    assert a.shape == b.shape == (3, 2)
    lines = [e.metadata["msg"] % e.metadata["args"] for e in named(events, "log")]
    assert any("runs eagerly" in ln and "mutated" in ln for ln in lines)


def test_forward_and_backward_aten_nodes_carry_the_user_source_line(events):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return torch.tanh(x @ self.w).sum()          # the line both graphs point at

    gm = torch.fx.symbolic_trace(Net())
    for node in gm.graph.nodes:                         # what capture records on each node
        if node.op == "call_function" or node.op == "call_method":
            node.meta["stack_trace"] = '  File "net.py", line 7, in forward\n    return torch.tanh(x @ self.w).sum()\n'
    aot_eager(gm, [torch.randn(2, 4)])
    (fw,) = named(events, "aot_forward_graph")
    (bw,) = named(events, "aot_backward_graph")
    for event in (fw, bw):
        assert "code: return torch.tanh(x @ self.w).sum()" in event.payload()


def test_a_call_that_needs_new_graphs_says_what_changed(events):
    compiled = aot_eager(torch.fx.symbolic_trace(torch.nn.Linear(4, 2)), [torch.randn(3, 4)])
    compiled(torch.randn(5, 4))
    with torch.no_grad():
        compiled(torch.randn(5, 4))
    lines = [e.metadata["msg"] % e.metadata["args"] for e in named(events, "log") if "again" in e.metadata["msg"]]
    assert lines == ["compiling again for new inputs: input 0: shape (3, 4) -> (5, 4)",
                     "compiling again for new inputs: grad mode True -> False"]
    later = [e for e in named(events, "aot_inference_graph")]
    assert len(later) == 1


def test_a_value_computed_twice_is_computed_once(events):
    """Autocast casts x once per linear that reads it; the joint graph keeps one cast, and the
    backward's casts of the same values are merged too. Gradients match eager's."""
    import engine

    def qkv(x, wq, wk, wv):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (x @ wq).float().sum() + (x @ wk).float().sum() + (x @ wv).float().sum()

    x = torch.randn(8, 16, requires_grad=True)
    ws = [torch.randn(16, 16, requires_grad=True) for _ in range(3)]
    engine.compile(qkv, backend="aot_eager")(x, *ws).backward()
    got = [t.grad for t in (x, *ws)]
    for t in (x, *ws):
        t.grad = None
    qkv(x, *ws).backward()
    for a, t in zip(got, (x, *ws)):
        torch.testing.assert_close(a, t.grad, rtol=1.6e-2, atol=1e-2)   # bf16 sums in another order
    (joint,) = named(events, "aot_joint_graph")
    casts_of_x = [line for line in joint.payload().splitlines()
                  if "_to_copy.default(primals_1, dtype = torch.bfloat16)" in line]
    assert len(casts_of_x) == 1


def test_two_equal_outputs_stay_two_tensors():
    """`x + 1` returned twice is one expression but two tensors in eager: writing one leaves
    the other as it was."""
    import engine

    def twice(x):
        return x + 1, x + 1

    for backend in ("aot_eager", "inductor"):
        a, b = engine.compile(twice, backend=backend)(torch.ones(4))
        a.add_(1)
        assert b.tolist() == [2.0] * 4, backend
