"""Partitioners: the default one saves what the backward reads; the min-cut one saves the
cheapest set of tensors and recomputes cheap ops (views, pointwise) in the backward."""

import pytest
import torch
import torch.fx

from engine.aot import aot_compile
from engine.aot.mincut import _FlowGraph, recomputable
from engine.backends.aot_eager import decomposition_table, run_graph


class GeluMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        h = self.up(x)
        return self.down(torch.nn.functional.gelu(h) * torch.sigmoid(h))


def compile_with(partitioner, decomps=True, record=None):
    def compiler(name):
        def c(gm, examples):
            if record is not None:
                record[name] = gm
            return gm
        return c

    model = GeluMLP()
    gm = torch.fx.symbolic_trace(model)
    compiled = aot_compile(gm, [torch.randn(8, 16)], fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                           partitioner=partitioner, decompositions=decomposition_table() if decomps else None)
    return model, compiled


def test_min_cut_saves_fewer_activation_bytes_than_default():
    _, compiled = compile_with("min_cut")
    stats = compiled.last_stats.saved
    activations = {k: v["bytes"] - v["param_bytes"] for k, v in stats.items()}
    # default saves h and every decomposed gelu/sigmoid intermediate; min-cut keeps h and recomputes
    assert activations["min_cut"] < activations["default"]
    assert stats["min_cut"]["recomputed"], "min-cut recomputes pointwise ops in the backward"
    assert not stats["default"]["recomputed"]


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
def test_partitioned_graphs_give_eager_gradients(partitioner):
    graphs = {}
    model, compiled = compile_with(partitioner, record=graphs)
    x = torch.randn(8, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    compiled(x).pow(2).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad]
    model.zero_grad()
    model(x2).pow(2).sum().backward()
    for a, b in zip(grads, [p.grad for p in model.parameters()] + [x2.grad]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    bw_inputs = [n.name for n in graphs["bw"].graph.nodes if n.op == "placeholder"]
    assert bw_inputs[-1].startswith("tangents_")
    assert len(bw_inputs) - 1 == len(compiled.last_stats.saved[partitioner]["names"])


def test_random_ops_are_never_recomputed():
    def f(x, w):
        return torch.nn.functional.dropout(x @ w, p=0.5, training=True).sum()

    graphs = {}

    def rec(name):
        def c(gm, ex):
            graphs[name] = gm
            return gm
        return c

    aot_compile(torch.fx.symbolic_trace(f), [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)],
                fw_compiler=rec("fw"), bw_compiler=rec("bw"), partitioner="min_cut",
                decompositions=decomposition_table())
    for node in graphs["bw"].graph.nodes:
        if node.op == "call_function":
            assert recomputable(node) or torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ())
            assert "rand" not in str(node.target) and "bernoulli" not in str(node.target)


def test_max_flow_min_cut_on_a_small_network():
    g = _FlowGraph()
    for u, v, c in [("s", "a", 3), ("s", "b", 2), ("a", "b", 1), ("a", "t", 2), ("b", "t", 3)]:
        g.add_edge(u, v, c)
    assert g.max_flow("s", "t") == 5
    assert g.reachable("s") == {"s"}


def test_mutated_input_saved_for_backward_keeps_its_old_value():
    def f(x, y):
        y.add_(1)            # min-cut may save the old y and recompute y + 1 in the backward,
        return (x * y).sum()  # so the saved y must be a copy taken before the write-back

    for partitioner in ("default", "min_cut"):
        compiled = aot_compile(torch.fx.symbolic_trace(f), [torch.randn(3, requires_grad=True), torch.randn(3)],
                               fw_compiler=run_graph, partitioner=partitioner)
        x, y = torch.randn(3, requires_grad=True), torch.randn(3)
        y0 = y.clone()
        compiled(x, y).backward()
        torch.testing.assert_close(x.grad, y0 + 1)
        torch.testing.assert_close(y, y0 + 1)



def test_a_parameters_autocast_copy_is_saved_not_cast_again_in_the_backward():
    """Under autocast a Linear's weight is cast to bfloat16 for the forward's matmul, and the
    backward's matmul (the input's gradient) reads that copy again. Min-cut saves the copy:
    casting again would re-read the float32 weight in every backward."""
    graphs = {}

    def compiler(name):
        def c(gm, examples):
            graphs[name] = gm
            return gm
        return c

    model = torch.nn.Linear(16, 32)
    x = torch.randn(8, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled = aot_compile(torch.fx.symbolic_trace(model), [x], fw_compiler=compiler("fw"),
                               bw_compiler=compiler("bw"), partitioner="min_cut")
        compiled(x).float().sum().backward()

    def weight_casts(gm):
        return [n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default
                and n.meta["val"].dtype == torch.bfloat16 and tuple(n.meta["val"].shape) == (32, 16)]

    assert weight_casts(graphs["fw"]) and not weight_casts(graphs["bw"])
    saved = [n.meta["val"] for n in graphs["bw"].graph.nodes if n.op == "placeholder"]
    assert any(v.dtype == torch.bfloat16 and tuple(v.shape) == (32, 16) for v in saved)
    grad = x.grad.clone()
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    torch.testing.assert_close(grad, x.grad)
