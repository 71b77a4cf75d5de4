"""comptime: code that runs while the engine traces, with the engine's own view of the
frame (variable trackers, the graph so far, guards), adding nothing to what it compiles."""

import contextlib
import dis
import io

import pytest
import torch

import engine
from engine.comptime import comptime

from debugger_helpers import REPO, fresh, run_script  # noqa: F401  (fresh is an autouse fixture)


ISSUE_EXAMPLE = """
    import torch, engine
    from engine.comptime import comptime

    @engine.compile(backend="eager")
    def fn(x, y, mode="add"):
        z = x + y if mode == "add" else x * y
        scale = z.shape[0]
        comptime.breakpoint()
        return z.relu() * scale

    x, y = torch.ones(3, 4), torch.ones(3, 4)
    out = fn(x, y)
    print("RESULT", torch.equal(out, (x + y).relu() * 3))
"""


def test_breakpoint_scripted_pdb_session_shows_the_engine_view(tmp_path):
    cmds = "\n".join([
        "ctx.print_locals()",
        "ctx.get_local('mode').as_python_constant()",
        "ctx.get_local('z').python_type().__name__",
        "ctx.get_local('z').as_fake().shape",
        "ctx.print_graph()",
        "ctx.print_guards()",
        "ctx.print_bt()",
        "c",
    ]) + "\n"
    p = run_script(tmp_path, ISSUE_EXAMPLE, cmds)
    out = p.stdout
    assert p.returncode == 0, p.stderr
    assert "[comptime] breakpoint while the engine traces fn" in out
    assert "(Pdb) ctx.print_locals()" in out  # commands from a pipe are echoed: a readable transcript
    assert "x = FakeTensor(..., size=(3, 4))" in out
    assert "z = FakeTensor(..., size=(3, 4))" in out
    assert "mode = 'add'" in out and "scale = 3" in out
    assert "\n'add'\n" in out and "\n'Tensor'\n" in out and "torch.Size([3, 4])" in out
    # the graph so far, rendered like TORCH_LOGS=graph_code: the add, with sizes
    assert 'add: "f32[3, 4][4, 1]cpu" = l_x_ + l_y_' in out
    assert "relu" not in out.split("ctx.print_graph()")[1].split("(Pdb)")[0]  # not traced yet
    # guards, rendered like TORCH_LOGS=guards
    assert "TENSOR_MATCH: check_tensor(L['x']" in out and "EQUALS_MATCH: L['mode'] == 'add'" in out
    bt = out.split("(Pdb) ctx.print_bt()")[1].split("(Pdb)")[0]
    assert "user_program.py\", line 9, in fn" in bt and "comptime.breakpoint()" in bt
    assert "RESULT True" in out


def test_breakpoint_without_commands_continues_with_a_note(tmp_path):
    p = run_script(tmp_path, ISSUE_EXAMPLE, "")
    assert p.returncode == 0, p.stderr
    assert "stdin is not a terminal" in p.stdout
    assert "end of input on stdin: tracing continues" in p.stdout
    assert "RESULT True" in p.stdout


def test_breakpoint_quit_keeps_compiling(tmp_path):
    p = run_script(tmp_path, ISSUE_EXAMPLE, "q\n")
    assert p.returncode == 0, p.stderr
    assert "[comptime] quit: tracing continues" in p.stdout
    assert "RESULT True" in p.stdout


def test_breakpoint_under_captured_stdin_does_not_hang(capsys):
    @engine.compile(backend="eager")
    def fn(x):
        y = x * 2
        comptime.breakpoint()
        return y + 1

    x = torch.randn(3)
    assert torch.allclose(fn(x), x * 2 + 1)
    out = capsys.readouterr().out
    assert "[comptime] breakpoint while the engine traces fn" in out
    assert "tracing continues" in out


