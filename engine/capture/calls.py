"""Calls during the trace: inlining Python functions (argument binding, closures,
generators), builtins, classes, nn.Module calls, torch operators, and the calls that
must break the graph."""

from __future__ import annotations

import builtins
import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import logging
import operator
import types
import warnings

import torch

import observe

from .. import config, markers
from ..distributed import collectives, ddp
from . import autocast as autocastmod
from . import autograd_function, checkpoint, higher_order
from . import module_conversion, numpy_ops, optimizers, runtime, scalars, scan, skipfiles
from .builder import is_constant_value, wrap_constant
from .containers import dict_update
from .graph_breaks import GraphBreak
from .source import GetItemSource, ModuleGlobalSource, AttrSource
from .tensor_ops import PURE_MODULES, convertible, is_torch_op
from .variables import (AutocastVariable, BoundMethodVariable, CellVariable, ConstantVariable, DictVariable,
                        ExceptionVariable, FunctionVariable, GradModeVariable, IteratorVariable, ListVariable,
                        NestedFunctionVariable, ObjectVariable, PartialVariable, ProfilerRangeVariable, SetVariable,
                        SuperVariable, TensorVariable, TupleVariable)

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


def _module_of(fn) -> str:
    return getattr(fn, "__module__", None) or ""


def _is_torch(fn) -> bool:
    mod = _module_of(fn)
    return mod == "torch" or mod.startswith("torch.")


def _inlinable_torch(fn) -> bool:
    """Python code inside torch that the capture inlines (module forwards and helpers)."""
    mod = _module_of(fn)
    if isinstance(fn, types.FunctionType) and fn.__code__.co_filename.startswith(runtime.OPTIM_DIR):
        # the optimizers' own code (not a wrapper that only borrowed an optimizer's name); opt.step()
        # itself is a graph break whose inner step compiles as its own frame (runtime.optimizer_step)
        return not runtime.is_optimizer_step_wrapper(fn)
    if fn is torch.utils.checkpoint.checkpoint_sequential:
        return True  # plain Python over checkpoint(), which the capture traces (capture/checkpoint.py)
    # torch.utils._contextlib, torch.amp.autocast_mode: `@torch.no_grad()`, `@torch.autocast(...)` as decorators
    # torch.masked and torch.signal.windows: Python over torch ops, traced as torch.compile traces them;
    # torch.nn.utils.clip_grad: clip_grad_norm_ & co, foreach ops over the .grads
    return mod.startswith(("torch.nn.modules", "torch.nn.utils.parametrize", "torch.nn.utils.clip_grad", "torch.masked",
                           "torch.signal", "torch._lowrank", "torch._linalg_utils")) or \
        mod in ("torch.nn.parameter", "torch.utils._foreach_utils", "torch.utils._contextlib", "torch.amp.autocast_mode")


# ---------------------------------------------------------------------- Python functions


