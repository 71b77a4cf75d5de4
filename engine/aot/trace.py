"""Aten-level tracing of the captured graph under FakeTensors with make_fx, functionalized:
the traced graphs have no mutation ops. The new value of each mutated input is returned as
an extra leading output, for the runtime epilogue to copy back.

Two traces: the inference graph (forward only) and the joint graph, forward and backward in
one graph: `joint(primals, tangents) -> [*forward_outputs, *grads]`."""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Optional

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import make_fx

import observe

from .cse import eliminate_common_subexpressions
from .errors import AOTAutogradError, BackwardTraceError
from .inputs import LiftedParams
from .interpret import run_captured_graph
from .metadata import GraphMeta
from . import provenance


@dataclasses.dataclass
class JointLayout:
    num_primals: int
    num_tangents: int
    num_forward_outputs: int          # mutated-input values first, then user outputs
    grad_inputs: list[int]            # the primal each grad output belongs to


def to_fun(t: Any) -> Any:
    return FunctionalTensor.to_functional(t) if isinstance(t, torch.Tensor) else t


def from_fun(t: Any) -> Any:
    if isinstance(t, FunctionalTensor):
        torch._sync(t)
        return torch._from_functional_tensor(t.elem)
    return t


def exclude_functionalize_key():
    # Python-level functionalization (FunctionalTensorMode) must not see the C++
    # Functionalize key above it (as torch's own AOT stage does).
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))


class Tracer:
    def __init__(self, gm: torch.fx.GraphModule, lifted: LiftedParams, meta: GraphMeta, num_user: int,
                 fake_mode, decompositions: Optional[dict]):
        self.gm, self.lifted, self.meta, self.num_user = gm, lifted, meta, num_user
        self.fake_mode, self.decompositions = fake_mode, decompositions

    def forward_outputs(self, f_args: list) -> list:
        out = run_captured_graph(self.gm, self.lifted, f_args[:self.num_user], f_args[self.num_user:],
                                 step="tracing to aten")
        leaves = pytree.tree_leaves(out)
        return [f_args[i] for i in self.meta.mutated_inputs] + [leaves[j] if j >= 0 else leaves[~j]._base
                                                                for j in self.meta.graph_output_leaves]

    def make_fx(self, fn, *args) -> torch.fx.GraphModule:
        try:
            with self.fake_mode, enable_python_dispatcher(), FunctionalTensorMode(), \
                    fx_traceback.preserve_node_meta(), _use_lazy_graph_module(True):
                traced = make_fx(fn, decomposition_table=self.decompositions or {})(*args)
        except AOTAutogradError:
            raise
        except Exception as exc:   # outside any one node: make_fx itself, or functionalization
            raise AOTAutogradError("tracing to aten", None, exc) from exc
        _cleanup(traced)
        provenance.stamp(traced)
        merged = eliminate_common_subexpressions(traced)
        if merged:
            observe.log("aot", logging.DEBUG, "common subexpressions: %d repeated calls merged", merged)
        return traced

    def trace_inference(self, fakes: list, autograd: bool = False) -> torch.fx.GraphModule:
        """`autograd`: the graph calls the backward itself (loss.backward() in the graph):
        traced with grad mode on and the inputs requiring grad as they do, so that the
        backward is traced from the forward's autograd graph, as the joint trace does."""
        def inference(primals):
            with exclude_functionalize_key():
                f_args = [to_fun(a) for a in primals]
                with torch.enable_grad() if autograd else torch.no_grad():
                    outs = self.forward_outputs(f_args)
            return [from_fun(o) for o in outs]

        if autograd:
            return self.make_fx(inference, list(fakes))
        # The inputs as they are without autograd: a graph that turns grad mode back on
        # (`with no_grad():` in the user's code) would otherwise meet autograd's checks on
        # views made under the trace's own no_grad.
        return self.make_fx(inference, [a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a
                                        for a in fakes])

    def trace_joint(self, fakes: list) -> tuple[torch.fx.GraphModule, JointLayout]:
        meta = self.meta
        mask = meta.tangent_mask()
        fw_fakes = [None] * meta.num_mutations + list(meta.graph_output_fakes)
        for k, i in enumerate(meta.mutated_inputs):
            fw_fakes[k] = fakes[i]
        with self.fake_mode:
            # Tangents are traced contiguous; the runtime makes the real ones contiguous too.
            tangents = [torch.empty(f.shape, dtype=f.dtype, device=f.device) for f, m in zip(fw_fakes, mask) if m]
        grad_inputs = [i for i, info in enumerate(meta.inputs) if info.requires_grad]
        present: list[int] = []

        def joint(primals, tangents):
            with exclude_functionalize_key():
                f_args = [to_fun(a) for a in primals]
                f_tangents = [to_fun(t) for t in tangents]
                with torch.enable_grad():
                    # Anomaly mode records each autograd node's forward source line, which the
                    # hooks below replay so that backward aten nodes carry it too.
                    with torch.autograd.set_detect_anomaly(True, check_nan=False):
                        outs = self.forward_outputs(f_args)
                    needed = [o for o, m in zip(outs, mask) if m]
                    _replay_forward_stacks([o.grad_fn for o in needed if o.grad_fn is not None])
                    wrt = [f_args[i] for i in grad_inputs]
                    try:
                        grads = torch.autograd.grad(needed, wrt, f_tangents, allow_unused=True)
                    except AOTAutogradError:
                        raise
                    except Exception as exc:
                        raise BackwardTraceError("tracing the backward (torch.autograd.grad over the forward)",
                                                 None, exc) from exc
            present[:] = [i for i, g in zip(grad_inputs, grads) if g is not None]
            return [from_fun(o) for o in outs] + [from_fun(g) for g in grads if g is not None]

        traced = self.make_fx(joint, list(fakes), tangents)
        layout = JointLayout(num_primals=len(fakes), num_tangents=len(tangents),
                             num_forward_outputs=len(fw_fakes), grad_inputs=list(present))
        return traced, layout


def _replay_forward_stacks(roots: list) -> None:
    """While autograd traces the backward, set the current FX stack trace and sequence
    number to those of the forward op each backward node differentiates."""
    seen = set(roots)
    work = collections.deque(roots)
    while work:
        node = work.popleft()
        for fn, _ in node.next_functions:
            if fn is not None and fn not in seen:
                seen.add(fn)
                work.append(fn)
        stack = node.metadata.get("traceback_", [])

        def prehook(grad_outputs, stack=stack, seq=node._sequence_nr()):
            fx_traceback.set_stack_trace(stack)
            fx_traceback.set_grad_fn_seq_nr(seq)   # provenance.stamp pairs it with the forward op

        def posthook(grad_inputs, grad_outputs):
            fx_traceback.set_stack_trace([])
            fx_traceback.reset_grad_fn_seq_nr()

        node.register_prehook(prehook)
        node.register_hook(posthook)


def _cleanup(gm: torch.fx.GraphModule) -> None:
    """Drop `detach` (a no-op in a graph that autograd never sees) and dead nodes."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (torch.ops.aten.detach.default,):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def graph_module(root, graph: torch.fx.Graph, class_name: str = "GraphModule") -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated when first read or called, not at each
    `recompile()`: the AOT graphs pass through several rewrites, and the code generator reads
    only their nodes (a 16-layer Llama step's graphs spent ~1.5 s writing code nobody ran)."""
    return _LazyGraphModule(root, graph, class_name=class_name)


def output_nodes(gm: torch.fx.GraphModule) -> list:
    """The flat list of output nodes of a traced graph (make_fx returns a list)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(pytree.tree_leaves(out.args[0], is_leaf=lambda x: x is None))


def placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]



