"""Frame conversion: trace a frame with its real inputs, compile the graph with the
backend, generate the transformed code, build the guards, and report every step on the
bus with PyTorch's event names."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
import warnings
from typing import Optional

import torch
import torch.fx

import observe

from .. import config
from ..distributed import ddp
from ..debug.minifier import hooks as minifier_hooks
from ..guards import SharedPrefixes, compile_guards, render_guards
from .. import shapes
from . import bytecode as bc
from . import resume as resume_mod
from .codegen import CodeGen
from .graph_breaks import GraphBreak
from .interpreter import BreakPoint, Frame, StopAtBreak, TopLevelBreak
from .output_graph import OutputGraph
from .pyversion import call_ex_callable_index, null_slot_of_method_load, split_call
from .runtime import CacheEntry, CompileOptions, FrameCache, frame_id_for, run_function, trampoline_for
from .source import GlobalSource, LocalSource
from . import backward, numpy_ops, runtime, scalars
from .variables import CellVariable, ConstantVariable, NullVariable, TensorVariable, WithExitVariable

_compiled_fn_counter = [0]

_CALL_OPS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
_JUMP_OPS = {"POP_JUMP_IF_FALSE": False, "POP_JUMP_IF_TRUE": True, "POP_JUMP_FORWARD_IF_FALSE": False,
             "POP_JUMP_FORWARD_IF_TRUE": True, "POP_JUMP_BACKWARD_IF_FALSE": False,
             "POP_JUMP_BACKWARD_IF_TRUE": True}
_JUMP_OR_POP = {"JUMP_IF_FALSE_OR_POP": False, "JUMP_IF_TRUE_OR_POP": True}


class Unsupported(RuntimeError):
    """fullgraph=True and the frame needs a graph break (or the capture cannot model it)."""


class InternalCompilerError(RuntimeError):
    """A bug in the engine while compiling a frame."""


class BackendCompilerFailed(RuntimeError):
    """The backend raised while compiling a graph."""


def _frame_dict(f) -> dict:
    filename, lineno, name, line = f
    return {"line": lineno, "name": name, "filename": filename}


def _caller_stack() -> list:
    """The user's frames that led to this compile (outermost first), without the engine's,
    observe's or torch's own frames, as dynamo_start shows them."""
    import linecache
    import sys
    from .skipfiles import is_internal_file

    out = []
    f = sys._getframe(1)
    while f is not None:
        filename = f.f_code.co_filename
        if not is_internal_file(filename):
            line = linecache.getline(filename, f.f_lineno).strip()
            out.append({"line": f.f_lineno, "name": f.f_code.co_name, "filename": filename, "loc": line})
        f = f.f_back
    return list(reversed(out))[-32:]


def format_user_stack(stack) -> str:
    lines = []
    for filename, lineno, name, line in stack:
        lines.append(f'  File "{filename}", line {lineno}, in {name}')
        if line:
            lines.append(f"    {line.strip()}")
    return "\n".join(lines)


def break_message(gb: GraphBreak) -> str:
    k = gb.kind
    return (f"{k.reason}\n  Explanation: {k.explanation}\n  Hint: {k.hint}\n\n  Developer debug context: {gb.detail}\n"
            f"\n For more details about this graph break, see docs/graph_breaks.md#{k.id.lower()}")


def break_root(gb: GraphBreak):
    """Where a break happened (file, line, kind): the same for every frame it splits."""
    stack = gb.user_stack or []
    return (stack[-1][0], stack[-1][1], gb.kind.id) if stack else None


def emit_graph_break(gb: GraphBreak, code, reported=None) -> None:
    stack = gb.user_stack or []
    where = stack[-1] if stack else (code.co_filename, code.co_firstlineno, code.co_name, "")
    if reported is not None and break_root(gb) == reported:
        # the frame that called this one broke on this same break and reported it
        observe.log("dynamo", logging.DEBUG, "graph break at %s:%s in %s, reported by the calling frame", where[0],
                    where[1], code.co_name)
        return
    if observe.enabled("artifact", "graph_breaks"):
        def payload():
            return (f"Graph break in user code at {where[0]}:{where[1]}\n"
                    f"Graph Break Reason: {gb.kind.id}: {break_message(gb)}\n"
                    f"User code traceback:\n{format_user_stack(stack)}\n")
        observe.emit("artifact", {"name": "dynamo_graph_break_reason", "encoding": "string"}, payload,
                     log="graph_breaks")
    if observe.enabled("graph_break"):
        observe.emit("graph_break", {
            "reason": gb.message(), "graph_break_id": gb.kind.id, "hint": gb.kind.hint,
            "explanation": gb.kind.explanation,
            "user_stack": [{"filename": f[0], "line": f[1], "name": f[2], "code": f[3]} for f in stack],
        })


def report_cache_limit(code, entries, L, G, limit_name: str = "cache_size_limit") -> None:
    """The frame hit a recompile limit: say so once (function, file, line, last reason);
    from now on its cache misses run eagerly."""
    limit = getattr(config, limit_name)
    last = entries[-1] if entries else None
    reasons = last.guards.failures(L, G) if last is not None else []
    reason = f"{last.compile_id}: {reasons[0]}" if reasons else "?"
    msg = (f"engine hit config.{limit_name} ({limit})\n"
           f"   function: '{code.co_name}' ({code.co_filename}:{code.co_firstlineno})\n"
           f"   last reason: {reason}\n"
           'To log all recompilation reasons, use TORCH_LOGS="recompiles".\n'
           "To diagnose recompilation issues, see docs/guards.md.")
    observe.log("recompiles", logging.WARNING, "%s", msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside engine/ (the user's call)."""
    engine_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, f = 1, sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(engine_dir):
        level += 1
        f = f.f_back
    return level


