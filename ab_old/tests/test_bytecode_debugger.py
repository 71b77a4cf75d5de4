"""The bytecode step debugger: a (bdb) prompt on the code the engine generated for each
compiled frame, stepping it with real values and showing the real value stack."""

import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import engine
from engine.capture.bytecode_builder import BytecodeBuilder
from engine.debug.bytecode_debugger import Session, debug
from engine.capture.pyversion import V
from engine.debug.bytecode_eval import EvalFrame, NotSteppable

from debugger_helpers import REPO, fresh, run_script  # noqa: F401  (fresh is an autouse fixture)


def call_slots(callable_line: str) -> list:
    """A callable and its NULL as the debugger lists them, in this Python's order
    (NULL below the callable before 3.13, above it from 3.13)."""
    return [callable_line, "NULL"] if V.null_above_callable else ["NULL", callable_line]


PRINT_IN_THE_MIDDLE = """
    import torch, engine

    @engine.compile(backend="eager")
    def fn(x, y):
        z = x + y
        print("in the middle", z.shape)   # graph break: the rest runs in a resume function
        return z.relu() * 2

    x, y = torch.full((4,), 2.0), torch.full((4,), 3.0)
    with engine.bytecode_debugger.debug():
        out = fn(x, y)
    print("RESULT", out.tolist())
"""


def test_scripted_session_through_a_graph_break(tmp_path):
    cmds = "ll\ns 3\nstack\nlocals\np L['x'] + 1\nc\nl\nwhere\nc\n"
    p = run_script(tmp_path, PRINT_IN_THE_MIDDLE, cmds)
    out = p.stdout
    assert p.returncode == 0, p.stderr
    first, second = out.split("[bdb] frame 2:")
    # frame 1: the first frame's generated code, with the regions its code generator recorded
    assert "[bdb] frame 1: fn" in first
    listing = first.split("(bdb) ll")[1].split("(bdb)")[0]
    labels = re.findall(r"\[(\w+)\]\s*$", listing, re.M)
    assert labels.index("call_graph") < labels.index("graph_break") < labels.index("resume_call")
    assert re.search(r"CALL .*\[graph_break\]", listing) and re.search(r"RETURN_VALUE .*\[resume_call\]", listing)
    # after 3 steps: NULL, the compiled graph and the real first input are on the stack
    stack = first.split("(bdb) stack")[1].split("(bdb)")[0]
    slots = call_slots("<bound method forward of GraphModule()>")
    assert stack.splitlines()[1:] == [f"  [0] {slots[0]}", f"  [1] {slots[1]}",
                                      "  [2] {'x': tensor([2., 2., 2., 2.]), 'y': tensor([3., 3., 3., 3.])}"]
    assert "tensor([3., 3., 3., 3.])" in first.split("(bdb) p L['x'] + 1")[1]
    assert "in the middle torch.Size([4])" in first  # the graph-break call ran for real
    # frame 2: the resume function's own generated code, called from frame 1's resume_call
    assert second.startswith(" engine_resume_in_fn_at_")
    where = second.split("(bdb) where")[1].split("(bdb)")[0]
    assert re.search(r"1 fn .*CALL \[resume_call\]", where) and "> 2 engine_resume_in_fn_at_" in where
    assert "RESULT [10.0, 10.0, 10.0, 10.0]" in out


def test_no_commands_on_a_pipe_continues_with_a_note(tmp_path):
    p = run_script(tmp_path, PRINT_IN_THE_MIDDLE, "")
    assert p.returncode == 0, p.stderr
    assert "[bdb] stdin is not a terminal" in p.stdout
    assert "end of input on stdin: continuing without the debugger" in p.stdout
    assert p.stdout.count("[bdb] frame") == 1  # nothing stops once input has ended
    assert "RESULT [10.0, 10.0, 10.0, 10.0]" in p.stdout


def test_an_open_pipe_with_no_commands_times_out_instead_of_hanging(tmp_path):
    script = tmp_path / "user_program.py"
    script.write_text(textwrap.dedent(PRINT_IN_THE_MIDDLE))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ENGINE_DEBUGGER_STDIN_TIMEOUT="1")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        proc.wait(timeout=120)  # stdin stays open and silent; the output is small enough for the pipes
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        proc.kill()
        proc.stdin.close()
    assert proc.returncode == 0, err
    assert "no command on stdin within 1 s" in out
    assert "RESULT [10.0, 10.0, 10.0, 10.0]" in out


