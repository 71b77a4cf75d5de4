"""What running the captured graph does to its inputs and what its outputs are, found by one
run on FakeTensors: which inputs are mutated, which outputs are inputs or views of inputs,
which outputs need gradients. The runtime wrapper is built from this."""

from __future__ import annotations

import dataclasses
import functools
from contextlib import nullcontext
from typing import Any, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree

from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from .inputs import LiftedParams
from .interpret import run_captured_graph


@dataclasses.dataclass
class InputInfo:
    mutates_data: bool
    mutates_metadata: bool
    requires_grad: bool          # before the call
    requires_grad_after: bool    # a mutation can make it require grad: buf.copy_(param)
    mutated_under_no_grad: bool = False   # every mutation ran under no_grad (an optimizer step)

    @property
    def differentiable_mutation(self) -> bool:
        """The new value carries autograd history into the input (buf.copy_(param))."""
        return self.mutates_data and self.requires_grad_after and not self.mutated_under_no_grad


@dataclasses.dataclass
class OutputInfo:
    """One leaf of the captured graph's output.

    kind: "graph"    computed by the aten graph, at `index` among its user outputs
          "input"    the input object `index` itself (returned as is, maybe mutated)
          "alias"    a view of input `index`, regenerated as a real view of the real input
          "output_alias" a view of graph output `index`, regenerated from it
          "constant" a non-tensor value, `constant`
    """

    kind: str
    index: int = -1
    constant: Any = None
    size: tuple = ()
    stride: tuple = ()
    storage_offset: int = 0
    requires_grad: bool = False
    fallback_index: int = -1     # output_alias: the graph output to use if the view cannot be rebuilt
    base_layout: tuple = ()      # output_alias: (size, stride) the view's base had when traced
    detached: bool = False       # alias: shares the input's memory, not its autograd history (x.detach())


@dataclasses.dataclass
class GraphMeta:
    inputs: list[InputInfo]
    outputs: list[OutputInfo]
    out_spec: Any                         # pytree spec of the captured graph's output
    mutated_inputs: list[int]             # inputs whose new value the aten graph returns first
    graph_output_leaves: list[int]        # leaf index of each (deduplicated) graph output; ~j: leaf j's base
    graph_output_fakes: list[torch.Tensor]
    graph_output_requires_grad: list[bool]
    fallback_reason: Optional[str] = None
    flat_out_type: Any = None             # list or tuple when out_spec is one of leaves only: built without pytree

    def __post_init__(self):
        s = self.out_spec
        if s is not None and s.type in (list, tuple) and s == pytree.tree_structure(s.type([0] * s.num_children)):
            self.flat_out_type = s.type
        # mutated inputs eager writes without a new version (mark_hidden_mutations)
        self.hidden_mutations: frozenset = frozenset()

    @property
    def num_mutations(self) -> int:
        return len(self.mutated_inputs)

    @functools.cached_property
    def differentiable_mutations(self) -> bool:
        """Whether some mutated input takes autograd history (read on every call: an
        optimizer step writes hundreds of inputs)."""
        return any(self.inputs[i].differentiable_mutation for i in self.mutated_inputs)

    def forward_output_requires_grad(self) -> list[bool]:
        """requires_grad of each aten-graph output (mutated inputs first, then user outputs)."""
        muts = [self.inputs[i].differentiable_mutation for i in self.mutated_inputs]
        return muts + list(self.graph_output_requires_grad)

    def tangent_mask(self) -> list[bool]:
        fakes = [None] * self.num_mutations + list(self.graph_output_fakes)
        out = []
        for rg, fake in zip(self.forward_output_requires_grad(), fakes):
            out.append(bool(rg) and (fake is None or fake.dtype.is_floating_point or fake.dtype.is_complex))
        return out

    def describe(self) -> str:
        """A readable summary (the `aot_forward_graph_fw_metadata` artifact)."""
        lines = ["inputs:"]
        for i, info in enumerate(self.inputs):
            flags = [k for k in ("mutates_data", "mutates_metadata", "requires_grad") if getattr(info, k)]
            lines.append(f"  {i}: {', '.join(flags) or '-'}")
        lines.append("outputs:")
        for j, o in enumerate(self.outputs):
            what = {"graph": f"graph output {o.index}", "input": f"input {o.index} itself",
                    "alias": f"view of input {o.index} size={list(o.size)} stride={list(o.stride)} "
                             f"offset={o.storage_offset}",
                    "output_alias": f"view of graph output {o.index} size={list(o.size)} stride={list(o.stride)} "
                                    f"offset={o.storage_offset}",
                    "constant": f"constant {o.constant!r}"}[o.kind]
            lines.append(f"  {j}: {what}{', requires_grad' if o.requires_grad else ''}")
        if self.fallback_reason:
            lines.append(f"fallback to eager: {self.fallback_reason}")
        return "\n".join(lines)


