"""The `ctx` that comptime code receives: the engine's trace-time view of the frame.

Everything shown comes from the live interpreter (`tx`, the engine's Frame at the
comptime call): its variable trackers (locals, value stack), its OutputGraph (the graph
so far, the guards), and the same renderers the logs use: the graph as
`print_readable` like TORCH_LOGS=graph_code, guards through `guards.render_guards` like
TORCH_LOGS=guards, bytecode through `capture.bytecode.format_code` like
TORCH_LOGS=bytecode. Values render as the tracker knows them: a tensor as its FakeTensor
(`FakeTensor(..., size=(3, 4))`), a constant as its value.

`trace_*` functions are what the interpreter calls for each `comptime` marker
(engine/comptime.py); they return the traced call's result, `None`.
"""

from __future__ import annotations

import builtins
import os
import pdb
import sys
import traceback
import types
from typing import Any, Optional, TextIO

import torch
import torch.fx

from ..capture.bytecode import format_code
from ..capture.graph_breaks import GraphBreak
from ..capture.variables import (BoundMethodVariable, CellVariable, ConstantVariable, DictVariable,
                                 FunctionVariable, ListVariable, NestedFunctionVariable, NullVariable,
                                 ObjectVariable, SetVariable, TensorVariable, TupleVariable, VariableTracker)
from ..guards import render_guards
from . import command_input


# ---------------------------------------------------------------------- rendering trackers


def render_vt(vt: Any, depth: int = 0) -> str:
    """How the engine sees a value at trace time."""
    if depth > 6:
        return "..."
    if isinstance(vt, TensorVariable):
        return repr(vt.fake)
    if isinstance(vt, ConstantVariable):
        return repr(vt.value)
    if isinstance(vt, NullVariable):
        return "NULL"
    if isinstance(vt, ListVariable):
        return "[" + ", ".join(render_vt(x, depth + 1) for x in vt.items) + "]"
    if isinstance(vt, TupleVariable):
        inner = ", ".join(render_vt(x, depth + 1) for x in vt.items)
        if vt.cls is tuple:
            return f"({inner}{',' if len(vt.items) == 1 else ''})"
        return f"{vt.cls.__name__}({inner})"
    if isinstance(vt, DictVariable):
        body = "{" + ", ".join(f"{k!r}: {render_vt(v, depth + 1)}" for k, v in vt.items.items()) + "}"
        return body if vt.cls is dict else f"{vt.cls.__name__}({body})"
    if isinstance(vt, SetVariable):
        return f"{vt.cls.__name__}({vt.items!r})"
    if isinstance(vt, FunctionVariable):
        return f"<function {getattr(vt.fn, '__qualname__', vt.fn)}>"
    if isinstance(vt, NestedFunctionVariable):
        return f"<function {vt.qualname} (made during the trace)>"
    if isinstance(vt, BoundMethodVariable):
        return f"<bound method {vt.name} of {render_vt(vt.obj, depth + 1)}>"
    if isinstance(vt, CellVariable):
        return f"<cell: {render_vt(vt.value, depth + 1) if vt.value is not None else 'empty'}>"
    if isinstance(vt, ObjectVariable):
        if vt.value is None:
            attrs = ", ".join(f"{k}={render_vt(v, depth + 1)}" for k, v in vt.attrs.items())
            return f"<{vt.cls.__name__} made during the trace{': ' + attrs if attrs else ''}>"
        try:
            text = repr(vt.value)
        except Exception:
            text = f"<{vt.cls.__name__} object>"
        return text if len(text) <= 200 else text[:197] + "..."
    return repr(vt)


class ComptimeVar:
    """A variable as the engine tracks it: `as_python_constant()`, `python_type()`,
    `as_fake()`, `as_proxy()`, `source`."""

    def __init__(self, vt: VariableTracker):
        self._vt = vt

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except NotImplementedError:
            return False

    def as_python_constant(self) -> Any:
        return _constant(self._vt)

    def python_type(self) -> type:
        if isinstance(self._vt, CellVariable):
            return ComptimeVar(self._vt.value).python_type() if self._vt.value is not None else types.CellType
        return self._vt.python_type()

    def is_proxy(self) -> bool:
        return isinstance(self._vt, TensorVariable)

    def as_proxy(self):
        if not isinstance(self._vt, TensorVariable):
            raise NotImplementedError(f"{render_vt(self._vt)} is not in the graph (no proxy)")
        return self._vt.proxy

    def as_fake(self):
        """The FakeTensor for a tensor; a constant's value for a constant."""
        if isinstance(self._vt, TensorVariable):
            return self._vt.fake
        return self.as_python_constant()

    @property
    def source(self) -> Optional[str]:
        src = getattr(self._vt, "source", None)
        return None if src is None else src.name()

    def size(self, dim: Optional[int] = None):
        fake = self.as_fake()
        return fake.size() if dim is None else fake.size(dim)

    def __repr__(self) -> str:
        return render_vt(self._vt)