def session(fn, args, commands, kwargs=None):
    out = io.StringIO()
    with debug(commands, out=out):
        result = fn(*args, **(kwargs or {}))
    return result, out.getvalue()


def test_stepping_shows_the_real_stack_before_the_graph_call():
    @engine.compile(backend="eager")
    def fn(x, d):
        return x * 2 + d["bias"]

    x = torch.tensor([1.0, -1.0])
    # the offset of the graph call, from a first listing; then break there and look at
    # the stack it will be called with, step over it and look at what it returned
    _, listing = session(fn, (x, {"bias": 0.5}), ["ll", "q"])
    call_line = next(ln for ln in listing.splitlines() if re.search(r"\bCALL\b.*\[call_graph\]", ln))
    offset = int(call_line.split()[1])
    result, text = session(fn, (x, {"bias": 0.5}), [f"b {offset}", "c", "stack", "s", "stack", "c"])
    assert torch.equal(result, x * 2 + 0.5)
    assert f"breakpoint set at offset {offset}: CALL [call_graph]" in text
    assert f"[bdb] breakpoint at offset {offset}" in text
    before = text.split("(bdb) stack")[1].split("(bdb)")[0].splitlines()[1:]
    null, graph = (1, 0) if V.null_above_callable else (0, 1)
    assert before[null] == f"  [{null}] NULL" and "GraphModule" in before[graph]
    assert before[2] == "  [2] Tensor(float32[2]) tensor([ 1., -1.])"  # d["bias"] became a constant
    after = text.split("(bdb) stack")[2].split("(bdb)")[0].splitlines()[1:]
    assert len(after) == 1 and "(tensor([ 2.5000, -1.5000]),)" in after[0]  # the graph's real output tuple


def test_locals_are_the_users_variables_and_the_generated_temporaries():
    @engine.compile(backend="eager")
    def fn(x):
        d = {}
        y = x.sin()
        d["y"] = y
        print("graph break")
        return d["y"].cos() + y + x

    x = torch.tensor([0.0, 1.0])
    # break at the call of the resume function: everything the rest of fn needs is built
    _, listing = session(fn, (x,), ["ll", "q"])
    resume_call = [ln for ln in listing.splitlines() if re.search(r"\bCALL\b.*\[resume_call\]", ln)][-1]
    offset = int(resume_call.split()[1])
    with contextlib.redirect_stdout(io.StringIO()):
        result, text = session(fn, (x,), ["locals", f"b {offset}", "c", "locals", "p d['y'] is graph_out_0[0]",
                                          "p L['x'] is x", "c", "locals", "c"])
    assert torch.equal(result, x.sin().cos() + x.sin() + x)
    frame1, frame2 = text.split("[bdb] frame 2:")
    first = frame1.split("(bdb) locals")[1].split("(bdb)")[0].splitlines()[1:]
    assert first == ["  x = Tensor(float32[2]) tensor([0., 1.])"]    # not L = {...}, G = {...}, F = ...
    at_resume = frame1.split("(bdb) locals")[2].split("(bdb)")[0].splitlines()[1:]
    names = [ln.split(" = ")[0].strip() for ln in at_resume]
    assert names[:3] == ["x", "d", "y"] and "graph_out_0" in names and not {"L", "G", "F"} & set(names)
    assert any(ln.startswith("  d = {'y': tensor([0.0000, 0.8415])}  # __t") and
               ln.endswith(", passed to the resume function") for ln in at_resume)
    assert "  y = Tensor(float32[2]) tensor([0.0000, 0.8415])  # graph_out_0[0], passed to the resume function" \
        in at_resume
    assert any(ln.startswith("  graph_out_0 = (tensor([0.0000, 0.8415]),)  # __o") for ln in at_resume)
    assert "(bdb) p d['y'] is graph_out_0[0]\nTrue" in frame1 and "(bdb) p L['x'] is x\nTrue" in frame1
    # the resume function's frame: the same names, now its arguments
    resumed = frame2.split("(bdb) locals")[1].split("(bdb)")[0].splitlines()[1:]
    assert {"x", "d", "y"} <= {ln.split(" = ")[0].strip() for ln in resumed}


