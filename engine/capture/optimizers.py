"""Optimizer steps: what the capture needs to trace `opt.step()`'s inner step as one graph.

- `opt.state[p]` (a defaultdict keyed by parameters) is read with a source that indexes by
  the parameter's own source, so its tensors become graph inputs, guarded like any other.
- `opt._init_group(...)` creates the state lazily on the first step. Before it is traced,
  it runs once for real (as under torch.compile), so the trace only reads existing state:
  the first compiled step creates the state exactly as eager's would, later steps guard on it.
  On CUDA a new optimizer's groups become `capturable` first (make_capturable), as
  torch.compile makes them.
- `opt.step()` after a `loss.backward()` traced into the same graph (capture/backward.py) is
  traced too (`inline_step`): its gradients are values of the graph, which the real
  `.grad`s will only hold once the graph has run; and `opt.zero_grad()` (set_to_none) is
  `p.grad = None` for each parameter (`grads_to_none`). Forward, backward, update and
  zeroing are one graph: the gradients a step consumes and drops never leave it.
- `Tensor.addcdiv_/addcmul_(t1, t2, value=<0-d tensor>)` (and `add_(x, alpha=<tensor>)`,
  `torch._foreach_addcdiv_(..., scalars=<tensor>)`): with the step count a tensor (torch's
  optimizers keep it so when compiled), the scale is a tensor; the op takes numbers only
  (or, for foreach, CPU scalars its fake kernel cannot see), so the trace computes
  `self + value * (t1 / t2)` with tensor ops instead."""

from __future__ import annotations

import os
import types

import torch

from .graph_breaks import GraphBreak
from .source import KeyedItemSource
from .variables import ConstantVariable, DictVariable, ListVariable, TensorVariable, TupleVariable


def unwrap_dynamo_disabled(fn):
    """Once torch.compile has run in the process, torch wraps optimizer helpers such as
    `_init_group` in Dynamo's disable wrapper (Dynamo models them itself). Those are the
    optimizer's own code to us: the function inside."""
    inner = getattr(fn, "__wrapped__", None)
    from .skipfiles import OPTIM_DIR, TORCH_DIR
    if isinstance(inner, types.FunctionType) and isinstance(fn, types.FunctionType) and \
            fn.__code__.co_filename.startswith(os.path.join(TORCH_DIR, "_dynamo")) and \
            inner.__code__.co_filename.startswith(OPTIM_DIR):
        return inner
    return fn


def is_init_group(fn, obj) -> bool:
    from .skipfiles import OPTIM_DIR
    return getattr(fn, "__name__", "") == "_init_group" and isinstance(obj, torch.optim.Optimizer) and \
        fn.__code__.co_filename.startswith(OPTIM_DIR)


def prepare_init_group(tx, fn, args) -> None:
    """Run `opt._init_group(group, [], [], ...)` for real: it creates missing state (for the
    parameters that have a gradient as the frame sees it: set by a backward in the graph, the
    real `.grad` stands in with a placeholder meanwhile)."""
    opt = args[0].value
    group = _real(tx, opt.param_groups, args[1])
    if group is None:
        raise GraphBreak("GB0011", f"{type(opt).__name__}._init_group on a param group the capture cannot find")
    real_args = [[] for _ in args[2:]]
    in_group = {id(p) for p in group["params"]}
    placeholders = [real for real in (tx._real_of(vt) for vt, value in tx.out.grads.values()
                                      if isinstance(value, TensorVariable))
                    if real.grad is None and id(real) in in_group]
    for real in placeholders:
        # _init_group reads only whether a gradient is there (and its layout), never its values
        real.grad = torch.empty((), dtype=real.dtype, device=real.device).expand(real.shape)
    try:
        with torch.no_grad():
            fn(opt, group, *real_args)
    finally:
        for real in placeholders:
            real.grad = None


