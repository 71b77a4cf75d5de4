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
