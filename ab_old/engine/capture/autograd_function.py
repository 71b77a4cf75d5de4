"""A user's `torch.autograd.Function`: `MyFn.apply(...)` is one graph node.

The node calls the Function itself, so its own machinery (ctx, save_for_backward,
needs_input_grad, mark_dirty, mark_non_differentiable, once_differentiable,
setup_context) is what runs: for real on the eager backend, and under AOT's make_fx,
where the forward is traced into the forward graph and the user's `backward` into the
backward graph. At capture time the call runs on FakeTensors, and so does its backward
(when a gradient can flow): a Function that cannot be traced (it reads a real tensor from
outside, branches on data, raises) is a graph break naming it, never a wrong gradient."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .graph_breaks import GraphBreak

APPLY = torch.autograd.Function.apply.__func__  # MyFn.apply, as the capture calls it
_APPLIERS: dict = {}


def applier(cls):
    """The graph node's target for `cls.apply`: a plain function named after the Function
    (an FX node cannot hold a classmethod bound to a user class)."""
    fn = _APPLIERS.get(cls)
    if fn is None:
        def fn(*args, **kwargs):
            return cls.apply(*args, **kwargs)
        fn.__name__ = fn.__qualname__ = f"{cls.__name__}_apply"
        fn.__module__ = __name__
        _APPLIERS[cls] = fn
    return fn


def why_not(cls) -> str | None:
    """Why a Function subclass is not put into the graph, or None."""
    if cls.__module__ == "torch" or cls.__module__.startswith("torch."):
        # torch's own (the reentrant checkpoint among them) reach into autograd from backward
        return f"torch's own autograd.Function {cls.__module__}.{cls.__qualname__}"
    if getattr(cls, "generate_vmap_rule", False) or "vmap" in vars(cls) or "jvp" in vars(cls):
        return f"autograd.Function {cls.__qualname__} with a vmap or jvp rule"
    return None


def call_apply(tx, args, kwargs):
    """`MyFn.apply(*args, **kwargs)` (args[0] is the class)."""
    from .tensor_ops import convertible
    from .variables import ObjectVariable

    clsv, args = args[0], list(args[1:])
    cls = tx.as_python(clsv) if not isinstance(clsv, ObjectVariable) else clsv.value
    reason = why_not(cls)
    if reason is not None:
        raise GraphBreak("GB0012", reason)
    if not convertible(args, kwargs):
        raise GraphBreak("GB0011", f"{cls.__qualname__}.apply with arguments that are not tensors or constants")
    result = tx.tensor_call("call_function", applier(cls), args, kwargs)
    _check_backward(tx, cls, args, kwargs, result)
    return result


def _check_backward(tx, cls, args, kwargs, result) -> None:
    """Run the user's backward once on FakeTensors, so that one that cannot be traced breaks
    now: the gradients with respect to the Function's own tensor arguments."""
    from .variables import TensorVariable

    def fakes(vts):
        return [v.fake for v in pytree.tree_leaves(vts, is_leaf=lambda v: isinstance(v, TensorVariable))
                if isinstance(v, TensorVariable)]

    outs = [o for o in fakes(_items(result)) if o.requires_grad]
    inputs = [t for t in fakes([_items(a) for a in args] + [_items(v) for v in kwargs.values()]) if t.requires_grad]
    if not outs or not inputs:
        return
    try:
        with tx.out.fake_mode, torch.enable_grad():
            torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs], allow_unused=True,
                                retain_graph=True)
    except Exception as exc:
        raise GraphBreak("GB0009", f"the backward of autograd.Function {cls.__qualname__} raised "
                                   f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def _items(vt):
    """A variable as nested Python lists, its tensors left as TensorVariables."""
    from .variables import ListVariable, TupleVariable
    if isinstance(vt, (TupleVariable, ListVariable)):
        return [_items(x) for x in vt.items]
    return vt
