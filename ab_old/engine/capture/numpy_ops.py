"""NumPy code traced into the graph, as PyTorch does: an ndarray in the trace is a tensor
(`NumpyVariable` holds its TensorVariable) and every NumPy operation on it is one graph
node that runs the same operation through `torch._numpy` (NumPy's semantics written in
torch ops), on FakeTensors while tracing and on real tensors when the graph runs.

Where ndarrays come from: `t.numpy()` (a CPU tensor that does not require grad), and
ndarray inputs (graph input `torch.from_numpy(L['a'])`, sharing memory, guarded like a
tensor). Where they go: `torch.from_numpy` / `torch.as_tensor` give the tensor back;
an ndarray that the frame returns or holds at a graph break is rebuilt with `.numpy()`
(a 0-d result as a NumPy scalar, as NumPy's reductions give). Anything else (Python
needing a value, an unknown NumPy function) is a graph break, as before."""

from __future__ import annotations

import functools
import operator
from typing import Any, Optional

import torch

from .graph_breaks import GraphBreak
from .source import Source
from .variables import ConstantVariable, ListVariable, TensorVariable, TupleVariable, VariableTracker

try:
    import numpy as np
    import torch._numpy as tnp
except ImportError:  # pragma: no cover - NumPy is optional
    np = None
    tnp = None


class NumpyVariable(VariableTracker):
    """An np.ndarray in the trace: the tensor it is (`tensor`, a TensorVariable)."""

    def __init__(self, tensor: TensorVariable, source: Optional[Source] = None):
        self.tensor = tensor
        self.source = source

    def python_type(self):
        return np.ndarray

    def __repr__(self):
        return f"NumpyVariable({self.tensor!r})"


class NumpyMethodVariable(VariableTracker):
    """`arr.sum` before it is called."""

    def __init__(self, obj: NumpyVariable, name: str):
        self.obj = obj
        self.name = name


def available() -> bool:
    return np is not None


# ---------------------------------------------------------------------- graph targets


def _to_tnp(x):
    if isinstance(x, torch.Tensor):
        return tnp.ndarray(x)
    if type(x) in (list, tuple):
        return type(x)(_to_tnp(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_tnp(v) for k, v in x.items()}
    return x


def _from_tnp(x):
    if isinstance(x, tnp.ndarray):
        return x.tensor
    if type(x) in (list, tuple):
        return type(x)(_from_tnp(v) for v in x)
    return x


@functools.lru_cache(maxsize=None)
def numpy_function(name: str):
    """Graph target for np.<name>(...)."""
    fn = getattr(tnp, name)

    def call(*args, **kwargs):
        return _from_tnp(fn(*_to_tnp(args), **_to_tnp(kwargs)))

    call.__name__ = call.__qualname__ = f"numpy_{name}"
    return call


@functools.lru_cache(maxsize=None)
def numpy_method(name: str):
    """Graph target for arr.<name>(...) (and attributes such as arr.T, called with no args)."""

    def call(obj, *args, **kwargs):
        attr = getattr(tnp.ndarray(obj), name)
        return _from_tnp(attr(*_to_tnp(args), **_to_tnp(kwargs)) if callable(attr) else attr)

    call.__name__ = call.__qualname__ = f"numpy_ndarray_{name}"
    return call


@functools.lru_cache(maxsize=None)
def numpy_operator(op):
    def call(*args):
        return _from_tnp(op(*_to_tnp(args)))

    call.__name__ = call.__qualname__ = f"numpy_{op.__name__}"
    return call


def to_numpy_output(t: torch.Tensor):
    """The ndarray the frame returns: NumPy's own type (a 0-d result as a NumPy scalar)."""
    a = t.detach().numpy()
    return a[()] if a.ndim == 0 else a


# ---------------------------------------------------------------------- tracing


_GRAPH_ATTRS = {"T", "real", "imag", "flat"}
_CONSTANT_ATTRS = {"shape", "ndim", "size", "dtype", "itemsize", "nbytes"}


def _torch_to_np_dtype(dtype: torch.dtype):
    try:
        return np.dtype(str(dtype).replace("torch.", ""))
    except TypeError:
        raise GraphBreak("GB0010", f"ndarray of dtype {dtype}") from None


def wrap_result(tx, proxy, result):
    """A numpy op's result: ndarrays (tensors) become NumpyVariables, the rest constants."""
    from .builder import wrap_constant

    if isinstance(result, torch.Tensor):
        return NumpyVariable(TensorVariable(proxy, result))
    if isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result):
        items = [NumpyVariable(TensorVariable(proxy[i], r)) if isinstance(r, torch.Tensor) else wrap_constant(r)
                 for i, r in enumerate(result)]
        return ListVariable(items) if isinstance(result, list) else TupleVariable(items)
    tx._drop_node(proxy)
    return wrap_constant(result)


def _unwrap(v):
    """Arguments for a numpy graph node: ndarrays as their tensors; nothing else but constants."""
    if isinstance(v, NumpyVariable):
        return v.tensor
    if isinstance(v, ConstantVariable):
        return v
    if isinstance(v, (ListVariable, TupleVariable)):
        return type(v)([_unwrap(x) for x in v.items]) if isinstance(v, ListVariable) else \
            TupleVariable([_unwrap(x) for x in v.items], cls=v.cls)
    raise GraphBreak("GB0010", f"a {type(v).__name__} passed to a NumPy operation")


def call(tx, target, args, kwargs):
    args = [_unwrap(a) for a in args]
    kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
    proxy, result = tx.out.call_op("call_function", target, tuple(args), kwargs)
    return wrap_result(tx, proxy, result)


