"""The minifier (docs/minifier.md): a model whose compile crashes, or computes a wrong
result, leaves a repro.py holding only the op at fault, which fails the same way when run
on its own."""

import importlib.util
import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import engine
import observe
from engine.debug.minifier.check import as_graph_module
from engine.debug.minifier.delta import Search
from engine.debug.minifier.progress import ProgressDisplay, report
from engine.debug.minifier.subgraph import OP_KINDS, GraphCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}
for _name in ("TORCH_LOGS", "TORCH_TRACE", "TORCHDYNAMO_REPRO_AFTER", "TORCHDYNAMO_REPRO_LEVEL",
              "ENGINE_INJECT_RELU_BUG_TESTING_ONLY"):
    ENV.pop(_name, None)


class Model(torch.nn.Module):
    """Several layers, a relu in the middle."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x).sin() * 2
        x = torch.relu(x)
        return self.b(x).cos() + 1


@pytest.fixture(autouse=True)
def fresh_engine():
    engine.reset()
    yield
    engine.reset()


def the_only_file(root, name):
    found = [os.path.join(dirpath, name) for dirpath, _, files in os.walk(root) if name in files]
    assert len(found) == 1, found
    return found[0]


def ops_of(script):
    """The ops of a written script's graph (its Repro module, traced again)."""
    spec = importlib.util.spec_from_file_location(f"repro_{abs(hash(script))}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gm = as_graph_module(module.Repro())
    return [n.target for n in gm.graph.nodes if n.op in OP_KINDS]


def told(exc):
    """What the user reads: the error's message and its notes."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def run_script(path, timeout=300):
    return subprocess.run([sys.executable, path], env=ENV, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(path))


RELUS = {torch.relu, torch.ops.aten.relu.default}
BUG_MESSAGES = {
    "compile_error": "RuntimeError: relu: injected compile error",
    "runtime_error": "RuntimeError: relu: injected runtime error",
    "accuracy": "AccuracyFailure: compiled result differs from eager: output 0: RMS error against fp64",
}


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
@pytest.mark.parametrize("bug", ["compile_error", "runtime_error", "accuracy"])
def test_injected_relu_bug_minifies_to_the_relu(tmp_path, bug, stage):
    # TORCHDYNAMO_REPRO_AFTER=<stage> TORCHDYNAMO_REPRO_LEVEL=3 (4 for accuracy): minify right away
    level = 4 if bug == "accuracy" else 3
    with engine.config.patch(inject_relu_bug_TESTING_ONLY=bug, repro_after=stage, repro_level=level,
                             debug_dir_root=str(tmp_path)):
        with pytest.raises(Exception) as info:
            engine.compile(Model())(torch.randn(4, 8))
    notes = told(info.value)
    repro = the_only_file(tmp_path, "repro.py")
    assert "; minified: " in notes and repro in notes                 # the error says where the repro is
    assert os.path.exists(os.path.join(os.path.dirname(repro), "minifier_launcher.py"))
    assert set(ops_of(repro)) <= RELUS and len(ops_of(repro)) == 1    # the relu and nothing else
    proc = run_script(repro)                                         # standalone, the same failure
    assert proc.returncode != 0
    assert BUG_MESSAGES[bug] in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_a_correct_compile_at_level_4_reports_nothing(tmp_path, stage):
    # the accuracy check against fp64 must not flag our codegen's ordinary rounding
    model, x = Model(), torch.randn(4, 8)
    with engine.config.patch(repro_after=stage, repro_level=4, debug_dir_root=str(tmp_path)):
        out = engine.compile(model)(x)
        out.sum().backward()
    torch.testing.assert_close(out, model(x))
    assert not os.path.exists(tmp_path) or not any("minifier" in d for _, dirs, _ in os.walk(tmp_path) for d in dirs)


USER_PROGRAM = textwrap.dedent('''\
    import torch
    import engine

    def toy_backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.target is torch.relu:
                raise NotImplementedError("toy_backend cannot compile relu")
        return gm.forward

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            x = self.a(x).sin() * 2
            x = torch.relu(x)
            return self.b(x).cos() + 1

    engine.compile(Model(), backend=toy_backend)(torch.randn(4, 8))
''')


def test_user_backend_that_raises_on_relu_end_to_end(tmp_path):
    # the guide's workflow: the program fails, the error names the launcher, running the
    # launcher writes repro.py, running repro.py fails as the program did
    (tmp_path / "prog.py").write_text(USER_PROGRAM)
    env = {**ENV, "TORCHDYNAMO_REPRO_AFTER": "dynamo", "TORCH_COMPILE_DEBUG_DIR": str(tmp_path / "debug")}
    proc = subprocess.run([sys.executable, "prog.py"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode != 0
    launcher = the_only_file(tmp_path / "debug", "minifier_launcher.py")
    assert "NotImplementedError: toy_backend cannot compile relu" in proc.stderr
    assert f"`python {launcher}` shrinks it to repro.py" in proc.stderr
    run = run_script(launcher)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "minifier: trial " in run.stderr                           # progress, plain lines when piped
    assert "nodes -> 1 in " in run.stderr
    repro = os.path.join(os.path.dirname(launcher), "repro.py")
    assert ops_of(repro) == [torch.relu]
    proc = run_script(repro)
    assert proc.stderr.strip().splitlines()[-1] == "NotImplementedError: toy_backend cannot compile relu"


def test_a_failure_the_minifier_cannot_see_again_keeps_the_whole_graph(tmp_path):
    calls = []

    def flaky_backend(gm, example_inputs):     # fails on its first call only
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("flaky_backend: out of luck")
        return gm.forward

    with engine.config.patch(repro_after="dynamo", repro_level=3, debug_dir_root=str(tmp_path)):
        with pytest.raises(Exception) as info:
            engine.compile(Model(), backend=flaky_backend)(torch.randn(4, 8))
    notes = told(info.value)
    assert "RuntimeError: flaky_backend: out of luck" in str(info.value)   # the user's error is kept
    assert "; not minified: the whole graph compiled and ran here without failing" in notes
    assert "holds the whole graph (7 nodes)" in notes
    assert len(ops_of(the_only_file(tmp_path, "repro.py"))) == 7


def test_level_1_writes_the_launcher_and_runs_the_graph_eagerly(tmp_path):
    model = Model()
    x = torch.randn(4, 8)
    with engine.config.patch(inject_relu_bug_TESTING_ONLY="compile_error", repro_after="dynamo", repro_level=1,
                             debug_dir_root=str(tmp_path)):
        with pytest.warns(RuntimeWarning, match="this graph runs eagerly instead"):
            out = engine.compile(model)(x)
    torch.testing.assert_close(out, model(x))
    assert the_only_file(tmp_path, "minifier_launcher.py")


def tricky(x, y):
    y.add_(1)                                    # mutates an input
    a, b = torch.split(x, x.shape[0] // 2)      # an op with several outputs
    m, i = torch.max(x.t(), dim=1)               # a view of an input, two outputs
    r = torch.relu(a * m.sum())
    return r + b, i, y.view(-1)[: x.shape[0] * 2]  # several graph outputs, a symbolic size


def test_every_cut_of_a_graph_is_a_valid_program():
    # mutation, views of inputs, symbolic shapes and multi-output ops: each graph the
    # minifier may try (a prefix, a suffix, one op alone) still runs
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    engine.compile(tricky, backend=keep, dynamic=True)(torch.randn(6, 6), torch.randn(6, 6))
    gm, example_inputs = graphs[0]
    assert any(n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt)
               for n in gm.graph.nodes)
    from engine.debug.minifier.minify import inputs_maker
    case = GraphCase.of(gm, inputs_maker(gm, example_inputs)())
    n = len(case.units)
    cuts = [tuple(range(k)) for k in range(1, n + 1)] + [tuple(range(k, n)) for k in range(n)]
    cuts += [(k,) for k in range(n)]
    for kept in cuts:
        sub = case.build(kept)
        assert sub is not None, kept
        sub(*inputs_maker(sub, case.inputs_of(sub))())
        for scalar in case.scalar_inputs(kept):               # sizes folded into constants
            folded = case.build(kept, frozenset([scalar]))
            folded(*inputs_maker(folded, case.inputs_of(folded))())


def test_delta_search_finds_one_bad_op_in_200_in_few_trials():
    search = Search(200, lambda kept: 137 in kept)
    assert search.run() == (137,)
    assert len(search.tried) <= 2 * 8 + 1        # two binary searches of log2(200) steps


def test_delta_search_keeps_two_ops_that_fail_only_together():
    search = Search(50, lambda kept: 10 in kept and 40 in kept)
    assert search.run() == (10, 40)


def test_progress_is_plain_lines_when_piped_and_on_the_minifier_log():
    stream = io.StringIO()
    seen = []
    observe.subscribe(seen.append, logs=["minifier"])
    try:
        with ProgressDisplay(stream):
            report("trial", "trial 3: 12 of 200 nodes: still fails", trial=3)
    finally:
        observe.unsubscribe(seen.append)
    assert stream.getvalue() == "minifier: trial 3: 12 of 200 nodes: still fails\n"
    assert [e.metadata["title"] for e in seen] == ["trial 3: 12 of 200 nodes: still fails"]


def test_repro_is_an_artifact_of_the_failing_compile_in_tlparse(tmp_path):
    from tlparse.cli import main

    (tmp_path / "prog.py").write_text(USER_PROGRAM)
    env = {**ENV, "TORCHDYNAMO_REPRO_AFTER": "dynamo", "TORCHDYNAMO_REPRO_LEVEL": "3",
           "TORCH_COMPILE_DEBUG_DIR": str(tmp_path / "debug"), "TORCH_TRACE": str(tmp_path / "trace")}
    proc = subprocess.run([sys.executable, "prog.py"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert "nodes -> 1 in " in proc.stderr, proc.stderr[-2000:]
    assert main([str(tmp_path / "trace"), "-o", str(tmp_path / "report"), "--no-browser"]) == 0
    artifacts = os.listdir(tmp_path / "report" / "artifacts")
    assert any("minifier_repro" in a and a.startswith("0_0") for a in artifacts), artifacts
    assert any("minifier_launcher" in a and a.startswith("0_0") for a in artifacts), artifacts
    repro = next(a for a in artifacts if "minifier_repro" in a)
    assert "torch.relu" in (tmp_path / "report" / "artifacts" / repro).read_text()


def test_the_guides_torch_config_spelling_turns_it_on(tmp_path):
    import torch._dynamo.config
    import torch._inductor.config

    with torch._dynamo.config.patch(repro_after="dynamo"), \
            torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}), \
            engine.config.patch(debug_dir_root=str(tmp_path)):
        with pytest.raises(Exception) as info:
            engine.compile(Model())(torch.randn(4, 8))
    from engine import torch_config
    torch_config.sync()      # the torch knobs are unset again: so are the engine's (as the next compile would)
    launcher = the_only_file(tmp_path, "minifier_launcher.py")
    assert f"`python {launcher}` shrinks it to repro.py" in told(info.value)
    assert "relu: injected compile error" in told(info.value)
    assert engine.config.repro_after is None and engine.config.inject_relu_bug_TESTING_ONLY is None


def no_inplace_backend(gm, example_inputs):
    """A backend that cannot compile in-place ops."""
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target.endswith("_"):
            raise NotImplementedError(f"no_inplace_backend cannot compile {node.target}")
    return gm.forward


def no_max_backend(gm, example_inputs):
    """A backend that cannot compile torch.max (an op with two outputs)."""
    for node in gm.graph.nodes:
        if node.target is torch.max:
            raise NotImplementedError("no_max_backend cannot compile torch.max")
    return gm.forward


@pytest.mark.parametrize("backend, kept, error", [
    (no_inplace_backend, ["add_"], "NotImplementedError: no_inplace_backend cannot compile add_"),
    (no_max_backend, [torch.max, "getitem", "getitem"], "NotImplementedError: no_max_backend cannot compile torch.max"),
])
def test_a_mutating_or_multi_output_op_minifies_to_a_valid_repro(tmp_path, backend, kept, error):
    with engine.config.patch(repro_after="dynamo", repro_level=3, debug_dir_root=str(tmp_path)):
        with pytest.raises(Exception) as info:
            engine.compile(tricky, backend=backend, dynamic=True)(torch.randn(6, 6), torch.randn(6, 6))
    assert error in told(info.value)
    repro = the_only_file(tmp_path, "repro.py")
    assert [t if isinstance(t, str) else getattr(t, "__name__", t) for t in ops_of(repro)] == \
        [t if isinstance(t, str) else getattr(t, "__name__", t) for t in kept]
    assert error in told(info.value)
    proc = run_script(repro)                       # a valid program, standalone: the same error
    assert proc.stderr.strip().splitlines()[-1] == error, proc.stderr[-2000:]