def _config_json() -> str:
    """engine.config as PyTorch's `dynamo_config` field: a JSON string the report shows."""
    return json.dumps(config.snapshot(), sort_keys=True, default=str)


def _emit_recompile_reasons(code, previous, L, G) -> None:
    if not previous:
        return

    def payload():
        lines = [f"Recompiling function {code.co_name} in {code.co_filename}:{code.co_firstlineno}",
                 "    triggered by the following guard failure(s):"]
        for e in reversed(previous):  # every failing guard of every entry, newest entry first
            fails = e.guards.failures(L, G) or ["(guards pass now)"]
            lines.extend(f"    - {e.compile_id}: {f}" for f in fails)
        return "\n".join(lines)

    if observe.enabled("artifact", "recompiles"):
        observe.emit("artifact", {"name": "recompile_reasons", "encoding": "string"}, payload, log="recompiles")
    if observe.enabled("artifact", "recompiles_verbose"):
        def verbose():  # every failing guard of every cache entry, newest entry first
            lines = [f"Recompiling function {code.co_name} in {code.co_filename}:{code.co_firstlineno}",
                     "    triggered by the following guard failure(s):"]
            for i, e in enumerate(reversed(previous)):
                lines.append(f"    guard {i} failures:")
                lines.extend(f"    - {e.compile_id}: {f}" for f in e.guards.failures(L, G))
            return "\n".join(lines)

        observe.emit("artifact", {"name": "recompile_reasons_verbose", "encoding": "string"}, verbose,
                     log="recompiles_verbose")


# ---------------------------------------------------------------------- the entry point


def convert_frame(fn, L: dict, G: dict, options: CompileOptions, cache: FrameCache, previous,
                  reported=None) -> Optional[CacheEntry]:
    """`reported`: see runtime.make_trampoline."""
    code = fn.__code__
    frame_id = frame_id_for(code)
    compile_index = cache.compiles
    cache.compiles += 1
    shapes.set_frame_options(code, options.dynamic)
    start = time.time()
    metrics = {
        "compile_id": f"{frame_id}/{compile_index}", "frame_key": str(frame_id + 1), "co_name": code.co_name,
        "co_filename": code.co_filename, "co_firstlineno": _first_line(code), "cache_size": len(previous),
        "accumulated_cache_size": len(cache.entries), "guard_count": None, "shape_env_guard_count": 0,
        "graph_op_count": None, "graph_node_count": None, "graph_input_count": None, "start_time": start,
        "entire_frame_compile_time_s": None, "backend_compile_time_s": None, "inductor_compile_time_s": None,
        "code_gen_time_s": None, "fail_type": None, "fail_reason": None, "fail_user_frame_filename": None,
        "fail_user_frame_lineno": None, "non_compliant_ops": [], "compliant_custom_ops": [], "restart_reasons": [],
        "dynamo_time_before_restart_s": 0.0, "has_guarded_code": False, "dynamo_config": _config_json(),
        "is_forward": True, "graph_break_count": 0,
    }
    attempt = 0
    breakpoint: Optional[BreakPoint] = None
    eager_backward: set = set()    # (code, offset) of backwards left to autograd (capture/backward.py)
    restart_time = 0.0
    entry = None
    try:
        while True:
            cid = observe.CompileId(frame_id, compile_index, attempt)
            with observe.compile_context(cid):
                if attempt == 0:
                    _emit_recompile_reasons(code, previous, L, G)
                    observe.log("dynamo", logging.INFO, "engine start compiling %s %s:%s", code.co_name,
                                code.co_filename, code.co_firstlineno)
                    observe.emit("dynamo_start", {"stack": _caller_stack() + [
                        _frame_dict((code.co_filename, _first_line(code), code.co_name, ""))]})
                    if observe.enabled("artifact", "bytecode"):
                        observe.emit("artifact", {"name": f"{code.co_name}_ORIGINAL_BYTECODE", "encoding": "string",
                                                  "title": f"ORIGINAL BYTECODE {code.co_name} {code.co_filename} "
                                                           f"line {code.co_firstlineno}"},
                                     lambda: bc.format_code(code, regions=False), log="bytecode")
                t_attempt = time.time()
                with observe.stage("entire_frame_compile", fn_name=code.co_name):
                    result = _attempt(fn, L, G, options, breakpoint, cid, metrics, reported, eager_backward)
                if isinstance(result, backward.BackwardEscapes):
                    observe.log("dynamo", logging.DEBUG, "Restarting analysis: a result of the graph needs "
                                "autograd after loss.backward(); the backward is left to autograd")
                    eager_backward |= result.sites
                    attempt += 1
                    continue
                if isinstance(result, BreakPoint):
                    observe.log("dynamo", logging.DEBUG, "Restarting analysis due to a graph break at offset %s: %s",
                                result.offset, result.gb.message())
                    restart_time += time.time() - t_attempt
                    metrics["restart_reasons"].append(result.gb.message())
                    breakpoint = result
                    attempt += 1
                    continue
                entry = result
                break
    except (Unsupported, BackendCompilerFailed) as exc:
        metrics["fail_type"] = type(exc).__name__
        metrics["fail_reason"] = str(exc).splitlines()[0] if str(exc) else ""
        _finish_metrics(metrics, start, restart_time, frame_id, compile_index, attempt)
        if isinstance(exc, BackendCompilerFailed) and config.suppress_errors:
            warnings.warn(f"engine: {exc}; running {code.co_name} eagerly", RuntimeWarning, stacklevel=4)
            return None
        raise
    except InternalCompilerError as exc:
        metrics["fail_type"] = type(exc).__name__
        metrics["fail_reason"] = str(exc).splitlines()[0]
        _finish_metrics(metrics, start, restart_time, frame_id, compile_index, attempt)
        if config.suppress_errors:
            warnings.warn(f"engine: {str(exc).splitlines()[0]}; running {code.co_name} eagerly", RuntimeWarning,
                          stacklevel=4)
            return None
        raise
    metrics["has_guarded_code"] = entry is not None
    observe.log("dynamo", logging.INFO, "engine done compiling %s %s:%s (%s)", code.co_name, code.co_filename,
                code.co_firstlineno, "compiled" if entry is not None else "runs eagerly")
    _finish_metrics(metrics, start, restart_time, frame_id, compile_index, attempt)
    return entry


