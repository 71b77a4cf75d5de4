"""AOT autograd: captured torch-level graph -> functional aten graphs (joint forward and
backward, partitioned), compiled by a backend's compilers, run by an autograd.Function.

    from engine.aot import aot_compile
    compiled = aot_compile(gm, example_inputs, fw_compiler=..., partitioner="min_cut")
    compiled(*args)      # gm's outputs, with autograd through them
"""

from .compile import PARTITIONERS, AOTCompiled, aot_compile
from .errors import AOTAutogradError

__all__ = ["AOTAutogradError", "AOTCompiled", "PARTITIONERS", "aot_compile"]