def collect(fn, *args):
    """Run fn compiled with a backend that keeps every graph it is given."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    result = engine.compile(fn, backend=backend)(*args)
    return result, graphs


def test_comptime_fn_sees_trackers_and_renderers():
    seen = {}

    def probe(ctx):
        seen["mode"] = ctx.get_local("mode").as_python_constant()
        seen["z_type"] = ctx.get_local("z").python_type()
        seen["z_fake"] = ctx.get_local("z").as_fake()
        seen["scale"] = ctx.get_local("scale").as_python_constant()
        seen["z_source"] = ctx.get_local("z").source
        seen["x_source"] = ctx.get_local("x").source
        for name in ("print_locals", "print_graph", "print_guards", "print_bt", "disas", "print_value_stack"):
            buf = io.StringIO()
            getattr(ctx, name)(file=buf)
            seen[name] = buf.getvalue()

    def fn(x, y, mode="mul"):
        z = x + y if mode == "add" else x * y
        scale = z.shape[0]
        comptime(probe)
        return z.relu() * scale

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    out, graphs = collect(fn, x, y)
    assert torch.allclose(out, (x * y).relu() * 3)
    assert seen["mode"] == "mul" and seen["scale"] == 3
    assert seen["z_type"] is torch.Tensor and tuple(seen["z_fake"].shape) == (3, 4)
    assert type(seen["z_fake"]).__name__ == "FakeTensor"
    assert seen["x_source"] == "L['x']" and seen["z_source"] is None
    assert "y = FakeTensor(..., size=(3, 4))" in seen["print_locals"]
    assert "mul" in seen["print_graph"] and "relu" not in seen["print_graph"]
    assert "TENSOR_MATCH: check_tensor(L['y']" in seen["print_guards"]
    assert "comptime(probe)" in seen["print_bt"] and "in fn" in seen["print_bt"]
    # disas: the frame's bytecode with --> at the comptime call, via the bytecode renderer
    current = [ln for ln in seen["disas"].splitlines() if ln.lstrip().startswith("-->")]
    assert len(current) == 1 and "CALL" in current[0]
    assert "(empty value stack)" in seen["print_value_stack"]


def test_value_stack_shows_pending_operands():
    seen = {}

    def fn(x):
        # the comptime call happens while `x * 2` waits on the stack for the addition
        return x * 2 + (comptime(lambda ctx: seen.setdefault("stack", _stack_text(ctx))) or 1)

    x = torch.randn(2)
    out, _ = collect(fn, x)
    assert torch.allclose(out, x * 2 + 1)
    assert "[0] FakeTensor(..., size=(2,))" in seen["stack"]


def _stack_text(ctx):
    buf = io.StringIO()
    ctx.print_value_stack(file=buf)
    return buf.getvalue()


def test_comptime_adds_no_graph_break_and_nothing_to_the_compiled_code():
    def plain(x, y):
        z = torch.sin(x) + y
        return z.relu() * 2

    def with_comptime(x, y):
        z = torch.sin(x) + y
        comptime(lambda ctx: ctx.get_local("z"))
        comptime.print(z)
        comptime.print_graph()
        return z.relu() * 2

    x, y = torch.randn(4), torch.randn(4)
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        out_a, graphs_a = collect(plain, x, y)
        out_b, graphs_b = collect(with_comptime, x, y)
    assert torch.allclose(out_a, out_b)
    assert len(graphs_a) == len(graphs_b) == 1  # no graph break
    assert graphs_a[0].code == graphs_b[0].code  # the same graph, node for node
    assert "FakeTensor(..., size=(4,))" in buf.getvalue()
    # the generated code is the plain function's instruction for instruction
    from engine.capture import runtime

    def generated(name):
        return [[i.opname for i in dis.get_instructions(e.fn)]
                for c in runtime._CACHES.values() if c.code.co_name == name for e in c.entries]

    assert generated("with_comptime") and generated("with_comptime") == generated("plain")
    explained = engine.explain(with_comptime)
    with contextlib.redirect_stdout(io.StringIO()):
        report = explained(x, y)
    assert report.graph_break_count == 0 and report.graph_count == 1


TRACE_TIME_CALLS = []


def record_x_shape(ctx):
    TRACE_TIME_CALLS.append(ctx.get_local("x").as_fake().shape)


def test_comptime_runs_at_trace_time_only():
    TRACE_TIME_CALLS.clear()

    @engine.compile(backend="eager")
    def fn(x):
        comptime(record_x_shape)
        return x + 1

    for _ in range(3):
        fn(torch.randn(5))
    assert TRACE_TIME_CALLS == [torch.Size([5])]  # traced once; the cached code never runs it
    fn(torch.randn(2, 2))                          # a new shape: traced again
    assert TRACE_TIME_CALLS == [torch.Size([5]), torch.Size([2, 2])]


def test_comptime_before_a_graph_break_runs_once():
    calls = []

    @engine.compile(backend="eager")
    def fn(x):
        y = x + 1
        comptime(lambda ctx: calls.append("before"))
        print("graph break")  # the frame is re-traced up to here before it is compiled
        comptime(lambda ctx: calls.append(ctx.get_local("y").as_fake().shape))
        return y * 2

    with contextlib.redirect_stdout(io.StringIO()):
        out = fn(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 4.0))
    assert calls == ["before", torch.Size([2])]  # the second ran while tracing the resume function


def test_ctx_graph_break_splits_the_graph():
    def fn(x):
        y = torch.cos(x)
        comptime(lambda ctx: ctx.graph_break())
        return torch.sin(y)

    x = torch.randn(3)
    out, graphs = collect(fn, x)
    assert torch.allclose(out, torch.sin(torch.cos(x)))
    assert len(graphs) == 2
    assert "cos" in graphs[0].code and "sin" in graphs[1].code


def test_comptime_in_an_inlined_function_sees_its_frame_and_caller():
    seen = {}

    def helper(t, k):
        comptime(lambda ctx: seen.update(k=ctx.get_local("k").as_python_constant(),
                                         outer=ctx.get_local("n", stacklevel=1).as_python_constant(),
                                         bt=_bt(ctx)))
        return t * k

    def fn(x, n):
        return helper(x, n + 1)

    x = torch.randn(2)
    out, graphs = collect(fn, x, 4)
    assert torch.allclose(out, x * 5)
    assert seen["k"] == 5 and seen["outer"] == 4
    assert seen["bt"].index("in fn") < seen["bt"].index("in helper")  # outermost first


def _bt(ctx):
    buf = io.StringIO()
    ctx.print_bt(file=buf)
    return buf.getvalue()


def test_get_local_errors_are_clear():
    errors = {}

    def probe(ctx):
        with pytest.raises(KeyError, match="'nope' is not a local of fn"):
            ctx.get_local("nope")
        with pytest.raises(NotImplementedError, match="not a Python constant"):
            ctx.get_local("x").as_python_constant()
        errors["ok"] = True

    def fn(x):
        comptime(probe)
        return x + 1

    collect(fn, torch.randn(2))
    assert errors == {"ok": True}


def test_a_failing_comptime_function_is_reported_and_results_stay_right(capsys):
    @engine.compile(backend="eager")
    def fn(x):
        comptime(lambda ctx: ctx.get_local("x").as_python_constant())  # a tensor is no constant
        return x + 1

    x = torch.randn(2)
    assert torch.equal(fn(x), x + 1)
    err = capsys.readouterr().err
    assert "[comptime] comptime function" in err and "raised while tracing" in err
    assert "NotImplementedError" in err and "is not a Python constant" in err


def test_eager_calls_are_harmless(capsys):
    comptime.breakpoint()                     # nothing happens outside a compile
    comptime.print_graph()
    comptime.print(torch.tensor([1.0, 2.0]))  # the value itself
    assert comptime(lambda ctx: 1 / 0, lambda: "fallback") == "fallback"
    assert comptime(lambda ctx: 1 / 0) is None
    assert capsys.readouterr().out == "tensor([1., 2.])\n"
