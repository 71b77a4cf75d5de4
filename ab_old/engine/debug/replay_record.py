"""The record `engine.debug.replay` keeps while the symbolic interpreter traces: one `Step`
per traced instruction, with what a person needs to step back through the trace.

The interpreter calls `Recorder.step(frame, inst, handler)` instead of `handler(inst)`
only while a recorder is installed (`interpreter.recorder`); with none installed the
per-instruction cost is one local `is None` test. Everything a step shows is rendered to
strings when the step is taken, so stepping back shows the values as they were then
(a list the program appends to later is not shown with its later items).
"""

from __future__ import annotations

import dataclasses
import linecache
from typing import Any, Optional

from .bytecode_debugger import render_value

_WIDTH = 100  # characters of one rendered value


@dataclasses.dataclass(slots=True)
class Step:
    """One traced instruction. `stack` and `locals` are the state before it ran;
    `nodes` and `guards` what it added (an inlined call's own instructions keep theirs)."""

    index: int
    compile_id: str            # [frame/compile] plus _attempt after a restart, as in the logs
    depth: int                 # inline depth: 0 for the compiled frame
    parent: Optional[int]      # the step (a CALL in the caller) this inlined instruction runs under
    function: str
    filename: str
    lineno: Optional[int]
    source: str                # the user's source line
    offset: int
    opname: str
    argrepr: str
    stack: tuple[str, ...]
    locals: dict[str, str]
    nodes: tuple[str, ...] = ()
    guards: tuple[str, ...] = ()
    event: str = ""            # "graph break: ..." or "raised ..." when the instruction did not finish

    @property
    def is_break(self) -> bool:
        return self.event.startswith("graph break")


@dataclasses.dataclass
class Recording:
    steps: list[Step] = dataclasses.field(default_factory=list)
    inputs: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # compile id -> graph inputs made before its first step

    def inline_stack(self, i: int) -> list[Step]:
        """The steps step i runs under, outermost first, ending with step i."""
        chain = []
        s: Optional[Step] = self.steps[i]
        while s is not None:
            chain.append(s)
            s = self.steps[s.parent] if s.parent is not None else None
        return list(reversed(chain))

    def graph_until(self, i: int) -> list[str]:
        """The nodes the capture attempt of step i had added when step i finished."""
        cid = self.steps[i].compile_id
        return list(self.inputs.get(cid, [])) + [n for s in self.steps[:i + 1] if s.compile_id == cid for n in s.nodes]

    def to_json(self) -> dict:
        return {"inputs": self.inputs, "steps": [dataclasses.asdict(s) for s in self.steps]}

    @classmethod
    def from_json(cls, data: dict) -> "Recording":
        return cls([Step(**s) for s in data.get("steps", [])], dict(data.get("inputs", {})))


def render_variable(vt: Any) -> str:
    """One line for a variable tracker: tensors by their graph node, dtype and shape;
    constants by their value (the bytecode debugger's rendering); others by their repr."""
    from ..capture.variables import ConstantVariable, NullVariable, TensorVariable

    if isinstance(vt, TensorVariable):
        fake = vt.fake
        try:
            shape = list(fake.shape)
            return f"Tensor %{vt.proxy.node.name} {str(fake.dtype).replace('torch.', '')}{shape}"
        except Exception:  # a fake whose metadata cannot be read (should not happen): say which node
            return f"Tensor %{vt.proxy.node.name}"
    if isinstance(vt, ConstantVariable):
        return render_value(vt.value, _WIDTH)
    if isinstance(vt, NullVariable):
        return "NULL"
    try:
        text = repr(vt)
    except Exception:
        text = f"<{type(vt).__name__}>"
    return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + "..."


