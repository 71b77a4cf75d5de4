"""compile_fx_graph: aten FX graph -> a callable running generated kernels.

lowering (graph.py, lowerings.py) -> scheduling and fusion (scheduler.py) -> C++ kernels
(cpp.py) and the Python wrapper (wrapper.py) -> one shared library (cache.py). Anything the
codegen cannot handle falls back: an unlowered op to an extern aten call, a graph it cannot
compile at all to running the aten graph as it is; both are reported on perf_hints."""

from __future__ import annotations

import hashlib
import json
import linecache
import logging
import traceback
import types

import sympy
import torch
from torch.utils import _pytree as pytree

import observe

from . import values as V
from . import cache_explain, kernel_copies
from .cache import has_vector_math
from .cpp import prelude, render_kernel
from .graph import GraphLowering, Unsupported
from .ir import ExternKernel, format_node
from .channels_last import convolutions_channels_last
from .pad_mm import pad_matmuls
from .wide_matmul import widen_matmuls
from .runtime import LayoutMismatch
from .provenance import kernel_origins
from .scheduler import FusedKernel, schedule
from .wrapper import generate

_graph_counter = [0]


class CompiledGraph:
    """The callable handed back to AOT: call(*args) -> the graph's outputs."""

    def __init__(self, gm, call, out_spec, wrapper_source, n_kernels, n_externs, fallback_reason=None,
                 artifacts=None):
        self.gm = gm
        self._call = call
        self.out_spec = out_spec
        self.source = wrapper_source
        self.n_kernels = n_kernels
        self.n_externs = n_externs
        self.fallback_reason = fallback_reason
        self.artifacts = artifacts or {}
        self.extern_ops: list = []
        self.fallback_ops: list = []
        self.mutated_args: frozenset = frozenset()   # input positions the graph writes in place
        # each output's strides where the generated code fixes them (None: eager's, or unknown);
        # a padded matmul's product returned with gaps. The backward graph is compiled for the
        # strides its saved tensors really have, not copied to eager's on every call.
        self.output_strides: list = []
        # the usual outputs, a flat list or tuple, are the wrapper's list as it is (or as a tuple)
        shape = pytree.tree_unflatten(list(range(out_spec.num_leaves)), out_spec)
        self._flat = type(shape) if type(shape) in (list, tuple) and list(shape) == list(range(len(shape))) else None

    def __call__(self, *args):
        return self.call_boxed(list(args))

    def call_boxed(self, args: list):
        """As __call__, but the list is the caller's last reference to its tensors and is
        consumed: the wrapper frees each after its last use (a backward's saved activations,
        freed as the backward goes instead of all at its end)."""
        if self._call is None:
            return self.gm(*args)
        try:
            outs = self._call(args)
        except LayoutMismatch:   # raised before the wrapper consumes the list
            _hint("an input mutated in place arrived with other strides than at compile time: "
                  "running the aten graph for this call")
            return self.gm(*args)
        if self._flat is list:
            return outs
        return tuple(outs) if self._flat is tuple else pytree.tree_unflatten(outs, self.out_spec)


def _hint(msg, *args):
    observe.emit("artifact", {"name": "perf_hints", "encoding": "string"}, lambda: msg % args if args else msg,
                 log="perf_hints")


def graph_key(gm, example_inputs) -> str:
    meta = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            meta.append((str(x.dtype), tuple(map(str, x.shape)), tuple(map(str, x.stride()))))
        else:
            meta.append(repr(type(x)))
    writes = repr((sorted(gm.meta.get("mutated_inputs", {}).items()), gm.meta.get("user_outputs"),
                   sorted(gm.meta.get("pinned_inputs", ()))))
    return hashlib.sha256((gm.code + repr(meta) + writes).encode()).hexdigest()[:16]


def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs) -> CompiledGraph:
    _graph_counter[0] += 1
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    _, out_spec = pytree.tree_flatten(out_node.args[0])
    try:
        _refuse_data_dependent_sizes(gm)
        return _compile(gm, example_inputs, out_spec)
    except Exception as exc:   # never a wrong result: run the aten graph as it is
        from engine import config
        if config.repro_after is not None and not isinstance(exc, Unsupported):
            raise    # the minifier is on (docs/minifier.md): it wants this crash, which the fallback hides
        return uncompiled(gm, out_spec, exc, "codegen",
                          logging.WARNING if not isinstance(exc, Unsupported) else logging.INFO)


