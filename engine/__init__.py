"""engine: a JIT compiler for PyTorch programs that reports everything it does on the
`observe` bus."""

import observe  # first: reads TORCH_LOGS / TORCH_TRACE before torch does
from observe.torch_interop import import_torch

import_torch()

from . import config  # noqa: E402