def getattr_(tx, obj: NumpyVariable, name: str):
    fake = obj.tensor.fake
    if name in _CONSTANT_ATTRS:
        if name == "shape":
            return ConstantVariable(tuple(fake.shape))
        if name == "ndim":
            return ConstantVariable(fake.dim())
        if name == "size":
            return ConstantVariable(fake.numel())
        if name == "dtype":
            return ConstantVariable(_torch_to_np_dtype(fake.dtype))
        if name == "itemsize":
            return ConstantVariable(fake.element_size())
        return ConstantVariable(fake.numel() * fake.element_size())
    if name in _GRAPH_ATTRS:
        return call(tx, numpy_method(name), [obj], {})
    if callable(getattr(np.ndarray, name, None)) and hasattr(tnp.ndarray, name) and not name.startswith("_"):
        return NumpyMethodVariable(obj, name)
    raise GraphBreak("GB0010", f"ndarray.{name}")


# Methods that return a new array (or a view) and mutate nothing: an unused graph node is
# dropped, so a mutating one (fill, sort, resize, ...) must stay a graph break.
PURE_METHODS = {"sum", "mean", "std", "var", "min", "max", "argmin", "argmax", "prod", "cumsum", "cumprod", "all",
                "any", "reshape", "transpose", "swapaxes", "squeeze", "flatten", "ravel", "astype", "copy", "clip",
                "round", "dot", "nonzero", "diagonal", "trace", "conj", "conjugate", "ptp", "view"}


def call_method(tx, m: NumpyMethodVariable, args, kwargs):
    if m.name not in PURE_METHODS or "out" in kwargs:
        raise GraphBreak("GB0010", f"ndarray.{m.name}() is not traced")
    return call(tx, numpy_method(m.name), [m.obj] + list(args), kwargs)


def binary(tx, op, a, b):
    if op not in BINARY_NUMPY_OPS:  # in-place operators mutate: not a droppable graph node
        raise GraphBreak("GB0010", f"{op.__name__} on an ndarray")
    return call(tx, numpy_operator(op), [a, b], {})


def unary(tx, op, v):
    if op not in (operator.neg, operator.pos, operator.invert, abs):
        raise GraphBreak("GB0010", f"{getattr(op, '__name__', op)} on an ndarray")
    return call(tx, numpy_operator(op), [v], {})


def numpy_callable_name(fn) -> Optional[str]:
    """np.<name> when `fn` is that NumPy function (or ufunc) and torch._numpy has it."""
    if np is None:
        return None
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name.startswith("_"):
        return None
    try:
        if getattr(np, name, None) is not fn:
            return None
    except Exception:
        return None
    return name if hasattr(tnp, name) else None


_MUTATING_FUNCTIONS = {"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"}


def fold_on_constants(tx, fn, args, kwargs):
    """np.sqrt(self.d_model) and other NumPy functions of Python constants that give a
    scalar: called now, the scalar is a constant of the trace (the arguments are already
    guarded). None where that does not hold (an array result, a mutating function)."""
    if np is None or not (isinstance(fn, np.ufunc) or (getattr(fn, "__module__", None) or "") == "numpy"):
        return None
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or getattr(np, name, None) is not fn or name in _MUTATING_FUNCTIONS or \
            "out" in kwargs:
        return None
    if not (all(tx.is_python_constant(a) for a in args) and all(tx.is_python_constant(v) for v in kwargs.values())):
        return None
    try:
        value = fn(*[tx.as_python(a) for a in args], **{k: tx.as_python(v) for k, v in kwargs.items()})
    except Exception:
        return None   # left to the call's own handling, which says why
    return ConstantVariable(value) if isinstance(value, (np.generic, int, float, bool, complex)) else None


def scalar_value(value):
    """A NumPy scalar as the Python scalar torch takes it for (np.float64(8.0) -> 8.0), so a
    graph's code never names NumPy; anything else unchanged."""
    return value.item() if np is not None and isinstance(value, np.generic) else value


def call_numpy_function(tx, fn, args, kwargs):
    name = numpy_callable_name(fn)
    if name is None or name in _MUTATING_FUNCTIONS or "out" in kwargs:
        raise GraphBreak("GB0010", f"numpy.{getattr(fn, '__name__', fn)} is not traced")
    return call(tx, numpy_function(name), args, kwargs)


def tensor_to_numpy(tx, t: TensorVariable, args, kwargs):
    """t.numpy(): the same tensor as an ndarray (shared memory, as eagerly)."""
    if args or kwargs or t.fake.requires_grad or t.fake.device.type != "cpu" or t.fake.is_conj() or \
            t.fake.is_neg() or t.ptype is not torch.Tensor and t.ptype is not torch.nn.Parameter:
        raise GraphBreak("GB0010", "Tensor.numpy()")
    return NumpyVariable(t)


def has_numpy(args, kwargs) -> bool:
    vals = list(args) + list(kwargs.values())
    while vals:
        v = vals.pop()
        if isinstance(v, NumpyVariable):
            return True
        if isinstance(v, (ListVariable, TupleVariable)):
            vals.extend(v.items)
    return False


def from_numpy(tx, fn, args, kwargs):
    """torch.from_numpy(arr) / torch.as_tensor(arr): the tensor the ndarray is."""
    if len(args) == 1 and not kwargs and isinstance(args[0], NumpyVariable):
        return args[0].tensor
    raise GraphBreak("GB0010", f"{getattr(fn, '__name__', fn)} of an ndarray with arguments")


def input_supported(value: Any) -> bool:
    if np is None or type(value) is not np.ndarray:
        return False
    try:
        torch.from_numpy(value)
    except Exception:
        return False
    return True


BINARY_NUMPY_OPS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
                    operator.pow, operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift,
                    operator.rshift, operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge}
