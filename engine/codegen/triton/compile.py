"""The Triton path of compile_fx: a scheduled graph -> one module of @triton.jit kernels
and a Python wrapper that allocates buffers, launches the kernels and calls the extern
aten ops (matmuls stay cuBLAS; their pointwise epilogues are fused Triton kernels over
their outputs, as the scheduler fused them)."""

from __future__ import annotations

import hashlib

import observe

import torch

from engine import config

from .. import kernel_copies
from .. import values as V
from ..scheduler import FusedKernel
from ..runtime import meta_empty_strided
from ..ir import TensorValue
from ..wrapper import (_arg_expr, _buffers_read, _extern_call, call_body, empty_strided_line, extern_call_expr,
                       fresh_and_contiguous, pyexpr, tup)
from . import combo, native_launch
from .kernel import Unsupported, module_prelude, render_kernel
from .launcher import compile_workers, precompile_graph


def wanted(g) -> bool:
    """Whether this graph's kernels are Triton: CUDA tensors, or CPU tensors when
    engine.config.triton_interpret asks for the Triton interpreter (tests)."""
    devices = {lay.device.type for lay in g.buffer_layouts.values()}
    if "cuda" in devices:
        return True
    return bool(getattr(config, "triton_interpret", False)) and devices <= {"cpu"}


def start_workers(example_inputs) -> None:
    """Start the compile worker processes when a graph of CUDA tensors comes in, so they
    load Triton while it lowers, and the C++ launcher's build (or its load, where built)."""
    if any(getattr(a, "is_cuda", False) for a in example_inputs):
        native_launch.start()
        if config.triton_precompile:
            compile_workers()