def _finish_metrics(metrics, start, restart_time, frame_id, compile_index, attempt) -> None:
    metrics["entire_frame_compile_time_s"] = round(time.time() - start, 6)
    metrics["dynamo_time_before_restart_s"] = round(restart_time, 6)
    with observe.compile_context(observe.CompileId(frame_id, compile_index, attempt)):
        observe.emit("compilation_metrics", metrics)


# ---------------------------------------------------------------------- one attempt


def _top_frame(fn, L, G, breakpoint):
    code = fn.__code__
    out = OutputGraph(code, G)
    out.frame_values = (L, G)   # what guard sources read at compile time (SharedPrefixes)
    builder = out.builder
    local_vars = {}
    cells = {}
    for name, value in L.items():
        src = LocalSource(name)
        vt = builder.wrap(value, src)
        if name in code.co_freevars:
            cells[name] = CellVariable(vt, source=src)
        else:
            local_vars[name] = vt
    for name in code.co_freevars:
        cells.setdefault(name, CellVariable(None, source=LocalSource(name)))
    frame = Frame(out, code, G, lambda n: GlobalSource(n), local_vars, cells, breakpoint=breakpoint,
                  fn_name=code.co_name)
    return out, frame


def _attempt(fn, L, G, options: CompileOptions, breakpoint, cid, metrics, reported=None, eager_backward=()):
    code = fn.__code__
    try:
        out, frame = _top_frame(fn, L, G, breakpoint)
        out.eager_backward = set(eager_backward)
    except GraphBreak as gb:
        # an input the capture cannot even wrap: run eagerly
        gb.user_stack = gb.user_stack or [(code.co_filename, code.co_firstlineno, code.co_name, "")]
        _break_to_eager(gb, options, code, reported)
        return None
    stop, stage = None, "bytecode_tracing"
    try:
        with observe.stage("bytecode_tracing"):
            try:
                frame.run()
            except StopAtBreak as s:
                stop = s
        stage = "code generation"
        return _finish(fn, out, frame, stop, options, cid, metrics, breakpoint)
    except TopLevelBreak as tb:
        gb = tb.gb
        _break_to_eager(gb, options, code, reported)
        metrics["graph_break_count"] += break_root(gb) != reported
        why = _why_not_resumable(tb.inst, frame, code)
        if why is None:
            return BreakPoint(tb.inst.offset, tb.arrival, gb)
        stack = gb.user_stack or []
        where = f" at {stack[-1][0]}:{stack[-1][1]}" if stack else ""
        _say_frame_runs_eagerly(code, f"{why}; the graph break{where} ([{gb.kind.id}]) makes the whole frame "
                                      "run eagerly")
        return None
    except GraphBreak as gb:
        # raised outside any instruction, or the values at the end could not be rebuilt
        if stage == "code generation":
            gb.user_stack = gb.user_stack or frame.user_stack()
        _break_to_eager(gb, options, code, reported)
        return None
    except resume_mod.ResumeUnsupported as exc:     # the break itself was reported when it was met
        _say_frame_runs_eagerly(code, f"{exc.reason}: the frame cannot be split at its graph break, so the "
                                      "whole frame runs eagerly")
        return None
    except backward.BackwardEscapes as exc:
        return exc
    except (Unsupported, InternalCompilerError, BackendCompilerFailed):
        raise
    except Exception as exc:
        raise _internal_error(exc, frame, stage) from exc
    finally:
        out.release()    # the capture lets go of the call's values


def _break_to_eager(gb: GraphBreak, options: CompileOptions, code, reported) -> None:
    """The frame (or its rest) runs eagerly: reported where the user looks; an error instead
    under fullgraph=True."""
    if options.fullgraph:
        raise Unsupported(_unsupported_text(gb)) from None
    emit_graph_break(gb, code, reported)


