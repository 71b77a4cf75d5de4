"""Resume functions: the code after a graph break, as a function of the value stack and
the live locals, behaves exactly like the original frame continuing there. Also the
worked example of a transformed frame built by hand with BytecodeBuilder. Runs without
torch too:  python3.12 -m pytest tests/test_capture_resume.py
"""

import contextlib
import io
import sys
import types

import bare_capture  # noqa: F401,E402 (before engine.capture: loads it without torch)

import pytest  # noqa: E402

from engine.capture.bytecode import assemble, decode, format_code, stack_depths  # noqa: E402
from engine.capture.pyversion import V  # noqa: E402
from engine.capture.bytecode_builder import BytecodeBuilder  # noqa: E402
from engine.capture.resume import (ResumeUnsupported, live_locals, make_function,  # noqa: E402
                                   make_resume_code)


def after_call_to(fn, callee_name, nth=0):
    """Offset just after the `nth` call whose callable is the global `callee_name`, with
    the instructions, so a test can resume there as a graph break at that call would."""
    insts = decode(fn.__code__)
    loads = [i for i in insts if i.opname == "LOAD_GLOBAL" and i.argval == callee_name]
    start = insts.index(loads[nth])
    call = next(i for i in insts[start:] if i.opname == "CALL")
    k = insts.index(call)
    return insts, start, k, insts[k + 1].offset


def resume_after(fn, callee_name, nth=0, **kw):
    _, _, _, offset = after_call_to(fn, callee_name, nth)
    depth = stack_depths(fn.__code__)[offset]
    return make_resume_code(fn.__code__, offset, depth, live_locals(fn.__code__, offset), **kw)


# ---------------------------------------------------------------- the worked example


def f(x):
    y = x + 1
    print(y)
    return y * 2


def compiled_graph(x):
    """Stands in for the compiled FX graph of `y = x + 1`: returns the graph outputs."""
    return (x + 1,)


def test_worked_example_transformed_frame_with_graph_break_and_resume():
    insts, start, call_idx, resume_offset = after_call_to(f, "print")
    resume = make_resume_code(f.__code__, resume_offset, 1, ["y"])  # stack: print's result
    assert resume.argnames == ["__stack0", "y"]
    print_lineno = f.__code__.co_firstlineno + 2
    assert resume.name == f"engine_resume_in_f_at_{print_lineno}"
    resume_fn = make_function(resume, f)

    b = BytecodeBuilder()
    with b.region("call_graph"):
        b.push_callable_const(compiled_graph)
        b.load_fast("x")
        b.call(1)
    with b.region("store_outputs"):
        b.unpack_sequence(1)
        b.store_fast("y")
    with b.region("resume_call"):
        b.push_callable_const(resume_fn)  # under the break's result: NULL, resume fn
    with b.region("graph_break"):
        for inst in insts[start:call_idx + 1]:  # LOAD_GLOBAL print; LOAD_FAST y; [PRECALL]; CALL
            b.append_original(inst)
    with b.region("resume_call"):
        b.load_fast("y")
        b.call(2)  # resume_fn(print's result, y)
        b.return_value()
    gen = b.build(f.__code__, "engine_transformed_f")
    transformed = types.FunctionType(gen.code, f.__globals__)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = transformed(3)
    assert result == f(3) == 8
    assert out.getvalue() == "4\n"

    labels = [label for _, _, label in gen.regions]
    assert labels == ["prologue", "call_graph", "store_outputs", "resume_call", "graph_break",
                      "resume_call"]
    listing = format_code(gen)
    for label in set(labels):
        assert f"[{label}]" in listing
    print_line = next(l for l in listing.splitlines() if "print" in l)
    assert "[graph_break]" in print_line and f" {print_lineno} " in print_line  # the user's line


# ---------------------------------------------------------------- loops, locals, signatures


def loop(n):
    t = 0
    for i in range(n):
        t += i
        print(i)
        t *= 2
    return t


def test_resume_inside_a_for_loop_takes_the_iterator_from_the_stack():
    resume = resume_after(loop, "print")
    assert resume.stack_depth == 2  # the range iterator, print's result
    assert resume.argnames == ["__stack0", "__stack1", "t"]
    fn = make_function(resume, loop)
    it = iter(range(5))
    next(it), next(it)  # the break happened at i == 1, after t = (0 * 2) + 1
    with contextlib.redirect_stdout(io.StringIO()):
        assert fn(it, None, 1) == loop(5)


def test_resume_inside_a_while_loop():
    def countdown(n):
        acc = []
        while n > 0:
            acc.append(n)
            print(n)
            n -= 1
        return acc

    resume = resume_after(countdown, "print")
    assert resume.argnames == ["__stack0", "n", "acc"] or resume.argnames == ["__stack0", "acc", "n"]
    fn = make_function(resume, countdown)
    args = {"__stack0": None, "n": 3, "acc": [5, 4, 3]}
    with contextlib.redirect_stdout(io.StringIO()):
        assert fn(*[args[a] for a in resume.argnames]) == [5, 4, 3, 2, 1]


