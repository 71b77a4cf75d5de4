"""TORCH_COMPILE_DEBUG's folder for programs compiled by engine.compile."""

import os
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch

import engine
from engine.debug import debug_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    return x * b


@pytest.fixture
def folder(tmp_path):
    engine.reset()
    sink = debug_dir.DebugDirSink(root=str(tmp_path), always=True).start()
    yield tmp_path
    sink.stop()
    engine.reset()


def test_one_folder_per_graph_with_the_captured_graph(folder, capsys):
    engine.compile(toy_example, backend="eager")(torch.randn(10), torch.randn(10))
    (run,) = os.listdir(folder)
    run = os.path.join(folder, run)
    graphs = sorted(d for d in os.listdir(run) if os.path.isdir(os.path.join(run, d)))
    # the frame before the break and the resume function after it each made a graph
    with_graph = [d for d in graphs if os.path.exists(os.path.join(run, d, "fx_graph_readable.py"))]
    assert len(with_graph) == 2
    (first,) = [d for d in with_graph if d.startswith("toy_example__0_")]
    (resume,) = [d for d in with_graph if d.startswith("resume_in_toy_example_at_")]
    assert "torch.abs" in open(os.path.join(run, first, "fx_graph_readable.py")).read()
    assert "mul" in open(os.path.join(run, resume, "fx_graph_readable.py")).read()
    assert "guards.txt" in os.listdir(os.path.join(run, first))
    log = open(os.path.join(run, "debug.log")).read()
    assert "dynamo_start toy_example" in log and "stage backend_compile" in log


def test_runnable_reproduces_the_compiled_graph(folder, capsys):
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum(dim=0)

    engine.compile(f, backend=backend)(torch.randn(4, 3), torch.randn(3, 5))
    (run,) = os.listdir(folder)
    (graph_dir,) = [d for d in os.listdir(os.path.join(folder, run)) if d.startswith("f__")]
    path = os.path.join(folder, run, graph_dir, "fx_graph_runnable.py")
    if not os.path.exists(path):
        pytest.skip("the engine does not pass graph_module on its backend_compile stage yet")
    ns = runpy.run_path(path)
    inputs = ns["make_inputs"]()
    gm, example_inputs = seen[0]
    assert [tuple(t.shape) for t in inputs] == [tuple(t.shape) for t in example_inputs]
    torch.testing.assert_close(ns["Repro"]()(*inputs), gm(*inputs))
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("output 0: (5,) torch.float32"), proc.stderr


def test_torch_compile_debug_env_var(tmp_path):
    script = tmp_path / "repro.py"
    script.write_text(textwrap.dedent("""
        import torch, engine
        @engine.compile(backend="aot_eager")
        def test_model(x):
            return torch.relu(x @ x.T).sum()
        test_model(torch.ones(10, 10, requires_grad=True))
    """))
    env = {**os.environ, "TORCH_COMPILE_DEBUG": "1", "PYTHONPATH": ROOT}
    env.pop("TORCH_COMPILE_DEBUG_DIR", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "torch_compile_debug"            # the default root: ./torch_compile_debug
    (run,) = os.listdir(root)
    assert run.startswith("run_") and run.endswith(f"-pid_{run.split('-pid_')[1]}")
    (graph,) = [d for d in os.listdir(root / run) if d.startswith("test_model__")]
    files = set(os.listdir(root / run / graph))
    assert {"fx_graph_readable.py", "aot_forward_graph.py", "aot_backward_graph.py"} <= files
