"""Split a graph captured inside DistributedDataParallel at DDP's gradient-bucket
boundaries, compile each piece with the chosen backend, and run the pieces in order.

Why: a compiled graph's backward is one autograd node, so every parameter's gradient
becomes ready at its very end and DDP's all-reduces start only after the whole backward.
Cut into pieces that each hold about one bucket of parameters, the last piece's backward
runs first, its gradients fill a bucket, and that bucket's all-reduce runs while the
earlier pieces' backward computes.

The buckets are counted the way DDP fills them: gradients become ready in reverse order
of use, so the graph is walked from its end, adding each parameter's bytes (parameters
that require grad and that DDP does not ignore) until the bucket's cap is reached; the
first bucket (the graph's last layers) has DDP's smaller first-bucket cap."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

import observe


@dataclasses.dataclass
class Bucket:
    """One piece of the split graph: the parameters whose gradients it produces."""

    params: list = dataclasses.field(default_factory=list)      # graph input names, in graph order
    size_bytes: int = 0
    nodes: list = dataclasses.field(default_factory=list)       # fx nodes, in graph order
    extended: bool = False    # grown past its cap until one of its values is used after it


@dataclasses.dataclass
class SplitPlan:
    """How one graph was split (kept on the compiled callable as `ddp_split_plan`)."""

    graph_name: str
    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    buckets: list            # list[Bucket], in graph (forward) order
    piece_names: list        # submodule names of the split graph, in call order

    def summary(self) -> str:
        lines = [f"DDP bucket split of {self.graph_name}: {len(self.buckets)} graph(s) "
                 f"(bucket_cap {_mib(self.bucket_cap_bytes)}, first bucket {_mib(self.first_bucket_cap_bytes)})"]
        width = max((len(n) for n in self.piece_names), default=5)
        for name, b in zip(self.piece_names, self.buckets):
            shown = ", ".join(b.params[:6]) + (f", ... ({len(b.params)} in all)" if len(b.params) > 6 else "")
            note = ("  (grown past its cap: no cut point before it, as its values are used only inside it "
                    "or an autocast/grad-mode block spans it)") if b.extended else ""
            lines.append(f"  {name:<{width}}  {len(b.nodes):4d} nodes  {len(b.params):3d} params  "
                         f"{_mib(b.size_bytes):>10}  {shown}{note}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _grad_param(value) -> Optional[torch.Tensor]:
    """The parameter whose gradient DDP all-reduces, or None."""
    if isinstance(value, torch.nn.Parameter) and value.requires_grad and not getattr(value, "_ddp_ignored", False):
        return value
    return None


def _param_bytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def _used_after(bucket_nodes: set, node: torch.fx.Node) -> bool:
    return any(user not in bucket_nodes for user in node.users)


def _cuttable_after(gm: torch.fx.GraphModule) -> dict:
    """node -> whether the graph may be cut right after it: not inside an autocast block or
    a grad-mode change the graph made. Their state nodes act while AOT traces a piece, so a
    piece must not start or end inside one (it would be traced without the casts)."""
    from ..capture import autocast as autocastmod
    ambient_grad = torch.is_grad_enabled()   # the caller's: the graph is compiled at its first call
    depth, grad = 0, ambient_grad
    out = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target is autocastmod.autocast_enter:
                depth += 1
            elif node.target is autocastmod.autocast_exit:
                depth -= 1
            elif node.target is torch._C._set_grad_enabled:
                grad = bool(node.args[0])
        out[node] = depth == 0 and grad == ambient_grad
    return out


def plan_buckets(gm: torch.fx.GraphModule, example_inputs: list, bucket_cap_bytes: int,
                 first_bucket_cap_bytes: int) -> list:
    """Assign every node of `gm` to a bucket; returns the buckets in graph order."""
    cuttable = _cuttable_after(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    input_of = {n: v for n, v in zip(placeholders, example_inputs)}
    counted: set = set()
    filling: list = [Bucket()]       # filling[-1] is the bucket being filled, from the graph's end
    members: set = set()             # the nodes of filling[-1]
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        current = filling[-1]
        cap = first_bucket_cap_bytes if len(filling) == 1 else bucket_cap_bytes
        if current.size_bytes >= cap:
            # a piece none of whose values is used after it would have no outputs, and one cut
            # inside an autocast or grad-mode block would lose it: keep filling it
            if cuttable[node] and any(_used_after(members, n) for n in current.nodes):
                filling.append(Bucket())
                members = set()
                current = filling[-1]
            else:
                current.extended = True
        params = []
        if node.op == "get_attr":
            params.append((node.target, _attr(gm, node.target)))
        for arg in node.all_input_nodes:
            if arg.op == "placeholder":   # named as the user's code reaches it: L['self']._modules['0'].weight
                params.append((arg.meta.get("source") or arg.name, input_of.get(arg)))
        for name, value in params:
            p = _grad_param(value)
            if p is not None and id(p) not in counted:
                counted.add(id(p))
                current.size_bytes += _param_bytes(p)
                current.params.append(name)
        current.nodes.append(node)
        members.add(node)
    if len(filling) > 1 and filling[-1].size_bytes == 0:
        # the graph's first ops use no parameter (an embedding-free preamble): not a piece of its own
        filling[-2].nodes.extend(filling.pop().nodes)
    buckets = list(reversed(filling))
    for b in buckets:
        b.nodes.reverse()
        b.params.reverse()
    return buckets


def _attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


class _Piece(torch.nn.Module):
    """A compiled piece in the split graph's place of the submodule it came from."""

    def __init__(self, compiled: Callable, name: str):
        super().__init__()
        self.compiled = compiled
        self.piece_name = name

    def forward(self, *args):
        return self.compiled(*args)


