"""The `inductor` backend: the AOT stage (functionalized forward/backward graphs, min-cut
partitioning, our decomposition table) with every aten graph compiled by engine.codegen
into fused C++ kernels."""

from __future__ import annotations

import torch.fx

from .registry import register_backend


@register_backend("inductor")
def inductor(gm: torch.fx.GraphModule, example_inputs: list, mode=None, options=None):
    # mode/options (torch.compile's keywords): "max-autotune" autotunes Triton launch configs
    from engine import config
    from engine.aot import aot_compile
    from engine.codegen import compile_fx_graph, decomposition_table
    from engine.debug.minifier.hooks import watch_codegen

    compile_fx_graph = watch_codegen(compile_fx_graph)   # repro_after="aot": a failing graph gets a launcher

    if mode == "max-autotune" or (options or {}).get("max_autotune"):
        def compile_fx_graph(g, inputs, _compile=compile_fx_graph):   # noqa: F811  (bw graphs compile later)
            with config.patch(max_autotune=True):
                return _compile(g, inputs)

    if mode == "reduce-overhead" or (options or {}).get("triton.cudagraphs"):
        import weakref

        from engine.codegen import cudagraphs
        forwards = weakref.WeakValueDictionary()   # graph id -> its forward: the backward shares its memory pool

        def compile_fx_graph(g, inputs, _compile=compile_fx_graph):   # noqa: F811
            compiled = _compile(g, inputs)
            role, gid = g.meta.get("aot_graph", ("graph", None))
            graphed = cudagraphs.wrap(compiled, inputs, f"{role} graph {gid}", compiled.mutated_args,
                                      leader=forwards.get(gid) if role == "backward" else None)
            if role == "forward" and isinstance(graphed, cudagraphs.CudaGraphed):
                forwards[gid] = graphed
            return graphed

    return aot_compile(gm, example_inputs, fw_compiler=compile_fx_graph, bw_compiler=compile_fx_graph,
                       inference_compiler=compile_fx_graph, partitioner="min_cut",
                       decompositions=decomposition_table())