def _constant(vt) -> Any:
    if isinstance(vt, ConstantVariable):
        return vt.value
    if isinstance(vt, (ListVariable, TupleVariable)):
        items = [_constant(x) for x in vt.items]
        if isinstance(vt, ListVariable):
            return items
        return tuple(items) if vt.cls is tuple else vt.cls(*items) if vt.is_namedtuple() else vt.cls(items)
    if isinstance(vt, DictVariable):
        return vt.cls({k: _constant(v) for k, v in vt.items.items()})
    if isinstance(vt, SetVariable):
        return vt.cls(vt.items)
    if isinstance(vt, FunctionVariable):
        return vt.fn
    if isinstance(vt, ObjectVariable) and vt.value is not None and not vt.attrs:
        return vt.value
    if isinstance(vt, CellVariable) and vt.value is not None:
        return _constant(vt.value)
    raise NotImplementedError(f"{render_vt(vt)} is not a Python constant at trace time")


# ---------------------------------------------------------------------- the context


class ComptimeContext:
    """The engine's state at the comptime call. Print methods take `file=` (stdout)."""

    def __init__(self, tx):
        self._tx = tx

    # --------------------------------------------------------------- values
    def get_local(self, name: str, *, stacklevel: int = 0) -> ComptimeVar:
        """A local (or closure variable) of the traced frame; `stacklevel=1` is its caller
        when the comptime call is in an inlined function."""
        tx = self._frame(stacklevel)
        if name in tx.locals:
            return ComptimeVar(tx.locals[name])
        if name in tx.cells:
            return ComptimeVar(tx.cells[name])
        known = ", ".join(list(tx.locals) + list(tx.cells))
        raise KeyError(f"{name!r} is not a local of {tx.code.co_name} at trace time (locals: {known})")

    def _frame(self, stacklevel: int):
        tx = self._tx
        for _ in range(stacklevel):
            if tx.parent is None:
                raise ValueError("stacklevel is past the compiled frame")
            tx = tx.parent
        return tx

    def graph_break(self, msg: str = "ctx.graph_break() in comptime code") -> None:
        """Break the graph at the comptime call: the graph so far is compiled, the rest
        continues in a resume function."""
        raise GraphBreak("GB0005", msg)

    def graph(self) -> torch.fx.Graph:
        """The live FX graph being built (do not modify it)."""
        return self._tx.out.graph

    def parent(self) -> "ComptimeContext":
        if self._tx.parent is None:
            raise ValueError("this is the compiled frame; it has no traced caller")
        return ComptimeContext(self._tx.parent)

    # --------------------------------------------------------------- printing
    def print(self, val: Any, *, file: Optional[TextIO] = None) -> None:
        """A ComptimeVar (or any value) as the engine sees it."""
        text = repr(val) if isinstance(val, ComptimeVar) else render_vt(val) \
            if isinstance(val, VariableTracker) else repr(val)
        builtins.print(text, file=file)

    def print_locals(self, *, file: Optional[TextIO] = None, stacklevel: int = 0) -> None:
        tx = self._frame(stacklevel)
        for name, vt in tx.locals.items():
            builtins.print(f"{name} = {render_vt(vt)}", file=file)
        for name, cell in tx.cells.items():
            if name not in tx.locals:
                builtins.print(f"{name} = {render_vt(cell.value) if cell.value is not None else '<empty cell>'}",
                               file=file)

    def print_value_stack(self, *, file: Optional[TextIO] = None, stacklevel: int = 0) -> None:
        """The interpreter's value stack below the comptime call, bottom first."""
        tx = self._frame(stacklevel)
        if not tx.stack:
            builtins.print("(empty value stack)", file=file)
        for i, vt in enumerate(tx.stack):
            builtins.print(f"[{i}] {render_vt(vt)}", file=file)

    def print_graph(self, *, file: Optional[TextIO] = None) -> None:
        """The graph traced so far, rendered like TORCH_LOGS=graph_code."""
        builtins.print(graph_so_far(self._tx.out), file=file)

    def print_guards(self, *, file: Optional[TextIO] = None) -> None:
        """The guards installed so far, rendered like TORCH_LOGS=guards."""
        builtins.print(render_guards(self._tx.out.guard_list()).lstrip("\n"), file=file)

    def print_bt(self, *, file: Optional[TextIO] = None) -> None:
        """The user stack being traced, outermost first (inlined calls included)."""
        for filename, lineno, name, line in self._tx.user_stack():
            builtins.print(f'  File "{filename}", line {lineno}, in {name}', file=file)
            if line and line.strip():
                builtins.print(f"    {line.strip()}", file=file)

    def disas(self, *, file: Optional[TextIO] = None, stacklevel: int = 0) -> None:
        """The traced frame's bytecode, `-->` at the comptime call (TORCH_LOGS=bytecode's renderer)."""
        tx = self._frame(stacklevel)
        cur = tx.current_inst
        builtins.print(format_code(tx.code, regions=False, current_offset=cur.offset if cur is not None else None),
                       file=file)

    def __repr__(self) -> str:
        tx = self._tx
        cur = tx.current_inst
        where = f"{os.path.basename(tx.code.co_filename)}:{cur.lineno if cur is not None else '?'}"
        return f"<ComptimeContext {tx.code.co_name} at {where}>"