def test_step_count_and_listing_range():
    @engine.compile(backend="eager")
    def fn(x):
        return torch.sin(x) + 1

    _, text = session(fn, (torch.zeros(2),), ["s 2", "l 0, 4", "q"])
    shown = [ln for ln in text.splitlines() if "-->" in ln]
    offsets = [int(ln.split()[2]) for ln in shown]
    listing = [int(ln.split()[1]) for ln in text.split("(bdb) l 0, 4")[1].split("(bdb)")[0].splitlines()[1:]]
    assert offsets[0] == 0 and offsets[1] > listing[-1]  # two instructions on, past offsets 0 and 2
    ranged = text.split("(bdb) l 0, 4")[1].split("(bdb)")[0].splitlines()[1:]
    assert ranged and all(0 <= int(re.search(r"\s(\d+)\s+[A-Z_]{3,}", ln).group(1)) <= 4 for ln in ranged)


def test_quit_runs_the_rest_without_stopping():
    @engine.compile(backend="eager")
    def fn(x):
        y = x + 1
        print("break")
        return y * 3

    import contextlib
    with contextlib.redirect_stdout(io.StringIO()):
        result, text = session(fn, (torch.ones(2),), ["q"])
    assert torch.equal(result, torch.full((2,), 6.0))
    assert text.count("[bdb] frame") == 1 and "quit: the program runs on" in text


def test_bad_commands_do_not_end_the_session():
    @engine.compile(backend="eager")
    def fn(x):
        return x - 1

    result, text = session(fn, (torch.ones(1),), ["frobnicate", "b 9999", "p undefined_name", "s x", "help", "c"])
    assert torch.equal(result, torch.zeros(1))
    assert "*** unknown command 'frobnicate'" in text
    assert "*** ValueError: no instruction at offset 9999" in text
    assert "*** NameError" in text and "stack        the real value stack" in text


PROGRAMS = []


def program(fn):
    PROGRAMS.append(fn)
    return fn


@program
def closure_and_data_dependent_jump(x, n):
    k = 3

    def add_k(t):
        return t + k
    y = add_k(x)
    if y.sum() > 0:
        return add_k(y) * n
    return y - n


@program
def keyword_and_star_args(x, *rest, scale=2, **kw):
    y = x * scale
    print("args:", *rest, **kw)
    return [y, {"a": y + len(rest)}]


@program
def mutation_and_method_calls(x, acc):
    acc.append(x.sum().item())
    h = torch.nn.functional.relu(x)
    acc.append(h.shape[0])
    return h.clone().add_(1)


ARGS = {
    "closure_and_data_dependent_jump": [(torch.ones(3), 2), (-torch.ones(3), 2)],
    "keyword_and_star_args": [((torch.ones(2), "a", "b"), {"scale": 3, "sep": "-"})],
    "mutation_and_method_calls": [(torch.arange(4.0), [])],
}


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_results_under_the_debugger_equal_eager(fn, capsys):
    for case in ARGS[fn.__name__]:
        args, kwargs = (case if isinstance(case[-1], dict) and isinstance(case[0], tuple) else (case, {}))
        fresh_args = lambda: tuple(list(a) if isinstance(a, list) else a for a in args)  # noqa: E731
        eager_args = fresh_args()
        expected = fn(*eager_args, **kwargs)
        engine.reset()
        compiled_args = fresh_args()
        got, text = session(engine.compile(fn, backend="eager"), compiled_args, ["c"] * 40, kwargs)
        assert "[bdb] frame 1" in text and "raised" not in text
        flat_e, flat_g = torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got)
        assert len(flat_e) == len(flat_g)
        for a, b in zip(flat_e, flat_g):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        assert eager_args == compiled_args or all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(eager_args, compiled_args))


