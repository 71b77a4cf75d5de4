"""The `inductor` backend: the AOT stage (functionalized forward/backward graphs, min-cut
partitioning, our decomposition table) with every aten graph compiled by engine.codegen
into fused C++ kernels."""

from __future__ import annotations

import torch.fx

from .registry import register_backend


@register_backend("inductor")
def inductor(gm: torch.fx.GraphModule, example_inputs: list):
    from engine.aot import aot_compile
    from engine.codegen import compile_fx_graph, decomposition_table

    return aot_compile(gm, example_inputs, fw_compiler=compile_fx_graph, bw_compiler=compile_fx_graph,
                       inference_compiler=compile_fx_graph, partitioner="min_cut",
                       decompositions=decomposition_table())
