"""`loss.backward()` inside the graph (with `engine.config.backward_in_graph` on; off by
default, docs/training.md says why).

When a compiled function calls `loss.backward()` on a loss its graph computed, the capture
records the backward as a node of the same graph: `grads_of(loss, *leaves)`, the gradients
of the loss for the leaf tensors it depends on (parameters and other graph inputs), then
what autograd's AccumulateGrad does with each: the first gradient becomes `p.grad` (with
the parameter's strides, autograd's layout contract), a later one is added into the
existing `p.grad` in place. The new `.grad` values are written back after the graph runs,
as any other attribute the frame sets. The AOT stage then traces forward and backward as
one graph (engine/aot/fused_backward.py: no autograd.Function around it, no autograd
engine at run time), which the backend compiles whole: one call instead of a forward
graph, autograd's engine, a backward graph and an AccumulateGrad per parameter.

After the backward the graph's results no longer require grad (as if detached): eager's
autograd graph behind them is spent once backward has run. A frame whose results still
need an autograd graph the backward did not consume (a second forward after the step, a
tensor computed apart from the loss and returned) is captured again with the backward
left to autograd (a graph break, GB0007, with the reason).

Left to autograd, with the reason on the graph-break log: `retain_graph`, `create_graph`,
`inputs` or a `gradient` argument; a loss that is not a scalar; hooks on a leaf (tensor hooks,
post-accumulate-grad hooks); a leaf that is not a graph input or a graph input with an
autograd history of its own; activation checkpointing in the graph (its recomputation
belongs to autograd's backward); anomaly mode, saved-tensor hooks, torch.distributed
(DDP's and FSDP's reducers hook the gradient accumulators); `engine.config.backward_in_graph`
off."""

from __future__ import annotations

import torch

from .. import config
from ..backward_ops import grads_of, like_param
from .graph_breaks import GraphBreak
from .source import AttrSource
from .variables import ConstantVariable, TensorVariable


def trace(tx, t: TensorVariable, args: list, kwargs: dict):
    """`t.backward(...)` met by the interpreter `tx`: record it in the graph, or raise the
    graph break that leaves it to autograd (with why)."""
    out = tx.out
    where = (tx.code, tx.current_inst.offset if tx.current_inst is not None else -1)
    why = _declined(tx, t, args, kwargs, where)
    if why:
        raise GraphBreak("GB0007", f"Tensor.backward(): {why}")
    leaves, nodes = _leaves(t.fake)
    for _src, _real, vt in out.inputs:
        if vt.fake.grad_fn is not None and vt.fake.grad_fn in nodes:
            raise _into_history(vt)
    if nodes & out.backward_nodes:
        raise GraphBreak("GB0007", "Tensor.backward() through a graph a backward already ran through "
                                   "(autograd raises: its saved tensors are freed)")
    by_fake = {id(vt.fake): (vt, real) for _src, real, vt in out.inputs}
    leaf_vts = []
    for fake in leaves:
        found = by_fake.get(id(fake))
        if found is None:
            raise GraphBreak("GB0007", "Tensor.backward() reaches a tensor made inside the compiled region with "
                                       "requires_grad=True: its gradient has nowhere to go but autograd")
        vt, real = found
        if not real.is_leaf:
            raise _into_history(vt)
        if real._backward_hooks or getattr(real, "_post_accumulate_grad_hooks", None):
            raise GraphBreak("GB0007", f"Tensor.backward() with hooks on {vt.source.name()}")
        if real.grad is not None and (type(real.grad) is not torch.Tensor or real.grad.layout != torch.strided):
            raise GraphBreak("GB0007", f"Tensor.backward() into the {type(real.grad).__name__} "
                                       f"{real.grad.layout} .grad of {vt.source.name()}")
        leaf_vts.append(vt)
    grads = tx.tensor_call("call_function", grads_of, [t, *leaf_vts], {})
    out.backward_nodes |= nodes
    out.backward_sites.add(where)
    for leaf, g in zip(leaf_vts, grads.items):
        current = grad_of(tx, leaf)
        if isinstance(current, TensorVariable):
            # AccumulateGrad without grad mode: `grad += new` in place
            tx.tensor_call("call_method", "add_", [current, g], {})
        else:
            set_grad(out, leaf, tx.tensor_call("call_function", like_param, [g, leaf], {}))
    return ConstantVariable(None)