def collect_metadata(gm: torch.fx.GraphModule, lifted: LiftedParams, fakes: list, num_user: int,
                     fake_mode, training: bool, inputs_alias: bool) -> GraphMeta:
    """Run the graph once, functionalized, on FakeTensors. Functionalization (not version
    counters: kernels such as batch_norm update running stats without bumping them) tells
    which inputs were mutated; storage identity tells which outputs alias inputs."""
    from .trace import exclude_functionalize_key, from_fun, to_fun

    # Data-dependent scalars (`t.item()`) made here are not bound to graph nodes: tell the ShapeEnv.
    ignore_unbacked = fake_mode.shape_env.ignore_fresh_unbacked_symbols() if fake_mode.shape_env else nullcontext()
    with fake_mode, ignore_unbacked, enable_python_dispatcher(), FunctionalTensorMode(), \
            torch.set_grad_enabled(training):
        with exclude_functionalize_key():
            f_args = [to_fun(a) for a in fakes]
            out = run_captured_graph(gm, lifted, f_args[:num_user], f_args[num_user:],
                                     step="functionalizing")
        inputs = []
        for f, a in zip(f_args, fakes):
            if not isinstance(f, torch.Tensor):
                inputs.append(InputInfo(False, False, False, False))
                continue
            torch._sync(f)
            inputs.append(InputInfo(mutates_data=bool(torch._functionalize_has_data_mutation(f.elem)),
                                    mutates_metadata=bool(torch._functionalize_has_metadata_mutation(f.elem)),
                                    requires_grad=bool(a.requires_grad), requires_grad_after=bool(f.requires_grad),
                                    mutated_under_no_grad=bool(
                                        torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(f.elem))))
        storages = [StorageWeakRef(f.untyped_storage()) if isinstance(f, torch.Tensor) else None for f in f_args]
        leaves, spec = pytree.tree_flatten(out)
        outputs, graph_leaves, graph_fakes, fallback = _describe_outputs(leaves, f_args, storages)
        graph_rg = [bool(t.requires_grad) for t in graph_fakes]
        graph_fakes = [from_fun(t) for t in graph_fakes]
    for i, (info, a) in enumerate(zip(inputs, fakes)):
        if info.mutates_data and isinstance(a, torch.Tensor) and \
                any(st == 0 and sz > 1 for sz, st in zip(a.shape, a.stride())):
            # written back whole, it would write one memory location many times (eager's
            # `z[-1] = v` writes it once)
            fallback = fallback or f"input {i} is mutated and has overlapping memory (an expanded tensor)"
    if any(o.kind == "alias" and inputs[o.index].mutates_data for o in outputs):
        fallback = _plain_view_layouts(gm, lifted, fakes, num_user, fake_mode, outputs) or fallback
    meta = _finish(inputs, outputs, spec, graph_leaves, graph_fakes, fallback, training, inputs_alias)
    meta.graph_output_requires_grad = graph_rg
    return meta


def _plain_view_layouts(gm, lifted, fakes: list, num_user: int, fake_mode, outputs: list) -> Optional[str]:
    """Sizes, strides and offsets of the outputs that are views of inputs, from a run without
    functionalization. A functionalized input that is mutated gets new, dense memory, so its
    views have that memory's layout, not the real input's (`w.mul_(2); return w[0]` with
    `w` strided or at an offset rebuilt the view at the wrong place). Returns a reason to run
    the graph eagerly when the layouts cannot be found."""
    from .inputs import make_fake, spec_of

    try:
        plain = [make_fake(spec_of(a)._replace(requires_grad=False), fake_mode)
                 if isinstance(a, torch.Tensor) else a for a in fakes]
        ignore = fake_mode.shape_env.ignore_fresh_unbacked_symbols() if fake_mode.shape_env else nullcontext()
        with fake_mode, ignore, torch.no_grad():
            out = run_captured_graph(gm, lifted, plain[:num_user], plain[num_user:], step="finding output views")
        leaves = pytree.tree_leaves(out)
        for o, leaf in zip(outputs, leaves):
            if o.kind != "alias":
                continue
            base = plain[o.index]
            if not isinstance(leaf, torch.Tensor) or \
                    StorageWeakRef(leaf.untyped_storage()) != StorageWeakRef(base.untyped_storage()):
                return "an output's view of a mutated input could not be located"
            o.size, o.stride, o.storage_offset = tuple(leaf.shape), tuple(leaf.stride()), int(leaf.storage_offset())
    except Exception as exc:   # symbolic specs, an op refusing plain fakes: run eagerly
        return f"an output is a view of a mutated input, and its layout could not be found ({type(exc).__name__})"
    return None


