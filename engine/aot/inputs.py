"""What the AOT stage knows about its inputs before tracing: parameters and buffers lifted
out of the GraphModule, a hashable description of every flat input (the cache key), and
fresh FakeTensors built from those descriptions."""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, NamedTuple, Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from ..guards.native import placement as native_placement


@dataclasses.dataclass
class LiftedParams:
    """Tensors the graph reads from its module (get_attr, or the parameters of a
    call_module submodule), lifted to trailing graph inputs so the aten graphs are pure
    functions. They are fetched live on every call, so optimizer updates are seen."""

    names: list[list[str]]          # one entry per unique tensor: every attribute path that holds it
    getters: list[Any]              # operator.attrgetter for the first path

    def fetch(self, gm: torch.nn.Module) -> list[torch.Tensor]:
        return [g(gm) for g in self.getters]

    def name_map(self, values: list[Any]) -> dict[str, Any]:
        """Attribute path -> value, for reparametrizing the module during tracing."""
        return {name: v for names, v in zip(self.names, values) for name in names}


def lift_parameters(gm: torch.fx.GraphModule) -> LiftedParams:
    found: dict[int, list[str]] = {}
    order: list[int] = []
    tensors: dict[int, torch.Tensor] = {}

    def add(name: str, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        key = id(t)
        if key not in found:
            found[key] = []
            order.append(key)
            tensors[key] = t
        if name not in found[key]:
            found[key].append(name)

    for node in gm.graph.nodes:
        if node.op == "get_attr":
            try:
                add(node.target, operator.attrgetter(node.target)(gm))
            except AttributeError:
                pass
        elif node.op == "call_module":
            sub = gm.get_submodule(node.target)
            for name, t in sub.named_parameters(remove_duplicate=False):
                add(f"{node.target}.{name}", t)
            for name, t in sub.named_buffers(remove_duplicate=False):
                add(f"{node.target}.{name}", t)
    names = [found[k] for k in order]
    return LiftedParams(names=names, getters=[operator.attrgetter(n[0]) for n in names])


class TensorSpec(NamedTuple):
    """Everything about a tensor input that a traced graph depends on (a named tuple:
    it is built and hashed on every call)."""

    shape: tuple
    stride: tuple
    storage_offset: int
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    is_param: bool


def _concrete(v: Any) -> Optional[int]:
    if isinstance(v, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import is_concrete_int

        return int(v) if is_concrete_int(v) else None
    return int(v)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def spec_of(x: Any) -> Any:
    """A hashable description of one flat input; None when it is not concrete (a symbolic
    FakeTensor or SymInt handed over at compile time: we compile on the first call)."""
    if type(x) in _PLAIN:   # the per-call fast path: real tensors
        return TensorSpec(tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device,
                          x.requires_grad, type(x) is torch.nn.Parameter)
    if isinstance(x, torch.Tensor):
        shape = tuple(_concrete(s) for s in x.shape)
        stride = tuple(_concrete(s) for s in x.stride())
        off = _concrete(x.storage_offset())
        if None in shape or None in stride or off is None:
            return None
        return TensorSpec(shape, stride, off, x.dtype, x.device, x.requires_grad,
                          isinstance(x, torch.nn.Parameter))
    if isinstance(x, torch.SymInt):
        c = _concrete(x)
        return None if c is None else ("int", c)
    if isinstance(x, (torch.SymFloat, torch.SymBool)):
        return None
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device)):
        return (type(x).__name__, x)
    return ("object", id(x))


def call_key(args: list[Any]) -> tuple:
    """(spec_of each input, for each the index of the first input sharing its storage) in one
    pass: computed on every call of a compiled graph (an optimizer step has hundreds of
    inputs), so plain tensors take a path without Python-level helpers (a TensorSpec made
    with tuple.__new__, torch.Size as the shape); a storage is known by its base address."""
    specs, aliases, seen = [], [], {}
    new, plain, param = tuple.__new__, torch.Tensor, torch.nn.Parameter
    for i, a in enumerate(args):
        t = type(a)
        if t is plain or t is param:
            off, dtype, device = a.storage_offset(), a.dtype, a.device
            specs.append(new(TensorSpec, (a.shape, a.stride(), off, dtype, device, a.requires_grad, t is param)))
            ptr = a.data_ptr()
            # empty storages all have address 0
            aliases.append(i if ptr == 0 else seen.setdefault((device, ptr - off * dtype.itemsize), i))
        else:
            specs.append(spec_of(a))
            aliases.append(_alias(a, i, seen))
    return tuple(specs), tuple(aliases)


_OFFSET, _DATA_PTR, _ITEMSIZE = torch.Tensor.storage_offset, torch.Tensor.data_ptr, torch.Tensor.element_size
_PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))


@functools.lru_cache(maxsize=64)
def _identity(n: int) -> tuple:
    return tuple(range(n))


def placement_key(args: list[Any]) -> tuple:
    """Where the inputs' memory lies, all a graph that writes an input or returns a view of
    one depends on once their specs are known (guarded): (each input's storage offset, the
    index of the first input sharing its storage), the same grouping as call_key's."""
    offsets = native_placement(args)     # the common case in C++ (an optimizer step's 600 inputs)
    if offsets is not None:
        return offsets, _identity(len(args))
    if set(map(type, args)) <= _PLAIN_TENSORS:
        # the common case, in C-level maps (600 inputs: 1.8 -> 0.3 ms): every input on its own storage
        offsets = tuple(map(_OFFSET, args))
        ptrs = list(map(_DATA_PTR, args))
        if 0 not in ptrs and len(set(map(operator.sub, ptrs, map(operator.mul, offsets, map(_ITEMSIZE, args))))) \
                == len(args):
            return offsets, tuple(range(len(args)))
    seen, aliases, offsets = {}, [], []
    for i, a in enumerate(args):
        if type(a) is torch.Tensor or type(a) is torch.nn.Parameter:
            off, ptr = a.storage_offset(), a.data_ptr()
            offsets.append(off)
            aliases.append(i if ptr == 0 else seen.setdefault((a.device, ptr - off * a.dtype.itemsize), i))
        else:
            offsets.append(None)
            aliases.append(_alias(a, i, seen))
    return tuple(offsets), tuple(aliases)


def _alias(a: Any, i: int, seen: dict) -> int:
    """The index of the first input sharing a's storage (i if none). Fake inputs never share
    storage here: compile-time examples are taken as distinct."""
    if not isinstance(a, torch.Tensor) or isinstance(a, FakeTensor):
        return i
    try:
        ptr = a.untyped_storage().data_ptr()
    except Exception:   # tensors without storage (sparse, ...): never aliased
        return i
    return i if ptr == 0 else seen.setdefault((a.device, ptr), i)


def make_fake(spec: TensorSpec, fake_mode) -> torch.Tensor:
    """A fresh FakeTensor with exactly the spec's layout (storage offset included, so the
    as_strided views we regenerate for aliased outputs use the same numbers)."""
    numel_extent = 1
    for size, stride in zip(spec.shape, spec.stride):
        if size == 0:
            numel_extent = 0
            break
        numel_extent += (size - 1) * abs(stride)
    with fake_mode:
        if spec.storage_offset == 0:
            t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=spec.device)
        else:
            base = torch.empty(spec.storage_offset + numel_extent, dtype=spec.dtype, device=spec.device)
            t = base.as_strided(spec.shape, spec.stride, spec.storage_offset).detach()
        if spec.requires_grad:
            t.requires_grad_(True)
    return t
