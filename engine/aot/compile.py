"""`aot_compile`: the AOT autograd stage's entry point, and the per-input-metadata cache
of compiled entries behind the callable it returns."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
import itertools
import json
import logging
from typing import Any, Callable, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import observe

from .errors import AOTAutogradError, BackwardTraceError
from .fused_backward import rematerialize
from .inputs import LiftedParams, TensorSpec, call_key, lift_parameters, make_fake, placement_key, spec_of
from .metadata import GraphMeta, collect_metadata, mark_hidden_mutations
from .mincut import min_cut_saved
from .missing_grads import BackwardsByMissing, caller_writable
from .partition import default_saved, extract, joint_parts, runtime_checks, split, tensor_bytes
from .readable import readable
from .runtime import EagerFallback, InferenceEntry, TrainingEntry
from .trace import Tracer, output_nodes, placeholders

Compiler = Callable[[torch.fx.GraphModule, list], Callable]
# partitioner -> what it saves of a joint graph's parts, given the primals that are
# parameters (free to save: alive anyway)
SAVERS = {"default": lambda parts, free: default_saved(parts), "min_cut": min_cut_saved}
PARTITIONERS = tuple(SAVERS)
_graph_ids = itertools.count()


@dataclasses.dataclass
class AOTConfig:
    fw_compiler: Compiler
    bw_compiler: Compiler
    inference_compiler: Compiler
    partitioner: str
    decompositions: Optional[dict]


@dataclasses.dataclass
class PartitionStats:
    """Saved activations of both partitioners for one joint graph."""

    partitioner: str
    saved: dict            # partitioner -> {"tensors", "bytes", "param_bytes", "names", "recomputed"}

    def __str__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        parts = [f"{name}: {s['tensors']} tensors, {s['bytes']} bytes "
                 f"({s['bytes'] - s['param_bytes']} excluding parameters), {len(s['recomputed'])} ops recomputed"
                 for name, s in self.saved.items()]
        return f"partitioner={self.partitioner}; saved for backward: " + "; ".join(parts)


def aot_compile(gm: torch.fx.GraphModule, example_inputs: list, *, fw_compiler: Compiler,
                bw_compiler: Optional[Compiler] = None, inference_compiler: Optional[Compiler] = None,
                partitioner: str = "default", decompositions: Optional[dict] = None) -> "AOTCompiled":
    """Trace `gm` to functional aten graphs (a joint forward/backward graph partitioned in
    two when an input requires grad, an inference graph otherwise), hand them to the
    compilers, and return a callable with `gm`'s calling convention and autograd support.

    Graphs are compiled now for `example_inputs` (when they are concrete) and again
    whenever a call's inputs differ in shape, stride, dtype, device, requires_grad or grad
    mode."""
    if partitioner not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {partitioner!r}; expected one of {PARTITIONERS}")
    config = AOTConfig(fw_compiler, bw_compiler or fw_compiler, inference_compiler or fw_compiler,
                       partitioner, decompositions)
    compiled = AOTCompiled(gm, config)
    compiled.precompile(list(example_inputs))
    return compiled


class AOTCompiled:
    def __init__(self, gm: torch.fx.GraphModule, config: AOTConfig):
        self.gm = gm
        self.config = config
        self.lifted: LiftedParams = lift_parameters(gm)
        self.num_user = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        self.cache: dict = {}
        self.compile_id = observe.current_compile_id()
        self.data_dependent = _data_dependent_sizes(gm)
        self.last_stats: Optional[PartitionStats] = None   # for tests and benchmarks
        # inputs the capture's guards pin (see _note_guarded): None until known, False when
        # this graph keys every call in full
        self.guarded = None
        self.unguarded: list = []
        self.track_aliases = False
        self.by_state: dict = {}

    # -- calls ---------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        flat = [*args, *self.lifted.fetch(self.gm)] if self.lifted.getters else list(args)
        if self.guarded:
            entry = self.by_state.get(self._guarded_key(flat))
            if entry is not None:
                return entry(flat)
        key = self._key(flat)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._compile(key, flat)
        self._note_guarded(flat, entry)
        return entry(flat)

    def _note_guarded(self, flat: list, entry) -> None:
        """The capture's guards pin the type, dtype, device, shape, strides and requires_grad
        of the graph inputs it lists in gm.meta["guarded_inputs"], before every call, so
        later calls key on the global state, the other inputs' specs and, where the graph
        writes an input or returns a view of one, every input's storage offset and aliasing
        (which place results in an input's memory): the full key of hundreds of parameters
        is not rebuilt on every call (BERT: 200 tensors, 0.2 ms a call)."""
        guarded = self.gm.meta.get("guarded_inputs")
        meta = getattr(entry, "meta", None)
        if guarded is None or self.guarded is False:
            return
        if meta is None:               # an eager fallback: keyed in full
            self.guarded, self.by_state = False, {}
            return
        writes = bool(meta.mutated_inputs) or any(o.kind in ("input", "alias") for o in meta.outputs)
        if self.guarded is None:
            self.guarded = frozenset(guarded)
            self.unguarded = [i for i in range(len(flat)) if i not in self.guarded]
            self.track_aliases = writes
        elif writes and not self.track_aliases:   # an entry that writes after ones that did not
            self.track_aliases, self.by_state = True, {}   # the others are re-keyed on their next call
        self.by_state[self._guarded_key(flat)] = entry

    def _guarded_key(self, flat: list) -> tuple:
        key = (torch.is_grad_enabled(), torch._C._is_any_autocast_enabled(),
               *[spec_of(flat[i]) for i in self.unguarded])
        return key + placement_key(flat) if self.track_aliases else key

    def _key(self, flat: list) -> tuple:
        # Autocast is baked into the traced graph, so it is part of the key.
        return (torch.is_grad_enabled(), *call_key(flat),
                torch._C._is_any_autocast_enabled())

    def precompile(self, example_inputs: list) -> None:
        if len(example_inputs) != self.num_user:
            return   # an unusual calling convention: compile on the first call
        flat = example_inputs + self.lifted.fetch(self.gm)
        key = self._key(flat)
        if any(s is None for s in key[1]):
            observe.log("aot", logging.DEBUG, "example inputs are symbolic: compiling on the first call")
            return
        self._compile(key, flat)

    # -- compiling -----------------------------------------------------------------------
    def _compile(self, key: tuple, flat: list):
        # A compile on a later call (new shapes, a no_grad call) is reported under the
        # compile id of the capture that produced the graph.
        ctx = observe.compile_context(self.compile_id) if observe.current_compile_id() is None else nullcontext()
        with ctx, observe.stage("aot"):
            if self.cache:
                difference = _Lazy(_key_difference, list(self.cache)[-1], key)
                observe.log("aot", logging.DEBUG, "compiling again for new inputs: %s", difference)
                # the capture's entry was reused (a dynamic size passed its guards), but its AOT
                # graphs and kernels are compiled again for these inputs: a cost the user
                # looking at recompiles should see
                observe.log("recompiles", logging.INFO, "Recompiling the AOT graphs of %s (its cache entry "
                            "is reused) for new inputs: %s", self.compile_id, difference)
            entry = self._build(key, flat)
        self.cache[key] = entry
        return entry

    def _build(self, key: tuple, flat: list):
        grad_enabled, specs, aliases, _autocast = key
        if self.data_dependent:
            observe.log("aot", logging.INFO, "graph runs eagerly (not compiled): %s", self.data_dependent)
            return EagerFallback(self.gm, self.num_user, self.data_dependent)
        # A ShapeEnv lets data-dependent scalars (`t.item()` in the graph) trace as symbols.
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        fakes = [make_fake(s, fake_mode) if isinstance(s, TensorSpec) else a for s, a in zip(specs, flat)]
        training = grad_enabled and any(isinstance(s, TensorSpec) and s.requires_grad for s in specs)
        # loss.backward() inside the graph (capture/backward.py): traced with autograd on, its
        # results detached: one graph, forward and backward, compiled as an inference graph
        in_graph_backward = bool(self.gm.meta.get("backward_in_graph")) and grad_enabled
        inputs_alias = any(a != i for i, a in enumerate(aliases))
        observe.log("aot", logging.DEBUG, "compiling for %d inputs (%d lifted parameters/buffers), %s",
                    len(flat), len(self.lifted.getters), "training" if training else "inference")
        with observe.stage("aot_collect_metadata"):
            try:
                meta = collect_metadata(self.gm, self.lifted, fakes, self.num_user, fake_mode,
                                        training or in_graph_backward, inputs_alias)
            except AOTAutogradError as exc:
                reason = _effectful_op(exc)
                if reason is None:
                    raise
                observe.log("aot", logging.INFO, "graph runs eagerly (not compiled): %s", reason)
                return EagerFallback(self.gm, self.num_user, reason)
        if training and not any(meta.tangent_mask()):
            training = False      # no output needs a gradient: an inference graph will do
        gid = next(_graph_ids)
        observe.emit("artifact", {"name": "aot_forward_graph_fw_metadata", "encoding": "string"},
                     payload=meta.describe)
        if meta.fallback_reason:
            observe.log("aot", logging.INFO, "graph %d runs eagerly (not compiled): %s", gid, meta.fallback_reason)
            return EagerFallback(self.gm, self.num_user, meta.fallback_reason)
        observe.log("aot", logging.DEBUG, "metadata:\n%s", meta.describe())
        mark_hidden_mutations(meta, self.gm)
        tracer = Tracer(self.gm, self.lifted, meta, self.num_user, fake_mode, self.config.decompositions)
        # The trace takes fresh fakes: the metadata pass's fakes remember their data-dependent
        # sizes (`nonzero`'s u0), already settled by the graph's runtime asserts, and an assert
        # on a settled size is traced as a constant and lost.
        fakes = [make_fake(s, fake_mode) if isinstance(s, TensorSpec) else a for s, a in zip(specs, flat)]
        if training:
            return self._build_training(tracer, meta, fakes, flat, gid)
        return self._build_inference(tracer, meta, fakes, gid, inputs_alias,
                                     _parameters(flat) if in_graph_backward else None)

    def _build_inference(self, tracer: Tracer, meta: GraphMeta, fakes: list, gid: int, inputs_alias: bool,
                         backward_free: Optional[set] = None):
        """`backward_free`: the graph runs its own backward (capture/backward.py); the
        positions of the parameters among its inputs, for the partitioner."""
        with observe.stage("aot_trace_inference_graph"):
            traced = tracer.trace_inference(fakes, autograd=backward_free is not None)
        if backward_free is not None:
            with observe.stage("aot_partition", partitioner=self.config.partitioner):
                traced = rematerialize(traced, backward_free, SAVERS[self.config.partitioner])
            observe.log("aot", logging.DEBUG, "graph %d runs its own backward: forward and backward partitioned "
                        "(%s ops recomputed after the tangent) and joined in one graph", gid,
                        traced.meta.get("recomputed_after_backward", "no"))
        graph = extract(traced, placeholders(traced), output_nodes(traced), "inference",
                        keep=runtime_checks(traced.graph))
        observe.emit("aot_inference_graph", {"title": f"===== Inference graph {gid} ====="},
                     payload=lambda: readable(graph), log="aot_graphs")
        graph.meta["aot_graph"] = ("inference", gid)   # kernel provenance names the graph
        graph.meta["pinned_inputs"] = self.gm.meta.get("guarded_inputs", frozenset())
        if not inputs_alias:
            # A compiler may write these outputs into the inputs' memory (and return the
            # inputs): an optimizer step then updates its parameters where they are.
            graph.meta["mutated_inputs"] = {k: i for k, i in enumerate(meta.mutated_inputs)
                                            if not (meta.inputs[i].mutates_metadata
                                                    or meta.inputs[i].differentiable_mutation)}
        with observe.stage("aot_compile_inference"):
            compiled = self.config.inference_compiler(graph, _example_values(graph))
        return InferenceEntry(compiled, meta)

    def _build_training(self, tracer: Tracer, meta: GraphMeta, fakes: list, flat: list, gid: int):
        with observe.stage("aot_trace_joint_graph"):
            try:
                joint, layout = tracer.trace_joint(fakes)
            except BackwardTraceError as exc:
                # Running the graph as captured reproduces eager exactly: the same error,
                # raised by autograd when (and only if) the user calls backward.
                observe.log("aot", logging.INFO, "graph %d runs eagerly (not compiled): autograd refused its "
                            "backward: %s", gid, exc.cause)
                return EagerFallback(self.gm, self.num_user, f"backward refused by autograd: {exc.cause}")
        observe.emit("aot_joint_graph", {"title": f"===== Joint graph {gid} ====="},
                     payload=lambda: readable(joint), log="aot_joint_graph")
        with observe.stage("aot_partition", partitioner=self.config.partitioner):
            try:
                parts = joint_parts(joint, layout)
                free = {parts.primals[i] for i in _parameters(flat)}
                choices = {name: saver(parts, free) for name, saver in SAVERS.items()}
                mutated = frozenset(parts.primals[i] for i in meta.mutated_inputs)
                splits = {name: split(joint, parts, saved, mutated) for name, saved in choices.items()}
            except AOTAutogradError:
                raise
            except Exception as exc:
                raise AOTAutogradError(f"partitioning the joint graph ({self.config.partitioner})", None, exc) from exc
        chosen = splits[self.config.partitioner]
        stats = PartitionStats(self.config.partitioner, {
            name: {"tensors": len(s.saved), "bytes": s.saved_bytes,
                   "param_bytes": sum(tensor_bytes(n) for n in s.saved if n in free),
                   "input_bytes": sum(tensor_bytes(n) for n in s.saved if n.op == "placeholder"),
                   "names": [n.name for n in s.saved], "recomputed": s.recomputed}
            for name, s in splits.items()})
        self.last_stats = stats
        observe.log("aot", logging.DEBUG, "graph %d: %s", gid, stats)   # str(stats) only if shown
        observe.emit("artifact", {"name": "aot_partition_stats", "encoding": "json"},
                     payload=lambda: json.dumps(dataclasses.asdict(stats)))
        saved_md = {"partitioner": stats.partitioner, "saved_bytes": chosen.saved_bytes,
                    "saved_tensors": len(chosen.saved),
                    "saved_bytes_by_partitioner": {k: v["bytes"] for k, v in stats.saved.items()}}
        observe.emit("aot_forward_graph", {"title": f"===== Forward graph {gid} =====", **saved_md},
                     payload=lambda: readable(chosen.forward), log="aot_graphs")
        observe.emit("aot_backward_graph", {"title": f"===== Backward graph {gid} =====", **saved_md},
                     payload=lambda: readable(chosen.backward), log="aot_graphs")
        chosen.forward.meta["aot_graph"] = ("forward", gid)
        chosen.forward.meta["pinned_inputs"] = self.gm.meta.get("guarded_inputs", frozenset())   # primals first
        chosen.forward.meta["user_outputs"] = len(parts.forward_outputs)   # then what backward saves
        chosen.backward.meta["aot_graph"] = ("backward", gid)
        with observe.stage("aot_compile_forward"):
            compiled_fw = self.config.fw_compiler(chosen.forward, _example_values(chosen.forward))
        with observe.stage("aot_compile_backward"):
            bw_examples = _saved_as_returned(chosen.backward, compiled_fw, len(parts.forward_outputs),
                                             len(chosen.saved))
            compiled_bw = self.config.bw_compiler(chosen.backward, bw_examples)
        fw_vals = [n.meta["val"] for n in parts.forward_outputs]
        writable = caller_writable(chosen.saved, parts.forward_outputs, parts.primals, free)
        backward_for = BackwardsByMissing(chosen.backward, bw_examples, self.config.bw_compiler, compiled_bw,
                                          layout.num_tangents, self.compile_id, writable)
        plain = tuple(i for i, a in enumerate(flat)
                      if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter))
        return TrainingEntry(compiled_fw, compiled_bw, meta, fw_vals, layout.grad_inputs, layout.num_primals,
                             backward_for, plain)


class _Lazy:
    """A log argument formatted only if a sink shows the line."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __str__(self) -> str:
        return self.fn(*self.args)


def _key_difference(old: tuple, new: tuple) -> str:
    """What changed between two cache keys, in words (the first few differences)."""
    diffs = []
    if old[0] != new[0]:
        diffs.append(f"grad mode {old[0]} -> {new[0]}")
    if old[3] != new[3]:
        diffs.append(f"autocast {old[3]} -> {new[3]}")
    for i, (a, b) in enumerate(zip(old[1], new[1])):
        if a == b:
            continue
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec):
            def show(v):
                return tuple(v) if isinstance(v, torch.Size) else v
            fields = [f"{f} {show(getattr(a, f))} -> {show(getattr(b, f))}" for f in TensorSpec._fields
                      if getattr(a, f) != getattr(b, f)]
            diffs.append(f"input {i}: " + ", ".join(fields))
        else:
            diffs.append(f"input {i}: {a} -> {b}")
    if old[2] != new[2]:
        diffs.append("inputs that share storage changed")
    return "; ".join(diffs[:4]) or "same inputs"


