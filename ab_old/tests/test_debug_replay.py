"""engine.debug.replay: compile a function while recording each traced instruction, then
step forwards and backwards through what the compiler did (docs/replay.md)."""

import io
import itertools
import json
import os

import torch

import engine
import engine.debug
from engine.capture import interpreter
from engine.debug.replay_record import Recording
from observe import trace


def scale(t, k):
    s = t * k
    return s - 1


def step(x, y):
    z = x + y
    z = scale(z, 2)
    print("checkpoint")
    return z.relu()


LINE = {name: step.__code__.co_firstlineno + i for i, name in enumerate(
    ["def", "add", "scale", "print", "return"])}
SCALE_MUL = scale.__code__.co_firstlineno + 1


def run_replay(commands):
    out = io.StringIO()
    result = engine.debug.replay(step, commands=commands, out=out)(torch.ones(4), torch.ones(4))
    return result, out.getvalue()


def test_the_program_runs_and_its_result_is_returned():
    result, _ = run_replay("q")
    assert torch.equal(result.value, torch.full((4,), 3.0))


def test_each_step_shows_the_user_line_and_what_the_instruction_added_to_the_graph():
    result, _ = run_replay("q")
    steps = result.recording.steps
    adds = [s for s in steps if any("operator.add" in n for n in s.nodes)]
    assert [s.lineno for s in adds] == [LINE["add"]] * len(adds) and adds
    assert all(s.opname.startswith(("BINARY_OP", "BINARY_ADD")) for s in adds)
    # the multiply belongs to the inlined helper's line, one call deep, under the CALL in step()
    mul = next(s for s in steps if any("operator.mul" in n for n in s.nodes))
    assert (mul.function, mul.lineno, mul.depth) == ("scale", SCALE_MUL, 1)
    caller = steps[mul.parent]
    assert (caller.function, caller.lineno, caller.opname) == ("step", LINE["scale"], "CALL")
    # the guard on the global `scale` is installed by the instruction that loaded it
    loads = [s for s in steps if any("G['scale']" in g for g in s.guards)]
    assert loads and all(s.opname == "LOAD_GLOBAL" and s.argrepr.endswith("scale") for s in loads)


def test_locals_and_stack_are_the_symbolic_values_by_the_users_names_as_they_were_then():
    result, _ = run_replay("q")
    steps = result.recording.steps
    first_call = next(s for s in steps if s.lineno == LINE["scale"] and s.opname == "CALL")
    assert first_call.locals["z"].startswith("Tensor %add float32[4]")
    later = next(s for s in steps if s.lineno == LINE["print"] and s.compile_id == first_call.compile_id)
    assert later.locals["z"].startswith("Tensor %sub")          # z was rebound by then
    call_print = next(s for s in steps if s.is_break)
    assert call_print.stack[-1] == "'checkpoint'"


def test_the_stepper_goes_to_the_break_back_into_the_inlined_call_and_out_again():
    _, text = run_replay(f"gb\nb\nline {SCALE_MUL}\nwhere\nlocals\nout\ngraph\nq")
    assert "! graph break: Call to a builtin that cannot be traced: builtin `print`" in text
    where = text.split("(replay) where\n", 1)[1].split("(replay)", 1)[0]
    assert [line.split()[0] for line in where.splitlines()] == ["step", "scale"]
    locals_ = text.split("(replay) locals\n", 1)[1].split("(replay)", 1)[0]
    assert "t = Tensor %add float32[4]" in locals_ and "k = 2" in locals_
    after_out = text.split("(replay) out\n", 1)[1].splitlines()[0]
    assert f"step {os.path.basename(__file__)}:{LINE['scale']}" in after_out
    graph = text.split("(replay) graph\n", 1)[1].split("(replay)", 1)[0]
    assert "%mul = operator.mul(%add, 2)" in graph and "%sub = operator.sub(%mul, 1)" in graph
    assert "%relu" not in graph    # not traced yet at that point


def test_stepping_back_and_forth_returns_to_the_same_instruction():
    _, text = run_replay("s 5\nb 5\nn 3\nbn 3\nq")
    shown = [line for line in text.splitlines() if line.startswith("[") and not line.startswith("[replay]")]
    assert shown[0].startswith("[0/")        # the first instruction ...
    assert shown[2] == shown[0] and shown[4] == shown[0]   # ... again after s 5 / b 5 and n 3 / bn 3
    assert shown[1] != shown[0]


def test_the_resume_function_after_the_break_is_recorded_too():
    result, text = run_replay("info\nq")
    compiles = list(dict.fromkeys(s.compile_id for s in result.recording.steps))
    assert compiles == ["0/0", "0/0_1", "1/0"]     # first attempt, restart, the resume function
    assert result.recording.steps[-1].function.startswith("engine_resume_in_step")
    assert "[0/0] step: steps 0.." in text and "graph break: Call to a builtin" in text


def test_recording_stops_when_the_replayed_function_raises():
    def broken(x):
        return x + undefined_name  # noqa: F821

    try:
        engine.debug.replay(broken, commands="q", out=io.StringIO())(torch.ones(2))
    except NameError:
        pass
    assert interpreter.recorder is None     # the next compile runs the interpreter's plain loop


def test_the_record_goes_to_the_trace_as_an_artifact(tmp_path):
    sink = trace.start(str(tmp_path))
    try:
        result, _ = run_replay("q")
    finally:
        trace.stop()
    text = "".join(open(os.path.join(tmp_path, f)).read() for f in os.listdir(tmp_path))
    assert '"name": "replay_record"' in text
    payload = text.split('"name": "replay_record"', 1)[1].split("\n", 1)[1]
    body = json.loads("\n".join(line[1:] for line in itertools.takewhile(lambda l: l.startswith("\t"),
                                                                          payload.splitlines())))
    assert len(body["steps"]) == len(result.recording.steps)
    assert body["steps"][0]["function"] == "step"
    del sink
    again = Recording.from_json(body)          # a record read back from a trace steps the same
    assert [(s.lineno, s.opname, s.nodes) for s in again.steps] == \
        [(s.lineno, s.opname, list(s.nodes)) for s in result.recording.steps]


def test_an_exception_the_traced_code_catches_is_shown_but_is_not_a_graph_break():
    def guarded(x):
        try:
            raise ValueError("not this one")
        except ValueError:
            pass
        return x + 1

    out = io.StringIO()
    result = engine.debug.replay(guarded, commands="gb\nq", out=out)(torch.ones(2))
    raised = [s for s in result.recording.steps if s.event]
    assert [(s.opname, s.event) for s in raised] == [("RAISE_VARARGS", "raised ValueError: not this one")]
    assert "[replay] no graph break after this step" in out.getvalue()
    assert torch.equal(result.value, torch.full((2,), 2.0))


def test_a_variable_a_closure_shares_is_shown_among_the_locals():
    def outer(x):
        scale = 3

        def inner(y):
            return y * scale
        return inner(x)

    result = engine.debug.replay(outer, commands="q", out=io.StringIO())(torch.ones(2))
    in_inner = next(s for s in result.recording.steps if s.function == "inner")
    assert in_inner.locals["scale"] == "3" and in_inner.locals["y"].startswith("Tensor %l_x_")
