"""Every knob of the compiler, in one place. Change them as attributes:
`engine.config.cache_size_limit = 16`, or temporarily with `engine.config.patch(...)`."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

# capture
suppress_errors: bool = os.environ.get("TORCHDYNAMO_SUPPRESS_ERRORS", "0") == "1"
verbose: bool = os.environ.get("TORCHDYNAMO_VERBOSE", "0") == "1"
debug_function: str | None = os.environ.get("TORCHDYNAMO_DEBUG_FUNCTION") or None
capture_scalar_outputs: bool = os.environ.get("TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS", "0") == "1"
reorderable_logging_functions: set = set()
# An exception inside the symbolic interpreter (a construct it models wrongly) becomes a
# graph break at that instruction, so the program still runs correctly (eagerly there).
# ENGINE_STRICT_CAPTURE=1 raises instead (for developing the engine).
capture_errors_as_graph_breaks: bool = os.environ.get("ENGINE_STRICT_CAPTURE", "0") != "1"

# `loss.backward()` in a compiled function: traced into the graph, forward and backward
# compiled as one (engine/capture/backward.py, docs/training.md). Off by default: on the
# GPU it measured slower, with a higher peak, than the partitioned pair behind autograd.
backward_in_graph: bool = os.environ.get("ENGINE_BACKWARD_IN_GRAPH", "0") == "1"

# guards and recompiles
cache_size_limit: int = 8
accumulated_cache_size_limit: int = 256

# dynamic shapes
automatic_dynamic_shapes: bool = True
assume_static_by_default: bool = True

# distributed: inside DistributedDataParallel, split each captured graph at DDP's gradient
# bucket boundaries (bucket_cap_mb) and compile the pieces one by one, so that each bucket's
# all-reduce starts while the backward of earlier layers still runs (PyTorch's default too).
# torch._dynamo.config.optimize_ddp is honoured ("ddp_optimizer" is True; its other strings off).
optimize_ddp: bool | str = os.environ.get("ENGINE_OPTIMIZE_DDP", "1") != "0"

# debug output
debug_dir_root: str = os.environ.get("TORCH_COMPILE_DEBUG_DIR") or os.path.join(os.getcwd(), "torch_compile_debug")
compile_debug: bool = os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1"

# codegen
cache_dir: str | None = os.environ.get("ENGINE_CACHE_DIR") or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
# Triton (CUDA tensors): autotune launch configs (mode="max-autotune"); and, for tests on
# machines without a GPU, emit Triton for CPU tensors and run it under TRITON_INTERPRET.
max_autotune: bool = os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE", "0") == "1"
triton_interpret: bool = False
# Extra flags for the C++ compiler of the CPU kernels (ENGINE_CPP_FLAGS, split on spaces),
# after the engine's own; part of the kernel cache key (engine/codegen/cache.py).
cpp_extra_flags: list = os.environ.get("ENGINE_CPP_FLAGS", "").split()
# Compile a graph's Triton kernels side by side before launching any (a static graph's
# from its codegen on, others on their first call): in this many worker processes (0: on
# threads, where Triton's front end holds the GIL).
triton_precompile: bool = os.environ.get("ENGINE_TRITON_PRECOMPILE", "1") != "0"
# Launch runs of independent pointwise kernels (an optimizer step's per-parameter updates)
# as one combo kernel each (engine/codegen/triton/combo.py).
combo_kernels: bool = os.environ.get("ENGINE_COMBO_KERNELS", "1") != "0"
# Launch Triton kernels through a small C extension (engine/codegen/triton/c_launch.py, built
# once with the system C compiler) rather than ctypes; 0: ctypes only.
c_launch: bool = os.environ.get("ENGINE_C_LAUNCH", "1") != "0"
# Check a cache entry's tensor guards in one C++ call (engine/guards/native.py), built once
# per machine into native_dir on a background thread; 0: the guards stay generated Python.
native_guards: bool = os.environ.get("ENGINE_NATIVE_GUARDS", "1") != "0"
# Repeat a CUDA graph's kernel launches and allocate its buffers through C++
# (engine/codegen/triton/native_launch.py), built like the guard checker; 0: Python.
native_launch: bool = os.environ.get("ENGINE_NATIVE_LAUNCH", "1") != "0"
# With native_launch, call cuBLASLt directly for 16-bit CUDA matmuls (mm, addmm with a bias),
# with torch.mm wherever it cannot; 0: torch.mm always.
direct_matmul: bool = os.environ.get("ENGINE_DIRECT_MATMUL", "1") != "0"
native_dir: str = os.environ.get("ENGINE_NATIVE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "engine-native")
# A 16-bit CUDA matmul whose product a graph returns cast to fp32 (autocast's weight
# gradients) computes fp32 directly, not rounded to 16 bits first (engine/codegen/wide_matmul.py);
# 0: eager's rounding.
wide_matmul: bool = os.environ.get("ENGINE_WIDE_MATMUL", "1") != "0"
# The CPUs this process may run on (its affinity: taskset, a container's cpuset), not the machine's.
usable_cpus: int = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
triton_compile_workers: int = int(os.environ.get("ENGINE_TRITON_COMPILE_WORKERS", min(16, usable_cpus)))


# minifier (docs/minifier.md): "dynamo" checks the captured FX graph's backend call, "aot"
# the AOT graphs our code generator receives; None: off. Level 1 writes the launcher and runs
# the graph eagerly, 2 writes it and re-raises, 3 also minifies right away, 4 also checks accuracy.
repro_after: str | None = os.environ.get("TORCHDYNAMO_REPRO_AFTER") or None
repro_level: int = int(os.environ.get("TORCHDYNAMO_REPRO_LEVEL", "2"))
# A compiled result is wrong when its RMS error against an fp64 run is above
# 2 * eager's RMS error against it + repro_tolerance (level 4).
repro_tolerance: float = float(os.environ.get("TORCHDYNAMO_REPRO_TOLERANCE", "1e-3"))
# Makes the inductor backend's relu wrong on purpose, to test the minifier:
# "compile_error" (lowering raises), "runtime_error" (the compiled graph raises when run),
# "accuracy" (relu(x) + 1). Never set it for real work.
inject_relu_bug_TESTING_ONLY: str | None = os.environ.get("ENGINE_INJECT_RELU_BUG_TESTING_ONLY") or None


def snapshot() -> dict[str, Any]:
    """Every knob and its value (written into traces and debug folders)."""
    module = sys.modules[__name__]
    return {
        k: (sorted(v, key=repr) if isinstance(v, set) else v)
        for k, v in vars(module).items()
        if not k.startswith("_") and not callable(v) and not isinstance(v, type(sys))
        and k not in ("annotations",)
    }


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """`with engine.config.patch(suppress_errors=True): ...`"""
    module = sys.modules[__name__]
    for key in changes:
        if not hasattr(module, key):
            raise AttributeError(f"engine.config has no knob {key!r}")
    old = {k: getattr(module, k) for k in changes}
    for k, v in changes.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)