def _internal_error(exc, frame, stage) -> InternalCompilerError:
    where = frame.user_frame() if frame.current_inst is not None else (frame.code.co_filename,
                                                                          frame.code.co_firstlineno,
                                                                          frame.code.co_name, "")
    msg = (f"engine: internal error during {stage} of {frame.code.co_name} at {where[0]}:{where[1]}"
           f" ({where[3].strip()}): {type(exc).__name__}: {exc}")
    if config.verbose:
        msg += "\n\nInternal traceback:\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    else:
        msg += "\n(set TORCHDYNAMO_VERBOSE=1 or engine.config.verbose=True for the internal traceback; "
        msg += "engine.config.suppress_errors=True runs such frames eagerly)"
    return InternalCompilerError(msg)


def _unsupported_text(gb: GraphBreak) -> str:
    stack = gb.user_stack or []
    where = stack[-1] if stack else ("?", "?", "?", "")
    return (f"fullgraph=True but the frame needs a graph break at {where[0]}:{where[1]} in {where[2]}"
            f"{(': ' + where[3].strip()) if where[3] else ''}\n"
            f"  [{gb.kind.id}] {gb.message()}\n  Hint: {gb.kind.hint}\n\nUser code traceback:\n"
            f"{format_user_stack(stack)}")


def _why_not_resumable(inst, frame, code) -> Optional[str]:
    """Why the frame cannot be split at the break at `inst` (it then runs eagerly), or None."""
    if inst.opname not in _CALL_OPS and inst.opname not in _JUMP_OPS and inst.opname not in _JUMP_OR_POP and \
            inst.opname not in resume_mod.STEP_OPERANDS:
        return f"the frame cannot be split at a {inst.opname} instruction"
    if frame.exc_stack:
        return "the break is inside an `except` or `finally` block, where the frame cannot be split"
    if inst.exn_tab_entry is not None and _state_blocks(inst, frame) is None:
        return ("the break is inside a `try` block or a `with` block of a context manager the engine cannot "
                "re-enter (grad mode, autocast and profiler ranges it can), where the frame cannot be split")
    if code.co_flags & 0x20:
        return "the frame is a generator, which cannot be split"
    return None


def _say_frame_runs_eagerly(code, reason: str) -> None:
    """A break the frame cannot be split at: the whole frame runs eagerly, said where the user
    looks (TORCH_LOGS=graph_breaks, explain's "Not Compiled", the report)."""
    name = emit_declined(code, reason)
    observe.log("graph_breaks", logging.INFO, "%s (%s:%s) runs eagerly: %s", name, code.co_filename,
                code.co_firstlineno, reason)


def emit_declined(code, reason: str) -> str:
    """The `compile_declined` event of a function that runs eagerly (explain's "Not Compiled",
    the report's list); returns the function's name."""
    name = getattr(code, "co_qualname", code.co_name)
    observe.emit("compile_declined", {"function": name, "filename": code.co_filename,
                                      "line": code.co_firstlineno, "reason": reason})
    return name


def _state_blocks(inst, frame):
    """The with-blocks enclosing `inst`, outermost first, as their GradModeVariables,
    AutocastVariables and ProfilerRangeVariables, when every enclosing exception-table block
    is a grad-mode `with` (torch.no_grad() & co), an autocast one or a profiler range; None
    when any is something else (a try, another context manager)."""
    from .variables import AutocastVariable, GradModeVariable, ProfilerRangeVariable

    insts, index, stack = frame.insts, frame.index, frame.stack
    blocks = []
    e = inst.exn_tab_entry
    while e is not None:
        k = index.get(id(e.target))
        if k is None or k + 1 >= len(insts) or insts[k].opname != "PUSH_EXC_INFO" or \
                insts[k + 1].opname != "WITH_EXCEPT_START":
            return None
        if not 1 <= e.depth <= len(stack):
            return None
        exit_vt = stack[e.depth - 1]
        if not (isinstance(exit_vt, WithExitVariable) and
                isinstance(exit_vt.ctx, (GradModeVariable, AutocastVariable, ProfilerRangeVariable))):
            return None
        blocks.append(exit_vt.ctx)
        # the enclosing block is where the handler's cleanup (COPY 3; POP_EXCEPT; RERAISE 1) re-raises to
        cleanup = insts[k].exn_tab_entry
        if cleanup is None:
            break
        j = index.get(id(cleanup.target))
        while j is not None and j < len(insts) and insts[j].opname != "RERAISE":
            j += 1
        if j is None or j >= len(insts):
            return None
        e = insts[j].exn_tab_entry
        if len(blocks) > 32:
            return None
    return list(reversed(blocks))


# ---------------------------------------------------------------------- finishing a capture