class Recorder:
    """Installed as `engine.capture.interpreter.recorder` while replay records.

    While recording, the steps are one flat list of strings and numbers (`_flat`, each
    step starting at `_starts[i]`): a step allocates no object the garbage collector
    tracks, so recording does not bring on extra collections (one object per step made
    the full collection of a model's heap, ~0.15 s, happen in every other replay). What a
    step added (nodes, guards, the break it raised) waits in `_added` under its index.
    `recording` turns them into Steps once the compile is over."""

    _FIELDS = 11   # compile id, depth, parent, function, file, line, source, offset, opname, argrepr, stack size

    def __init__(self):
        self._flat: list = []
        self._starts: list[int] = []
        self._added: dict[int, list] = {}  # step index -> [nodes, guards, event]
        self.inputs: dict[str, list[str]] = {}
        self._open: list[int] = []         # indices of the steps running now, innermost last
        self._graph = None                 # the OutputGraph the counts below belong to
        self._states: dict[int, tuple] = {}  # id(OutputGraph) -> its counts, while another one is traced
        self._seen: set = set()
        self._node_count = 0
        self._guard_count = 0
        self._shape_guards: list = []
        self._shape_guard_count = 0
        self._raised: Optional[int] = None  # id of the exception already noted on an inner step
        self._rendered: dict[int, str] = {}   # id -> text of trackers whose text cannot change ...
        self._rendered_of: dict[int, Any] = {}  # ... and the tracker (an id is only unique while it lives)
        self._lines: dict = {}
        self._compile_id = "?"
        from ..capture.variables import DictVariable, ListVariable, SetVariable, TupleVariable, VariableTracker
        self._mutable = {DictVariable, ListVariable, SetVariable, TupleVariable}
        self._tracker = VariableTracker

    # ------------------------------------------------------------------ the hook
    def step(self, frame, inst, handler) -> None:
        out = frame.out
        if out is not self._graph:
            self._start_graph(out)
        elif out.graph._len != self._node_count or len(out.guards) != self._guard_count \
                or len(self._shape_guards) != self._shape_guard_count:
            self._flush(out)
        index = len(self._starts)
        flat = self._flat
        self._starts.append(len(flat))
        code = frame.code
        render = self._render
        lineno = inst.lineno
        # the fields, the stack's size and values, then name, value pairs of the locals
        stack = frame.stack
        flat += (self._compile_id, frame.depth, self._open[-1] if self._open and frame.parent is not None else None,
                 code.co_name, code.co_filename, lineno, self._source_line(code.co_filename, lineno),
                 inst.offset, inst.opname, inst.argrepr or (inst.argval if inst.argval is not None else ""),
                 len(stack))
        rendered, rendered_of = self._rendered, self._rendered_of
        for v in stack:
            text = rendered.get(id(v))    # _render's cache, looked up here: this loop runs ~10 times a step
            flat.append(text if text is not None and rendered_of[id(v)] is v else render(v))
        for name, v in frame.locals.items():
            text = rendered.get(id(v))
            flat.append(name)
            flat.append(text if text is not None and rendered_of[id(v)] is v else render(v))
        for name, cell in frame.cells.items():   # the variables a closure shares, by their names too
            v = getattr(cell, "value", None)
            flat.append(name)
            flat.append(render(v) if isinstance(v, self._tracker) else "<empty cell>")
        self._open.append(index)
        try:
            handler(inst)
        except BaseException as exc:
            self._note_exception(index, exc)
            raise
        finally:
            if out is self._graph and (out.graph._len != self._node_count or len(out.guards) != self._guard_count
                                       or len(self._shape_guards) != self._shape_guard_count):
                self._flush(out)
            self._open.pop()

    def note_event(self, index: int, event: str) -> None:
        self._added.setdefault(index, [(), (), ""])[2] = event

    def rows_of(self, compile_id: str) -> list[int]:
        return [i for i, start in enumerate(self._starts) if self._flat[start] == compile_id]

    def event_of(self, index: int) -> str:
        return self._added.get(index, [(), (), ""])[2]

    @property
    def recording(self) -> Recording:
        steps = []
        flat, starts, n = self._flat, self._starts, self._FIELDS
        for i, start in enumerate(starts):
            r = flat[start:starts[i + 1] if i + 1 < len(starts) else len(flat)]
            nodes, guards, event = self._added.get(i, ((), (), ""))
            argrepr = r[9] if isinstance(r[9], str) else str(r[9])
            end = n + r[10]
            steps.append(Step(i, *r[:9], argrepr, tuple(r[n:end]), dict(zip(r[end::2], r[end + 1::2])),
                              tuple(nodes), tuple(guards), event))
        return Recording(steps, dict(self.inputs))

    # ------------------------------------------------------------------ attribution
    def _source_line(self, filename: str, lineno: Optional[int]) -> str:
        key = (filename, lineno)
        text = self._lines.get(key)
        if text is None:
            text = self._lines[key] = linecache.getline(filename, lineno).strip() if lineno else ""
        return text

    _STATE = ("_graph", "_compile_id", "_seen", "_node_count", "_guard_count", "_shape_guards",
              "_shape_guard_count")

    def _start_graph(self, out) -> None:
        """Switch to another capture's OutputGraph (a new attempt, or back to one whose
        trace compiled another frame in between): its counts are kept apart."""
        import observe

        if self._graph is not None:
            self._flush(self._graph)
            self._states[id(self._graph)] = tuple(getattr(self, k) for k in self._STATE)
        saved = self._states.get(id(out))
        if saved is not None and saved[0] is out:
            for k, v in zip(self._STATE, saved):
                setattr(self, k, v)
            self._flush(out)
            return
        self._graph = out
        self._compile_id = str(observe.current_compile_id() or "?")
        self._seen = set(out.graph.nodes)
        self._node_count = out.graph._len
        self.inputs.setdefault(self._compile_id, [_format_node(n) for n in out.graph.nodes])
        self._guard_count = len(out.guards)
        env = getattr(out.fake_mode, "shape_env", None)
        self._shape_guards = getattr(env, "guards", None)
        if not isinstance(self._shape_guards, list):
            self._shape_guards = []
        self._shape_guard_count = len(self._shape_guards)

    def _flush(self, out) -> None:
        """What was added since the last step boundary belongs to the innermost open step."""
        graph = out.graph
        added = self._added.setdefault(self._open[-1], [(), (), ""]) if self._open else [(), (), ""]
        self._node_count = graph._len
        new = []
        for node in reversed(graph.nodes):       # appended nodes are at the end ...
            if node in self._seen:
                break
            new.append(node)
        new.reverse()
        if len(self._seen) + len(new) < graph._len:
            # ... graph inputs are inserted after the other placeholders
            new = [n for n in graph.nodes if n.op == "placeholder" and n not in self._seen] + new
        self._seen.update(new)
        if new:
            added[0] += tuple(_format_node(n) for n in new)
        if len(out.guards) != self._guard_count:
            from ..guards.render import expression
            guards = list(out.guards.values())[self._guard_count:]
            self._guard_count = len(out.guards)
            added[1] += tuple(f"{g.kind}: {expression(g)}" for g in guards)
        if len(self._shape_guards) != self._shape_guard_count:
            guards = self._shape_guards[self._shape_guard_count:]
            self._shape_guard_count = len(self._shape_guards)
            added[1] += tuple(f"SHAPE_ENV: {getattr(g, 'expr', g)}" for g in guards)

    def _note_exception(self, index: int, exc: BaseException) -> None:
        from ..capture.graph_breaks import GraphBreak
        from ..capture.interpreter import TracedException, _Return

        if isinstance(exc, _Return) or id(exc) == self._raised:
            return   # a return, or already noted on the inlined instruction that raised it
        self._raised = id(exc)
        if isinstance(exc, GraphBreak):
            event = f"graph break: {exc.message()}"
        elif isinstance(exc, TracedException):
            event = f"raised {exc.describe()}"
        else:
            event = f"raised {type(exc).__name__}: {exc}"
        self.note_event(index, event)

    def _render(self, vt) -> str:
        key = id(vt)
        text = self._rendered.get(key)
        if text is not None and self._rendered_of[key] is vt:
            return text
        text = render_variable(vt)
        if type(vt) not in self._mutable:   # a container's text changes with its items: rendered each time
            self._rendered[key] = text
            self._rendered_of[key] = vt
        return text