def graph_so_far(out) -> str:
    """A copy of the OutputGraph's graph (the live one is left alone) rendered with the
    graph_code log's renderer."""
    copy = torch.fx.Graph()
    copy.graph_copy(out.graph, {})
    copy.output(None)
    root = torch.nn.Module()
    for name, value in getattr(out, "constant_tensors", {}).items():
        root.register_buffer(name, value, persistent=False)
    gm = torch.fx.GraphModule(root, copy, class_name="GraphSoFar")
    return gm.print_readable(print_output=False, include_stride=True, include_device=True).rstrip("\n")


# ---------------------------------------------------------------------- the trace-time hooks


def _in_replay(tx) -> bool:
    """The frame converter re-traces up to a graph break before compiling: comptime code
    already ran on the first pass at the same state, so it runs once."""
    root = tx
    while root.parent is not None:
        root = root.parent
    return getattr(root, "breakpoint", None) is not None


def _run(tx, body) -> ConstantVariable:
    if not _in_replay(tx):
        body(ComptimeContext(tx))
    return ConstantVariable(None)


def _real_value(tx, vt):
    """The real object behind a tracker read from the frame (a list, dict, object or
    function the engine wrapped), so comptime code that mutates it mutates the real one."""
    if isinstance(vt, FunctionVariable):
        return vt.fn
    if isinstance(vt, ObjectVariable) and vt.value is not None:
        return vt.value
    out = tx.out
    for value in getattr(out, "_keepalive", ()):
        if out.memo.get(id(value)) is vt:
            return value
    raise LookupError


def _real_callable(tx, vt):
    """The function a comptime(...) call was given, as a real Python function."""
    if isinstance(vt, FunctionVariable):
        return vt.fn
    if isinstance(vt, NestedFunctionVariable):
        closure = None
        if vt.closure:
            closure = tuple(types.CellType(_plain(tx, c.value)) if c.value is not None else types.CellType()
                            for c in vt.closure)
        defaults = tuple(_plain(tx, x) for x in vt.defaults.items) if vt.defaults is not None else None
        f = types.FunctionType(vt.code, vt.f_globals, vt.code.co_name, defaults, closure)
        if vt.kwdefaults is not None:
            f.__kwdefaults__ = {k: _plain(tx, v) for k, v in vt.kwdefaults.items.items()}
        f.__qualname__ = vt.qualname
        return f
    if isinstance(vt, ObjectVariable) and vt.value is not None and callable(vt.value):
        return vt.value
    raise TypeError(f"comptime(fn) needs a function, got {render_vt(vt)}")


def _plain(tx, vt):
    """A closure cell or default of a comptime function: the real object when the engine
    read it from the frame, a constant's value, else the tracker as a ComptimeVar."""
    if getattr(vt, "source", None) is not None and not isinstance(vt, (ConstantVariable, TensorVariable)):
        try:
            return _real_value(tx, vt)
        except LookupError:
            pass
    try:
        return _constant(vt)
    except NotImplementedError:
        return ComptimeVar(vt)