def _finish(fn, out: OutputGraph, frame: Frame, stop, options: CompileOptions, cid, metrics, breakpoint):
    code = fn.__code__
    # which variables the generated code needs
    if stop is None:
        plan, resumes = ("return", frame.return_value), []
        needed = [frame.return_value]
    else:
        plan = _break_plan(frame, stop.inst, code)
        needed = plan[1]
        resumes = _resume_codes(plan, frame, code)      # a refusal comes before anything compiles
    needed = list(needed)
    autocast_changes = out.end_autocast()
    for vt in out.mutated:
        needed.append(vt)
    for (_, _n), (_src, v) in out.global_stores.items():
        needed.append(v)
    for _fn, a, k in out.deferred_calls:
        needed.extend(a)
        needed.extend(k.values())
    needed.extend(v for _leaf, v in out.grads.values())
    # graph outputs: every tensor reachable from what is needed that the graph computed
    outputs: list = []
    seen = set()
    for vt in needed:
        _collect_tensors(vt, outputs, seen, set())
    if out.backward_nodes and backward.escaping(out, outputs):
        raise backward.BackwardEscapes(set(out.backward_sites))
    output_nodes = []
    for t in outputs:
        if isinstance(t, ConstantVariable):  # a captured scalar (.item()): the graph outputs it
            node = scalars.output_node(t.value)
            if node is None:
                raise GraphBreak("GB0018", f"the captured scalar expression {t.value}")
            out.sym_outputs[id(t)] = node
        else:
            node = t.proxy.node
        if node.op in ("placeholder", "get_attr"):
            continue
        if node not in output_nodes:
            output_nodes.append(node)
    graph = out.graph
    out.dead_code_elimination(set(output_nodes))
    for node in list(graph.nodes):
        if node.op == "placeholder" and not node.users:
            graph.erase_node(node)
    op_count = len(out.op_nodes())
    compiled_name = None
    ns_graph = {}
    if op_count > 0:
        results = tuple(output_nodes)
        if out.backward_nodes:     # after loss.backward() in the graph, its results need no autograd graph
            results = tuple(_detached(out, n) if _requires_grad(n) else n for n in output_nodes)
        graph.output(results)
        _compiled_fn_counter[0] += 1
        compiled_name = f"__compiled_fn_{_compiled_fn_counter[0]}"
        gm = torch.fx.GraphModule(_GraphRoot(out.constant_tensors), graph)
        gm.meta = {"compiled_name": compiled_name, "backward_in_graph": bool(out.backward_nodes)}
        shapes.insert_runtime_asserts(gm, out.fake_mode.shape_env, compiled_name)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        input_sources = [n.meta["source"] for n in placeholders]
        real_by_source = {}
        for source, real, _vt in out.inputs:          # the first input of each source
            real_by_source.setdefault(source.name(), real)
        real_inputs = [real_by_source[s] for s in input_sources]
        # the graph inputs whose metadata the guards pin exactly: the AOT stage neither re-keys
        # them nor the generated code re-checks them (known before the backend compiles)
        exact = {g.source for g in shapes.relax_tensor_match(out.guard_list(), out.inputs)
                 if g.kind == "TENSOR_MATCH" and None not in g.expected.sizes and None not in g.expected.strides}
        gm.meta["guarded_inputs"] = frozenset(i for i, src in enumerate(input_sources) if str(src) in exact)
        _emit_graph(gm, compiled_name, code)
        metrics["graph_op_count"] = op_count
        metrics["graph_node_count"] = len(graph.nodes)
        metrics["graph_input_count"] = len(placeholders)
        t0 = time.time()
        with observe.stage("backend_compile", backend=options.backend_name, graph_module=gm,
                           example_inputs=real_inputs):
            try:   # through the minifier's hook: with repro_after="dynamo" a failure writes a launcher
                compiled = minifier_hooks.call_backend(ddp.backend_for_graph(options.backend), options.backend_name,
                                                       gm, real_inputs)
            except Exception as exc:
                notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))
                raise BackendCompilerFailed(
                    f"backend={options.backend_name!r} raised {type(exc).__name__}: {exc} while compiling "
                    f"{compiled_name} of {code.co_name} ({code.co_filename}:{code.co_firstlineno}){notes}") from exc
        metrics["backend_compile_time_s"] = round(time.time() - t0, 6)
        ns_graph[compiled_name] = compiled
        out.output_index = {n: i for i, n in enumerate(output_nodes)}
        shared = SharedPrefixes(_source_lookup(out))
        graph_call = f"__o = {compiled_name}({', '.join(shared.expression(str(s)) for s in input_sources)})"
    else:
        out.output_index = {}
        graph_call = None
        shared = None
        metrics["graph_op_count"] = 0
        metrics["graph_node_count"] = 0
        metrics["graph_input_count"] = 0
    cg = CodeGen(out, out.output_index, shared)
    cg.ns.update(ns_graph)
    if graph_call:
        cg.emit("call_graph", graph_call)
    for fn_, state in autocast_changes:  # what the graph did to the autocast state (OutputGraph.end_autocast)
        cg.emit("call_graph", f"{cg.const(fn_, 'autocast')}({state.device!r}, {state.enabled!r}, "
                              f"{cg.const(state.dtype, 'dtype')}, {state.cache_enabled!r})")
    trampoline = trampoline_for(options)
    if plan[0] != "return" and breakpoint is not None and len(breakpoint.gb.user_stack or ()) > 1:
        trampoline = trampoline_for(options, break_root(breakpoint.gb))  # broke inside the callee
    cg.ns["___trampoline"] = trampoline
    # a resume function continues a frame we compiled (even one inside torch, e.g. an optimizer step)
    cg.ns["___run_resume"] = lambda f, *a: run_function(f, a, {}, options, force=True)
    if plan[0] == "return":
        rv = cg.expr(plan[1])
        cg.side_effects()
        cg.emit("resume_call", f"return {rv}")
    else:
        _codegen_break(cg, plan, resumes, frame, fn, code)
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in code.co_name)
    fname = f"__transformed_{safe}_{cid.frame_id}_{cid.frame_compile_id}"
    src = cg.source(fname)
    cg.ns["sys"] = __import__("sys")
    exec(compile(src, f"<engine transformed {code.co_name}>", "exec"), cg.ns)
    transformed = cg.ns[fname]
    guards = shapes.finalize_guards(out)  # tensor matches relaxed at symbolic dims, plus the shape guards
    metrics["shape_env_guard_count"] = sum(1 for g in guards if g.kind == "SHAPE_ENV")
    compiled_guards = compile_guards(guards, _source_lookup(out))
    metrics["guard_count"] = len(guards)
    if observe.enabled("artifact", "bytecode"):
        observe.emit("artifact", {"name": f"{code.co_name}_MODIFIED_BYTECODE", "encoding": "string",
                                  "title": f"MODIFIED BYTECODE {code.co_name} {code.co_filename} "
                                           f"line {code.co_firstlineno}"},
                     lambda: src + "\n" + bc.format_code(transformed.__code__, regions=False), log="bytecode")
    if observe.enabled("dynamo_cpp_guards_str", "guards"):
        observe.emit("dynamo_cpp_guards_str", {}, lambda: render_guards(guards), log="guards")
    return CacheEntry(compiled_guards, transformed, options.key, str(cid), src)