def _refuse_data_dependent_sizes(gm) -> None:
    """The wrapper cannot compute a size only known after a kernel ran (nonzero, unique:
    an unbacked symbol u0)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in gm.graph.nodes:
        for t in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(t, torch.Tensor) and free_unbacked_symbols(t):
                raise Unsupported(f"{node.name} has a data-dependent size "
                                  f"({', '.join(sorted(map(str, free_unbacked_symbols(t))))})")


def uncompiled(gm, out_spec, exc: Exception, what: str, level: int) -> CompiledGraph:
    """The graph codegen could not compile, run as its aten ops; the reason goes to the
    inductor log and perf_hints."""
    reason = f"{type(exc).__name__}: {exc}"
    observe.log("inductor", level, what + " could not compile this graph, running its aten ops: %s", reason)
    observe.log("inductor", logging.DEBUG, "%s", traceback.format_exc())
    _hint("whole graph runs uncompiled (aten ops one by one): %s", reason)
    observe.emit("artifact", {"name": "graph_uncompiled", "encoding": "string", "stage": what,
                              "crash": not isinstance(exc, Unsupported)}, lambda: reason)
    cache_explain.report("bypass", "(not compiled)", None, [], [f"{what} could not compile this graph: {reason}"])
    return CompiledGraph(gm, None, out_spec, None, 0, 0, fallback_reason=reason)


def output_buffers(g) -> set:
    """The buffers the graph's outputs are views of."""
    out = set()
    for o in g.outputs:
        view = g.as_strided(o) if hasattr(o, "loader") else None
        if view is not None:
            out.add(view[0])
    return out


def lower_and_schedule(gm, example_inputs):
    """Lowering and scheduling, shared by the C++ and Triton emitters: returns the graph's
    cache key, its lowering, its schedule and the pre-fusion IR text (None when nothing
    reads it: _debug_texts_wanted)."""
    from engine import config
    # rewrites before the key: the rewritten graph is what gets compiled
    if pad_matmuls(gm):
        _hint("16-bit matmuls with a size not a multiple of 8 run on zero-padded operands (pad_mm.py)")
    if config.wide_matmul and widen_matmuls(gm):
        _hint("16-bit matmuls whose product the graph returns cast to fp32 compute fp32 directly (wide_matmul.py)")
    if convolutions_channels_last(gm):
        _hint("convolutions run channels-last; the graph's input is copied to that layout once (channels_last.py)")
    key = graph_key(gm, example_inputs)
    with observe.stage("lowering"):
        g = GraphLowering(gm, example_inputs).run()
    ir_pre = "\n\n".join(format_node(n) for n in g.nodes) if _debug_texts_wanted() else None
    for op in g.fallback_ops:
        _hint("%s has no lowering: it runs as an extern kernel (aten call), not fused", op)

    graph_inputs = {b.name for b in g.inputs if b is not None}
    user_ops = {n.name: n.meta["fx_origins"] for n in gm.graph.nodes if n.meta.get("fx_origins")}
    sched = schedule(g.nodes, output_buffers(g), graph_inputs, g.write_back, user_ops, g.backward_starts)
    g.mutated_inputs |= {t for n, t in sched.reuse.items() if t in graph_inputs}   # written in place
    observe.emit("artifact", {"name": "schedule", "encoding": "string"},
                 lambda: "\n".join(sched.log), log="schedule")
    g.kernel_origins = {o.kernel: o for o in kernel_origins(gm, sched.steps)}
    role, gid = gm.meta.get("aot_graph", ("inference", None))
    observe.emit("artifact", {"name": "kernel_provenance", "encoding": "json"},
                 lambda: json.dumps({"graph": role, "aot_graph": gid, "key": key,
                                     "kernels": [o.to_json() for o in g.kernel_origins.values()]}),
                 log="kernel_provenance")
    return key, g, sched, ir_pre


def load_wrapper(wrapper_src: str, key: str, g) -> types.ModuleType:
    """Emit the wrapper as output code and run it as a module (which loads the kernels),
    with the graph's constant tensors set on it."""
    observe.emit("inductor_output_code", {"filename": f"output_code_{key}.py"}, lambda: wrapper_src,
                 log="output_code")
    module = types.ModuleType(f"engine_codegen_graph_{key}")
    module.__file__ = f"<engine codegen graph {key}>"
    # tracebacks and profilers (the allocator's history) show the generated line
    linecache.cache[module.__file__] = (len(wrapper_src), None, wrapper_src.splitlines(True), module.__file__)
    exec(compile(wrapper_src, module.__file__, "exec"), module.__dict__)
    for name, value in g.constants.items():
        setattr(module, name, value)
    return module


def finish(gm, g, sched, module, out_spec, wrapper_src, n_kernels: int, artifacts: dict) -> CompiledGraph:
    """The CompiledGraph of a loaded wrapper; remembered as the last one for debug_files."""
    output_strides = [_static_strides(g, o) for o in g.outputs]
    V.reset()
    n_externs = sum(isinstance(s, ExternKernel) for s in sched.steps)
    compiled = CompiledGraph(gm, module.call, out_spec, wrapper_src, n_kernels, n_externs, artifacts=artifacts)
    compiled.extern_ops = list(g.extern_ops)
    compiled.fallback_ops = list(g.fallback_ops)
    compiled.mutated_args = frozenset(b.arg_index for b in g.inputs if b is not None and b.arg_index >= 0
                                      and b.name in g.mutated_inputs)
    compiled.output_strides = output_strides
    _last[0] = compiled
    return compiled


def _static_strides(g, value):
    view = g.as_strided(value) if hasattr(value, "loader") else None
    if view is None or not all(isinstance(s, sympy.Integer) for s in view[1].strides):
        return None
    return tuple(int(s) for s in view[1].strides)