def _format_node(node) -> str:
    """`%add = operator.add(%l_x_, %l_y_)`: the node as a line of the graph's code."""
    try:
        if node.op == "placeholder":
            return f"%{node.name} = input {node.target}"
        if node.op == "get_attr":
            return f"%{node.name} = self.{node.target}"
        if node.op == "output":
            return f"return {_format_arg(node.args[0])}"
        args = [_format_arg(a) for a in node.args] + [f"{k}={_format_arg(v)}" for k, v in node.kwargs.items()]
        if node.op == "call_method":
            return f"%{node.name} = {args[0]}.{node.target}({', '.join(args[1:])})"
        target = node.target if isinstance(node.target, str) else _qualified_name(node.target)
        return f"%{node.name} = {target}({', '.join(args)})"
    except Exception:   # a target or argument that cannot be named: say which node it is
        return f"%{node.name} = {node.op}"


def _format_arg(a) -> str:
    import torch.fx

    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, tuple):
        return "(" + ", ".join(_format_arg(x) for x in a) + ("," if len(a) == 1 else "") + ")"
    if isinstance(a, list):
        return "[" + ", ".join(_format_arg(x) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_format_arg(v)}" for k, v in a.items()) + "}"
    text = repr(a)
    return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + "..."


def _qualified_name(fn) -> str:
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if mod in ("_operator", "operator"):
        mod = "operator"
    elif mod == "torch":
        name = getattr(fn, "__name__", name)   # torch.relu's qualname is _VariableFunctionsClass.relu
    elif mod.startswith("torch._C"):
        # the C bindings behind torch.relu and F.gelu: named as the user wrote them
        mod = "torch.nn.functional" if mod == "torch._C._nn" else "torch"
        name = getattr(fn, "__name__", name)
    return f"{mod}.{name}" if mod else name