def call_python_function(tx, fn, args, kwargs, source):
    # engine.comptime: run the user's trace-time code with this interpreter; nothing is traced
    comptime_handler = getattr(fn, "__engine_comptime__", None)
    if comptime_handler is not None:
        return comptime_handler(tx, args, kwargs)
    fn = optimizers.unwrap_dynamo_disabled(fn)
    if numpy_ops.has_numpy(args, kwargs) and numpy_ops.numpy_callable_name(fn) is not None:
        return numpy_ops.call_numpy_function(tx, fn, args, kwargs)  # np.mean(arr) & co: torch._numpy
    inner = getattr(fn, "_engine_orig", None)
    if inner is not None and not getattr(fn, "_engine_disabled", False):
        # an engine.compile'd function called from compiled code: trace the original
        return tx.call(tx.out.builder.wrap_sourceless(inner), args, kwargs)
    if fn is markers.graph_break:
        raise GraphBreak("GB0005")
    if getattr(fn, "_engine_disabled", False) or fn in markers.DISALLOWED:
        raise GraphBreak("GB0006", getattr(fn, "__qualname__", repr(fn)))
    if fn in config.reorderable_logging_functions:
        return defer_logging_call(tx, fn, args, kwargs)
    if fn in markers.ALLOWED:
        return call_torch_op(tx, fn, args, kwargs)
    if skipfiles.is_engine_file(fn.__code__.co_filename):
        raise GraphBreak("GB0013", f"engine internals ({fn.__qualname__})")
    if is_torch_op(fn):
        return call_torch_op(tx, fn, args, kwargs)
    special = SPECIAL_FUNCTIONS.get(fn)
    if special is not None:
        return special(tx, args, kwargs)
    if fn is torch.optim.Optimizer.zero_grad and args and isinstance(args[0], ObjectVariable) and \
            _set_to_none(tx, args[1:], kwargs):
        return inline_user_function(tx, optimizers.grads_to_none, args[:1], {}, None)
    if args and isinstance(args[0], ObjectVariable) and optimizers.is_init_group(fn, args[0].value):
        optimizers.prepare_init_group(tx, fn, args)  # creates the state on the first step; traced below
    if fn in _MODULE_CALLS and args and isinstance(args[0], ObjectVariable) and \
            isinstance(args[0].value, torch.nn.Module):
        return call_module_hooks_checked(tx, args[0], args[1:], kwargs)
    if fn.__qualname__ == "is_compiling" and _is_torch(fn):
        return ConstantVariable(True)  # torch's older is_compiling spellings, which libraries still call
    if _is_torch(fn) and not _inlinable_torch(fn):
        collective = collectives.collective_name(fn)
        if collective is not None:
            raise GraphBreak("GB0020", f"{collective} (runs eagerly between two graphs, on every rank)")
        if collectives.is_process_query(fn) and all(tx.is_python_constant(a) for a in args) and \
                all(tx.is_python_constant(v) for v in kwargs.values()):
            return tx.const_apply(fn, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
        if runtime.is_optimizer_step_wrapper(fn) and args and isinstance(args[0], ObjectVariable):
            inner = runtime.optimizer_step_target(types.MethodType(fn, args[0].value), args[1:], kwargs)
            if inner is not None and tx.out.backward_nodes:
                return optimizers.inline_step(tx, args[0], inner)
            why = ("its inner step compiles as a graph of its own: engine/capture/runtime.optimizer_step; with "
                   "the backward in the graph (engine.config.backward_in_graph) the step joins that graph"
                   if inner is not None else "step hooks or arguments: the step runs eagerly")
            raise GraphBreak("GB0012", f"{_module_of(fn)}.{fn.__qualname__} ({why})")
        raise GraphBreak("GB0012", f"{_module_of(fn)}.{fn.__qualname__}")
    mod = _module_of(fn).split(".")[0]
    if mod in PURE_MODULES and all(tx.is_python_constant(a) for a in args) and \
            all(tx.is_python_constant(v) for v in kwargs.values()):
        return tx.const_apply(fn, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
    if fn.__code__.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE):
        raise GraphBreak("GB0011", "coroutine")
    return inline_user_function(tx, fn, args, kwargs, source)


def _set_to_none(tx, args, kwargs) -> bool:
    """zero_grad's `set_to_none` argument is a constant True (its default)."""
    flag = args[0] if args else kwargs.get("set_to_none", ConstantVariable(True))
    return len(args) + len(kwargs) <= 1 and tx.is_python_constant(flag) and tx.as_python(flag) is True


def defer_logging_call(tx, fn, args, kwargs):
    tx.out.deferred_calls.append((fn, list(args), dict(kwargs)))
    return ConstantVariable(None)


def is_logging_call(fn) -> bool:
    """A `logging.Logger` method (transformers' `logger.warning_once` too) or `warnings.warn`:
    replayed after the graph, in order, with the values it was given (no graph break)."""
    if fn is warnings.warn:
        return True
    owner = getattr(fn, "__self__", None)
    return isinstance(owner, (logging.Logger, logging.LoggerAdapter)) and \
        getattr(fn, "__name__", "") not in ("setLevel", "addHandler", "removeHandler", "addFilter", "removeFilter")


def inline_user_function(tx, fn, args, kwargs, source):
    globals_source = _globals_source_for(fn, source)
    defaults = tuple_of_real(tx, fn.__defaults__, AttrSource(source, "__defaults__") if source else None)
    kwdefaults = None
    if fn.__kwdefaults__:
        kwdefaults = DictVariable({k: tx.out.builder.wrap_sourceless(v) if not is_constant_value(v) else
                                   ConstantVariable(v) for k, v in fn.__kwdefaults__.items()})
    closure = None
    if fn.__closure__:
        cells = []
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                content = cell.cell_contents
            except ValueError:
                cells.append(CellVariable(None))
                continue
            csrc = None
            if source is not None:
                csrc = AttrSource(GetItemSource(AttrSource(source, "__closure__"), len(cells)), "cell_contents")
            vt = tx.out.builder.wrap(content, csrc) if csrc is not None else tx.out.builder.wrap_sourceless(content)
            cells.append(CellVariable(vt, source=csrc))
        closure = tuple(cells)
    return inline_code(tx, fn.__code__, fn.__globals__, globals_source, defaults, kwdefaults, closure, args, kwargs,
                       fn.__qualname__)


def tuple_of_real(tx, values, source):
    if not values:
        return None
    items = []
    for i, v in enumerate(values):
        if is_constant_value(v):
            items.append(ConstantVariable(v))
        elif source is not None:
            items.append(tx.out.builder.wrap(v, GetItemSource(source, i)))
        else:
            items.append(tx.out.builder.wrap_sourceless(v))
    return TupleVariable(items)


def _globals_source_for(fn, source):
    mod = fn.__globals__.get("__name__")
    if _is_torch(fn):
        return lambda name: None  # torch's own globals are not guarded
    import sys

    if mod and sys.modules.get(mod) is not None and getattr(sys.modules[mod], "__dict__", None) is fn.__globals__:
        return lambda name: ModuleGlobalSource(mod, name)
    if source is not None:
        return lambda name: GetItemSource(AttrSource(source, "__globals__"), name)
    return lambda name: None


def bind_args(tx, code, defaults, kwdefaults, args, kwargs, name) -> dict:
    """CPython's argument binding, over variables."""
    nargs = code.co_argcount
    nkwonly = code.co_kwonlyargcount
    npos_only = code.co_posonlyargcount
    names = code.co_varnames
    result = {}
    pos_names = names[:nargs]
    kwonly_names = names[nargs:nargs + nkwonly]
    i = nargs + nkwonly
    varargs_name = names[i] if code.co_flags & CO_VARARGS else None
    if varargs_name:
        i += 1
    varkw_name = names[i] if code.co_flags & CO_VARKEYWORDS else None
    args = list(args)
    for pname, a in zip(pos_names, args):
        result[pname] = a
    extra = args[nargs:]
    if extra and not varargs_name:
        raise tx.exception(TypeError, f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    if varargs_name:
        result[varargs_name] = TupleVariable(extra)
    varkw = {}
    for k, v in kwargs.items():
        if k in pos_names[npos_only:] or k in kwonly_names:
            if k in result:
                raise tx.exception(TypeError, f"{name}() got multiple values for argument '{k}'")
            result[k] = v
        elif varkw_name:
            varkw[k] = v
        else:
            raise tx.exception(TypeError, f"{name}() got an unexpected keyword argument '{k}'")
    if varkw_name:
        result[varkw_name] = DictVariable(varkw)
    dvals = defaults.items if defaults is not None else []
    first_default = nargs - len(dvals)
    for idx, pname in enumerate(pos_names):
        if pname not in result:
            if idx >= first_default:
                result[pname] = dvals[idx - first_default]
            else:
                raise tx.exception(TypeError, f"{name}() missing required positional argument: '{pname}'")
    for pname in kwonly_names:
        if pname not in result:
            if kwdefaults is not None and pname in kwdefaults.items:
                result[pname] = kwdefaults.items[pname]
            else:
                raise tx.exception(TypeError, f"{name}() missing required keyword-only argument: '{pname}'")
    return result


def inline_code(tx, code, f_globals, globals_source, defaults, kwdefaults, closure, args, kwargs, name):
    from .interpreter import MAX_INLINE_DEPTH, Frame

    if tx.depth >= MAX_INLINE_DEPTH:
        raise GraphBreak("GB0011", "inlining too deep (recursion?)")
    local_vars = bind_args(tx, code, defaults, kwdefaults, args, kwargs, name)
    cells = {}
    for cname in code.co_cellvars:
        cells[cname] = CellVariable(local_vars.pop(cname, None)) if cname in local_vars else CellVariable(None)
    if code.co_freevars:
        if closure is None or len(closure) != len(code.co_freevars):
            raise GraphBreak("GB0011", f"closure of {name}")
        for fname, cell in zip(code.co_freevars, closure):
            cells[fname] = cell
    # the callee's MAKE_CELL finds its cells already made (Frame.MAKE_CELL skips them)
    child = Frame(tx.out, code, f_globals, globals_source, local_vars, cells, parent=tx, fn_name=name)
    with observe.stage("trace_function", fn_name=code.co_name, filename=code.co_filename, lineno=code.co_firstlineno):
        result = child.run()
    if child.generator_values is not None:
        return IteratorVariable(child.generator_values, types.GeneratorType)
    return result


# ---------------------------------------------------------------------- torch ops


def call_torch_op(tx, fn, args, kwargs):
    if not convertible(args, kwargs):
        if isinstance(fn, types.FunctionType) and fn.__module__ == "torch.nn.functional":
            # Python over torch ops, given a callable (triplet_margin_with_distance_loss's
            # distance_function): traced through, as torch.compile does
            return inline_user_function(tx, fn, args, kwargs, None)
        raise GraphBreak("GB0011", f"{getattr(fn, '__name__', fn)} called with unsupported argument types")
    out = kwargs.get("out")
    if any(isinstance(o, TensorVariable) and not o.fake.is_contiguous()
           for o in (out.items if isinstance(out, (ListVariable, TupleVariable)) else [out])):
        # eager writes a strided out= tensor element by element, reading inputs that may
        # overlap it as they change (`sub(y, y[0], out=y)` on a view); the graph computes,
        # then copies. torch.compile runs such a call eagerly too (fuzz 404182)
        raise GraphBreak("GB0017", f"{getattr(fn, '__name__', fn)} with an out= tensor that is not contiguous")
    if isinstance(out, TensorVariable) and _resizes(tx, fn, args, kwargs, out):
        # eager resizes an out= tensor of another size to the result's (with a warning); the
        # graph's copy into it would not (fuzz 411215); torch.compile runs it eagerly too
        raise GraphBreak("GB0017", f"{getattr(fn, '__name__', fn)} with an out= tensor of another size than its result")
    scaled = optimizers.foreach_scaled_by_tensor(tx, fn, args, kwargs)
    if scaled is not None:
        return scaled
    return tx.tensor_call("call_function", fn, args, kwargs)


def _resizes(tx, fn, args, kwargs, out) -> bool:
    """Whether the call, given `out=`, would resize it: the result's size (the call on the
    fake inputs, without out) is not out's. Not asked where a size depends on the data (a
    mask's count): comparing it would add a runtime assertion to the graph (fuzz 313332)."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, TensorVariable)]
    if any(scalars.is_unbacked(tuple(t.fake.shape)) for t in tensors):
        return False
    try:
        with tx.out.fake_mode:    # fake tensors only: a factory (`randn(3, out=z)`) runs nothing
            res = fn(*[to_fake_or_const(tx, a) for a in args],
                     **{k: to_fake_or_const(tx, v) for k, v in kwargs.items() if k != "out"})
    except Exception:
        return False      # the call itself will say what is wrong with it
    return isinstance(res, torch.Tensor) and res.shape != out.fake.shape


def _const_fold_torch(tx, fn, args, kwargs):
    return tx.const_apply(fn, [to_fake_or_const(tx, a) for a in args],
                          {k: to_fake_or_const(tx, v) for k, v in kwargs.items()})


def to_fake_or_const(tx, v):
    if isinstance(v, TensorVariable):
        return v.fake
    return tx.as_python(v)


# ---------------------------------------------------------------------- objects


def call_object(tx, fnv: ObjectVariable, args, kwargs):
    fn = fnv.value
    if fn is None:
        raise GraphBreak("GB0013", f"call of a {fnv.cls.__name__} instance built in the trace")
    if fn is markers.graph_break:
        raise GraphBreak("GB0005")
    special = SPECIAL_FUNCTIONS.get(fn) if _hashable(fn) else None
    if special is not None:
        return special(tx, args, kwargs)
    if numpy_ops.has_numpy(args, kwargs):  # an ndarray argument: NumPy traced through torch._numpy
        if fn in (torch.from_numpy, torch.as_tensor, torch.asarray):
            return numpy_ops.from_numpy(tx, fn, args, kwargs)
        if numpy_ops.numpy_callable_name(fn) is not None:
            return numpy_ops.call_numpy_function(tx, fn, args, kwargs)
    elif _hashable(fn):
        folded = numpy_ops.fold_on_constants(tx, fn, args, kwargs)
        if folded is not None:
            return folded
    if isinstance(fn, type):
        return call_class(tx, fnv, args, kwargs)
    if isinstance(fn, torch.nn.Module):
        return call_module(tx, fnv, args, kwargs)
    if _marked_constant(fn) and all(tx.is_python_constant(a) for a in args) and \
            all(tx.is_python_constant(v) for v in kwargs.values()):
        # torch._dynamo.assume_constant_result's marker (transformers' version probes carry it):
        # called now, its answer is a constant of the graph, as under torch.compile
        return tx.const_apply(fn, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
    if isinstance(fn, types.FunctionType):
        return call_python_function(tx, fn, args, kwargs, fnv.source)
    if is_logging_call(fn):
        return defer_logging_call(tx, fn, args, kwargs)
    if isinstance(fn, types.MethodType):
        self_vt = tx.out.builder.wrap(fn.__self__, AttrSource(fnv.source, "__self__")) if fnv.source else \
            tx.out.builder.wrap_sourceless(fn.__self__)
        if isinstance(fn.__func__, types.FunctionType):
            return call_python_function(tx, fn.__func__, [self_vt] + list(args), kwargs, None)
        raise GraphBreak("GB0002", repr(fn))
    if _hashable(fn) and (fn in markers.DISALLOWED):
        raise GraphBreak("GB0006", repr(fn))
    if _hashable(fn) and fn in config.reorderable_logging_functions or is_logging_call(fn):
        return defer_logging_call(tx, fn, args, kwargs)
    if isinstance(fn, functools._lru_cache_wrapper):
        cached = _cached_answer(tx, fn, args, kwargs)
        if cached is not None:
            return cached
        # otherwise traced through: what it returns does not depend on the cache
        return tx.call(tx.out.builder.wrap_sourceless(fn.__wrapped__), args, kwargs)
    if is_torch_op(fn) or (_hashable(fn) and fn in markers.ALLOWED):
        if fn in TORCH_CONSTANT_FOLD:
            return TORCH_CONSTANT_FOLD[fn](tx, args, kwargs)
        return call_torch_op(tx, fn, args, kwargs)
    if _hashable(fn) and fn in TORCH_CONSTANT_FOLD:
        return TORCH_CONSTANT_FOLD[fn](tx, args, kwargs)
    if isinstance(fn, functools.partial):
        inner = tx.out.builder.wrap_sourceless(fn.func)
        pargs = [tx.out.builder.wrap_sourceless(a) for a in fn.args]
        pkw = {k: tx.out.builder.wrap_sourceless(v) for k, v in fn.keywords.items()}
        return tx.call(inner, pargs + list(args), {**pkw, **kwargs})
    if isinstance(fn, (types.WrapperDescriptorType, types.MethodDescriptorType)) and \
            getattr(fn, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase) and args and \
            isinstance(args[0], TensorVariable):
        # Tensor.uniform_(x, ...), Tensor.__radd__(x, 2): the unbound method is the method
        return tx.tensor_method(args[0], fn.__name__, list(args[1:]), kwargs)
    if isinstance(fn, types.MethodWrapperType) and fn.__name__ == "__get__" and \
            isinstance(fn.__self__, types.FunctionType) and 1 <= len(args) <= 2 and not kwargs:
        # `func.__get__(obj, cls)`: func bound to obj (the LR schedulers' wrapper of opt.step)
        return BoundMethodVariable(args[0], fn.__self__.__name__, fn.__self__)
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                       types.WrapperDescriptorType, types.MethodDescriptorType)):
        mod = _module_of(fn) or getattr(getattr(fn, "__self__", None), "__name__", "")
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, types.ModuleType):
            mod = owner.__name__
        elif isinstance(owner, type) and owner.__module__ == "builtins":
            mod = "builtins"   # a builtin type's classmethod: dict.fromkeys(range(n)), int.from_bytes(...)
        elif getattr(fn, "__objclass__", None) in _IMMUTABLE_BUILTIN_TYPES or fn in _READING_METHODS or \
                type(owner) in _IMMUTABLE_BUILTIN_TYPES and type(owner) is not tuple:
            # an immutable value's method, unbound or bound, or a set's or list's that only
            # reads: map(str.isalnum, name), `AXES.__contains__` of a frozenset,
            # set.difference(left, right) (einops' pattern parser)
            mod = "builtins"
        if (mod in PURE_MODULES or mod == "builtins") and all(tx.is_python_constant(a) for a in args) and \
                all(tx.is_python_constant(v) for v in kwargs.values()) and fn not in _IMPURE_BUILTINS:
            return tx.const_apply(fn, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
        if mod == "builtins" or fn in _IMPURE_BUILTINS:
            raise GraphBreak("GB0001", f"builtin `{fn.__name__}` with argument types "
                                       f"{[a.python_type().__name__ if not isinstance(a, ObjectVariable) else type(a.value).__name__ for a in args]}")
        raise GraphBreak("GB0002", f"{mod}.{getattr(fn, '__qualname__', fn)}")
    import weakref
    if isinstance(fn, weakref.ReferenceType):
        return _call_weakref(tx, fnv, args)
    call = getattr(type(fn), "__call__", None)
    if isinstance(call, types.FunctionType) and not _is_torch(type(fn)):
        return call_python_function(tx, call, [fnv] + list(args), kwargs, None)
    overload = getattr(fn, "_opoverload", None)
    if isinstance(overload, torch._ops.OpOverload):   # a torch.library.custom_op: the op it registered
        return call_torch_op(tx, overload, args, kwargs)
    raise GraphBreak("GB0013", f"call of {type(fn).__name__}")


def _cached_answer(tx, fn, args, kwargs):
    """A cached function called with constants (einops' pattern parser, a config lookup) is
    called now: its answer for them is the cache's, the same object eager gets back on every
    later call. An answer that is a list, dict or set, which the program may fill in for
    eager's next call (`@cache def registry(): return {}`), breaks the graph: the call runs
    eagerly and the program gets the cache's own. None (traced through) where the answer
    holds a tensor."""
    if not (all(tx.is_python_constant(a) for a in args) and all(tx.is_python_constant(v) for v in kwargs.values())):
        return None
    cargs, ckwargs = [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()}
    try:
        hash((tuple(cargs), tuple(ckwargs.items())))
    except TypeError:       # (a symbolic size, an unhashable argument: the cache would raise)
        return None
    try:
        answer = fn(*cargs, **ckwargs)
    except Exception:  # noqa: BLE001  (traced through, it raises where the program does)
        return None
    if _holds_tensor(answer, 4):
        return None
    if isinstance(answer, (list, dict, set)):
        # traced through, it would be a new one on each call where eager gets the cache's own
        raise GraphBreak("GB0017", f"{getattr(fn, '__qualname__', fn)} hands back the cache's "
                                   f"{type(answer).__name__}, which the program may change between calls")
    return wrap_constant(answer)


def _holds_tensor(value, depth: int) -> bool:
    """A tensor within `depth` levels of containers and attributes (a recipe's lists of ints
    are fine)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth == 0 or value is None or isinstance(value, (str, bytes, int, float, bool, complex)):
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_tensor(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v, depth - 1) for v in value.values())
    fields = list(getattr(value, "__dict__", {}).values()) + \
        [getattr(value, k, None) for k in getattr(type(value), "__slots__", ())]
    return any(_holds_tensor(v, depth - 1) for v in fields)


_IMMUTABLE_BUILTIN_TYPES = (str, bytes, int, float, complex, bool, tuple, frozenset, range)
_READING_METHODS = {set.difference, set.symmetric_difference, set.union, set.intersection, set.issubset,
                    set.issuperset, set.isdisjoint, set.__contains__, list.index, list.count, list.__contains__}
_IMPURE_BUILTINS = {print, input, open, id, exec, eval, compile, globals, locals, vars, dir, help, breakpoint,
                    __import__, exit, quit} if hasattr(builtins, "exit") else {print, input, open}


def _marked_constant(fn) -> bool:
    """The function (or the one an lru_cache wraps) is marked `_dynamo_marked_constant`."""
    target = fn.__wrapped__ if isinstance(fn, functools._lru_cache_wrapper) else fn
    try:
        return getattr(target, "_dynamo_marked_constant", False) is True
    except Exception:     # an object whose __getattr__ raises something else
        return False


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def call_module(tx, mv: ObjectVariable, args, kwargs):
    m = mv.value
    if isinstance(m, runtime.OptimizedModule):
        inner = m._orig_mod
        return call_module(tx, tx.out.builder.wrap(inner, AttrSource(mv.source, "_orig_mod")) if mv.source
                           else tx.out.builder.wrap_sourceless(inner), args, kwargs)
    if ddp.is_ddp(m):
        raise GraphBreak("GB0021", f"{type(m).__name__} (its forward runs eagerly; the module it wraps "
                                   "compiles as a frame of its own)")
    if _has_hooks(m):
        return call_module_hooks_checked(tx, mv, args, kwargs)
    if type(m).__call__ is not torch.nn.Module.__call__ and isinstance(type(m).__call__, types.FunctionType) and \
            not _is_torch(type(m).__call__):
        return call_python_function(tx, type(m).__call__, [mv] + list(args), kwargs, None)
    return inline_forward(tx, mv, args, kwargs)


_MODULE_CALLS = {torch.nn.Module.__call__, torch.nn.Module._call_impl}


def _has_hooks(m) -> bool:
    from torch.nn.modules import module as module_mod
    return bool(m._forward_hooks or m._forward_pre_hooks or getattr(m, "_backward_hooks", None) or
                getattr(m, "_backward_pre_hooks", None) or module_mod._global_forward_hooks or
                module_mod._global_forward_pre_hooks or module_mod._global_backward_hooks or
                getattr(module_mod, "_global_backward_pre_hooks", None))


def call_module_hooks_checked(tx, mv, args, kwargs):
    """nn.Module's call itself (also `super().__call__(...)` from a module class's own
    __call__): forward pre-hooks, forward, forward hooks, traced as Module._call_impl runs
    them. The hook dicts are guarded (their keys, and each hook by identity); backward hooks
    and global hooks are a graph break."""
    from torch.nn.modules import module as module_mod
    m = mv.value
    if not _has_hooks(m):
        return inline_forward(tx, mv, args, kwargs)
    name = type(m).__name__
    if getattr(m, "_backward_hooks", None) or getattr(m, "_backward_pre_hooks", None) or \
            module_mod._global_backward_hooks or getattr(module_mod, "_global_backward_pre_hooks", None):
        raise GraphBreak("GB0014", f"{name} with backward hooks")
    if module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks or mv.source is None:
        raise GraphBreak("GB0014", f"{name} with global forward hooks" if mv.source is not None
                         else f"{name} (a module the capture cannot guard) with hooks")
    args = list(args)
    kwargs = dict(kwargs)
    pre = tx.getattr(mv, "_forward_pre_hooks")
    for hid, hook in list(pre.items.items()):
        if hid in m._forward_pre_hooks_with_kwargs:
            r = tx.call(hook, [mv, TupleVariable(args), DictVariable(kwargs)], {})
            if not (isinstance(r, ConstantVariable) and r.value is None):
                if not (isinstance(r, TupleVariable) and len(r.items) == 2 and isinstance(r.items[1], DictVariable)):
                    raise GraphBreak("GB0014", f"{name}: a forward pre-hook with kwargs that returns {type(r).__name__}")
                args, kwargs = list(tx.unpack(r.items[0])), dict(r.items[1].items)
        else:
            r = tx.call(hook, [mv, TupleVariable(args)], {})
            if not (isinstance(r, ConstantVariable) and r.value is None):
                args = list(r.items) if isinstance(r, TupleVariable) else [r]
    result = inline_forward(tx, mv, args, kwargs)
    post = tx.getattr(mv, "_forward_hooks")
    for hid, hook in list(post.items.items()):
        if hid in m._forward_hooks_with_kwargs:
            r = tx.call(hook, [mv, TupleVariable(args), DictVariable(kwargs), result], {})
        else:
            r = tx.call(hook, [mv, TupleVariable(args), result], {})
        if not (isinstance(r, ConstantVariable) and r.value is None):
            result = r
    return result


def inline_forward(tx, mv: ObjectVariable, args, kwargs):
    """What nn.Module.__call__ does without hooks: the module's forward, inlined (a class's own
    __call__ that ends in `super().__call__(...)` gets here too)."""
    m = mv.value
    forward = type(m).forward
    if not isinstance(forward, types.FunctionType):
        raise GraphBreak("GB0013", f"{type(m).__name__}.forward is not a Python function")
    if "forward" in m.__dict__:
        raise GraphBreak("GB0013", "module with an instance-level forward")
    return inline_user_function(tx, forward, [mv] + list(args), kwargs, None)


def call_class(tx, clsv: ObjectVariable, args, kwargs):
    cls = clsv.value
    if cls in (torch.no_grad, torch.enable_grad):
        if args or kwargs:
            raise GraphBreak("GB0011", f"{cls.__name__} with arguments")
        return GradModeVariable(cls is torch.enable_grad, tx.out.grad_enabled, False)
    if cls is torch.set_grad_enabled:
        mode = tx.as_python(args[0] if args else kwargs["mode"])
        prev = tx.out.grad_enabled
        tx.out.set_grad_enabled(bool(mode))
        return GradModeVariable(bool(mode), prev, True)
    if cls is torch.inference_mode:
        raise GraphBreak("GB0011", "torch.inference_mode")
    if cls is torch.autograd.profiler.record_function:
        return ProfilerRangeVariable()
    if cls is functools.partial and args:
        return PartialVariable(args[0], args[1:], kwargs)
    if issubclass(cls, torch.amp.autocast_mode.autocast):
        # built for real (it only validates its arguments), entered by BEFORE_WITH
        ctx = cls(*[tx.as_python(a) for a in args], **{k: tx.as_python(v) for k, v in kwargs.items()})
        return AutocastVariable(autocastmod.AutocastState(*autocastmod.block_of(ctx)))
    handler = BUILTIN_CLASSES.get(cls)
    if handler is not None:
        return handler(tx, args, kwargs)
    if cls is super:
        if args:
            return SuperVariable(tx.as_python(args[0]), args[1])
        # zero-argument super(): __class__ cell and the first argument of the frame
        cell = tx.cells.get("__class__")
        first = tx.code.co_varnames[0] if tx.code.co_argcount else None
        if cell is None or first is None:
            raise GraphBreak("GB0011", "super() without __class__")
        klass = tx.as_python(cell.value)
        self_vt = tx.locals.get(first) or (tx.cells[first].value if first in tx.cells else None)
        return SuperVariable(klass, self_vt)
    if issubclass(cls, BaseException):
        return ExceptionVariable(cls, list(args))
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return make_namedtuple(tx, cls, args, kwargs)
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        return make_stateless_module(tx, cls, args, kwargs)
    if _is_torch(cls) or cls in (torch.Tensor, torch.nn.Parameter):
        # (and torch's frozen option dataclasses, LinearCrossEntropyOptions(...): plain values)
        frozen = dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen and \
            all(tx.is_python_constant(a) for a in args) and all(tx.is_python_constant(v) for v in kwargs.values())
        if cls in (torch.device, torch.dtype, torch.Size, torch.finfo, torch.iinfo) or issubclass(cls, torch.Size) \
                or frozen:
            return tx.const_apply(cls, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
        raise GraphBreak("GB0013", f"construction of {cls.__module__}.{cls.__qualname__}")
    # a metaclass that does not change how instances are made (ABCMeta) builds them as type does
    if cls.__module__ == "builtins" or type(cls).__call__ is not type.__call__ and not dataclasses.is_dataclass(cls):
        if all(tx.is_python_constant(a) for a in args) and all(tx.is_python_constant(v) for v in kwargs.values()) \
                and cls.__module__ in ("builtins",) + PURE_MODULES:
            return tx.const_apply(cls, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
        raise GraphBreak("GB0013", f"construction of {cls.__qualname__}")
    is_dict = issubclass(cls, dict) and cls.__new__ is dict.__new__
    if (cls.__new__ is not object.__new__ and not is_dict) or not cls.__dictoffset__ and \
            not dataclasses.is_dataclass(cls):
        raise GraphBreak("GB0013", f"class {cls.__qualname__} with a custom __new__ or __slots__")
    obj = ObjectVariable(None, cls=cls, is_new=True)
    init = cls.__init__
    if is_dict:
        obj.dict_vt = DictVariable({})
        if init in (dict.__init__, collections.OrderedDict.__init__):
            obj.dict_vt.items = bi_dict(tx, args, kwargs).items
            return obj
    if init is not object.__init__:
        if not isinstance(init, types.FunctionType):
            raise GraphBreak("GB0013", f"{cls.__qualname__}.__init__ is not Python")
        call_python_function(tx, init, [obj] + list(args), kwargs, None)
    elif args or kwargs:
        raise tx.exception(TypeError, f"{cls.__name__}() takes no arguments")
    return obj


def make_stateless_module(tx, cls, args, kwargs):
    """`nn.ReLU()` / `nn.Dropout(p)` / transformers' `ACT2FN["silu"]` built inside forward: a
    module with constant arguments that holds no tensor (no parameters, buffers or tensor
    attributes) is made now, once, and called like any module: each call would have built an
    equal one. Anything else is a break."""
    if not all(tx.is_python_constant(a) for a in args) or not all(tx.is_python_constant(v) for v in kwargs.values()):
        raise GraphBreak("GB0013", f"creating an nn.Module ({cls.__name__}) inside the compiled region")
    try:
        m = cls(*[tx.as_python(a) for a in args], **{k: tx.as_python(v) for k, v in kwargs.items()})
    except Exception as exc:     # what eager would raise, at the user's line
        raise tx.exception(type(exc), str(exc)) from None
    if any(True for _ in m.parameters()) or any(True for _ in m.buffers()) or \
            any(isinstance(v, torch.Tensor) for v in vars(m).values()):
        raise GraphBreak("GB0013", f"creating an nn.Module with parameters ({cls.__name__}) inside the compiled region")
    return tx.out.builder.wrap_sourceless(m)


def make_namedtuple(tx, cls, args, kwargs):
    fields = cls._fields
    defaults = getattr(cls, "_field_defaults", {})
    values = list(args)
    if len(values) > len(fields):
        raise tx.exception(TypeError, f"{cls.__name__} takes {len(fields)} arguments")
    for f in fields[len(values):]:
        if f in kwargs:
            values.append(kwargs[f])
        elif f in defaults:
            values.append(wrap_constant(defaults[f]))
        else:
            raise tx.exception(TypeError, f"{cls.__name__} missing required argument: '{f}'")
    return TupleVariable(values, cls=cls)


# ---------------------------------------------------------------------- builtins


def bi_len(tx, args, kwargs):
    (v,) = args
    if isinstance(v, (ListVariable, TupleVariable)):
        return ConstantVariable(len(v.items))
    if isinstance(v, (DictVariable, SetVariable)):
        return ConstantVariable(len(v.items))
    if isinstance(v, ConstantVariable):
        return tx.const_apply(len, [v.value])
    if isinstance(v, TensorVariable):
        if v.fake.dim() == 0:
            raise tx.exception(TypeError, "len() of a 0-d tensor")
        return ConstantVariable(v.fake.shape[0])
    if isinstance(v, ObjectVariable) and isinstance(v.value, torch.nn.Module):
        tx.guard_module_structure(v)
        return ConstantVariable(len(v.value))
    if isinstance(v, ObjectVariable):
        meth = getattr(v.cls, "__len__", None)
        if isinstance(meth, types.FunctionType):
            return tx.inline_function(meth, [v], {}, None)
        if v.dict_vt is not None:
            return ConstantVariable(len(v.dict_vt.items))
    raise GraphBreak("GB0011", f"len() of {type(v).__name__}")


def _type_of(tx, v):
    if isinstance(v, ObjectVariable):
        return v.cls
    if isinstance(v, TensorVariable):
        return v.ptype
    if isinstance(v, (FunctionVariable,)):
        return type(v.fn)
    return v.python_type()


def bi_isinstance(tx, args, kwargs):
    v, t = args
    types_ = tx.as_python(t, "isinstance's second argument")
    if isinstance(v, TensorVariable):
        return ConstantVariable(issubclass(v.ptype, types_) if isinstance(types_, type) else
                                any(issubclass(v.ptype, x) for x in types_))
    if isinstance(v, ObjectVariable) and v.value is not None:
        return ConstantVariable(isinstance(v.value, types_))
    try:
        pt = _type_of(tx, v)
    except NotImplementedError:
        raise GraphBreak("GB0011", f"isinstance of {type(v).__name__}") from None
    return ConstantVariable(issubclass(pt, types_))


def bi_issubclass(tx, args, kwargs):
    return tx.const_apply(issubclass, [tx.as_python(a) for a in args])


def bi_type(tx, args, kwargs):
    if len(args) != 1:
        raise GraphBreak("GB0013", "type() with 3 arguments")
    return ObjectVariable(_type_of(tx, args[0]))


def bi_getattr(tx, args, kwargs):
    obj, name = args[0], tx.as_python(args[1])
    if len(args) == 3:
        from .interpreter import TracedException
        try:
            return tx.getattr(obj, name)
        except TracedException as exc:
            if issubclass(exc.exc.cls, AttributeError):
                return args[2]
            raise
    return tx.getattr(obj, name)


def bi_hasattr(tx, args, kwargs):
    from .interpreter import TracedException
    obj, name = args[0], tx.as_python(args[1])
    try:
        tx.getattr(obj, name)
        present = True
    except TracedException as exc:
        if not issubclass(exc.exc.cls, AttributeError):
            raise
        present = False
    if isinstance(obj, ObjectVariable) and obj.source is not None and not obj.attrs.get(name):
        tx.out.add_guard("HASATTR", obj.source, (name, present))
    return ConstantVariable(present)


def bi_setattr(tx, args, kwargs):
    tx.setattr(args[0], tx.as_python(args[1]), args[2])
    return ConstantVariable(None)


def bi_delattr(tx, args, kwargs):
    tx.delattr(args[0], tx.as_python(args[1]))
    return ConstantVariable(None)


def bi_object_setattr(tx, args, kwargs):
    obj, name, value = args
    if isinstance(obj, ObjectVariable) and obj.is_new:
        obj.attrs[tx.as_python(name)] = value
        return ConstantVariable(None)
    raise GraphBreak("GB0017", "object.__setattr__ on an existing object")


def bi_range(tx, args, kwargs):
    return ConstantVariable(range(*[tx.as_python(a) for a in args]))


def bi_enumerate(tx, args, kwargs):
    items = tx.unpack(args[0])
    start = tx.as_python(args[1]) if len(args) > 1 else tx.as_python(kwargs.get("start", ConstantVariable(0)))
    return IteratorVariable([TupleVariable([ConstantVariable(i + start), x]) for i, x in enumerate(items)], enumerate)


def bi_zip(tx, args, kwargs):
    if kwargs.get("strict") is not None and tx.as_python(kwargs["strict"]):
        seqs = [tx.unpack(a) for a in args]
        if len({len(s) for s in seqs}) > 1:
            raise tx.exception(ValueError, "zip() arguments have different lengths")
    seqs = [tx.unpack(a) for a in args]
    return IteratorVariable([TupleVariable(list(t)) for t in zip(*seqs)], zip)


def bi_map(tx, args, kwargs):
    fn = args[0]
    seqs = [tx.unpack(a) for a in args[1:]]
    return IteratorVariable([tx.call(fn, list(t), {}) for t in zip(*seqs)], map)


def bi_filter(tx, args, kwargs):
    fn, seq = args
    items = tx.unpack(seq)
    if isinstance(fn, ConstantVariable) and fn.value is None:
        return IteratorVariable([x for x in items if tx.truth(x)], filter)
    return IteratorVariable([x for x in items if tx.truth(tx.call(fn, [x], {}))], filter)


def bi_reversed(tx, args, kwargs):
    v = args[0]
    if isinstance(v, DictVariable) or isinstance(v, SetVariable):
        raise GraphBreak("GB0011", "reversed() of a dict")
    return IteratorVariable(list(reversed(tx.unpack(v))), type(reversed([])))


def bi_iter(tx, args, kwargs):
    if len(args) != 1:
        raise GraphBreak("GB0011", "iter() with a sentinel")
    return tx.get_iter(args[0])


def bi_next(tx, args, kwargs):
    it = args[0]
    if not isinstance(it, IteratorVariable):
        raise GraphBreak("GB0011", f"next() on {type(it).__name__}")
    v = it.next()
    if v is None:
        if len(args) > 1:
            return args[1]
        raise tx.exception(StopIteration, "")
    return v


def _sort_key(tx, v):
    return tx.as_python(v, "a sort key")


def bi_sorted(tx, args, kwargs):
    items = tx.unpack(args[0])
    key = kwargs.get("key")
    reverse = tx.as_python(kwargs["reverse"]) if "reverse" in kwargs else False
    if key is None or (isinstance(key, ConstantVariable) and key.value is None):
        keys = [_sort_key(tx, x) for x in items]
    else:
        keys = [_sort_key(tx, tx.call(key, [x], {})) for x in items]
    order = sorted(range(len(items)), key=lambda i: keys[i], reverse=reverse)
    return ListVariable([items[i] for i in order])


def bi_sum(tx, args, kwargs):
    items = tx.unpack(args[0])
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    acc = start
    for x in items:
        acc = tx.binary(operator.add, acc, x)
    return acc


def _minmax(tx, args, kwargs, pick):
    if len(args) == 1:
        items = tx.unpack(args[0])
    else:
        items = list(args)
    key = kwargs.get("key")
    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        raise tx.exception(ValueError, "arg is an empty sequence")
    if any(isinstance(x, TensorVariable) for x in items):
        if key is not None:
            raise GraphBreak("GB0010", "min/max with key over tensors")
        fn = torch.maximum if pick is max else torch.minimum
        acc = items[0]
        for x in items[1:]:
            if isinstance(acc, TensorVariable) and isinstance(x, TensorVariable):
                raise GraphBreak("GB0003", "min/max of tensors compares their values")
            raise GraphBreak("GB0003", "min/max of a tensor and a number compares values")
        return acc
    if key is not None:
        keys = [tx.as_python(tx.call(key, [x], {})) for x in items]
        best = pick(range(len(items)), key=lambda i: keys[i])
        return items[best]
    vals = [tx.as_python(x) for x in items]
    best = pick(range(len(items)), key=lambda i: vals[i])
    return items[best]


def bi_min(tx, args, kwargs):
    return _minmax(tx, args, kwargs, min)


def bi_max(tx, args, kwargs):
    return _minmax(tx, args, kwargs, max)


def bi_any(tx, args, kwargs):
    for x in tx.unpack(args[0]):
        if tx.truth(x):
            return ConstantVariable(True)
    return ConstantVariable(False)


def bi_all(tx, args, kwargs):
    for x in tx.unpack(args[0]):
        if not tx.truth(x):
            return ConstantVariable(False)
    return ConstantVariable(True)


def bi_abs(tx, args, kwargs):
    return tx.unary(operator.abs, args[0]) if isinstance(args[0], TensorVariable) else \
        tx.const_apply(abs, [tx.as_python(args[0])])


def bi_list(tx, args, kwargs):
    return ListVariable(tx.unpack(args[0]) if args else [])


def bi_tuple(tx, args, kwargs):
    return TupleVariable(tx.unpack(args[0]) if args else [])


def bi_dict(tx, args, kwargs):
    d = DictVariable({})
    dict_update(tx, d, args, kwargs)
    return d


def bi_set(tx, args, kwargs):
    s = SetVariable([])
    if args:
        for x in tx.unpack(args[0]):
            tx.set_add(s, x)
    return s


def bi_frozenset(tx, args, kwargs):
    s = bi_set(tx, args, kwargs)
    s.cls = frozenset
    return s


def _scalar_conv(pytype):
    def conv(tx, args, kwargs):
        if args and isinstance(args[0], TensorVariable):
            raise GraphBreak("GB0010", f"{pytype.__name__}() of a tensor")
        return tx.const_apply(pytype, [tx.as_python(a, f"an argument of {pytype.__name__}()") for a in args],
                              {k: tx.as_python(v) for k, v in kwargs.items()})
    return conv


def bi_str(tx, args, kwargs):
    if args and isinstance(args[0], TensorVariable):
        raise GraphBreak("GB0010", "str() of a tensor")
    if args and isinstance(args[0], ObjectVariable) and args[0].value is not None and \
            not isinstance(args[0].value, (type, types.FunctionType)):
        raise GraphBreak("GB0011", "str() of an object")
    return tx.const_apply(str, [tx.as_python(a) for a in args])


def bi_repr(tx, args, kwargs):
    if isinstance(args[0], (TensorVariable, ObjectVariable)):
        raise GraphBreak("GB0011", "repr() of an object")
    return tx.const_apply(repr, [tx.as_python(args[0])])


def bi_callable(tx, args, kwargs):
    v = args[0]
    if isinstance(v, (FunctionVariable, NestedFunctionVariable, BoundMethodVariable)):
        return ConstantVariable(True)
    if isinstance(v, ObjectVariable) and v.value is not None:
        return ConstantVariable(callable(v.value))
    if isinstance(v, (ConstantVariable, TensorVariable, ListVariable, TupleVariable, DictVariable)):
        return ConstantVariable(False)
    raise GraphBreak("GB0011", "callable() of an object")


def bi_print(tx, args, kwargs):
    if print in config.reorderable_logging_functions:
        return defer_logging_call(tx, print, args, kwargs)
    raise GraphBreak("GB0001", f"builtin `print` with argument types {[_safe_tname(a) for a in args]}")


def _safe_tname(a):
    try:
        return a.python_type().__name__
    except Exception:
        return type(a).__name__


def bi_reduce(tx, args, kwargs):
    fn, seq = args[0], args[1]
    items = tx.unpack(seq)
    if len(args) > 2:
        acc = args[2]
    else:
        if not items:
            raise tx.exception(TypeError, "reduce() of empty iterable with no initial value")
        acc, items = items[0], items[1:]
    for x in items:
        acc = tx.call(fn, [acc, x], {})
    return acc


def inspect_signature(tx, args, kwargs):
    """inspect.signature(f) of a function known at trace time (guarded by identity): its
    signature now, as an object whose attributes are read like any other."""
    fn = args[0]
    if isinstance(fn, FunctionVariable):
        target = fn.fn
    elif isinstance(fn, ObjectVariable) and fn.value is not None:
        target = fn.value
    elif isinstance(fn, BoundMethodVariable) and fn.fn is not None and isinstance(fn.obj, ObjectVariable) \
            and fn.obj.value is not None:
        target = types.MethodType(fn.fn, fn.obj.value)
    else:
        raise GraphBreak("GB0011", f"inspect.signature of {type(fn).__name__}")
    try:
        sig = inspect.signature(target, **{k: tx.as_python(v) for k, v in kwargs.items()})
    except (TypeError, ValueError) as exc:
        raise tx.exception(type(exc), str(exc)) from None
    return ObjectVariable(sig)


_SHARED_BY_COPY = (type, types.FunctionType, types.ModuleType, types.BuiltinFunctionType, types.MethodType)


def copy_value(tx, vt, deep: bool, memo: dict):
    """copy.copy / copy.deepcopy of a value the trace knows: a new container or object
    (reading an existing object's attributes installs their guards, as any read does).
    Tensors and classes with their own copy protocol break."""
    if id(vt) in memo:
        return memo[id(vt)]
    sub = (lambda v: copy_value(tx, v, True, memo)) if deep else (lambda v: v)
    if isinstance(vt, (ConstantVariable, FunctionVariable)):
        return vt
    if isinstance(vt, TupleVariable):
        out = TupleVariable([sub(x) for x in vt.items], cls=vt.cls)
    elif isinstance(vt, ListVariable) and type(vt) is ListVariable:
        out = memo[id(vt)] = ListVariable([])
        out.items = [sub(x) for x in vt.items]
    elif isinstance(vt, DictVariable):
        out = memo[id(vt)] = DictVariable({}, cls=vt.cls)
        out.items = {k: sub(v) for k, v in vt.items.items()}
    elif isinstance(vt, SetVariable):
        out = SetVariable(list(vt.items), cls=vt.cls)
    elif isinstance(vt, ObjectVariable):
        value = vt.value
        if isinstance(value, _SHARED_BY_COPY):
            return vt  # copy returns these themselves
        cls = vt.cls
        if any(name in klass.__dict__ for klass in cls.__mro__[:-1] for name in
               ("__deepcopy__", "__copy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__")) or \
                isinstance(value, torch.nn.Module) or issubclass(cls, dict) and vt.dict_vt is None or \
                not vt.is_new and not isinstance(getattr(value, "__dict__", None), dict) or \
                cls.__new__ not in (object.__new__, dict.__new__):
            raise GraphBreak("GB0011", f"copy of a {cls.__qualname__} object")
        out = memo[id(vt)] = ObjectVariable(None, cls=cls, is_new=True)
        if vt.is_new:
            names = list(vt.attrs)
        else:
            names = list(value.__dict__)
            if vt.source is not None:
                tx.out.add_guard("DICT_KEYS", AttrSource(vt.source, "__dict__"), tuple(names))
        out.attrs = {name: sub(tx.object_getattr(vt, name, generic=True)) for name in names}
        if vt.dict_vt is not None:
            out.dict_vt = copy_value(tx, vt.dict_vt, deep, memo) if deep else DictVariable(dict(vt.dict_vt.items))
    else:
        raise GraphBreak("GB0011", f"copy of {type(vt).__name__}")
    memo[id(vt)] = out
    return out


def _no_memo():
    raise GraphBreak("GB0011", "copy.deepcopy with a memo")


def bi_dataclass_fields(tx, args, kwargs):
    v = args[0]
    cls = v.cls if isinstance(v, ObjectVariable) and v.is_new else tx.as_python(v) if not isinstance(v, ObjectVariable) \
        else (v.value if isinstance(v.value, type) else type(v.value))
    return TupleVariable([ObjectVariable(f) for f in dataclasses.fields(cls)])


def bi_is_dataclass(tx, args, kwargs):
    v = args[0]
    t = v.cls if isinstance(v, ObjectVariable) else _type_of(tx, v)
    return ConstantVariable(dataclasses.is_dataclass(t))


def _operator_fn(op):
    def apply(tx, args, kwargs):
        if len(args) == 2:
            return tx.binary(op, args[0], args[1])
        return tx.unary(op, args[0])
    return apply


def op_getitem(tx, args, kwargs):
    return tx.getitem(args[0], args[1])


def op_setitem(tx, args, kwargs):
    tx.setitem(args[0], args[1], args[2])
    return ConstantVariable(None)


def op_not(tx, args, kwargs):
    return ConstantVariable(not tx.truth(args[0]))


def op_truth(tx, args, kwargs):
    return ConstantVariable(tx.truth(args[0]))


def op_is(tx, args, kwargs):
    return ConstantVariable(tx.is_same(args[0], args[1]))


def op_contains(tx, args, kwargs):
    return ConstantVariable(tx.contains(args[0], args[1]))


def torch_is_grad_enabled(tx, args, kwargs):
    return ConstantVariable(tx.out.grad_enabled)


def torch_is_tensor(tx, args, kwargs):
    return ConstantVariable(isinstance(args[0], TensorVariable))


def torch_meta_fold(fn):
    def fold(tx, args, kwargs):
        return _const_fold_torch(tx, fn, args, kwargs)
    return fold


def namedtuple_replace(tx, args, kwargs):
    self = args[0]
    if not isinstance(self, TupleVariable) or not self.is_namedtuple():
        raise GraphBreak("GB0011", "_replace on a non-namedtuple")
    items = list(self.items)
    for k, v in kwargs.items():
        if k not in self.cls._fields:
            raise tx.exception(ValueError, f"Got unexpected field names: {[k]!r}")
        items[self.cls._fields.index(k)] = v
    return TupleVariable(items, cls=self.cls)


def namedtuple_asdict(tx, args, kwargs):
    self = args[0]
    return DictVariable(dict(zip(self.cls._fields, self.items)))


SPECIAL_FUNCTIONS = {
    len: bi_len, isinstance: bi_isinstance, issubclass: bi_issubclass, getattr: bi_getattr, hasattr: bi_hasattr,
    setattr: bi_setattr, delattr: bi_delattr, enumerate: None, zip: None, map: None, filter: None, reversed: None, iter: bi_iter,
    next: bi_next, sorted: bi_sorted, sum: bi_sum, min: bi_min, max: bi_max, any: bi_any, all: bi_all, abs: bi_abs,
    callable: bi_callable, print: bi_print, repr: bi_repr, functools.reduce: bi_reduce,
    dataclasses.fields: bi_dataclass_fields, dataclasses.is_dataclass: bi_is_dataclass,
    inspect.signature: inspect_signature,
    copy.copy: lambda tx, a, k: copy_value(tx, a[0], False, {}),
    copy.deepcopy: lambda tx, a, k: copy_value(tx, a[0], True, {}) if len(a) == 1 and not k else _no_memo(),
    operator.getitem: op_getitem, operator.setitem: op_setitem, operator.not_: op_not, operator.truth: op_truth,
    operator.is_: op_is, operator.contains: op_contains, object.__setattr__: bi_object_setattr,
    torch.is_grad_enabled: torch_is_grad_enabled, torch.is_tensor: torch_is_tensor,
}
SPECIAL_FUNCTIONS = {k: v for k, v in SPECIAL_FUNCTIONS.items() if v is not None}
try:
    from torch._higher_order_ops.associative_scan import associative_scan as _torch_associative_scan
    SPECIAL_FUNCTIONS[_torch_associative_scan] = lambda tx, args, kwargs: inline_user_function(
        tx, scan.associative_scan, args, kwargs, None)
except ImportError:     # an older torch without it
    pass
for _op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod, operator.pow,
            operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift, operator.lt,
            operator.le, operator.eq, operator.ne, operator.gt, operator.ge, operator.neg, operator.pos,
            operator.invert, operator.iadd, operator.imul, operator.isub):
    SPECIAL_FUNCTIONS[_op] = _operator_fn(_op)

BUILTIN_CLASSES = {
    range: bi_range, enumerate: bi_enumerate, zip: bi_zip, map: bi_map, filter: bi_filter, reversed: bi_reversed,
    list: bi_list, tuple: bi_tuple, dict: bi_dict, set: bi_set, frozenset: bi_frozenset, int: _scalar_conv(int),
    float: _scalar_conv(float), bool: _scalar_conv(bool), complex: _scalar_conv(complex), str: bi_str,
    type: bi_type, slice: lambda tx, a, k: ConstantVariable(slice(*[tx.as_python(x) for x in a])),
    object: lambda tx, a, k: ObjectVariable(None, cls=object, is_new=True),
    collections.OrderedDict: lambda tx, a, k: _with_cls(bi_dict(tx, a, k), collections.OrderedDict),
}

def _with_cls(d, cls):
    d.cls = cls
    return d


TORCH_CONSTANT_FOLD = {
    torch.is_grad_enabled: torch_is_grad_enabled,
    torch.is_tensor: torch_is_tensor,
    torch.is_floating_point: torch_meta_fold(torch.is_floating_point),
    torch.is_complex: torch_meta_fold(torch.is_complex),
    torch.numel: torch_meta_fold(torch.numel),
    torch.get_default_dtype: torch_meta_fold(torch.get_default_dtype),
    torch.is_inference_mode_enabled: torch_meta_fold(torch.is_inference_mode_enabled),
    torch.typename: torch_meta_fold(torch.typename),
}


def _fixed(value):
    def fold(tx, args, kwargs):
        return ConstantVariable(value)
    return fold


def _query(fn):
    """A query of global torch state that the GLOBAL_STATE guard covers: answered now."""
    def fold(tx, args, kwargs):
        return tx.const_apply(fn, [tx.as_python(a) for a in args], {k: tx.as_python(v) for k, v in kwargs.items()})
    return fold


def _has_torch_function(tx, args, kwargs):
    # plain tensors, parameters and Python values never override torch functions
    def overrides(v):
        if isinstance(v, TensorVariable):
            return v.ptype not in (torch.Tensor, torch.nn.Parameter)
        if isinstance(v, (ListVariable, TupleVariable)):
            return any(overrides(x) for x in v.items)
        if isinstance(v, ObjectVariable):
            return hasattr(v.cls, "__torch_function__") and v.cls is not object
        return False
    return ConstantVariable(any(overrides(a) for a in args))


def _torch_assert(tx, args, kwargs):
    """torch._assert(cond, message): checked now when cond is known (a shape test)."""
    cond = args[0] if args else kwargs["condition"]
    if isinstance(cond, TensorVariable):
        raise GraphBreak("GB0010", "torch._assert on a tensor value")
    if not tx.truth(cond):
        msg = args[1] if len(args) > 1 else kwargs.get("message", ConstantVariable(""))
        raise tx.exception(AssertionError, tx.as_python(msg))
    return ConstantVariable(None)


def _call_weakref(tx, ref_vt, args):
    target = ref_vt.value()
    return tx.out.builder.wrap_sourceless(target)


def _set_grad_enabled_fn(tx, args, kwargs):
    tx.out.set_grad_enabled(bool(tx.as_python(args[0])))
    return ConstantVariable(None)


def _state_queries():
    import torch.backends.mha as mha
    import torch.overrides as overrides
    table = {
        torch._C._set_grad_enabled: _set_grad_enabled_fn,
        torch.jit.is_scripting: _fixed(False), torch.jit.is_tracing: _fixed(False),
        torch._C._get_tracing_state: _fixed(None), mha.get_fastpath_enabled: _query(mha.get_fastpath_enabled),
        torch.is_autocast_enabled: _autocast_query(torch.is_autocast_enabled),
        torch._C._is_any_autocast_enabled: _autocast_query(torch._C._is_any_autocast_enabled),
        torch.get_autocast_dtype: _autocast_query(torch.get_autocast_dtype),
        torch.are_deterministic_algorithms_enabled: _query(torch.are_deterministic_algorithms_enabled),
        torch.get_default_dtype: _query(torch.get_default_dtype),
        overrides.has_torch_function: _has_torch_function,
        overrides.has_torch_function_unary: _has_torch_function,
        overrides.has_torch_function_variadic: _has_torch_function,
    }
    import torch.utils._python_dispatch as python_dispatch
    table[torch._assert] = _torch_assert
    table[python_dispatch._get_current_dispatch_mode_stack] = lambda tx, a, k: ListVariable([])  # none in user code
    table[python_dispatch.is_in_torch_dispatch_mode] = _fixed(False)
    # nn.MultiheadAttention's inference fast path (`torch._native_multi_head_attention`) has no
    # decomposition but math attention; under torch.compile, too, the module takes its
    # composite path, whose `scaled_dot_product_attention` stays a flash / cuDNN kernel
    table[torch.nn.modules.activation._is_make_fx_tracing] = _fixed(True)
    for name, value in (("is_compiling", True), ("is_dynamo_compiling", True), ("is_exporting", False)):
        fn = getattr(torch.compiler, name, None)
        if fn is not None:
            table[fn] = _fixed(value)  # as under torch.compile: code may take its compile-friendly path
    if hasattr(torch._utils, "is_compiling"):
        table[torch._utils.is_compiling] = _fixed(True)
    for name in ("is_autocast_cpu_enabled", "get_autocast_gpu_dtype", "get_autocast_cpu_dtype"):
        fn = getattr(torch, name, None)
        if fn is not None:
            table[fn] = _autocast_query(fn)
    return table


def _autocast_query(fn):
    """An autocast query answers for the state the traced code is in (inside its own blocks)."""
    def handler(tx, args, kwargs):
        with autocastmod.applied(tx.out.autocast) if tx.out.autocast else contextlib.nullcontext():
            return _query(fn)(tx, args, kwargs)
    return handler


for _k, _v in _state_queries().items():
    SPECIAL_FUNCTIONS[_k] = _v


def torch_check(tx, args, kwargs):
    """`torch._check(cond)`: true at trace time, nothing to do; on a data-dependent size
    (`torch._check(t.shape[0] == 3)` after `t = x[x > 0]`), the shape environment takes it
    as a fact and the graph checks it where the size is known (engine/shapes/runtime_asserts.py);
    false, or on a tensor, it runs eagerly (where eager raises)."""
    cond = args[0] if args else kwargs.get("cond")
    value = cond.value if isinstance(cond, ConstantVariable) else None
    if value is True:
        return ConstantVariable(None)
    if isinstance(value, torch.SymBool) and scalars.is_unbacked(value):
        torch._check(value)
        return ConstantVariable(None)
    if isinstance(value, torch.SymBool):
        if tx.as_python(cond, "torch._check's condition"):   # guarded, like `if n == 3:`
            return ConstantVariable(None)
    raise GraphBreak("GB0012", "torch._check of a condition that is not true at trace time")


SPECIAL_FUNCTIONS[torch._check] = torch_check
SPECIAL_FUNCTIONS[torch._C._group_tensors_by_device_and_dtype] = optimizers.group_by_device_and_dtype


def _module_conversion(fn):
    def handler(tx, args, kwargs):
        same = module_conversion.unchanged(tx, fn, args, kwargs)
        return same if same is not None else inline_user_function(tx, fn, args, kwargs, None)
    return handler


for _fn in module_conversion.CONVERSIONS:
    SPECIAL_FUNCTIONS[_fn] = _module_conversion(_fn)
SPECIAL_FUNCTIONS[autograd_function.APPLY] = autograd_function.call_apply
SPECIAL_FUNCTIONS[torch.utils.checkpoint.checkpoint] = checkpoint.call_checkpoint
SPECIAL_FUNCTIONS.update(higher_order.special_functions())  # torch.cond, torch.func.*
