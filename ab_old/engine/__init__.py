"""engine: a JIT compiler for PyTorch programs that reports everything it does on the
`observe` bus."""

import observe  # first: reads TORCH_LOGS / TORCH_TRACE before torch does
from observe.torch_interop import import_torch

import_torch()

from . import config  # noqa: E402

# Compile metrics (always collected, compile-time events only) and the TORCH_COMPILE_DEBUG folder.
from observe.metrics import compile_times  # noqa: E402
from .debug import debug_dir as _debug_dir  # noqa: E402

_debug_dir.install()
from .api import (OptimizedModule, allow_in_graph, compile, disable, disallow_in_graph, explain,  # noqa: E402
                  graph_break, mark_dynamic, mark_static, reset)
from .capture.convert_frame import BackendCompilerFailed, InternalCompilerError, Unsupported  # noqa: E402
from .stance import RecompileError, set_stance  # noqa: E402
from . import stance as _stance  # noqa: E402

_stance.install_torch_hook()  # torch.compiler.set_stance(...) sets the engine's stance too
from . import torch_config as _torch_config  # noqa: E402

_torch_config.check_environment()  # the guide's TORCHDYNAMO_* variables the engine does not act on, named once

__all__ = ["config", "compile", "explain", "reset", "disable", "allow_in_graph", "disallow_in_graph", "graph_break",
           "mark_dynamic", "mark_static", "OptimizedModule", "Unsupported", "InternalCompilerError",
           "BackendCompilerFailed", "set_stance", "RecompileError"]
from . import bytecode_debugger  # noqa: E402  engine.bytecode_debugger.debug(): the bytecode step debugger
