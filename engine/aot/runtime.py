"""What runs on every call: the compiled forward (inside a torch.autograd.Function when
gradients are needed, the compiled backward as its backward), then the epilogue that
writes mutated inputs back and rebuilds outputs that are inputs or views of inputs."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .metadata import GraphMeta


def epilogue(meta: GraphMeta, flat: list, outs) -> Any:
    n = meta.num_mutations
    grad = torch.is_grad_enabled()
    if n and not (grad and meta.differentiable_mutations):
        written = []
        hidden = meta.hidden_mutations
        with torch.no_grad():          # one context for all (an optimizer step writes back hundreds)
            for k, i in enumerate(meta.mutated_inputs):
                if outs[k] is not flat[i]:
                    _write_back(flat[i], outs[k], i in hidden)
                elif i not in hidden:  # the compiled graph wrote it in place, through a pointer
                    written.append(flat[i])
        if written:
            # as an in-place op would: a tensor saved for a backward before (eager's `x * w`
            # saves w) then fails autograd's check instead of giving a gradient from new values
            torch.autograd.graph.increment_version(written)
    else:
        for k, i in enumerate(meta.mutated_inputs):
            target, new = flat[i], outs[k]
            if meta.inputs[i].differentiable_mutation and grad:
                target.copy_(new)          # eager's in-place op would be recorded by autograd too
            elif target is not new or i not in meta.hidden_mutations:
                with torch.no_grad():
                    _write_back(target, new, i in meta.hidden_mutations)
    leaves = []
    for o in meta.outputs:
        if o.kind == "graph":
            out = outs[n + o.index]
            if isinstance(out, torch.Tensor) and out.requires_grad and not o.requires_grad:
                out = out.detach()
            leaves.append(out)
        elif o.kind == "input":
            leaves.append(flat[o.index])
        elif o.kind == "alias":
            # A real view of the real input, as eager returns; autograd sees it as one
            # (detached first where eager's output is detached, x.detach(): a write into it
            # with a value that requires grad leaves the input not requiring grad, fuzz 418293).
            base = flat[o.index]
            if not o.requires_grad and (base.requires_grad or o.detached):
                base = base.detach()
            leaves.append(base.as_strided(o.size, o.stride, o.storage_offset))
        elif o.kind == "output_alias":
            base, out = outs[n + o.index], outs[n + o.fallback_index]
            if (tuple(base.shape), base.stride()) == o.base_layout and base.storage_offset() == 0:
                view = (o.size, o.stride, o.storage_offset)       # the base laid out as traced
            elif _same_storage(out, base):
                # the compiler laid the base out its own way (a size-1 dim's stride) and
                # returned the view over its memory: still a view of the base for autograd,
                # as eager's is, so that a later in-place op on the base reaches its gradient
                # too (fuzz 931083: `t1 = t0[0].lerp_(x, .5)`, a break, then `t0.mul_(2)`)
                view = (out.shape, out.stride(), out.storage_offset())
            else:   # the compiler gave this output its own buffer: the computed value is right
                view, base = None, out
            if base.requires_grad and not o.requires_grad:
                base = base.detach()
            leaves.append(base if view is None else base.as_strided(*view))
        else:
            leaves.append(o.constant)
    if meta.flat_out_type is not None:
        return meta.flat_out_type(leaves)
    return pytree.tree_unflatten(leaves, meta.out_spec)


def _write_back(target: torch.Tensor, new: torch.Tensor, hidden: bool) -> None:
    """target.copy_(new), under no_grad; `hidden`: as eager's batch norm updates its running
    statistics, without a new version (an eager batch norm that saved them before still
    takes them: fuzz 941102)."""
    if not hidden or target.is_inference():
        target.copy_(new)
        return
    with torch.autograd._unsafe_preserve_version_counter(target):
        target.copy_(new)


def _same_storage(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device == b.device
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0)


DOUBLE_BACKWARD_MESSAGE = (
    "AOT autograd: differentiating the gradient of a compiled graph (double backward, "
    "create_graph=True then backward again) is not supported; run this part eagerly "
    "(engine.disable) or compute the higher-order gradient with torch.func outside the compiled region")


def _refuse_double_backward(grads: tuple) -> tuple:
    """Gradients that raise a clear error only if someone differentiates them again
    (what torch.autograd.function.once_differentiable does, with our message)."""
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    err = torch._C._functions.DelayedError(DOUBLE_BACKWARD_MESSAGE, len(present))
    out = err(*[g.detach().requires_grad_(True) for g in present])
    wrapped = iter(out if isinstance(out, (tuple, list)) else (out,))
    return tuple(None if g is None else next(wrapped) for g in grads)


class EagerFallback:
    """Runs the captured graph as is: the correct answer where the AOT stage does not
    support what the graph does (the reason is logged once, at compile time)."""

    def __init__(self, gm: torch.fx.GraphModule, num_user: int, reason: str):
        self.gm, self.num_user, self.reason = gm, num_user, reason

    def __call__(self, flat: list) -> Any:
        return self.gm(*flat[:self.num_user])


class InferenceEntry:
    def __init__(self, compiled: Callable, meta: GraphMeta):
        self.compiled, self.meta = compiled, meta

    def __call__(self, flat: list) -> Any:
        with torch.no_grad(), _no_autocast():
            outs = self.compiled(*flat)
        if torch.is_grad_enabled():
            # A view made under the no_grad above is marked so; a write into it with a value
            # that requires grad then raises, where eager's view, made with grad on, takes the
            # write (fuzz 378473: `t.diagonal().addcmul_(y, y)` after a break, y requiring
            # grad). Its detached alias is the same memory and no view.
            outs = [o.detach() if isinstance(o, torch.Tensor) and o._is_view() else o for o in outs]
        return epilogue(self.meta, flat, outs)


class TrainingEntry:
    def __init__(self, compiled_fw: Callable, compiled_bw: Callable, meta: GraphMeta,
                 forward_output_vals: list, grad_inputs: list[int], num_primals: int,
                 backward_for: Callable, plain_inputs: tuple = ()):
        mask = meta.tangent_mask()
        num_forward_outputs = len(forward_output_vals)
        tangent_meta = [(tuple(f.shape), f.dtype, f.device) for f in forward_output_vals]
        nondiff = [k for k, m in enumerate(mask) if not m]
        optional = backward_for.optional_saved      # saved inputs not every backward needs

        class CompiledFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                ctx.set_materialize_grads(False)   # which outputs got no gradient: see _backward
                outs = compiled_fw(*args)
                fw_outs, saved = outs[:num_forward_outputs], outs[num_forward_outputs:]
                # An output that is a view of an intermediate (linear on a 1-D input: a squeeze
                # of the matmul) would be a view output of a Function that returns several,
                # which autograd forbids to modify in place; eager's is an ordinary tensor.
                # Its detached alias has the same memory and is not a view.
                fw_outs = [o.detach() if isinstance(o, torch.Tensor) and o._is_view() else o for o in fw_outs]
                is_tensor = [isinstance(s, torch.Tensor) for s in saved]
                if optional:
                    saved = list(saved)
                    ctx.kept = _keep_outside_autograd(saved, is_tensor, optional)
                ctx.save_for_backward(*[s for s, t in zip(saved, is_tensor) if t])
                ctx.saved_other = [None if t else s for s, t in zip(saved, is_tensor)]
                if nondiff:
                    # A tensor that is also a differentiable output (the graph returns one
                    # buffer for `t` and `t.detach()`) stays differentiable, and its
                    # non-differentiable slot gets an object of its own: autograd ties a
                    # tensor returned twice to its last slot, whose gradient is dropped (t's
                    # gradient was lost when `t` and `t.detach()` both crossed a graph break).
                    diff = {id(fw_outs[k]) for k, m in enumerate(mask) if m}
                    fw_outs = list(fw_outs)
                    for k in nondiff:
                        if isinstance(fw_outs[k], torch.Tensor) and id(fw_outs[k]) in diff:
                            fw_outs[k] = fw_outs[k].detach()
                    ctx.mark_non_differentiable(*[fw_outs[k] for k in nondiff if isinstance(fw_outs[k], torch.Tensor)])
                return tuple(fw_outs)

            @staticmethod
            def backward(ctx, *grads):
                create_graph = torch.is_grad_enabled()
                with torch.no_grad():
                    result = _backward(ctx, grads)
                return _refuse_double_backward(result) if create_graph else result

        def _backward(ctx, grads):
            missing = tuple(grads[k] is None for k, m in enumerate(mask) if m)
            # Where outputs got no gradient (the loss does not use them), their zeros may meet
            # ops eager never runs (0/0), and a gradient computed only from them is None.
            bw, absent, unread = backward_for(missing) if any(missing) else (compiled_bw, None, ())
            # Nothing saved: not read at all. A second backward through a node that saved
            # nothing runs in eager (a buffer updated in place from a parameter on each call
            # chains the calls' nodes), and autograd raises on reading a freed node's list.
            # Saved tensors an earlier backward freed and this one does not read stand in as
            # uninitialized tensors of their layout: that chain's next backward reaches the
            # last call's node with a gradient for the updated buffer alone, which needs none
            # of what the rest of the graph saved (eager's node for the update saved nothing;
            # fuzz 912548, 924288).
            saved = ctx.saved_other
            try:
                tensors = iter(ctx.saved_tensors if None in saved else ())
            except RuntimeError:
                tensors = iter(_stand_ins(backward_for, missing, [i for i, o in enumerate(saved) if o is None]))
            args = [next(tensors) if o is None else o for o in saved]
            del tensors
            if optional:
                if ctx.kept is None:
                    freed = [i for i, o in enumerate(saved) if o is _KEPT]
                    for i, t in zip(freed, _stand_ins(backward_for, missing, freed)):
                        args[i] = t
                else:
                    _unkeep(ctx, args, unread)
            for k, m in enumerate(mask):
                if not m:
                    continue
                g = grads[k]
                if g is None:
                    shape, dtype, device = tangent_meta[k]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                args.append(g.contiguous())
            gs = call_consuming(bw, args, ctx)
            result = [None] * num_primals
            for n, (i, g) in enumerate(zip(grad_inputs, gs)):
                result[i] = None if absent and absent[n] else g
            return tuple(result)

        CompiledFunction.__name__ = "CompiledFunction"
        self.function = CompiledFunction
        self.meta = meta
        # Inputs that require grad but reach no output the gradient flows through: handed in
        # detached, so that autograd has no edge from the compiled node to their history.
        # Eager's graph has none; with one, a loss of the other outputs ran their producer's
        # backward, which checked a tensor it saved and the program had since written
        # (fuzz 375527: `t1 = lin(y)` unused after a break, y then scaled in place).
        reached = set(grad_inputs)
        self.unreached = tuple(i for i, info in enumerate(meta.inputs) if info.requires_grad and i not in reached)
        # Function.apply's C part, bound to the class: the Python classmethod around it
        # unwraps every argument that is a dead functorch wrapper (a tensor that escaped a
        # vmap or grad), one Python-level call per input, 30 us of a 150-parameter forward's
        # 90 before its first kernel. Parameters are never such wrappers; the other tensor
        # inputs (`plain_inputs`) are unwrapped here as apply would.
        self.apply = _FUNCTION_APPLY.__get__(None, CompiledFunction)
        self.plain_inputs = plain_inputs

    def __call__(self, flat: list) -> Any:
        args = flat
        if self.unreached or self.plain_inputs:
            args = list(flat)
            for i in self.plain_inputs:
                args[i] = _unwrap_if_dead(args[i])
            for i in self.unreached:
                if isinstance(args[i], torch.Tensor):
                    args[i] = args[i].detach()
        with _no_autocast():
            if torch._C._are_functorch_transforms_active():
                outs = self.function.apply(*args)     # torch's own refusal (no setup_context)
            else:
                outs = self.apply(*args)
        return epilogue(self.meta, flat, outs)


_FUNCTION_APPLY = torch._C._FunctionBase.__dict__["apply"]
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead

_KEPT = object()      # in ctx.saved_other: a saved tensor kept outside autograd (ctx.kept)


def _keep_outside_autograd(saved: list, is_tensor: list, optional: tuple) -> dict:
    """The optional saved tensors, as detached aliases (no grad_fn: no reference cycle
    through an output) with their versions now, which `_unkeep` checks only where the
    backward reads them; they leave autograd's saved tensors (`saved`/`is_tensor` edited)."""
    kept = {}
    for i in optional:
        if is_tensor[i]:
            kept[i] = (saved[i].detach(), saved[i]._version)
            saved[i], is_tensor[i] = _KEPT, False
    return kept