def test_regions_come_from_the_bytecode_builder():
    """A frame built with the BytecodeBuilder is labelled from GeneratedCode.regions."""
    def template(a, b):
        return a

    b = BytecodeBuilder()
    with b.region("call_graph"):
        b.push_callable_const(torch.add)
        b.load_fast("a")
        b.load_fast("b")
        b.call(2)
        b.store_fast("out")
    with b.region("resume_call"):
        b.load_fast("out")
        b.return_value()
    gen = b.build(template.__code__, "generated_add")
    fn = types.FunctionType(gen.code, globals(), "generated_add")
    entry = types.SimpleNamespace(generated=gen, compile_id="0/0")

    s = Session(["ll", "s 4", "stack", "c"], out=io.StringIO())
    result = s.run_frame(fn, (torch.ones(2), torch.ones(2)), entry=entry, title="generated_add")
    text = s.out.getvalue()
    assert torch.equal(result, torch.full((2,), 2.0))
    assert "regions (from the BytecodeBuilder's regions)" in text
    listing = text.split("(bdb) ll")[1].split("(bdb)")[0]
    for inst in gen.instructions:  # every label in the listing is the one the builder recorded
        if inst.region in ("call_graph", "resume_call"):
            assert re.search(rf"\s{inst.offset}\s+{inst.opname}\b.*\[{inst.region}\]", listing), inst
    stack = text.split("(bdb) stack")[1].split("(bdb)")[0].splitlines()[1:]
    null, add = (1, 0) if V.null_above_callable else (0, 1)
    assert stack[null] == f"  [{null}] NULL" and "add" in stack[add] and "tensor([1., 1.])" in stack[2]


COUNTER = 0


class Base:
    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v


class Child(Base):
    def get(self):
        return super().get() * 10


def _slices_and_methods(xs):
    ys = list(xs)
    ys[1:3] = [9, 9]
    del ys[0]
    head, *tail = ys[:4]
    return ys[::-1], head, tail, "-".join(str(y) for y in ys), {k: v for k, v in zip("ab", ys)}, {*ys}


def _control_flow(n):
    global COUNTER
    out, i = [], 0
    while True:
        i += 1
        if i % 2 == 0:
            continue
        if i > n:
            break
        out.append(i if i < 5 else -i)
    COUNTER += 1
    return out, 1 < n <= 10, not out, n and out[-1], [j for j in range(n) for k in range(j) if k == 1]


def _objects(k):
    c = Child(k)
    c.extra = [k] * 2
    text = f"{c.get():05d}|{c.extra!s}|{k:.2f}"
    del c.extra
    return c.get(), hasattr(c, "extra"), text, isinstance(c, Base), (lambda a, *b, z=3, **w: (a, b, z, w))(1, 2, q=4)


@pytest.mark.parametrize("fn,args", [(_slices_and_methods, ([1, 2, 3, 4, 5],)), (_control_flow, (7,)),
                                     (_objects, (3,))], ids=lambda v: getattr(v, "__name__", ""))
def test_evaluator_agrees_with_cpython(fn, args):
    before = COUNTER
    expected = fn(*args)
    assert EvalFrame(fn, args).run_to_end() == expected
    assert COUNTER == before + (2 if fn is _control_flow else 0)  # global stores land in the real globals


def test_evaluator_matches_cpython_and_refuses_what_it_does_not_model():
    def f(x, y=2, *a, k=3, **kw):
        z = [i * 2 for i in range(x)]
        d = {"a": x, **kw}
        s = f"{x!r:>4}-{y}"
        q, *r = (1, 2, 3)
        t = z[1:3]
        if x > 2 and y is not None:
            t += [k]
        for i in range(3):
            x += i

        def inner(u):
            return u + x
        return z, d, s, q, r, t, inner(1), sorted(a), "a" in d

    frame = EvalFrame(f, (4, 5, 6, 7), {"k": 1, "zz": 2})
    assert frame.run_to_end() == f(4, 5, 6, 7, k=1, zz=2)

    log = []

    class Swallow:
        def __enter__(self):
            log.append("enter")
            return self

        def __exit__(self, *exc):
            log.append(exc[0])
            return True

    def handlers(n):
        out = []
        try:
            out.append(1 / n)
        except ZeroDivisionError:
            out.append("zero")
        except (TypeError, ValueError):
            out.append("type")
        else:
            out.append("else")
        finally:
            out.append("finally")
        with Swallow():
            raise KeyError("swallowed by __exit__")
        try:
            try:
                raise ValueError("re-raised")
            except ValueError:
                raise
        except ValueError as e:
            out.append(str(e))
        return out

    for n in (0, 2, "x"):
        log.clear()
        expected, expected_log = handlers(n), list(log)
        log.clear()
        assert EvalFrame(handlers, (n,)).run_to_end() == expected and log == expected_log

    def uncaught():
        with Swallow():
            pass
        return {}["missing"]

    with pytest.raises(KeyError, match="missing"):
        EvalFrame(uncaught).run_to_end()

    def gen():
        yield 1

    with pytest.raises(NotSteppable, match="generators"):
        EvalFrame(gen)