def _effectful_op(exc: AOTAutogradError) -> Optional[str]:
    """Why a graph runs eagerly when functionalization met an op with a side effect that
    must stay ordered (torch.linalg's error checks, `aten._linalg_check_errors`: dropping it
    would return garbage where eager raises), else None."""
    cause = exc.cause
    if isinstance(cause, AssertionError) and "Could not find a token for effect" in str(cause):
        where = f" (in {exc.node.name})" if exc.node is not None else ""
        return f"an op with an ordered side effect{where}: {cause}"
    return None


def _data_dependent_sizes(gm: torch.fx.GraphModule) -> Optional[str]:
    """Why the graph cannot be compiled when a tensor in it has a data-dependent size
    (nonzero, unique, masked_select, `t[t > 0]`: unbacked symbols), else None."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in gm.graph.nodes:
        val = node.meta.get("example_value", node.meta.get("val"))
        for t in pytree.tree_leaves(val):
            if isinstance(t, torch.Tensor) and free_unbacked_symbols(t):
                syms = ", ".join(sorted(map(str, free_unbacked_symbols(t))))
                return (f"{node.name} has a data-dependent size ({syms}): graphs with data-dependent "
                        f"output shapes run their captured ops")
    return None


def _parameters(flat: list) -> set:
    """The positions of the nn.Parameters among a graph's inputs."""
    return {i for i, a in enumerate(flat) if isinstance(a, torch.nn.Parameter)}


def _example_values(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _saved_as_returned(backward: torch.fx.GraphModule, compiled_fw, num_user: int, num_saved: int) -> list:
    """The backward's example inputs, each saved tensor with the strides the compiled forward
    returns it with (`output_strides`, where its compiler reports them): GPT-2's logits come
    out of a padded matmul with gaps between rows, and a backward compiled for eager's dense
    strides copied all 393 MB of them on every call."""
    examples = _example_values(backward)
    strides = getattr(compiled_fw, "output_strides", None) or []
    for i in range(min(num_saved, len(examples))):
        fake, k = examples[i], num_user + i
        want = strides[k] if k < len(strides) else None
        if want is None or not isinstance(fake, torch.Tensor) or len(want) != fake.dim() \
                or tuple(fake.stride()) == want or not all(isinstance(s, int) for s in fake.shape):
            continue
        mode = getattr(fake, "fake_mode", None)
        with mode if mode is not None else nullcontext():
            examples[i] = torch.empty_strided(fake.shape, want, dtype=fake.dtype, device=fake.device)
    return examples