def inline_step(tx, opt_vt, inner):
    """`opt.step()` (its wrappers reduce to `inner` under the optimizer's grad mode, see
    runtime.optimizer_step_target) traced into the frame's graph, for a frame whose graph
    ran the backward that made the gradients."""
    opt = opt_vt.value
    if getattr(opt.__dict__.get("step"), "_wrapped_by_lr_sched", False) and \
            any(not isinstance(g.get("lr"), torch.Tensor) for g in opt.param_groups):
        # a float lr is a constant of the graph, guarded by value: each new value would
        # recompile the forward and backward with it, not only the step's own graph
        raise GraphBreak("GB0012", f"{type(opt).__name__}.step with an LR scheduler changing its float lr (a step "
                                   "in the graph would recompile with every new lr; pass lr=torch.tensor(...) to "
                                   "keep it in the graph)")
    make_capturable(opt)
    prev = tx.out.grad_enabled
    tx.out.set_grad_enabled(bool(opt.defaults["differentiable"]))
    try:
        with capturable_in_trace(opt):
            return tx.call_python_function(inner, [opt_vt], {}, None)
    finally:
        tx.out.set_grad_enabled(prev)


def group_by_device_and_dtype(tx, args, kwargs):
    """torch._C._group_tensors_by_device_and_dtype(tensorlistlist, with_indices) over traced
    lists (clip_grad_norm_ and the foreach helpers call it): the lists' tensors grouped by the
    first list's devices and dtypes, known from the fake tensors."""
    lists = args[0] if args else kwargs["tensorlistlist"]
    with_indices = tx.as_python(args[1] if len(args) > 1 else kwargs.get("with_indices", ConstantVariable(False)))
    if not isinstance(lists, (ListVariable, TupleVariable)) or \
            not all(isinstance(lst, (ListVariable, TupleVariable)) for lst in lists.items):
        raise GraphBreak("GB0011", "_group_tensors_by_device_and_dtype on something other than lists of tensors")
    firsts = lists.items[0].items if lists.items else []
    groups: dict = {}
    for i, t in enumerate(firsts):
        if not isinstance(t, TensorVariable):
            raise GraphBreak("GB0011", "_group_tensors_by_device_and_dtype with a first list that is not all tensors")
        groups.setdefault((t.fake.device, t.fake.dtype), []).append(i)
    return DictVariable({key: TupleVariable([
        ListVariable([ListVariable([lst.items[i] for i in idx]) for lst in lists.items]),
        ListVariable([ConstantVariable(i) for i in idx] if with_indices else [])]) for key, idx in groups.items()})


def grads_to_none(opt) -> None:
    """What `Optimizer.zero_grad(set_to_none=True)` does to values (its profiler range aside);
    traced in its place."""
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = None


def make_capturable(opt) -> None:
    """As torch.compile does before it traces a CUDA step: a new optimizer's groups keep their
    step counts on the device (`capturable`), or torch's optimizers leave the compiled path
    for an eager one on CUDA. Done before the trace reads the groups."""
    for group in opt.param_groups:
        params = group.get("params", [])
        if "capturable" in group and not group["capturable"] and not group.get("fused") and params and \
                all(p.is_cuda for p in params) and not any(opt.state.get(p) for p in params):
            group["capturable"] = True


# ids of the param groups whose step is being compiled: the trace reads `capturable` as True
_CAPTURABLE_IN_TRACE: set = set()


class capturable_in_trace:
    """While `opt`'s inner step compiles, its param groups read `capturable=True` in the trace
    (the real groups keep their value), as torch.compile traces them: the step count stays a
    tensor and `if rho_t > 5` (RAdam), `.item()` (ASGD) become tensor ops, not graph breaks.
    A part of the step that runs eagerly (after a break) reads the real value."""

    def __init__(self, opt):
        self.ids = {id(g) for g in opt.param_groups
                    if g.get("capturable") is False and not g.get("fused") and not g.get("differentiable")}

    def __enter__(self):
        self.ids -= _CAPTURABLE_IN_TRACE
        _CAPTURABLE_IN_TRACE.update(self.ids)

    def __exit__(self, *exc):
        _CAPTURABLE_IN_TRACE.difference_update(self.ids)