_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)


def _stand_ins(backward_for, missing: tuple, freed: list) -> list:
    """Stand-ins for the saved tensors at `freed`, which an earlier backward freed, where a
    backward with `missing` gradients reads none of them; else autograd's error."""
    stand_ins = backward_for.stand_ins(missing, freed) if any(missing) else None
    if stand_ins is None:
        raise RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                           "tensors after they have already been freed): a compiled graph's saved tensors "
                           "were freed after the first backward. Specify retain_graph=True the first time.")
    return stand_ins


def _unkeep(ctx, args: list, unread: frozenset) -> None:
    """Put the kept tensors into the backward's arguments, with autograd's checks: a tensor
    the backward reads must not have been written in place since, and a backward through
    the graph a second time finds them freed (unless the graph was retained; _backward)."""
    kept = ctx.kept
    for i, (t, version) in kept.items():
        if i not in unread and t._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: [{t.type()} {list(t.shape)}], saved by a compiled graph, is at version "
                f"{t._version}; expected version {version} instead.")
        args[i] = t
    if not _keep_graph():
        ctx.kept = None


def call_consuming(compiled: Callable, args: list, ctx) -> Any:
    """compiled(*args), handing it the last references to `args`: autograd's copies of the
    saved tensors are dropped first (unless the graph is retained for another backward), so
    a compiled graph that takes its list (`call_boxed`) frees each saved activation after
    its last use. Otherwise all of them lived until the backward returned, beside every
    gradient it had made."""
    boxed = getattr(type(compiled), "call_boxed", None)   # the class's own: not a wrapper's __getattr__
    if boxed is None:
        return compiled(*args)
    ctx.maybe_clear_saved_tensors()
    return boxed(compiled, args)


_NO_CONTEXT = contextlib.nullcontext()


def _no_autocast():
    """The traced graphs carry autocast's casts already (it was on while tracing, inside the
    graph's own autocast blocks or around the call): running them under autocast again would
    cast what a block with enabled=False kept in float32."""
    return torch._C._DisableAutocast() if torch._C._is_any_autocast_enabled() else _NO_CONTEXT