def test_locals_not_passed_are_unbound_not_garbage():
    def g(x):
        y = x
        print(y)
        return z  # noqa: F821 - a local assigned only on another path
        z = 1  # noqa: F841

    resume = make_resume_code(g.__code__, after_call_to(g, "print")[3], 1, [])
    with pytest.raises(UnboundLocalError):
        make_function(resume, g)(None)


def test_keyword_only_and_varargs_originals_resume_with_plain_positional_args():
    def h(a, *args, k=10, **kw):
        s = a + sum(args) + k + len(kw)
        print(s)
        return s, args, kw

    resume = resume_after(h, "print")
    code = resume.code
    assert code.co_argcount == len(resume.argnames) and code.co_kwonlyargcount == 0
    assert not code.co_flags & 0x0C  # no *args / **kwargs
    values = {"__stack0": None, "s": 7, "args": (1,), "kw": {"q": 1}}
    fn = make_function(resume, h)
    with contextlib.redirect_stdout(io.StringIO()):
        assert fn(*[values[a] for a in resume.argnames]) == (7, (1,), {"q": 1})


def test_exceptions_after_the_break_point_at_the_users_line():
    def g(x):
        print(x)
        return 1 / x

    resume = resume_after(g, "print")
    fn = make_function(resume, g)
    with pytest.raises(ZeroDivisionError) as info:
        fn(None, 0)
    assert info.traceback[-1].lineno + 1 == g.__code__.co_firstlineno + 2


# ---------------------------------------------------------------- closures and cells


def test_free_variables_come_from_the_original_closure():
    def outer():
        scale = 3

        def inner(x):
            y = x * scale
            print(y)
            return y + scale

        return inner

    inner = outer()
    resume = resume_after(inner, "print")
    assert resume.code.co_freevars == ("scale",)
    with contextlib.redirect_stdout(io.StringIO()):
        assert make_function(resume, inner)(None, 6) == inner(2)


def test_cell_variables_are_shared_with_closures_made_before_the_break():
    def outer():
        y = 1

        def read():
            return y

        print("break")
        y = 2  # the closure made before the break must see this
        return read()

    resume = resume_after(outer, "print")
    assert resume.closure_names == ["y"] and "y" not in resume.argnames
    assert resume.code.co_freevars == ("y",)
    # the frame's cell for y, as the caller's bytecode would pass it (LOAD_CLOSURE y)
    y_cell = types.CellType(1)
    read_code = next(c for c in outer.__code__.co_consts if isinstance(c, types.CodeType))
    read = types.FunctionType(read_code, {}, "read", None, (y_cell,))
    fn = make_function(resume, outer, cells=[y_cell])
    args = {"__stack0": None, "read": read}
    assert fn(*[args[a] for a in resume.argnames]) == 2
    assert y_cell.cell_contents == 2


def test_generated_frame_passes_its_cells_to_the_resume_function():
    def outer(a):
        def read():
            return a

        print("break")
        a = a + 1
        return read()

    _, start, call_idx, offset = after_call_to(outer, "print")
    insts = decode(outer.__code__)
    resume = make_resume_code(outer.__code__, offset, 1, live_locals(outer.__code__, offset))
    assert resume.argnames == ["__stack0", "read"]

    b = BytecodeBuilder()
    with b.region("original"):  # everything before the break, copied as it is
        for inst in insts:
            if inst.opname in ("MAKE_CELL", "RESUME", "COPY_FREE_VARS"):
                continue
            if inst is insts[start]:
                break
            b.append_original(inst)
    with b.region("resume_call"):
        b.null_before()
        b.make_resume_function(resume)  # LOAD_CLOSURE a; BUILD_TUPLE; MAKE_FUNCTION
        b.null_after()
    with b.region("graph_break"):
        for inst in insts[start:call_idx + 1]:
            b.append_original(inst)
    with b.region("resume_call"):
        b.load_fast("read")
        b.call(2)
        b.return_value()
    gen = b.build(outer.__code__, "engine_transformed_outer")
    with contextlib.redirect_stdout(io.StringIO()):
        assert types.FunctionType(gen.code, outer.__globals__)(10) == outer(10) == 11


# ---------------------------------------------------------------- NULL on the stack


def test_break_inside_a_call_with_null_below_the_callable():
    def g(x):
        return pow(2, abs(x))  # break at abs(): pow's NULL, pow and 2 are on the stack

    insts, start, call_idx, offset = after_call_to(g, "abs")
    depth = stack_depths(g.__code__)[offset]
    assert depth == 4  # NULL, pow, 2, abs(x)   (3.13+: pow, NULL, 2, abs(x))
    null = 1 if V.null_above_callable else 0
    resume = make_resume_code(g.__code__, offset, depth, [], null_stack_indices=[null])
    assert resume.argnames == [f"__stack{i}" for i in range(4) if i != null]
    assert make_function(resume, g)(pow, 2, 5) == 32


# ---------------------------------------------------------------- refusals, checks, cache