class _GraphRoot(torch.nn.Module):
    def __init__(self, constants):
        super().__init__()
        for k, v in constants.items():
            if isinstance(v, torch.nn.Parameter):
                self.register_parameter(k, v)
            else:
                self.register_buffer(k, v, persistent=False)


def _source_lookup(out):
    """A source's value in the frame being compiled (None where the capture has no frame)."""
    values = getattr(out, "frame_values", None)
    if values is None:
        return None
    namespace = {"L": values[0], "G": values[1], "sys": sys}
    return lambda source: eval(_source_code(source), namespace)


@functools.lru_cache(maxsize=4096)
def _source_code(source: str):
    """A source's compiled expression: the guard builder looks up each module prefix of every
    guard (a 16-layer Llama step: 2,200 look-ups, 0.4 s when each compiled its string anew)."""
    return compile(source, "<source>", "eval")


def _detached(out, node):
    new = out.graph.call_function(torch.Tensor.detach, (node,))
    with out.fake_mode:
        new.meta["example_value"] = new.meta["val"] = node.meta["example_value"].detach()
    return new


def _requires_grad(node) -> bool:
    val = node.meta.get("example_value")
    return isinstance(val, torch.Tensor) and val.requires_grad


def _collect_tensors(vt, acc, seen, visiting):
    from .variables import (BoundMethodVariable, DictVariable, IteratorVariable, ListVariable,
                            NestedFunctionVariable, ObjectVariable, TupleVariable, ExceptionVariable)
    if vt is None or id(vt) in visiting:
        return
    visiting.add(id(vt))
    if isinstance(vt, TensorVariable) or (isinstance(vt, ConstantVariable) and scalars.is_unbacked(vt.value)):
        if id(vt) not in seen:
            seen.add(id(vt))
            acc.append(vt)
        return
    if isinstance(vt, numpy_ops.NumpyVariable):
        if vt.source is None:
            _collect_tensors(vt.tensor, acc, seen, visiting)
        return
    if vt.source is not None and not isinstance(vt, (ListVariable, DictVariable, ObjectVariable)):
        return
    if isinstance(vt, (ListVariable, TupleVariable)):
        for x in vt.items:
            _collect_tensors(x, acc, seen, visiting)
    elif isinstance(vt, IteratorVariable):
        for x in vt.items[vt.index:]:
            _collect_tensors(x, acc, seen, visiting)
    elif isinstance(vt, DictVariable):
        for x in vt.items.values():
            _collect_tensors(x, acc, seen, visiting)
    elif isinstance(vt, ObjectVariable):
        for x in vt.attrs.values():
            _collect_tensors(x, acc, seen, visiting)
        if vt.dict_vt is not None:
            _collect_tensors(vt.dict_vt, acc, seen, visiting)
    elif isinstance(vt, BoundMethodVariable):
        _collect_tensors(vt.obj, acc, seen, visiting)
    elif isinstance(vt, CellVariable):
        _collect_tensors(vt.value, acc, seen, visiting)
    elif isinstance(vt, NestedFunctionVariable):
        for c in vt.closure or ():
            _collect_tensors(c, acc, seen, visiting)
        if vt.defaults is not None:
            _collect_tensors(vt.defaults, acc, seen, visiting)
    elif isinstance(vt, ExceptionVariable):
        for x in vt.args:
            _collect_tensors(x, acc, seen, visiting)


def _emit_graph(gm, name, code) -> None:
    if observe.enabled("dynamo_output_graph", "graph_code"):
        def sizes():
            out = {}
            for n in gm.graph.nodes:
                v = n.meta.get("val", n.meta.get("example_value"))
                if isinstance(v, torch.Tensor):
                    out[n.name] = list(v.shape)
            return out

        def payload():
            return gm.print_readable(print_output=False, include_stride=True, include_device=True)

        observe.emit("dynamo_output_graph", {"sizes": sizes(), "title": f"TRACED GRAPH\n ===== {name} ====="},
                     payload, log="graph_code")
    if observe.enabled("log", "graph_sizes"):
        lines = [f"TRACED GRAPH TENSOR SIZES\n===== {name} ====="]
        for n in gm.graph.nodes:
            v = n.meta.get("val", n.meta.get("example_value"))
            if isinstance(v, torch.Tensor):
                lines.append(f"{n.name}: {tuple(v.shape)}")
        observe.log("graph_sizes", logging.INFO, "%s", "\n".join(lines))


# ---------------------------------------------------------------------- graph breaks