def _describe_outputs(leaves: list, f_args: list, storages: list):
    outputs: list[OutputInfo] = []
    graph_leaves: list[int] = []
    graph_fakes: list[torch.Tensor] = []
    roots: set[int] = set()    # graph outputs handed out as themselves (not only a rebuilt view's fallback)
    fallback = None
    for j, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                fallback = fallback or f"output {j} is a symbolic scalar"
            outputs.append(OutputInfo("constant", constant=leaf))
            continue
        rg = bool(leaf.requires_grad)
        same = next((i for i, a in enumerate(f_args) if leaf is a), None)
        if same is not None:
            outputs.append(OutputInfo("input", index=same, requires_grad=rg))
            continue
        ref = StorageWeakRef(leaf.untyped_storage())
        base = next((i for i, st in enumerate(storages) if st is not None and st == ref), None)
        if base is not None:
            if leaf.dtype != f_args[base].dtype or leaf.is_complex() or f_args[base].is_complex():
                fallback = fallback or f"output {j} is a dtype-changing view of input {base}"
            # autograd's views all point at their root base; a detach() starts a new root
            arg = f_args[base]
            root = arg._base if arg._is_view() else arg
            detached = not (leaf._is_view() and leaf._base is root)
            if detached and rg:
                # `t = w.detach(); t.mul_(y); return t`: t shares w's memory and has the write's
                # gradient history, w has neither; a view of w rebuilt after the call cannot
                # carry that history (fuzz 444319: t came back without requires_grad)
                fallback = fallback or (f"output {j} is a detached alias of input {base} written in place "
                                        "with a value that requires grad")
            outputs.append(OutputInfo("alias", index=base, size=tuple(leaf.shape), stride=tuple(leaf.stride()),
                                      storage_offset=leaf.storage_offset(), requires_grad=rg, detached=detached))
            continue
        dup = next((k for k, prev in enumerate(graph_fakes) if prev is leaf), None)
        if dup is None:
            dup = len(graph_fakes)
            graph_fakes.append(leaf)
            graph_leaves.append(j)
        # (not of an output that does not require grad where this one does: a view of it
        # could not carry this output's gradient, as in `y = x @ w; return y.detach().relu_(), y`)
        # (nor of an earlier output that is itself rebuilt as a view: the graph's tensor for it is
        # only a fallback, outside the view family; fuzz 375436: `t6 = t3.unsqueeze(0)` and
        # t3[1:] returned, t3 not, then t3[1:] written in place, and t6's gradient missed it)
        owner = next((k for k, prev in enumerate(graph_fakes[:dup]) if k in roots and _owns_storage(prev)
                      and StorageWeakRef(prev.untyped_storage()) == ref and prev.dtype == leaf.dtype
                      and (prev.requires_grad or not rg)), None)
        if owner is None:
            owner = _intermediate_base(leaf, j, leaves, ref, rg, graph_fakes, graph_leaves)
            if owner is not None:
                roots.add(owner)
        base_layout = (tuple(graph_fakes[owner].shape), tuple(graph_fakes[owner].stride())) if owner is not None else ()
        if owner is not None:
            # A view of another output (`return y, y.view(-1)`): rebuilt as a real view of
            # that output, as eager returns it (the graph still computes it, as a fallback).
            outputs.append(OutputInfo("output_alias", index=owner, size=tuple(leaf.shape),
                                      stride=tuple(leaf.stride()), storage_offset=leaf.storage_offset(),
                                      requires_grad=rg, fallback_index=dup, base_layout=base_layout))
            continue
        roots.add(dup)
        outputs.append(OutputInfo("graph", index=dup, requires_grad=rg))
    return outputs, graph_leaves, graph_fakes, fallback


