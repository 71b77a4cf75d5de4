"""DistributedDataParallel and the engine.

DDP's own forward (buffer broadcast, the reducer's bookkeeping, its autograd sink) is
torch's code and runs eagerly, as it does under torch.compile; the module it wraps is
what compiles. Both spellings work:

- `DDP(engine.compile(model))`: DDP calls the compiled module;
- `engine.compile(DDP(model))` (and compiled code that calls a DDP module): `call_ddp`
  runs DDP's forward with the wrapped module's forward compiled.

A graph captured while DDP's forward runs (DDP marks itself active around the call) is
split at the gradient-bucket boundaries when `engine.config.optimize_ddp` is on
(bucket_split.py)."""

from __future__ import annotations

import logging
from typing import Callable

import torch

import observe

from .. import config


def _ddp_class():
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel


def is_ddp(module) -> bool:
    return isinstance(module, _ddp_class())


def active_ddp_module():
    """The DDP module whose forward is running now (None outside of one)."""
    if not torch.distributed.is_available():
        return None
    get = getattr(_ddp_class(), "_get_active_ddp_module", None)
    return get() if get is not None else None


def bucket_caps(ddp) -> tuple:
    """(bucket cap, first bucket cap) in bytes, as this DDP module fills its buckets."""
    cap = int(ddp.bucket_bytes_cap)
    first = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
    if first is None:
        first = min(getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", cap), cap)
    return cap, min(int(first), cap)


def backend_for_graph(backend: Callable) -> Callable:
    """The backend to compile a graph with now: inside an active DDP forward with
    optimize_ddp on, one that splits the graph at bucket boundaries first."""
    ddp = active_ddp_module()
    if ddp is None:
        return backend
    # torch's spellings too (torch._dynamo.config.optimize_ddp is copied here): True or
    # "ddp_optimizer" split; False, "no_optimization" and the compiled-autograd modes don't
    if config.optimize_ddp not in (True, "ddp_optimizer"):
        observe.log("dynamo", logging.INFO, "graph compiled inside DistributedDataParallel as one piece "
                    "(engine.config.optimize_ddp=%r): its all-reduces start after the whole backward",
                    config.optimize_ddp)
        return backend
    from .bucket_split import split_and_compile
    cap, first = bucket_caps(ddp)

    def ddp_split_backend(gm, example_inputs):
        return split_and_compile(gm, example_inputs, backend, cap, first)
    return ddp_split_backend


class _CompiledForward:
    """The wrapped module's forward for the length of one DDP call: compiled by the engine."""

    def __init__(self, module, options):
        self.module = module
        self.options = options

    def __call__(self, *args, **kwargs):
        from ..capture.runtime import run_function
        return run_function(type(self.module).forward, (self.module,) + args, kwargs, self.options)


def call_ddp(ddp, args, kwargs, options):
    """`engine.compile(DDP(model))(x)`: DDP's forward, eagerly, around the wrapped module's
    compiled forward. The wrapped module gets an instance-level `forward` for the length of
    the call (DDP calls `self.module(...)` or `self.module.forward(...)`, both find it)."""
    from ..capture.runtime import OptimizedModule
    inner = ddp.module
    forward = type(inner).forward if isinstance(inner, torch.nn.Module) else None
    if isinstance(inner, OptimizedModule):
        return ddp(*args, **kwargs)   # DDP(engine.compile(model)) compiled again: the inner one compiles
    if not callable(forward) or "forward" in inner.__dict__:
        observe.log("dynamo", logging.INFO, "DDP wraps a %s whose forward is set on the instance: it runs as DDP "
                    "calls it, not compiled (compile the wrapped module instead: DDP(engine.compile(model)))",
                    type(inner).__name__)
        return ddp(*args, **kwargs)
    inner.__dict__["forward"] = _CompiledForward(inner, options)
    try:
        return ddp(*args, **kwargs)
    finally:
        inner.__dict__.pop("forward", None)

