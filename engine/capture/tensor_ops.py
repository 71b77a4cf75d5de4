"""Which callables become graph nodes, and how variable-tracker arguments turn into
FakeTensor / Proxy arguments."""

from __future__ import annotations

import math
import operator
import types

import torch

from . import numpy_ops, scalars
from .graph_breaks import GraphBreak
from ..shapes.symbolic import has_symbolic, to_proxy as symbolic_to_proxy
from .variables import (ConstantVariable, DictVariable, ListVariable, ObjectVariable, TensorVariable, TupleVariable,
                        VariableTracker)


class _Unconvertible(Exception):
    pass


def _convert(v, which: str):
    if isinstance(v, TensorVariable):
        return v.fake if which == "fake" else v.proxy
    if isinstance(v, ConstantVariable):
        if which == "proxy" and has_symbolic(v.value):  # a symbolic size: a graph value (engine/shapes)
            if scalars.is_unbacked(v.value):  # a captured .item(): rebuilt over the item() nodes
                try:
                    return scalars.to_proxy(v.value)
                except NotImplementedError as exc:
                    raise GraphBreak("GB0019", f"cannot put the expression {v.value} in the graph ({exc})") from None
            return symbolic_to_proxy(v.value)
        return numpy_ops.scalar_value(v.value)
    if isinstance(v, ListVariable):
        return [_convert(x, which) for x in v.items]
    if isinstance(v, TupleVariable):
        items = tuple(_convert(x, which) for x in v.items)
        return items if v.cls is tuple or v.cls is torch.Size else tuple(items)
    if isinstance(v, DictVariable):
        return {k: _convert(x, which) for k, x in v.items.items()}
    if isinstance(v, ObjectVariable) and isinstance(v.value, (torch.dtype, torch.device, torch.layout,
                                                              torch.memory_format)):
        return v.value
    if isinstance(v, (list, tuple)):
        return type(v)(_convert(x, which) for x in v)
    if isinstance(v, dict):
        return {k: _convert(x, which) for k, x in v.items()}
    if isinstance(v, VariableTracker):
        raise _Unconvertible(type(v).__name__)
    return v


def convertible(args, kwargs) -> bool:
    try:
        _convert(list(args), "fake")
        _convert(dict(kwargs), "fake")
        return True
    except _Unconvertible:
        return False


def to_fake(v):
    try:
        return _convert(v, "fake")
    except _Unconvertible as exc:
        raise GraphBreak("GB0011", f"argument of type {exc} passed to a torch operator") from None


def to_proxy(v):
    return _convert(v, "proxy")


def has_tensor(v) -> bool:
    if isinstance(v, TensorVariable):
        return True
    if isinstance(v, (ListVariable, TupleVariable)):
        return any(has_tensor(x) for x in v.items)
    if isinstance(v, DictVariable):
        return any(has_tensor(x) for x in v.items.values())
    if isinstance(v, (list, tuple)):
        return any(has_tensor(x) for x in v)
    if isinstance(v, dict):
        return any(has_tensor(x) for x in v.values())
    return False


_GRAPH_PY_MODULES = ("torch.nn.functional", "torch.functional", "torch._refs", "torch.nn.init",
                     "torch._decomp", "torch.special", "torch.linalg", "torch.fft", "torch._tensor")

# Functions of torch that are never put in a graph.
_NOT_IN_GRAPH = {
    "manual_seed", "seed", "initial_seed", "set_default_dtype", "set_default_tensor_type", "use_deterministic_algorithms",
    "set_num_threads", "set_printoptions", "save", "load", "compile", "is_grad_enabled", "set_grad_enabled",
    "get_default_dtype", "is_tensor", "is_storage", "is_floating_point", "is_complex", "numel", "typename",
    "is_inference_mode_enabled", "is_autocast_enabled", "get_rng_state", "set_rng_state", "from_numpy",
    "as_tensor", "asarray", "frombuffer", "_assert", "set_anomaly_enabled", "backward", "grad",
}


def is_torch_op(fn) -> bool:
    """A torch callable that the graph may contain: a builtin from torch's C namespaces, an
    OpOverload, or a Python function of torch.nn.functional & co."""
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    name = getattr(fn, "__name__", "")
    if name in _NOT_IN_GRAPH or name.startswith(("set_", "_set_", "_enter_", "_exit_", "_push_", "_pop_")) or \
            "seed" in name or "rng_state" in name:
        return False  # changes global state: never a graph node, and never run at trace time
    if isinstance(fn, types.BuiltinFunctionType):
        mod = getattr(fn, "__module__", None) or ""
        if mod.startswith("torch"):
            return True
        self_obj = getattr(fn, "__self__", None)
        self_name = getattr(self_obj, "__name__", "") if self_obj is not None else ""
        return isinstance(self_name, str) and self_name.startswith("torch._C")
    if isinstance(fn, types.FunctionType):
        mod = fn.__module__ or ""
        return mod in _GRAPH_PY_MODULES or any(mod.startswith(m + ".") for m in _GRAPH_PY_MODULES)
    return False


# Tensor methods that never go in a graph.
TENSOR_METHOD_BREAKS = {
    "item": "GB0004", "tolist": "GB0004", "numpy": "GB0010", "__bool__": "GB0010", "__int__": "GB0010",
    "__float__": "GB0010", "__index__": "GB0010", "register_hook": "GB0007",
    "retain_grad": "GB0007", "data_ptr": "GB0010", "cpu_numpy": "GB0010", "__array__": "GB0010",
    "untyped_storage": "GB0011", "storage": "GB0011", "share_memory_": "GB0011", "pin_memory": "GB0011",
    "record_stream": "GB0011", "__reduce_ex__": "GB0011", "__setstate__": "GB0011", "apply_": "GB0011",
    "map_": "GB0011", "resize_": "GB0011", "set_": "GB0011", "requires_grad_": "GB0011",
}

# Tensor methods answered from metadata (static shapes): never graph nodes.
TENSOR_METADATA_METHODS = {"size", "stride", "dim", "ndimension", "numel", "nelement", "is_contiguous",
                           "element_size", "storage_offset", "is_floating_point", "is_complex", "get_device",
                           "is_signed", "__len__", "has_names", "is_set_to", "is_shared", "is_pinned"}

TENSOR_CONSTANT_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf", "layout",
                         "is_sparse", "is_quantized", "is_meta", "is_mkldnn", "is_nested", "names", "is_cpu",
                         "itemsize", "nbytes"}
TENSOR_GRAPH_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}

BINARY_OPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow, "@": operator.matmul, "&": operator.and_, "|": operator.or_,
    "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift, ">>=": operator.irshift,
}

COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
               ">=": operator.ge}

INPLACE_TO_OUT = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                  operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                  operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
                  operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
                  operator.ilshift: operator.lshift, operator.irshift: operator.rshift}

# Pure functions evaluated at trace time when every argument is a Python constant.
PURE_BUILTINS = {abs, all, any, bool, chr, divmod, float, format, hash, int, len, max, min, ord, pow, repr, round,
                 sorted, str, sum, tuple, list, set, frozenset, reversed, enumerate, zip, range, slice, bin, hex,
                 oct, callable, isinstance, issubclass, type, dict, complex, iter, next, id}
PURE_MODULES = ("math", "operator", "string", "keyword", "re", "itertools")