def _into_history(vt: TensorVariable) -> GraphBreak:
    return GraphBreak("GB0007", f"Tensor.backward() continues into the autograd graph of {vt.source.name()}, "
                                "computed before the compiled region")


def _declined(tx, t: TensorVariable, args: list, kwargs: dict, where) -> str:
    """Why this backward stays with autograd ('' when it can go in the graph)."""
    out = tx.out
    if not config.backward_in_graph:
        return "left to autograd (engine.config.backward_in_graph is off; on, it is traced into the graph)"
    if where in out.eager_backward:
        return ("a result of the graph still needs autograd after this backward (a tensor computed apart "
                "from the loss, or after the backward, is returned or kept): the backward runs eagerly")
    names = ["gradient", "retain_graph", "create_graph", "inputs"]
    given = {names[i]: a for i, a in enumerate(args[:4])}
    given.update(kwargs)
    for name, v in given.items():
        if not (isinstance(v, ConstantVariable) and v.value in (None, False)):
            return f"the {name} argument (only a plain loss.backward() is compiled)"
    if t.source is not None:
        return "its loss was computed before the compiled region"
    if not t.fake.requires_grad or t.fake.grad_fn is None:
        return "its tensor does not require grad (autograd raises)"
    if t.fake.numel() != 1:
        return "a loss with more than one element needs a gradient argument (autograd raises)"
    if out.checkpoint_regions:
        return "activation checkpointing in the graph: its recomputation belongs to autograd's backward"
    if torch.is_anomaly_enabled():
        return "anomaly detection is on"
    if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        return "saved-tensor hooks are active"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "torch.distributed is initialized (DDP's and FSDP's reducers hook the gradient accumulation)"
    return ""


def _leaves(fake: torch.Tensor) -> tuple[list, set]:
    """The leaf tensors (AccumulateGrad's variables) behind `fake`'s autograd graph, in the
    order found, and every node of that graph."""
    leaves, seen, stack = [], set(), [fake.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor) and type(node).__name__ == "AccumulateGrad":
            if all(v is not var for v in leaves):
                leaves.append(var)
            continue
        stack.extend(fn for fn, _ in reversed(node.next_functions))
    return leaves, seen


def grad_of(tx, t: TensorVariable):
    """`t.grad` as the frame sees it now: set by the frame (a backward, `p.grad = ...`), or the
    real one, a guarded graph input."""
    tracked = tx.out.grads.get(id(t))
    if tracked is not None:
        return tracked[1]
    if t.source is None:
        raise GraphBreak("GB0011", ".grad of a tensor computed in the graph")
    real = tx._real_of(t)
    return tx.out.builder.wrap(real.grad, AttrSource(t.source, "grad"))


def set_grad(out, t: TensorVariable, value) -> None:
    """`t.grad = value` (a tensor of the graph, or None), written back after the graph."""
    if t.source is None:
        raise GraphBreak("GB0017", "attribute store Tensor.grad on a tensor computed in the graph")
    if not (isinstance(value, TensorVariable) or isinstance(value, ConstantVariable) and value.value is None):
        raise GraphBreak("GB0017", "Tensor.grad set to something other than a tensor or None")
    out.grads[id(t)] = (t, value)


def escaping(out, tensors: list) -> bool:
    """Whether one of the graph's results needs an autograd graph the backward did not
    consume (then the frame is captured again with the backward left to autograd)."""
    return any(isinstance(t, TensorVariable) and t.fake.grad_fn is not None and t.fake.requires_grad
               and t.fake.grad_fn not in out.backward_nodes for t in tensors)


class BackwardEscapes(Exception):
    """Raised at the end of a capture (see `escaping`): capture again with the backwards at
    `sites` ((code, offset) each) left to autograd."""

    def __init__(self, sites: set):
        super().__init__(f"{len(sites)} backward(s) to leave to autograd")
        self.sites = sites
