"""When the compiler itself fails: a clear error naming the user's line and the stage, or,
with suppress_errors, eager execution with a warning. Never a wrong result."""

import io
import warnings

import pytest
import torch

import engine
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)


def broken_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


def fn(x):
    return torch.relu(x) + 1


def test_a_backend_failure_names_the_backend_and_the_function():
    with pytest.raises(engine.BackendCompilerFailed) as info:
        engine.compile(fn, backend=broken_backend)(torch.randn(3))
    text = str(info.value)
    assert "broken_backend" in text and "backend exploded" in text and f"{__file__}" in text


def test_suppress_errors_runs_eagerly_with_a_warning():
    x = torch.randn(3)
    with engine.config.patch(suppress_errors=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = engine.compile(fn, backend=broken_backend)(x)
    torch.testing.assert_close(out, fn(x))
    assert any("running fn eagerly" in str(w.message) for w in caught)


def test_an_interpreter_failure_becomes_a_graph_break_not_a_wrong_result(monkeypatch):
    from engine.capture import interpreter

    def broken(self, inst):
        raise KeyError("simulated interpreter bug")

    monkeypatch.setattr(interpreter.Frame, "BINARY_OP", broken)
    x = torch.randn(3)
    out = engine.explain(lambda t: torch.relu(t) * 2)(x)
    assert out.break_reasons and "internal error while tracing BINARY_OP" in out.break_reasons[0].reason
    torch.testing.assert_close(engine.compile(lambda t: torch.relu(t) * 2, backend="eager")(x), torch.relu(x) * 2)


def test_strict_capture_reports_the_user_line_and_stage(monkeypatch):
    from engine.capture import interpreter

    def broken(self, inst):
        raise KeyError("simulated interpreter bug")

    monkeypatch.setattr(interpreter.Frame, "BINARY_OP", broken)

    def user_fn(t):
        return t * 2

    with engine.config.patch(capture_errors_as_graph_breaks=False):
        with pytest.raises(engine.InternalCompilerError) as info:
            engine.compile(user_fn, backend="eager")(torch.randn(2))
    text = str(info.value)
    assert f"{__file__}:{user_fn.__code__.co_firstlineno + 1}" in text and "bytecode_tracing" in text
    assert "return t * 2" in text and "TORCHDYNAMO_VERBOSE" in text


def test_debug_function_compiles_only_the_named_function():
    compiled_names = []

    def backend(gm, example_inputs):
        compiled_names.append(gm)
        return gm.forward

    def other(x):
        return x + 1

    with engine.config.patch(debug_function="fn"):
        engine.compile(other, backend=backend)(torch.randn(2))
        assert compiled_names == []
        engine.compile(fn, backend=backend)(torch.randn(2))
        assert len(compiled_names) == 1


def test_compile_keywords_and_disable():
    assert engine.compile(fn, disable=True) is fn
    wrapped = engine.compile(backend="eager", fullgraph=True, dynamic=False)(fn)
    torch.testing.assert_close(wrapped(torch.ones(2)), torch.full((2,), 2.0))


def test_a_function_the_engine_will_not_compile_says_so_and_explain_lists_it():
    from engine_helpers import logs

    def gen(x):      # a generator: the engine never captures its frame
        yield x * 2

    with logs("dynamo") as shown:
        out = list(engine.compile(gen)(torch.ones(2)))
        list(engine.compile(gen)(torch.ones(2)))       # said once per compiled function, not per call
    torch.testing.assert_close(out[0], torch.full((2,), 2.0))
    declined = [s for s in shown if "not compiled, it runs eagerly" in s]
    assert len(declined) == 2 and "a generator or coroutine" in declined[0] and "gen" in declined[0]
    e = engine.explain(gen)(torch.ones(2))
    assert e.graph_count == 0 and len(e.not_compiled) == 1 and "a generator or coroutine" in e.not_compiled[0]
    assert "Not Compiled (runs eagerly):" in str(e)
    # torch's own functions: the same
    e = engine.explain(torch.nn.functional.normalize)(torch.ones(2, 2))
    assert e.not_compiled and "torch internals" in e.not_compiled[0]


def _said_to_run_eagerly(f):
    """Run f compiled (eager's result) under TORCH_LOGS=graph_breaks, then explain it: the
    "runs eagerly" log lines, every line shown, and explain's output."""
    from engine_helpers import logs
    with logs("graph_breaks") as shown:
        torch.testing.assert_close(engine.compile(f)(torch.ones(3)), f(torch.ones(3)))
    return [s for s in shown if "runs eagerly" in s], shown, engine.explain(f)(torch.ones(3))


def test_a_frame_that_cannot_be_split_at_its_break_says_why_it_runs_eagerly():
    """A break inside a `try` block: the frame cannot be split there and runs eagerly (as
    under torch.compile). The break's own reason is not the whole story: the log, explain's
    "Not Compiled" and the report say that the frame ran eagerly and why."""

    def f(x):
        y = x * 2
        try:
            y = y + 1
            print("inside", file=io.StringIO())
        except ValueError:
            pass
        return y.sin()

    eager, shown, e = _said_to_run_eagerly(f)
    assert len(eager) == 1 and "inside a `try` block" in eager[0] and "[GB0013]" in eager[0], shown
    assert e.graph_count == 0 and len(e.not_compiled) == 1 and "`try` block" in e.not_compiled[0]
    assert len(e.break_reasons) == 1


def test_a_frame_whose_resume_function_cannot_be_built_says_it_runs_eagerly(monkeypatch):
    """Where the code after a break cannot be made a function of its own (the resume
    builder refuses: a frame shape the checks before it did not foresee), the frame runs
    eagerly, and the log and explain say so, not only the break's own reason."""
    from engine.capture import resume

    def refuse(code, offset, *args, **kwargs):
        raise resume.ResumeUnsupported(f"{code.co_name} offset {offset} is between KW_NAMES and its call")
    monkeypatch.setattr(resume, "_make", refuse)
    monkeypatch.setattr(resume, "_cache", {})

    def f(x):
        y = x * 2
        print("between", file=io.StringIO())
        return y.sin()

    eager, shown, e = _said_to_run_eagerly(f)
    assert len(eager) == 1 and "KW_NAMES" in eager[0] and "whole frame runs eagerly" in eager[0], shown
    assert e.graph_count == 0 and len(e.not_compiled) == 1 and "KW_NAMES" in e.not_compiled[0]


def test_the_report_lists_functions_the_engine_did_not_compile(tmp_path):
    import os
    import subprocess
    import sys

    from tlparse.cli import main

    (tmp_path / "prog.py").write_text(
        "import engine, torch\n"
        "def gen(x):\n"
        "    yield x * 2\n"
        "list(engine.compile(gen)(torch.ones(2)))\n")
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace")}
    env.pop("TORCH_LOGS", None)
    proc = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not compiled, it runs eagerly" in proc.stderr        # the warning, where the user looks
    assert main([str(tmp_path / "trace"), "-o", str(tmp_path / "report"), "--no-browser"]) == 0
    index = (tmp_path / "report" / "index.html").read_text()
    section = index.split('id="not-compiled"')[1].split("</table>")[0]
    assert "gen" in section and "prog.py:2" in section and "a generator or coroutine" in section