def _compile(gm, example_inputs, out_spec) -> CompiledGraph:
    from . import triton as triton_codegen
    triton_codegen.start_workers(example_inputs)
    key, g, sched, ir_pre = lower_and_schedule(gm, example_inputs)
    cache_explain.describe_graph(key, gm, example_inputs)   # what a kernel cache miss is explained against
    if triton_codegen.wanted(g):     # CUDA tensors (or config.triton_interpret): the Triton emitter
        cache_explain.report("bypass", key, None, [], ["Triton kernels: cached by Triton's own cache "
                                                       "(TRITON_CACHE_DIR), not explained here"])
        return triton_codegen.compile_triton(gm, g, sched, out_spec, key, ir_pre)

    with observe.stage("codegen"):
        kernel_sigs, kernel_srcs = {}, {}
        for step in sched.steps:
            if isinstance(step, FusedKernel):
                src, bufs, syms, written = render_kernel(step, g.buffer_layouts)
                kernel_sigs[step.name] = (bufs, syms, written)
                kernel_srcs[step.name] = src
                observe.emit("artifact", {"name": "kernel_code", "kernel": step.name, "encoding": "string"},
                             (lambda s=src, n=step.name: f"# kernel {n}\n{s}"), log="kernel_code")
                _kernel_hints(step, g)
        same_as = kernel_copies.copies({n: (src, None) for n, src in kernel_srcs.items()})
        cpp_source = prelude(has_vector_math()) + "\n" + "\n".join(
            src for n, src in kernel_srcs.items() if n not in same_as)
        wrapper_src = generate(g, sched, cpp_source, kernel_sigs, repr(out_spec), key, same_as)
        if not kernel_sigs:
            cache_explain.report("bypass", key, None, [], ["no generated kernels: every op runs as an aten call"])
    module = load_wrapper(wrapper_src, key, g)      # compiles (or loads from the cache) the kernels
    artifacts = debug_artifacts(gm, sched, ir_pre, {"output_code.py": wrapper_src})
    return finish(gm, g, sched, module, out_spec, wrapper_src, len(kernel_sigs), artifacts)


def _debug_texts_wanted() -> bool:
    """Whether anything reads the FX graph and IR dumps: a trace (TORCH_TRACE), the debug
    folder (TORCH_COMPILE_DEBUG), TORCH_LOGS=ir_pre_fusion,ir_post_fusion. Writing them costs
    ~1-2 s on a large graph (a 16-layer Llama training step), so with no reader they are not made."""
    return observe.enabled("artifact", "ir_pre_fusion") or observe.enabled("artifact", "ir_post_fusion")


def debug_artifacts(gm, sched, ir_pre: str | None, texts: dict) -> dict:
    """The TORCH_COMPILE_DEBUG files of a graph (`debug_files`): `texts` (the output code and
    the emitter's own), and, when something reads them (ir_pre is then made), the FX graph and
    the IR before and after fusion, each also emitted as an artifact event."""
    if ir_pre is None:
        return dict(texts)
    dumps = {"fx_graph_transformed.py": (gm.print_readable(print_output=False), None),
             "ir_pre_fusion.txt": (ir_pre + "\n", "ir_pre_fusion"),
             "ir_post_fusion.txt": (_post_fusion_text(sched), "ir_post_fusion")}
    for fname, (text, log) in dumps.items():
        observe.emit("artifact", {"name": fname.rsplit(".", 1)[0], "filename": fname, "encoding": "string"},
                     (lambda t=text: t), log=log)
    return {**{f: t for f, (t, _log) in dumps.items()}, **texts}


def _kernel_hints(fk: FusedKernel, g: GraphLowering):
    for m in fk.members:
        if m.name in fk.stored and not m.buf.layout.is_contiguous():
            _hint("%s in %s is stored with non-contiguous strides %s", m.name, fk.name, list(m.buf.layout.strides))
    if fk.outer == () and any(ph.reduction for ph in fk.phases):
        _hint("%s reduces to a single value on one thread (no outer loop to parallelize)", fk.name)


def _post_fusion_text(sched) -> str:
    out = []
    for step in sched.steps:
        if isinstance(step, ExternKernel):
            out.append(format_node(step))
            continue
        out.append(f"{step.name}: outer={list(step.outer)} stores={sorted(step.stored)}")
        for p, ph in enumerate(step.phases):
            out.append(f"  phase {p} inner={list(ph.inner)}{' (reduction)' if ph.reduction else ''}")
            for m in ph.members:
                kind = m.buf.data.reduction_type if m.buf.is_reduction else "pointwise"
                where = "stored" if m.name in step.stored else "registers"
                out.append(f"    {m.name} [{kind}, {where}] = {m.value!r}")
    return "\n".join(out) + "\n"


_last = [None]


def debug_files(compiled=None) -> dict:
    """The TORCH_COMPILE_DEBUG files of a compiled graph (the last one by default):
    fx_graph_transformed.py, ir_pre_fusion.txt, ir_post_fusion.txt, output_code.py."""
    compiled = compiled if compiled is not None else _last[0]
    return dict(compiled.artifacts) if compiled is not None else {}
