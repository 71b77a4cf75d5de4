"""A model's layers repeat their kernels: each block's layer norm, activation and residual
add is the same code over buffers of its own. Kernels whose sources differ only in their
names and in the names of the buffers they read and write are one kernel: the module
keeps the first, the wrapper binds the later names to it, and it is compiled once (C++
or Triton)."""

from __future__ import annotations

import re

# buffer names as they appear in a kernel's parameters, accumulators and results
# (p_buf5, acc_buf14, red_buf14_i, p_arg97, p_extern13)
_BUFFER_NAME = re.compile(r"(?<![A-Za-z0-9])(?:buf|arg|extern)\d+(?![0-9])")


def canonical(name: str, source: str) -> str:
    """source with its kernel's name and its buffer names (numbered by first use) made
    generic: equal for two layers' copies of one kernel."""
    order: dict = {}
    return _BUFFER_NAME.sub(lambda m: order.setdefault(m.group(0), f"b{len(order)}"),
                            source.replace(name, "KERNEL"))


def copies(kernels: dict) -> dict:
    """kernels: name -> (source, how it launches: anything else two copies must share).
    Returns name -> the earlier kernel it is a copy of."""
    first, same_as = {}, {}
    for name, (source, launch) in kernels.items():
        rep = first.setdefault((canonical(name, source), launch), name)
        if rep != name:
            same_as[name] = rep
    return same_as