def _intermediate_base(leaf, j: int, leaves: list, ref, rg: bool, graph_fakes: list, graph_leaves: list):
    """Outputs that are views of one intermediate the graph does not return (`t1 =
    t0.select(1, -1)` and `t3 = t1.unsqueeze(0)`, both returned): that intermediate becomes
    a graph output of its own, hidden from the caller, and each such output is rebuilt as
    a real view of it. Returned as independent tensors, they shared memory but not autograd
    history, so writing one in place later (fuzz 316766: `leaky_relu_(t1)`) left the
    other's gradient wrong. Its index among the graph outputs, or None."""
    base = leaf._base if leaf._is_view() else None
    if base is None or not _owns_storage(base, any_order=True) or base.dtype != leaf.dtype \
            or (rg and not base.requires_grad):
        return None
    if not any(k != j and isinstance(x, torch.Tensor) and StorageWeakRef(x.untyped_storage()) == ref
               for k, x in enumerate(leaves)):
        return None    # no other output shares its memory: nothing to keep in step
    known = next((k for k, prev in enumerate(graph_fakes) if prev is base), None)
    if known is not None:
        return known
    graph_fakes.append(base)
    graph_leaves.append(~j)     # ~j: the base of leaf j (see GraphMeta.graph_output_leaves)
    return len(graph_fakes) - 1


def _owns_storage(t: torch.Tensor, any_order: bool = False) -> bool:
    """t is the whole of its storage (offset 0, dense; contiguous unless any_order): its
    views can be rebuilt from it."""
    dense = _dense_in_some_order(t) if any_order else t.is_contiguous()
    return t.storage_offset() == 0 and dense and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _dense_in_some_order(t: torch.Tensor) -> bool:
    """Its elements fill a block of memory without gaps or overlaps, the dims in some order
    (a transposed result is dense; a slice is not)."""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _finish(inputs, outputs, spec, graph_leaves, graph_fakes, fallback, training, inputs_alias) -> GraphMeta:
    mutated = [i for i, info in enumerate(inputs) if info.mutates_data]
    if any(info.mutates_metadata for info in inputs):
        fallback = fallback or "an input's size, stride or offset is mutated (x.t_(), x.resize_(), ...)"
    if mutated and inputs_alias:
        fallback = fallback or "inputs share storage and one of them is mutated"
    if training and any(inputs[i].requires_grad and not inputs[i].mutated_under_no_grad for i in mutated):
        fallback = fallback or "an input that requires grad is mutated in place outside no_grad"
    if not training and any(o.requires_grad for o in outputs):
        fallback = fallback or "an output requires grad although no input does"
    return GraphMeta(inputs=inputs, outputs=outputs, out_spec=spec, mutated_inputs=mutated,
                     graph_output_leaves=graph_leaves, graph_output_fakes=graph_fakes,
                     graph_output_requires_grad=[bool(t.requires_grad) for t in graph_fakes],
                     fallback_reason=fallback)


# batch norm as a captured graph calls it: the op -> (the argument positions of the running
# mean and variance, the position of `training`)
_BATCH_NORMS = {torch.nn.functional.batch_norm: ((1, 2), 5, "running_mean", "running_var"),
                torch.batch_norm: ((3, 4), 5, "running_mean", "running_var")}


def mark_hidden_mutations(meta: GraphMeta, gm: torch.fx.GraphModule) -> None:
    """The mutated inputs that are the running statistics of a batch norm in training mode:
    eager's batch norm writes them without a new version (its schema does not declare the
    write), so a backward that saved them (eager's batch norm does) still takes them after
    the next update; the write-back must not give them one either (fuzz 941102: an eager
    batch norm, a graph break, then the same module compiled). gm: the captured graph,
    whose placeholders are the inputs in order."""
    index = {n: k for k, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    stats = set()
    for n in gm.graph.nodes:
        spec = _BATCH_NORMS.get(n.target) if n.op == "call_function" else None
        if spec is None:
            continue
        (mean_at, var_at), training_at, mean_kw, var_kw = spec
        training = n.args[training_at] if len(n.args) > training_at else n.kwargs.get("training", False)
        if training is not True:
            continue
        for at, kw in ((mean_at, mean_kw), (var_at, var_kw)):
            arg = n.args[at] if len(n.args) > at else n.kwargs.get(kw)
            # only where batch norms are all that touch it (another write is eager's, versioned)
            if arg in index and all(_BATCH_NORMS.get(u.target) for u in arg.users):
                stats.add(index[arg])
    meta.hidden_mutations = frozenset(i for i in meta.mutated_inputs if i in stats)
