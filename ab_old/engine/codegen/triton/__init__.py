"""The Triton emitter: scheduled kernels -> @triton.jit functions for CUDA tensors
(and, with engine.config.triton_interpret, for CPU tensors under Triton's interpreter).

    start_workers(example_inputs)          start the compile worker processes for a CUDA graph
    wanted(g) -> bool                      this lowered graph takes the Triton path
    compile_triton(gm, g, sched, out_spec, key, ir_pre) -> CompiledGraph

docs/triton.md describes the kernels, the heuristics and max-autotune."""

from .compile import compile_fx_triton, compile_triton, start_workers, wanted
from .kernel import Unsupported

__all__ = ["compile_fx_triton", "compile_triton", "start_workers", "wanted", "Unsupported"]
