"""comptime: code that runs while the engine traces a frame, not when it runs.

    from engine.comptime import comptime

    @engine.compile(backend="eager")
    def fn(x, y):
        z = x + y
        comptime.breakpoint()                       # pdb at trace time, `ctx` in scope
        comptime(lambda ctx: ctx.print_graph())     # any fn(ctx) at trace time
        comptime.print(z)                           # FakeTensor(..., size=(4,))
        return z.relu()

The symbolic interpreter recognises these calls (the `__engine_comptime__` marker on the
functions below) and runs them with the live interpreter instead of tracing them: they
add no graph break, nothing to the graph and nothing to the generated code. `ctx` is an
`engine.debug.comptime_context.ComptimeContext`.

Run eagerly (outside a compile, or in code the engine runs eagerly after a graph break)
they do what is sensible without a tracer: `comptime(fn, fallback_fn)` calls
`fallback_fn()` (default: nothing), `comptime.print(x)` prints `x` with the builtin
print, and `comptime.breakpoint()` and the `comptime.print_*` shortcuts do nothing.
"""

from __future__ import annotations

import builtins
from typing import Any, Callable


def _trace_time(handler_name: str, drop_self: bool = False):
    """Mark a function as comptime: the interpreter calls
    `comptime_context.<handler_name>(tx, args, kwargs)` instead of tracing it."""

    def mark(fn):
        def handler(tx, args, kwargs):
            from .debug import comptime_context
            return getattr(comptime_context, handler_name)(tx, list(args)[1:] if drop_self else list(args), kwargs)

        fn.__engine_comptime__ = handler
        return fn

    return mark


def _ctx_shortcut(method: str):
    """Mark `comptime.<method>()`: at trace time it runs `ctx.<method>()`."""

    def mark(fn):
        def handler(tx, args, kwargs):
            from .debug import comptime_context
            return comptime_context.run_ctx_method(tx, method)

        fn.__engine_comptime__ = handler
        return fn

    return mark


class _Comptime:
    """The `comptime` object. Its methods are markers the interpreter recognises."""

    __slots__ = ()  # no __dict__: the capture guards it by identity

    @_trace_time("trace_call", drop_self=True)
    def __call__(self, fn: Callable[[Any], Any], fallback_fn: Callable[[], Any] = lambda: None):
        """`fn(ctx)` runs at trace time when compiled; `fallback_fn()` when run eagerly."""
        return fallback_fn()

    @staticmethod
    @_trace_time("trace_breakpoint")
    def breakpoint():
        """Open pdb while the engine traces this line, with `ctx` in scope. Eagerly:
        nothing (use the builtin breakpoint() for a runtime stop)."""

    @staticmethod
    @_trace_time("trace_print")
    def print(e):
        """Print what the engine knows about `e` at trace time (a tensor as
        `FakeTensor(..., size=(3, 4))`); eagerly, print `e` itself."""
        builtins.print(e)

    @staticmethod
    @_trace_time("trace_graph_break")
    def graph_break():
        """Break the graph here (from trace-time code); eagerly: nothing."""

    @staticmethod
    @_ctx_shortcut("print_graph")
    def print_graph():
        """The graph traced so far; eagerly: nothing."""

    @staticmethod
    @_ctx_shortcut("print_locals")
    def print_locals():
        """The frame's locals as the engine sees them; eagerly: nothing."""

    @staticmethod
    @_ctx_shortcut("print_bt")
    def print_bt():
        """The user stack being traced; eagerly: nothing."""

    @staticmethod
    @_ctx_shortcut("print_guards")
    def print_guards():
        """The guards installed so far; eagerly: nothing."""

    @staticmethod
    @_ctx_shortcut("print_value_stack")
    def print_value_stack():
        """The interpreter's value stack; eagerly: nothing."""

    @staticmethod
    @_ctx_shortcut("disas")
    def disas():
        """The frame's bytecode with the current instruction marked; eagerly: nothing."""

    def __repr__(self) -> str:
        return "engine.comptime.comptime"


comptime = _Comptime()

__all__ = ["comptime"]