def trace_call(tx, args, kwargs):
    if not args:
        raise TypeError("comptime(fn) needs a function fn(ctx)")
    fn = _real_callable(tx, args[0])

    def body(ctx):
        try:
            fn(ctx)
        except GraphBreak:
            raise
        except Exception as exc:
            # the engine turns errors while tracing into a graph break (the call then runs
            # eagerly, where comptime(fn) does nothing): say what went wrong, loudly
            name = getattr(fn, "__qualname__", repr(fn))
            filename, lineno, _, _ = tx.user_frame()
            sys.stderr.write(f"[comptime] comptime function {name} raised while tracing "
                             f"{os.path.basename(filename)}:{lineno}:\n")
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            raise RuntimeError(f"comptime function {name} raised {type(exc).__name__}: {exc}") from exc

    return _run(tx, body)


def trace_print(tx, args, kwargs):
    if len(args) != 1:
        raise TypeError("comptime.print(x) takes one value")
    return _run(tx, lambda ctx: ctx.print(ComptimeVar(args[0])))


def trace_graph_break(tx, args, kwargs):
    if _in_replay(tx):
        return ConstantVariable(None)
    ComptimeContext(tx).graph_break("comptime.graph_break()")


def run_ctx_method(tx, method: str):
    """`comptime.print_graph()` and the other shortcuts: `ctx.<method>()` at trace time."""
    return _run(tx, lambda ctx: getattr(ctx, method)())


# ---------------------------------------------------------------------- breakpoint: pdb at trace time

_skip_breakpoints = False  # set by `q` / end of input: later breakpoints in this process don't stop


class _Commands:
    """pdb's stdin when it is not a terminal: command_input's reader (echo, end of input)."""

    def __init__(self, out):
        self.out = out

    def readline(self) -> str:
        try:
            return command_input.read_command("", self.out) + "\n"
        except command_input.InputEnded as exc:
            self.out.write(f"[comptime] {exc.reason}: tracing continues\n")
            return ""  # Cmd turns this into the EOF command


class ComptimePdb(pdb.Pdb):
    """pdb whose `q` and end of input let tracing go on instead of killing the compile."""

    def __init__(self, user_frame=None):
        self.user_frame = user_frame  # (filename, lineno, name, line) of the comptime call
        if command_input.stdin_is_terminal():
            super().__init__(readrc=False, nosigint=True)
        else:
            out = sys.stdout
            super().__init__(stdin=_Commands(out), stdout=out, readrc=False, nosigint=True)
            self.use_rawinput = False

    def print_stack_entry(self, frame_lineno, prompt_prefix=pdb.line_prefix):
        # where the user is: their traced line, not this module's stop frame
        frame, _ = frame_lineno
        if frame.f_code is _stop_here.__code__ and self.user_frame is not None:
            filename, lineno, name, line = self.user_frame
            self.message(f"> {filename}({lineno}){name}() [traced by the engine]")
            if line and line.strip():
                self.message(f"{prompt_prefix.lstrip(chr(10))}{line.strip()}")
            return
        super().print_stack_entry(frame_lineno, prompt_prefix)

    def do_EOF(self, arg):
        global _skip_breakpoints
        _skip_breakpoints = True
        return self.do_continue(arg)

    def do_quit(self, arg):
        global _skip_breakpoints
        _skip_breakpoints = True
        self.message("[comptime] quit: tracing continues; later comptime.breakpoint() calls are skipped")
        return self.do_continue(arg)

    do_q = do_exit = do_quit


def _stop_here(ctx, dbg):  # the frame pdb stops in: `ctx` is its local
    dbg.set_trace(sys._getframe())
    return None  # (Pdb) ctx.print_locals() ... `c` continues tracing


def trace_breakpoint(tx, args, kwargs):
    if _in_replay(tx) or _skip_breakpoints:
        return ConstantVariable(None)
    ctx = ComptimeContext(tx)
    filename, lineno, name, line = tx.user_frame()
    out = sys.stdout
    out.write(f"[comptime] breakpoint while the engine traces {name} ({os.path.basename(filename)}:{lineno}). "
              "`ctx` is its view of the frame: ctx.print_locals(), ctx.print_graph(), ctx.print_guards(), "
              "ctx.print_bt(), ctx.disas(), ctx.print_value_stack(), ctx.get_local(name). `c` continues tracing.\n")
    if not command_input.stdin_is_terminal() and not command_input.at_eof():
        out.write("[comptime] stdin is not a terminal: reading pdb commands from it (end of input continues)\n")
    if command_input.at_eof():
        out.write("[comptime] stdin has ended: not stopping\n")
        return ConstantVariable(None)
    out.flush()
    previous = sys.gettrace()  # a coverage tool or outer debugger keeps its hook
    try:
        _stop_here(ctx, ComptimePdb((filename, lineno, name, line)))
    finally:
        sys.settrace(previous)
    return ConstantVariable(None)
