"""Code generation: aten graphs -> loop-level IR -> fused kernels (C++ on CPU).

    compile_fx_graph(aten_gm, example_inputs) -> callable(*args)
    debug_files(compiled=None) -> {filename: text} for TORCH_COMPILE_DEBUG
    decomposition_table() -> the decompositions the AOT stage should apply

docs/codegen.md describes the IR, the scheduler, the logs and the cache."""

from .compile_fx import CompiledGraph, compile_fx_graph, debug_files
from .decompositions import decomposition_table

__all__ = ["CompiledGraph", "compile_fx_graph", "debug_files", "decomposition_table"]