def test_generators_and_try_blocks_are_refused_with_a_reason():
    def gen(x):
        yield x
        print(x)
        yield x

    with pytest.raises(ResumeUnsupported, match="generator"):
        make_resume_code(gen.__code__, after_call_to(gen, "print")[3], 1, ["x"])

    def guarded(x):
        try:
            print(x)
            return x
        except ValueError:
            return None

    with pytest.raises(ResumeUnsupported, match="try/with"):
        make_resume_code(guarded.__code__, after_call_to(guarded, "print")[3], 1, ["x"])

    def managed(x, cm):
        with cm:
            print(x)
        return x

    with pytest.raises(ResumeUnsupported, match="try/with"):
        offset = after_call_to(managed, "print")[3]
        make_resume_code(managed.__code__, offset, stack_depths(managed.__code__)[offset], ["x"])


def test_wrong_stack_depth_is_a_clear_error():
    with pytest.raises(ValueError, match="stack holds 1 values"):
        make_resume_code(f.__code__, after_call_to(f, "print")[3], 0, ["y"])


def test_resume_code_is_cached_and_reassembles_exactly():
    offset = after_call_to(loop, "print")[3]
    a = make_resume_code(loop.__code__, offset, 2, ["t"])
    b = make_resume_code(loop.__code__, offset, 2, ["t"])
    assert a is b
    assert make_resume_code(loop.__code__, offset, 2, ["t", "n"]) is not a
    again = assemble(decode(a.code), template=a.code)
    assert again.co_code == a.code.co_code and again.co_linetable == a.code.co_linetable


def test_live_locals_follow_the_paths_after_the_offset():
    def g(a, b, c):
        d = a + b
        print(d)
        if c:
            return d
        d = 0
        return b

    offset = after_call_to(g, "print")[3]
    assert live_locals(g.__code__, offset) == ["b", "c", "d"]


@pytest.mark.skipif(not V.precall, reason="3.11 call sequence")
def test_311_precall_must_stay_next_to_call():
    from engine.capture.bytecode import AssemblyError, create_instruction

    insts = decode(f.__code__)
    k = next(i for i, inst in enumerate(insts) if inst.opname == "PRECALL")
    with pytest.raises(AssemblyError, match="PRECALL"):
        assemble(insts[:k + 1] + [create_instruction("NOP")] + insts[k + 1:], template=f.__code__)


def test_resume_listing_labels_the_prologue_and_the_original_code():
    resume = resume_after(loop, "print")
    lines = format_code(resume).splitlines()
    assert lines[0] == resume.name
    assert "RESUME" in lines[1] and lines[1].endswith("[prologue]")
    jump = next(l for l in lines if "JUMP_FORWARD" in l)
    assert jump.endswith("[prologue]")
    target = next(i for i in resume.instructions if i.opname == "JUMP_FORWARD").target
    original = next(i for i in decode(loop.__code__) if i.offset == resume.offset)
    assert (target.opname, target.lineno) == (original.opname, original.lineno)
    assert f"to {target.offset}" in jump
    assert all(l.endswith("[original]") for l in lines[lines.index(jump) + 1:])


def _collatz_like(n, k=3):
    steps, best = 0, n
    while n != 1 and steps < 50:
        if n % 2 == 0:
            n //= 2
        elif n % 3 == 0:
            n = n // 3 + 1
        else:
            n = k * n + 1
        best = max(best, n)
        steps += 1
    label = "long" if steps > 10 else "short"
    return steps, best, label


def test_resuming_at_every_statement_of_a_run_gives_the_same_result():
    """Differential check: trace a real run, and at each statement whose stack is empty,
    resume from that point with the locals the frame had there."""
    code = _collatz_like.__code__
    depths = stack_depths(code)
    snapshots = []

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line" and depths.get(frame.f_lasti) == 0:
            snapshots.append((frame.f_lasti, dict(frame.f_locals)))
        return tracer

    sys.settrace(tracer)
    try:
        expected = _collatz_like(27)
    finally:
        sys.settrace(None)
    assert len(snapshots) > 30  # every branch of the loop, several times
    for offset, local_values in snapshots:
        live = live_locals(code, offset)
        resume = make_resume_code(code, offset, 0, live)
        fn = make_function(resume, _collatz_like)
        assert fn(*[local_values[a] for a in resume.argnames]) == expected, offset


def test_try_blocks_after_the_resume_point_still_catch():
    def g(x):
        print(x)
        try:
            r = 10 // x
        except ZeroDivisionError:
            r = -1
        return r

    fn = make_function(resume_after(g, "print"), g)
    assert (fn(None, 0), fn(None, 5)) == (-1, 2)


def test_closures_created_after_the_break_capture_the_shared_cell():
    def g(x):
        print(x)
        x = x + 1

        def get():
            return x

        return get()

    resume = resume_after(g, "print")
    assert "x" not in resume.argnames and resume.closure_names == ["x"]
    cell = types.CellType(4)
    fn = make_function(resume, g, cells=[cell])
    assert fn(*[None for _ in resume.argnames]) == 5 and cell.cell_contents == 5