def split_and_compile(gm: torch.fx.GraphModule, example_inputs: list, backend: Callable,
                      bucket_cap_bytes: int, first_bucket_cap_bytes: int) -> Callable:
    """The backend call inside DDP: one compiled callable with `gm`'s calling convention,
    made of one compiled piece per bucket (just `backend(gm, ...)` when one bucket holds all)."""
    graph_name = (getattr(gm, "meta", None) or {}).get("compiled_name", "graph")
    buckets = plan_buckets(gm, example_inputs, bucket_cap_bytes, first_bucket_cap_bytes)
    if len(buckets) == 1:
        plan = SplitPlan(graph_name, bucket_cap_bytes, first_bucket_cap_bytes, buckets, [graph_name])
        _report(plan, None)
        compiled = backend(gm, example_inputs)
        _remember(compiled, plan)
        return compiled
    piece_of = {n: i for i, b in enumerate(buckets) for n in b.nodes}
    split = split_module(gm, None, lambda node: piece_of[node])
    names = [n.target for n in split.graph.nodes if n.op == "call_module"]
    # split_module numbers submodules by bucket index; call order follows the graph
    ordered = [buckets[int(name.rsplit("_", 1)[1])] for name in names]
    plan = SplitPlan(graph_name, bucket_cap_bytes, first_bucket_cap_bytes, ordered, names)
    _report(plan, split)
    values = _example_values(gm, example_inputs)
    for name in names:
        sub = getattr(split, name)
        sub.meta = {"compiled_name": f"{graph_name}_{name}"}
        sub_inputs = [values[n.name] for n in sub.graph.nodes if n.op == "placeholder"]
        t0 = time.time()
        with observe.stage("backend_compile", piece=name):
            compiled = backend(sub, sub_inputs)
        observe.log("dynamo", 10, "DDP piece %s of %s compiled in %.3fs", name, graph_name, time.time() - t0)
        setattr(split, name, _Piece(compiled, name))
    split.recompile()
    _remember(split, plan)
    return split


def _remember(compiled, plan: SplitPlan) -> None:
    try:
        compiled.ddp_split_plan = plan
    except (AttributeError, TypeError):   # a backend that returned a bound method or a C callable
        pass


def _example_values(gm: torch.fx.GraphModule, example_inputs: list) -> dict:
    """Each node's example value by name: the real inputs for placeholders, the capture's
    FakeTensors for intermediate values (split_module names a piece's inputs after them)."""
    values: dict[str, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, v in zip(placeholders, example_inputs):
        values[n.name] = v
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "output"):
            values[n.name] = n.meta.get("example_value", n.meta.get("val"))
    return values


def _report(plan: SplitPlan, split: Optional[torch.fx.GraphModule]) -> None:
    """TORCH_LOGS=ddp_graphs shows the plan; the trace gets PyTorch's split events (tlparse
    lists them on the compile's page)."""
    observe.emit("artifact", {"name": "ddp_bucket_split", "encoding": "string",
                              "graphs": len(plan.buckets), "bucket_cap_bytes": plan.bucket_cap_bytes},
                 lambda: plan.summary(), log="ddp_graphs")
    if split is None:
        return
    observe.emit("optimize_ddp_split_graph", {}, lambda: split.print_readable(print_output=False),
                 log="ddp_graphs", level=10)
    for name in plan.piece_names:
        sub = getattr(split, name)
        observe.emit("optimize_ddp_split_child", {"name": name},
                     (lambda sub=sub: sub.print_readable(print_output=False)), log="ddp_graphs", level=10)
