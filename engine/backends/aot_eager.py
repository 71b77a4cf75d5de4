"""The AOT ablation backends of PyTorch's troubleshooting guide: the AOT stage with the
aten graphs run as they are (no code generation).

- aot_eager: functionalized joint graph, default partitioner, no decompositions.
- aot_eager_decomp_partition: torch's core aten decompositions and the min-cut
  partitioner, i.e. everything the inductor backend's AOT stage does, minus codegen.
"""

from __future__ import annotations

import torch.fx

from .registry import register_backend


def run_graph(gm: torch.fx.GraphModule, example_inputs: list):
    """The `aot_eager` compiler: run the aten GraphModule as it is."""
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