def _break_plan(frame: Frame, inst, code):
    """What the generated code must do at the break: the values it needs, and how."""
    stack = list(frame.stack)
    k = frame.index[id(inst)]
    next_inst = frame.insts[k + 1] if k + 1 < len(frame.insts) else None
    if inst.opname in ("CALL", "CALL_KW"):
        argc = inst.arg
        if inst.opname == "CALL_KW":  # 3.13+: the keyword names are the top of the stack
            kw = tuple(frame.as_python(stack.pop()))
        else:
            kw = frame.kw_names
        items = stack[len(stack) - argc - 2:]
        below = stack[:len(stack) - argc - 2]
        fn_vt, self_vt = split_call(items[:2], lambda v: isinstance(v, NullVariable))
        args = ([self_vt] if self_vt is not None else []) + list(items[2:])
        kwargs = {}
        if kw:
            kwargs = dict(zip(kw, args[len(args) - len(kw):]))
            args = args[:len(args) - len(kw)]
        detail = ("call", fn_vt, args, kwargs, None, None)
        resume_offsets = [(next_inst.offset, len(below) + 1)]
    elif inst.opname == "CALL_FUNCTION_EX":
        has_kw = inst.arg & 1
        n = 3 + has_kw
        items = stack[len(stack) - n:]
        below = stack[:len(stack) - n]
        fn_vt, star, kws = items[call_ex_callable_index()], items[2], (items[3] if has_kw else None)
        detail = ("call_ex", fn_vt, [star], {}, kws, None)
        resume_offsets = [(next_inst.offset, len(below) + 1)]
    elif inst.opname in _JUMP_OPS:
        cond = stack[-1]
        below = stack[:-1]
        detail = ("jump", cond, _JUMP_OPS[inst.opname], None, None, None)
        resume_offsets = [(next_inst.offset, len(below)), (inst.target.offset, len(below))]
    elif inst.opname in _JUMP_OR_POP:
        cond = stack[-1]
        below = stack[:-1]
        detail = ("jump_or_pop", cond, _JUMP_OR_POP[inst.opname], None, None, None)
        resume_offsets = [(next_inst.offset, len(below)), (inst.target.offset, len(below) + 1)]
    elif inst.opname in resume_mod.STEP_OPERANDS:
        n = resume_mod.step_operands(inst)
        operands = stack[len(stack) - n:]
        below = stack[:len(stack) - n]
        detail = ("step", None, list(operands), {}, None, None)
        resume_offsets = [(next_inst.offset, len(below) + resume_mod.step_pushes(inst))]
    else:
        raise GraphBreak("GB0011", f"cannot split the frame at {inst.opname}")
    live = {}
    for off, _depth in resume_offsets:
        for name in resume_mod.live_locals(code, off):
            if name in frame.locals:
                live[name] = frame.locals[name]
    cells = {name: frame.cells[name] for name in code.co_cellvars if name in frame.cells}
    needed = [v for v in below if not isinstance(v, NullVariable)] + list(live.values()) + list(cells.values())
    _, a, b, c, d, _ = detail
    for x in (a, b, c, d):
        if isinstance(x, list):
            needed.extend(x)
        elif isinstance(x, dict):
            needed.extend(x.values())
        elif x is not None and not isinstance(x, bool):
            needed.append(x)
    return ("break", needed, detail, below, live, cells, resume_offsets, inst)


def _resume_codes(plan, frame, code) -> list:
    """The functions that continue the frame after its break (one per place it can go on:
    two after a jump); made before the graph compiles, so that a frame the resume builder
    refuses (ResumeUnsupported) runs eagerly having compiled nothing."""
    _, _needed, detail, below, live, _cells, resume_offsets, inst = plan
    blocks = _state_blocks(inst, frame) if inst.exn_tab_entry is not None else []
    nulls = [i for i, v in enumerate(below) if isinstance(v, NullVariable)]
    # a method load leaves the attribute and a NULL (on the side pyversion says)
    slots = nulls + [len(below) + null_slot_of_method_load()] if detail[0] == "step" and inst.is_method_load \
        else nulls
    return [resume_mod.make_resume_code(code, off, depth, [n for n in resume_mod.live_locals(code, off) if n in live],
                                        null_stack_indices=slots, inside_handlers=bool(blocks),
                                        name=f"engine_resume_in_{_original_name(code.co_name)}_at_{_lineno_at(frame, off)}")
            for off, depth in resume_offsets]


