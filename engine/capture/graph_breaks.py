"""Every kind of graph break, in one table. Each has a stable id, a one-line reason, an
explanation of why the capture cannot continue, and a concrete hint. The table at the end
of docs/graph_breaks.md is generated from this one (`update_doc`)."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class GraphBreakKind:
    id: str
    reason: str
    explanation: str
    hint: str


KINDS: list[GraphBreakKind] = [
    GraphBreakKind(
        "GB0001", "Call to a builtin that cannot be traced",
        "The function is implemented in C and has effects the capture cannot see into or replay "
        "(e.g. `print`, `input`, `open`). It is run eagerly between two graphs.",
        "Move the call out of the compiled function, or, for logging calls, add the function to "
        "`engine.config.reorderable_logging_functions` so it is replayed after the graph."),
    GraphBreakKind(
        "GB0002", "Call to a C function or extension that cannot be traced",
        "The callee is not Python code (no bytecode to trace) and not a known torch operator, so the "
        "capture cannot tell what it does (e.g. `time.time`, a C extension).",
        "Call it outside the compiled region, or wrap the code that needs it in a function "
        "decorated with `@engine.disable` and pass its result in."),
    GraphBreakKind(
        "GB0003", "Data-dependent control flow on a tensor value",
        "A Python `if`/`while`/`and`/`or` needs the truth value of a tensor, which is only known "
        "when the graph runs.",
        "Use `torch.where(cond, a, b)` or `torch.cond(pred, true_fn, false_fn, operands)` to keep "
        "both branches in the graph, or compute the condition from shapes/constants."),
    GraphBreakKind(
        "GB0004", "Tensor.item() / Tensor.tolist() converts a tensor to Python scalars",
        "The value of the scalar is only known at run time, and the capture specializes on Python "
        "numbers.",
        "Set `engine.config.capture_scalar_outputs = True`, or keep the value as a 0-d tensor "
        "(e.g. `y * s_tensor` instead of `y * s_tensor.item()`)."),
    GraphBreakKind(
        "GB0005", "engine.graph_break() was called",
        "The user asked for a graph break here.",
        "Remove the `engine.graph_break()` call to keep one graph."),
    GraphBreakKind(
        "GB0006", "Call to a function marked with engine.disable",
        "The function was explicitly excluded from compilation, so it runs eagerly.",
        "Remove `@engine.disable` (or `engine.disallow_in_graph`) from the function if it should "
        "be compiled."),
    GraphBreakKind(
        "GB0007", "Tensor.backward() / autograd API call",
        "Calling the autograd engine from inside a captured region is not traced; it runs "
        "eagerly between graphs. A plain `loss.backward()` is traced into the graph when "
        "`engine.config.backward_in_graph` is on; the reason says why one was not.",
        "Accept the break (the compiled backward runs behind autograd), set "
        "`engine.config.backward_in_graph = True` (docs/training.md), or compile the forward "
        "and loss only and call `loss.backward()` outside."),
    GraphBreakKind(
        "GB0008", "Operator has a data-dependent output shape",
        "The output shape of the operator depends on tensor values (e.g. `nonzero`, boolean "
        "masking), which the capture cannot know before run time; or an operator on such a "
        "size would trace only by assuming its value (`x[mask] + w` assumes the mask keeps "
        "exactly w's length, where 1 would broadcast).",
        "Use a fixed-shape formulation (`torch.where(mask, x, 0)` instead of `x[mask]`), state "
        "the size with `torch._check(t.shape[0] == n)` (checked when the graph runs), or accept "
        "the break."),
    GraphBreakKind(
        "GB0009", "Operator failed on fake tensors",
        "Running the operator on FakeTensors (shape propagation) raised an error; the call is run "
        "eagerly so the real behaviour (or the real error) happens.",
        "Check the operator's arguments (shapes, dtypes); if the call is valid eagerly, report it."),
    GraphBreakKind(
        "GB0010", "Tensor converted to a Python or NumPy value",
        "`bool(t)`, `int(t)`, `float(t)` or iterating a tensor's values needs its data, which is "
        "only known at run time. NumPy code on ndarrays is traced (through torch._numpy), except "
        "what mutates an array (`arr.fill`, `arr += 1`, `out=`), `t.numpy()` of a tensor that "
        "requires grad, and NumPy functions torch._numpy does not have.",
        "Keep the computation in torch (`torch.where`, tensor ops), or move the conversion out "
        "of the compiled function."),
    GraphBreakKind(
        "GB0011", "Unsupported Python construct",
        "The capture does not model this bytecode instruction or object operation; the "
        "instruction is run eagerly.",
        "Rewrite the construct in a simpler form, or move it into a function decorated with "
        "`@engine.disable`."),
    GraphBreakKind(
        "GB0012", "Call to a torch-internal Python function that is not traced",
        "The function lives inside torch (optimizers, autograd utilities, ...) and is not a "
        "graph operator; it runs eagerly.",
        "Call it outside the compiled function, or accept the break (optimizer steps usually "
        "are)."),
    GraphBreakKind(
        "GB0013", "Call to an object the capture cannot model",
        "The callee is a user object with a custom `__call__`, a class with a custom `__new__` or "
        "metaclass, or another callable whose behaviour the capture does not model.",
        "Call a plain function or method instead, or wrap the call in `@engine.disable`."),
    GraphBreakKind(
        "GB0014", "nn.Module with hooks",
        "The module has backward hooks, or the global module registry has hooks (a module's own "
        "forward hooks and pre-hooks are traced with its forward).",
        "Remove the hooks while compiling, or compile the module's forward directly."),
    GraphBreakKind(
        "GB0015", "Exception raised while tracing",
        "The traced code raises an exception that no enclosing `try` in the compiled frame "
        "catches; the code runs eagerly so the real exception propagates.",
        "Nothing to fix if the exception is intended; otherwise check the inputs."),
    GraphBreakKind(
        "GB0016", "Graph break inside a `with` or `try` block",
        "A graph break happened inside a try block or a `with` block of a context manager other "
        "than torch.no_grad()/enable_grad()/set_grad_enabled() (those are split like any frame: "
        "the resume function re-enters the block); the frame is run eagerly instead of being split.",
        "Move the unsupported call out of the `with`/`try` block."),
    GraphBreakKind(
        "GB0017", "Mutation the capture cannot replay",
        "The code mutates an object (a closure cell, a tensor attribute, a builtin container of "
        "unknown origin) in a way the capture cannot replay after the graph.",
        "Return the new value instead of mutating it, or move the mutation out of the compiled function."),
    GraphBreakKind(
        "GB0018", "Value the generated code cannot rebuild",
        "A value that is live at a graph break or returned (a generator, a closure over a "
        "traced cell, an object built in an unsupported way) cannot be rebuilt after the graph.",
        "Return plain tensors, containers, dataclasses or namedtuples."),
    GraphBreakKind(
        "GB0019", "Python needs the value of a captured scalar",
        "With `config.capture_scalar_outputs = True`, `.item()` is a graph value (an unbacked "
        "symbol such as `u0`) whose number is only known when the graph runs; Python control "
        "flow, `int()`/`float()`, indexing or printing with it needs that number now.",
        "Keep the scalar in tensor ops (`torch.where(s > 0, a, b)`, `x * s`), or use "
        "`torch.cond` for control flow on it."),
    GraphBreakKind(
        "GB0020", "Collective communication call",
        "A collective (`torch.distributed.all_reduce`, `broadcast`, `barrier`, ..., or a functional "
        "collective) talks to the other ranks; the capture does not put it in a graph. It runs "
        "eagerly between two graphs with the real tensors, so every rank makes the same calls in "
        "the same order and the result is eager's.",
        "Call collectives outside the compiled function (before or after it), or accept the break. "
        "For gradient synchronization wrap the model in DDP or FSDP, which the engine compiles "
        "around. If ranks hang, `tlparse DIR --all-ranks-html` shows where their compiles differ."),
    GraphBreakKind(
        "GB0021", "Call of a DistributedDataParallel module",
        "DDP's own forward (buffer broadcast, the gradient reducer's bookkeeping) is torch's code "
        "and runs eagerly, as under torch.compile; the module it wraps compiles as a frame of its "
        "own, split at gradient-bucket boundaries (`engine.config.optimize_ddp`).",
        "Nothing to fix. To keep the surrounding code in one graph with the model, compile the "
        "wrapped module instead: `DDP(engine.compile(model))`."),
]

BY_ID: dict[str, GraphBreakKind] = {k.id: k for k in KINDS}


def kind(gb_id: str) -> GraphBreakKind:
    return BY_ID[gb_id]


class GraphBreak(Exception):
    """Raised inside the interpreter: the capture cannot continue at this instruction.
    `detail` says what exactly (e.g. which builtin); `kind` says which registry entry."""

    def __init__(self, gb_id: str, detail: str = "", user_stack: Optional[list] = None):
        self.kind = BY_ID[gb_id]
        self.detail = detail
        self.user_stack = user_stack or []
        super().__init__(self.message())

    def message(self) -> str:
        return self.kind.reason + (f": {self.detail}" if self.detail else "")


def render_markdown() -> str:
    lines = [
        "| id | reason | why | hint |",
        "| --- | --- | --- | --- |",
    ]
    for k in KINDS:
        lines.append(f"| {k.id} | {k.reason} | {k.explanation} | {k.hint} |")
    return "\n".join(lines) + "\n"


def update_doc(path: str) -> None:
    """Rewrite the table that ends the doc at `path` (docs/graph_breaks.md); the prose and the
    example above it are the doc's own."""
    with open(path) as f:
        text = f.read()
    head = text[:text.index(render_markdown().splitlines()[0])]
    with open(path, "w") as f:
        f.write(head + render_markdown())


if __name__ == "__main__":   # python -m engine.capture.graph_breaks docs/graph_breaks.md
    import sys
    update_doc(sys.argv[1])
