"""The AOT ablation backends of PyTorch's troubleshooting guide: the AOT stage with the
aten graphs run as they are (no code generation).

- aot_eager: functionalized joint graph, default partitioner, no decompositions.
- aot_eager_decomp_partition: torch's core aten decompositions and the min-cut
  partitioner, i.e. everything the inductor backend's AOT stage does, minus codegen.
"""

from __future__ import annotations

import torch
import torch.fx

from .registry import register_backend


def run_graph(gm: torch.fx.GraphModule, example_inputs: list):
    """The `aot_eager` compiler: run the aten GraphModule as it is, but for its views
    (tolerant_views)."""
    return tolerant_views(gm)


def tolerant_views(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`aten.view` nodes as `aten.reshape`. The trace chose `view` from FakeTensor strides,
    and some aten kernels lay their result out otherwise than their meta function says (on
    CPU, softplus_backward of a transposed input keeps its strides where the meta says
    contiguous: Qwen3.5's and Doge's backward failed with "view size is not compatible",
    as under torch.compile). The graphs are functional, so where the view works reshape is
    that same view, and where it would raise, reshape copies."""
    view, reshape = torch.ops.aten.view.default, torch.ops.aten.reshape.default
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is view:
            node.target = reshape
            changed = True
    if changed:
        gm.recompile()
    return gm


@register_backend("aot_eager")
def aot_eager(gm: torch.fx.GraphModule, example_inputs: list):
    from engine.aot import aot_compile

    return aot_compile(gm, example_inputs, fw_compiler=run_graph, partitioner="default")


_decomps = None


def decomposition_table() -> dict:
    global _decomps
    if _decomps is None:
        from torch._decomp import core_aten_decompositions

        _decomps = dict(core_aten_decompositions())
    return _decomps


@register_backend("aot_eager_decomp_partition")
def aot_eager_decomp_partition(gm: torch.fx.GraphModule, example_inputs: list):
    from engine.aot import aot_compile

    return aot_compile(gm, example_inputs, fw_compiler=run_graph, partitioner="min_cut",
                       decompositions=decomposition_table())