def _precompile_early(module, example_inputs) -> None:
    """Start compiling a static graph's kernels in the worker processes now, not on its
    first call: a training graph's forward kernels compile while its backward graph
    lowers, and its backward kernels while the forward runs. The inputs' stand-ins are
    meta tensors of their sizes, strides and dtypes (a launch specializes on a pointer's
    16-byte alignment: a real input not aligned so compiles its own binary then)."""
    import torch

    workers = compile_workers()
    if workers is None or not workers.ready.is_set():
        return
    stand_ins = [meta_empty_strided(tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else x
                 for x in example_inputs]
    precompile_graph(module._precompile, stand_ins, early=True)


def _check_devices(fk: FusedKernel, layouts: dict, interpret: bool):
    want = "cpu" if interpret else "cuda"
    names = {m.name for m in fk.members} | {ld.name for m in fk.members for ld in V.loads(m.value)}
    for n in names:
        if layouts[n].device.type != want:
            raise Unsupported(f"{fk.name} mixes devices: {n} is on {layouts[n].device}")


def compile_triton(gm, g, sched, out_spec, key: str, ir_pre: str | None):
    """Render, load and wrap; returns compile_fx's CompiledGraph."""
    from ..compile_fx import _hint, _kernel_hints, debug_artifacts, finish, load_wrapper, output_buffers

    interpret = not any(lay.device.type == "cuda" for lay in g.buffer_layouts.values())
    autotune = getattr(config, "triton_autotune", False) or getattr(config, "max_autotune", False)
    needed = output_buffers(g)
    reads_by_step = [step.reads() for step in sched.steps]
    with observe.stage("codegen"):
        kernels = {}
        for i, step in enumerate(sched.steps):
            if isinstance(step, FusedKernel):
                elsewhere = set().union(*(r for j, r in enumerate(reads_by_step) if j != i))
                _check_devices(step, g.buffer_layouts, interpret)
                ks = render_kernel(step, g.buffer_layouts, interpret, needed | elsewhere)
                kernels[step.name] = ks
                observe.emit("artifact", {"name": "kernel_code", "kernel": step.name, "encoding": "string"},
                             (lambda s=ks: f"# kernel {s.name} ({s.kind}{', persistent' if s.persistent else ''})"
                                           f"\n{s.source}"), log="kernel_code")
                _kernel_hints(step, g)
                _triton_hints(ks, _hint)
        combos = _combos(sched, kernels, interpret) if config.combo_kernels else []
        same_as = _same_kernels(kernels, {ks.name for c in combos for ks in c.members})
        kernel_src = module_prelude(interpret) + "\n\n".join(
            [k.source for k in kernels.values() if k.name not in same_as] + [combo.source(c) for c in combos])
        wrapper_src = generate(g, sched, kernel_src, kernels, key, interpret, autotune, combos, same_as)
    module = load_wrapper(wrapper_src, key, g)   # loads the kernels
    if not interpret:
        native_launch.when_ready(module)
    if hasattr(module, "_precompile") and not g.sym_bindings:
        _precompile_early(module, g.example_inputs)
    artifacts = debug_artifacts(gm, sched, ir_pre, {"output_code.py": wrapper_src, "triton_kernels.py": kernel_src})
    compiled = finish(gm, g, sched, module, out_spec, wrapper_src, len(kernels), artifacts)
    compiled.triton_kernels = kernels
    compiled.module = module    # kept while the graph is: native_launch switches its allocators when built
    return compiled


def _same_kernels(kernels: dict, in_combos: set) -> dict:
    """name -> the earlier kernel it is a copy of (kernel_copies): the copy launches the first
    one's binary, and a profile shows one kernel launched once a layer. Kernels launched
    inside a combo keep their own."""
    def launch(ks):
        return ks.kind, ks.persistent, ks.x_contiguous, ks.split_slots, _inplace(ks), str(ks.xnumel), str(ks.rnumel)
    return kernel_copies.copies({n: (ks.source, launch(ks)) for n, ks in kernels.items() if n not in in_combos})


def _inplace(ks) -> tuple:
    """Positions of the buffers the kernel reads and writes (autotuning times it on copies)."""
    return tuple(i for i, b in enumerate(ks.buffers) if b in ks.written and b in ks.read)


def _combos(sched, kernels: dict, interpret: bool) -> list:
    combos = []
    for idx in combo.plan(sched.steps, kernels, sched.reuse):
        c = combo.build(len(combos), idx, [kernels[sched.steps[i].name] for i in idx], interpret)
        combos.append(c)
        observe.emit("artifact", {"name": "fusion", "encoding": "string"},
                     lambda c=c: f"combined: {', '.join(ks.name for ks in c.members)} launch as one kernel, "
                                 f"{c.name} ({c.total_blocks} programs of {c.xblock}): independent pointwise "
                                 f"kernels in a row", log="fusion")
    return combos


def _triton_hints(ks, hint):
    if ks.kind == "reduction" and not ks.persistent and not ks.split_slots:
        hint("%s loops over rows of %s elements (not persistent: the row is larger than one block or dynamic); "
             "each phase re-reads its inputs", ks.name, ks.rnumel)
    if ks.kind == "reduction" and ks.xnumel == 1 and not ks.split_slots:
        hint("%s reduces everything in one program (no split reduction): slow for large inputs", ks.name)


def _graph_gpu(g, interpret: bool):
    """The index of the one GPU the graph's buffers are on, where its launches repeat (None:
    the Triton interpreter, or several GPUs: every launch takes the Launcher's path)."""
    devices = {lay.device for lay in g.buffer_layouts.values() if lay.device.type == "cuda"}
    if interpret or len(devices) != 1:
        return None
    return next(iter(devices)).index


def generate(g, sched, kernel_src: str, kernels: dict, graph_key: str, interpret: bool, autotune: bool,
             combos: list = (), same_as: dict | None = None) -> str:
    same_as = same_as or {}
    src_hash = hashlib.sha256(kernel_src.encode()).hexdigest()[:16]
    gpu = _graph_gpu(g, interpret)
    allocators: dict = {}      # buffer -> its layout, allocated by a module-level allocator

    def alloc(name, layout):
        if interpret or not all(getattr(x, "is_Integer", False) for x in (*layout.sizes, *layout.strides)):
            return empty_strided_line(name, layout)
        allocators[name] = layout
        return f"{name} = _alloc_{name}()"
    gemms = {} if config.direct_matmul else None     # matmul result -> its Gemm's (bias, out_dtype)
    body = _body(g, sched, kernels, combos, precompile=False, gpu=gpu, alloc=alloc, gemms=gemms)
    lines = [
        "# Generated by engine.codegen (Triton): the wrapper of one compiled graph.",
        "import torch",
        "from engine.codegen.runtime import ensure_layout, expect_input, meta_empty_strided",
        "from engine.codegen.triton.heuristics import Config",
        "from engine.codegen.triton.launcher import Launcher, gemm_stream, launch_stream, load_module, "
        "precompile_graph, wait_precompiled",
        "from engine.codegen.triton.native_launch import allocator, gemm",
        "aten = torch.ops.aten",
        "prims = torch.ops.prims",
        "empty_strided = torch.empty_strided",
        "",
    ]
    if kernels:
        lines.append(f"TRITON_SOURCE = r'''{kernel_src}'''")
        lines.append(f"_mod = load_module(TRITON_SOURCE, interpret={interpret})")
        for name, ks in kernels.items():
            if name in same_as:
                lines.append(f"{name} = {same_as[name]}  # the same kernel")
                continue
            inplace = _inplace(ks)
            split = f", split_fn=_mod.{name}_split, split_slots={ks.split_slots}" if ks.split_slots else ""
            lines.append(f"{name} = Launcher(_mod.{name}, {name!r}, {ks.kind!r}, persistent={ks.persistent}, "
                         f"x_contiguous={ks.x_contiguous}, autotune={autotune}, interpret={interpret}, "
                         f"inplace_args={inplace!r}, source_hash={src_hash!r}{split}, device={gpu})")
        for c in combos:
            lines.append(f"{c.name} = Launcher(_mod.{c.name}, {c.name!r}, 'pointwise', persistent=False, "
                         f"x_contiguous=False, autotune=False, interpret={interpret}, inplace_args=(), "
                         f"source_hash={src_hash!r}, fixed=Config({c.xblock}, 1, {c.num_warps}), device={gpu})")
        lines.append("")
    for name, lay in allocators.items():
        lines.append(f"_alloc_{name} = allocator({tup(lay.sizes)}, {tup(lay.strides)}, {lay.dtype}, '{lay.device}')")
    for name, (bias, out_dtype) in (gemms or {}).items():
        lines.append(f"_gemm_{name} = gemm({bias}, {out_dtype})")
    for name in g.constants:
        lines.append(f"{name} = None  # set by the loader: a constant tensor of the graph")
    lines.append("")
    precompile = bool(kernels) and not interpret and not autotune and config.triton_precompile
    if precompile:
        lines.append("_first_call = [True]")
        lines.append("")
        lines.append("def _precompile(args, early=False):")
        lines.append('    """Compile every kernel of the graph side by side (no launch, externs not run); early:')
        lines.append('    at codegen, with stand-ins for the inputs: start worker compiles only, wait for none."""')
        lines.append("    empty_strided = meta_empty_strided")
        lines.append("    _jobs = []")
        lines.extend("    " + ln for ln in _body(g, sched, kernels, combos, precompile=True))
        lines.append("    if not early:")
        lines.append("        wait_precompiled(_jobs)")
        lines.append("")
    lines.append("def call(args):")
    if precompile:
        lines.append("    if _first_call[0]:")
        lines.append("        _first_call[0] = False")
        lines.append("        precompile_graph(_precompile, args)")
    lines.extend("    " + ln for ln in body)
    lines.append("")
    return "\n".join(lines)


def _body(g, sched, kernels, combos, precompile: bool, gpu=None, alloc=empty_strided_line, gemms=None) -> list:
    """The wrapper's lines; gemms (a dict): where given, 16-bit matmuls go through
    native_launch's Gemm, and it is filled with each one's result name -> (bias, out_dtype)."""
    # a combo launches at its last member's step; the members before it launch nothing
    combo_of = {sched.steps[i].name: c for c in combos for i in c.steps}
    launched_at = {i: c.steps[-1] for c in combos for i in c.steps}
    repeats = []      # the static launches, which repeat on the call's stream (_s)

    def kernel_call(step, resolve):
        c = combo_of.get(step.name)
        if c is not None:
            if step.name != sched.steps[c.steps[-1]].name:
                return []
            name, args, sizes = c.name, [resolve(b) for b in c.buffers], [f"xnumel={c.total_blocks * c.xblock}"]
            static = True
        else:
            ks = kernels[step.name]
            name, args = step.name, [resolve(b) for b in ks.buffers] + [str(s) for s in ks.symbols]
            sizes = [f"xnumel={pyexpr(ks.xnumel)}"] + ([f"rnumel={pyexpr(ks.rnumel)}"] if ks.kind == "reduction" else [])
            static = ks.xnumel.is_Integer and (ks.kind != "reduction" or ks.rnumel.is_Integer)
        call = f"{name}({', '.join(args + sizes)})"
        if precompile:
            return [f"_jobs.extend({name}.precompile({', '.join(args + sizes)}, early=early))"]
        if static:    # the launch repeats the last one (Launcher.fast) unless an argument changed
            repeats.append(name)
            return [f"{name}.fast({', '.join(['_s'] + args)}) or {call}"]
        return [call]

    read = _buffers_read(g, sched)

    def step_call(step):
        if precompile:     # the extern's outputs, not computed: kernels only need their layouts
            return [empty_strided_line(o.name, o.layout) for o in step.outputs]
        direct = _direct_matmul(g, step) if gpu is not None and gemms is not None else None
        if direct is None:
            return _extern_call(g, step, read)
        gemms[step.outputs[0].name] = direct[0]
        return direct[1]

    body = call_body(g, sched, kernel_call, step_call, run=not precompile, launched_at=launched_at, alloc=alloc)
    if gemms:
        body.insert(0, "_g = gemm_stream(_s)")
    if repeats or gemms:
        # one look at the device, the stream and the launch hooks a call, not one a launch
        body.insert(0, f"_s = launch_stream({gpu})")
    return body


aten = torch.ops.aten
_DIRECT_MATMULS = {aten.mm.default: False, aten.mm.dtype: False, aten.addmm.default: True}   # op -> takes a bias


def _direct_matmul(g, ext):
    """A 16-bit matmul (or addmm with a bias) whose result aten would allocate fresh and
    contiguous, called through native_launch's Gemm (cuBLASLt directly, less host time than
    torch.mm) with torch.mm's call where it returns None: (the Gemm's constructor
    arguments, the lines), or None to keep the call as it is."""
    bias = _DIRECT_MATMULS.get(ext.op)
    if bias is None or len(ext.outputs) != 1 or ext.outputs[0].path != () or \
            not fresh_and_contiguous(ext, ext.outputs[0].layout):
        return None
    out = ext.outputs[0]
    args = list(ext.args)
    if bias:
        if len(args) != 3 or ext.kwargs:     # addmm(bias, a, b) with beta = alpha = 1
            return None
        args = [args[1], args[2], args[0]]
    elif ext.op is aten.mm.dtype:
        if len(args) != 2 or set(ext.kwargs) != {"out_dtype"} or ext.kwargs["out_dtype"] != torch.float32:
            return None
    elif len(args) != 2 or ext.kwargs:
        return None
    if not all(isinstance(a, TensorValue) for a in args):
        return None
    dtype = args[0].dtype
    if dtype not in (torch.bfloat16, torch.float16) or args[1].dtype != dtype:
        return None
    out_dtype = ext.kwargs.get("out_dtype")
    if out.layout.dtype != (out_dtype or dtype):
        return None
    argv = ", ".join(["_g"] + [_arg_expr(g, a) for a in args])
    return ((bias, out_dtype), [f"{out.name} = _gemm_{out.name}({argv})",
                                f"if {out.name} is None: {out.name} = {extern_call_expr(g, ext)}"])


def compile_fx_triton(gm, example_inputs):
    """compile_fx_graph's pipeline with the Triton emitter whatever the device (CPU tensors
    run under the Triton interpreter): what the tests and `wanted` graphs use."""
    import logging

    from torch.utils import _pytree as pytree

    from ..compile_fx import lower_and_schedule, uncompiled

    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    _, out_spec = pytree.tree_flatten(out_node.args[0])
    try:
        key, g, sched, ir_pre = lower_and_schedule(gm, example_inputs)
        return compile_triton(gm, g, sched, out_spec, key, ir_pre)
    except Exception as exc:   # never a wrong result: run the aten graph as it is
        return uncompiled(gm, out_spec, exc, "triton codegen", logging.INFO)