def _codegen_break(cg: CodeGen, plan, resumes: list, frame, fn, code) -> None:
    _, _needed, detail, below, live, cells, resume_offsets, inst = plan
    kind = detail[0]
    # values first (store_outputs), then side effects, then the break itself
    from .variables import IteratorVariable
    cg.loop_iterators = {id(v) for v in below if isinstance(v, IteratorVariable)}
    below_exprs = [None if isinstance(v, NullVariable) else cg.expr(v) for v in below]
    live_exprs = {name: cg.expr(v) for name, v in live.items()}
    cell_exprs = []
    for name in code.co_cellvars:
        cv = cells.get(name)
        if cv is None:
            cell_exprs.append("___make_cell()")
        else:
            cell_exprs.append(cg.expr(cv))
    if kind == "step":
        arg_exprs = [cg.expr(a) for a in detail[2]]
    elif kind in ("call", "call_ex"):
        fn_expr = cg.expr(detail[1])
        arg_exprs = [cg.expr(a) for a in detail[2]]
        kw_exprs = {k: cg.expr(v) for k, v in detail[3].items()}
        star_kw = cg.expr(detail[4]) if kind == "call_ex" and detail[4] is not None else None
    else:
        cond_expr = cg.expr(detail[1])
    cg.side_effects()
    blocks = _state_blocks(inst, frame) if inst.exn_tab_entry is not None else []
    # The break runs under the grad mode and autocast state the frame has there, whatever the
    # graph left (a graph leaves the autocast state as it found it: OutputGraph.end_autocast).
    # Inside grad-mode or autocast with blocks, an exception from the break leaves them all;
    # otherwise the resume function, given each block's exit, ends them.
    cg.ns["___set_grad_enabled"] = torch._C._set_grad_enabled
    if blocks or frame.out.grad_enabled != frame.out.initial_grad_enabled:
        cg.emit("graph_break", f"___set_grad_enabled({bool(frame.out.grad_enabled)!r})")
    guard_call = None
    if blocks:
        cg.ns["___exit_blocks"] = runtime.exit_blocks
        guard_call = f"___exit_blocks(({''.join(cg.expr(WithExitVariable(b)) + ', ' for b in blocks)}))"
    closure_expr = "F.__closure__" if code.co_freevars else "()"
    cells_expr = "(" + "".join(f"{c}, " for c in cell_exprs) + ")"

    def resume_call(r, top_expr: Optional[str], depth_below: int) -> str:
        code_name = cg.const(r.code, "resume_code")
        fexpr = (f"___FunctionType({code_name}, G, {r.name!r}, None, "
                 f"({closure_expr} or ()) + {cells_expr} or None)") if (code.co_freevars or code.co_cellvars) else \
            f"___FunctionType({code_name}, G, {r.name!r})"
        args = [e for e in below_exprs if e is not None]
        if top_expr is not None:
            args.append(top_expr)
        args += [live_exprs[n] for n in r.live_locals]
        return f"___run_resume({fexpr}{''.join(', ' + a for a in args)})"

    def emit_call(text: str) -> None:
        if guard_call is None:
            cg.emit("graph_break", text)
            return
        cg.emit("graph_break", "try:")
        cg.emit("graph_break", f"    {text}")
        cg.emit("graph_break", "except BaseException:")
        cg.emit("graph_break", f"    {guard_call}  # the with blocks' exits")
        cg.emit("graph_break", "    raise")

    if kind == "step":  # the instruction itself, run eagerly (engine/capture/resume.step_function)
        step = cg.const(resume_mod.step_function(inst), "step")
        if resume_mod.step_pushes(inst):
            emit_call(f"__r = {step}({', '.join(arg_exprs)})")
            cg.emit("resume_call", f"return {resume_call(resumes[0], '__r', len(below))}")
        else:
            emit_call(f"{step}({', '.join(arg_exprs)})")
            cg.emit("resume_call", f"return {resume_call(resumes[0], None, len(below))}")
    elif kind == "call":
        call_args = arg_exprs + [f"{k}={v}" for k, v in kw_exprs.items()]
        emit_call(f"__r = ___trampoline({fn_expr}{''.join(', ' + a for a in call_args)})")
        cg.emit("resume_call", f"return {resume_call(resumes[0], '__r', len(below))}")
    elif kind == "call_ex":
        star = arg_exprs[0]
        kwpart = f", **{star_kw}" if star_kw else ""
        emit_call(f"__r = ___trampoline({fn_expr}, *{star}{kwpart})")
        cg.emit("resume_call", f"return {resume_call(resumes[0], '__r', len(below))}")
    elif kind == "jump":
        jump_when = detail[2]
        # POP_JUMP_IF_TRUE jumps when truthy; resumes[0] falls through, resumes[1] is the target
        cg.emit("graph_break", f"if {cond_expr}:")
        first, second = (resumes[1], resumes[0]) if jump_when else (resumes[0], resumes[1])
        cg.emit("graph_break", f"    return {resume_call(first, None, len(below))}")
        cg.emit("resume_call", f"return {resume_call(second, None, len(below))}")
    elif kind == "jump_or_pop":
        jump_when = detail[2]
        cg.emit("graph_break", f"__c = {cond_expr}")
        if jump_when:
            cg.emit("graph_break", "if __c:")
            cg.emit("graph_break", f"    return {resume_call(resumes[1], '__c', len(below))}")
            cg.emit("resume_call", f"return {resume_call(resumes[0], None, len(below))}")
        else:
            cg.emit("graph_break", "if not __c:")
            cg.emit("graph_break", f"    return {resume_call(resumes[1], '__c', len(below))}")
            cg.emit("resume_call", f"return {resume_call(resumes[0], None, len(below))}")


def _first_line(code) -> int:
    """A resume function starts where it resumes (engine_resume_in_fn_at_7 -> 7), as in PyTorch."""
    import re
    m = re.fullmatch(r"engine_resume_in_.*_at_(\d+)", code.co_name)
    return int(m.group(1)) if m else code.co_firstlineno


def _original_name(name: str) -> str:
    """engine_resume_in_fn_at_7 -> fn (a resume of a resume is still named after fn)."""
    import re
    m = re.fullmatch(r"engine_resume_in_(.*)_at_\d+", name)
    return m.group(1) if m else name


def _lineno_at(frame, offset) -> int:
    for inst in frame.insts:
        if inst.offset == offset:
            return inst.lineno or frame.code.co_firstlineno
    return frame.code.co_firstlineno
