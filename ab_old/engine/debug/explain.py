"""explain(): run a function compiled with a counting backend and report its graphs,
graph breaks (reason, user stack, registry id, hint), ops and guards. Built from bus
events (`graph_break`, `dynamo_cpp_guards_str`), not a second instrumentation path."""

from __future__ import annotations

import dataclasses

import observe


@dataclasses.dataclass
class BreakReason:
    reason: str
    user_stack: list            # [(filename, lineno, name, line)], outermost first
    graph_break_id: str
    hint: str
    explanation: str = ""

    def __str__(self) -> str:
        where = self.user_stack[-1] if self.user_stack else None
        loc = f" at {where[0]}:{where[1]}" if where else ""
        return f"[{self.graph_break_id}] {self.reason}{loc}"


@dataclasses.dataclass
class ExplainOutput:
    graphs: list = dataclasses.field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: list = dataclasses.field(default_factory=list)
    op_count: int = 0
    ops_per_graph: list = dataclasses.field(default_factory=list)
    out_guards: list = dataclasses.field(default_factory=list)
    compile_times: str = ""
    not_compiled: list = dataclasses.field(default_factory=list)   # functions the engine declined, with why

    def __str__(self) -> str:
        # PyTorch's layout; styled with rich only when printed to a terminal.
        from .explain_render import render

        return render(self)


def _op_name(node) -> str:
    t = node.target
    if isinstance(t, str):
        return f"<method {t}>"
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)
    return f"{mod}.{name}" if mod else name


def explain(fn, *extra_args, **extra_kwargs):
    from ..api import OptimizedModule, compile as engine_compile, reset

    def run(*args, **kwargs):
        result = ExplainOutput()
        graphs = []

        def counting_backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def on_event(event):
            md = event.metadata
            if event.name == "compile_declined":
                result.not_compiled.append(f"{md['function']} ({md['filename']}:{md['line']}): {md['reason']}")
                return
            stack = [(f["filename"], f["line"], f["name"], f.get("code", "")) for f in md.get("user_stack", [])]
            result.break_reasons.append(BreakReason(md["reason"], stack, md["graph_break_id"], md["hint"],
                                                    md.get("explanation", "")))

        captured_guards = []
        reset()  # like PyTorch's explain: count this program's graphs, not what earlier calls cached
        target = fn._orig_mod if isinstance(fn, OptimizedModule) else getattr(fn, "_engine_orig", fn)
        observe.subscribe(on_event, events=["graph_break", "compile_declined"])
        try:
            from ..capture import runtime
            before = {code: list(c.entries) for code, c in runtime._CACHES.items()}
            compiled = engine_compile(target, backend=counting_backend)
            compiled(*args, **kwargs)
            for code, c in runtime._CACHES.items():
                old = before.get(code, [])
                for e in c.entries:
                    if e not in old:
                        captured_guards.extend(e.guards.guards)
        finally:
            observe.unsubscribe(on_event)
        result.graphs = graphs
        result.graph_count = len(graphs)
        result.graph_break_count = max(0, len(graphs) - 1)
        result.ops_per_graph = [[_op_name(n) for n in g.graph.nodes if n.op in ("call_function", "call_method",
                                                                                  "call_module")] for g in graphs]
        result.op_count = sum(len(o) for o in result.ops_per_graph)
        result.out_guards = captured_guards
        from observe.metrics import compile_times
        result.compile_times = compile_times()
        return result

    if extra_args or extra_kwargs:
        return run(*extra_args, **extra_kwargs)
    return run