def traced_group_items(value: dict, items: dict, constant) -> None:
    """The builder's hook: a param group of a step being compiled reads capturable=True."""
    if _CAPTURABLE_IN_TRACE and id(value) in _CAPTURABLE_IN_TRACE and "capturable" in items:
        items["capturable"] = constant(True)


def _real(tx, candidates, vt):
    for c in candidates:
        if tx.out.memo.get(id(c)) is vt:
            return c
    return None


def keyed_item(tx, obj, key_vt):
    """`d[key]` for a real dict keyed by an object the frame has a source for (opt.state[p]);
    None when that does not apply."""
    d = obj.value
    if not isinstance(d, dict) or obj.source is None or getattr(key_vt, "source", None) is None:
        return None
    for k in d:
        if not isinstance(k, (int, str)) and tx.out.memo.get(id(k)) is key_vt:
            return tx.out.builder.wrap(d[k], KeyedItemSource(obj.source, key_vt.source))
    return None


_SCALED = {"addcdiv_": (torch.div, "add_"), "addcmul_": (torch.mul, "add_"),
           "addcdiv": (torch.div, "add"), "addcmul": (torch.mul, "add")}
_ADDED = {"add_": "add_", "add": "add", "sub_": "sub_", "sub": "sub"}


def scaled_by_tensor(tx, name: str, args, kwargs):
    """self.addcdiv_(t1, t2, value=v) / self.add_(other, alpha=v) with a tensor v (ASGD);
    None when v is not a tensor."""
    if name in _ADDED and isinstance(kwargs.get("alpha"), TensorVariable) and len(args) == 2 and \
            set(kwargs) == {"alpha"}:
        term = tx.tensor_call("call_function", torch.mul, [args[1], kwargs["alpha"]], {})
        return tx.tensor_call("call_method", _ADDED[name], [args[0], term], {})
    value = kwargs.get("value")
    if name not in _SCALED or not isinstance(value, TensorVariable) or len(args) != 3 or set(kwargs) != {"value"}:
        return None
    combine, add = _SCALED[name]
    self_, t1, t2 = args
    term = tx.tensor_call("call_function", combine, [t1, t2], {})
    term = tx.tensor_call("call_function", torch.mul, [term, value], {})
    return tx.tensor_call("call_method", add, [self_, term], {})


_FOREACH_SCALED = {torch._foreach_addcdiv_: (torch._foreach_div, torch._foreach_add_),
                   torch._foreach_addcmul_: (torch._foreach_mul, torch._foreach_add_),
                   torch._foreach_addcdiv: (torch._foreach_div, torch._foreach_add),
                   torch._foreach_addcmul: (torch._foreach_mul, torch._foreach_add)}


def foreach_scaled_by_tensor(tx, fn, args, kwargs):
    """torch._foreach_addcdiv_(self, t1, t2, scalars) with `scalars` a 1-D tensor (Adam's
    foreach step stacks its step sizes into one when compiled): the op's fake kernel wants
    those on the CPU, so the trace computes self + (t1 / t2) * scalars[i] with tensor ops."""
    pair = _FOREACH_SCALED.get(fn) if isinstance(fn, type(torch._foreach_add_)) else None
    scalars = args[3] if len(args) == 4 else kwargs.get("scalars")
    if pair is None or not isinstance(scalars, TensorVariable) or len(args) + len(kwargs) != 4:
        return None
    combine, add = pair
    self_, t1, t2 = args[:3]
    terms = tx.tensor_call("call_function", combine, [t1, t2], {})
    parts = tx.tensor_call("call_function", torch.unbind, [scalars], {})
    terms = tx.tensor_call("call_function", torch._foreach_mul, [terms, ListVariable(list(parts.items))], {})
    return tx.tensor_call("call_function", add, [self_, terms], {})
