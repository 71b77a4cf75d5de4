"""The loop-level IR: buffers with layouts, pointwise and reduction nodes as functions
over index variables, extern kernels (aten calls), and the tensor values lowerings pass
around (a loader function over indices; a strided view of a buffer when it has one)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import sympy
import torch

from . import values as V
from .index import contiguous_strides, numel, simplify

# ops whose schemas declare no alias, yet eager's results are views of the input
UNDECLARED_VIEWS = {torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.unsafe_split_with_sizes.default}


@dataclasses.dataclass
class Layout:
    sizes: tuple            # sympy expressions
    strides: tuple          # sympy expressions
    dtype: torch.dtype
    device: torch.device
    offset: Any = 0

    def index(self, idx) -> sympy.Expr:
        return simplify(sympy.sympify(self.offset) + sum(
            (i * s for i, s in zip(idx, self.strides)), sympy.Integer(0)))

    def same(self, other: "Layout") -> bool:
        """The same memory, read the same way (sizes may be lists or tuples)."""
        return (tuple(self.sizes), tuple(self.strides), self.dtype, self.device, self.offset) == \
            (tuple(other.sizes), tuple(other.strides), other.dtype, other.device, other.offset)

    def is_contiguous(self) -> bool:
        return all(sz == 1 or st == cs for sz, st, cs in zip(self.sizes, self.strides, contiguous_strides(self.sizes))) \
            and self.offset == 0

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        off = f", offset={self.offset}" if self.offset != 0 else ""
        return f"{dt}{list(self.sizes)} strides={list(self.strides)}{off}"


@dataclasses.dataclass
class Pointwise:
    ranges: list
    fn: Callable[[list], V.Value]          # index -> value


@dataclasses.dataclass
class Reduction:
    ranges: list                            # kept (output) dims, in output order
    reduction_ranges: list
    reduction_type: str                     # sum prod max min argmax argmin any all
    fn: Callable[[list, list], V.Value]     # (index, reduction index) -> value
    src_dtype: torch.dtype


@dataclasses.dataclass
class Buffer:
    name: str
    layout: Layout

    def store_index(self, idx) -> sympy.Expr:
        return self.layout.index(idx)


@dataclasses.dataclass
class InputBuffer(Buffer):
    arg_index: int          # position in the graph's inputs (or a constant's name)
    const_name: Optional[str] = None


@dataclasses.dataclass
class ComputedBuffer(Buffer):
    data: Any               # Pointwise | Reduction
    origins: list = dataclasses.field(default_factory=list)   # fx node names that built it

    def body(self, idx, ridx=None) -> V.Value:
        if isinstance(self.data, Reduction):
            return self.data.fn(idx, ridx)
        return self.data.fn(idx)

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def reads(self) -> set[str]:
        from .index import index_var
        idx = [index_var(f"q{i}", s) for i, s in enumerate(self.data.ranges)]
        if isinstance(self.data, Reduction):
            ridx = [index_var(f"qr{i}", s) for i, s in enumerate(self.data.reduction_ranges)]
            v = self.data.fn(idx, ridx)
        else:
            v = self.data.fn(idx)
        return {x.name for x in V.loads(v)}


@dataclasses.dataclass
class ExternKernel:
    """A call of an aten op on realized buffers: matmul, convolution, anything unlowered."""

    name: str                   # name of the result in the wrapper
    op: Any                     # torch OpOverload
    args: Any                   # pytree of TensorValue | python values
    kwargs: dict
    outputs: list               # list[ExternOutput]
    reads_: set
    mutates: set                # buffer names written in place (mutating ops)
    origins: list = dataclasses.field(default_factory=list)
    in_place_of: Optional[str] = None   # the scheduler's choice: the op's in-place form writes this dead buffer

    def reads(self) -> set[str]:
        return set(self.reads_)


@dataclasses.dataclass
class ExternOutput(Buffer):
    kernel: str = ""
    path: tuple = ()            # where in the op's result this tensor sits


@dataclasses.dataclass
class TensorValue:
    """What a lowering returns: a tensor's sizes and dtype, a loader (index -> value) and,
    when the tensor is a strided view of a buffer, that buffer and view layout."""

    sizes: tuple
    dtype: torch.dtype
    device: torch.device
    loader: Callable[[list], V.Value]
    buffer: Optional[str] = None
    layout: Optional[Layout] = None

    @property
    def realized(self) -> bool:
        return self.buffer is not None

    def numel(self):
        return numel(self.sizes)


def strided_value(buffer: str, layout: Layout) -> TensorValue:
    cdt = V.compute_dtype(layout.dtype)

    def loader(idx):
        return V.load(buffer, layout.index(idx), cdt)

    return TensorValue(tuple(layout.sizes), layout.dtype, layout.device, loader, buffer, layout)


def format_node(buf) -> str:
    """A readable dump of one IR node (ir_pre_fusion.txt / ir_post_fusion.txt)."""
    from .index import index_var
    if isinstance(buf, ExternKernel):
        outs = ", ".join(f"{o.name}: {o.layout}" for o in buf.outputs)
        return f"{buf.name} = ExternKernel({buf.op}, reads={sorted(buf.reads_)}) -> {outs}"
    d = buf.data
    idx = [index_var(f"i{k}", s) for k, s in enumerate(d.ranges)]
    if isinstance(d, Reduction):
        ridx = [index_var(f"r{k}", s) for k, s in enumerate(d.reduction_ranges)]
        body = d.fn(idx, ridx)
        head = (f"{buf.name}: {buf.layout} = Reduction({d.reduction_type}, ranges={list(d.ranges)}, "
                f"reduction_ranges={list(d.reduction_ranges)})")
    else:
        body = d.fn(idx)
        head = f"{buf.name}: {buf.layout} = Pointwise(ranges={list(d.ranges)})"
    origins = f"  # origins: {', '.join(buf.origins)}" if buf.origins else ""
    return f"{head}{origins}\n    {body!r}"
