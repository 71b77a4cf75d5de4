"""TORCH_COMPILE_DEBUG / engine.config.compile_debug: a per-run folder with a sub-folder
per compiled graph, holding the readable and runnable graph and later stages' files."""

import json
import os
import re
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch

import engine
import observe
from engine.debug import debug_dir
from compile_events import compile_graph

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale + x[:, :4].sum(dim=-1, keepdim=True)


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    return x * b


@pytest.fixture
def sink(tmp_path):
    s = debug_dir.DebugDirSink(root=str(tmp_path), always=True).start()
    yield s
    s.stop()


def only_run_dir(root):
    (run,) = os.listdir(root)
    return os.path.join(root, run)


def test_run_folder_and_one_folder_per_compile(sink, tmp_path):
    compile_graph(toy_example, [torch.randn(3), torch.randn(3)], frame_id=0)
    compile_graph(toy_example, [torch.randn(5), torch.randn(5)], frame_id=0, compile_idx=1)
    run = only_run_dir(tmp_path)
    assert re.fullmatch(r"run_\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d_\d{6}-pid_%d" % os.getpid(), os.path.basename(run))
    assert sorted(os.listdir(run)) == ["config.json", "debug.log", "toy_example__0_0", "toy_example__0_1"]
    files = sorted(os.listdir(os.path.join(run, "toy_example__0_0")))
    assert files == ["compilation_metrics.json", "fx_graph_readable.py", "fx_graph_runnable.py", "guards.txt"]
    readable = open(os.path.join(run, "toy_example__0_0", "fx_graph_readable.py")).read()
    assert "torch.abs(a)" in readable and "[0/0]" in readable
    log = open(os.path.join(run, "debug.log")).read()
    assert "[0/1] dynamo_start toy_example" in log and re.search(r"\[0/0\] stage backend_compile [\d.]+ ms ok", log)
    assert json.load(open(os.path.join(run, "config.json")))["cache_size_limit"] == engine.config.cache_size_limit


def test_runnable_reproduces_the_graph_outputs_on_its_inputs(sink, tmp_path):
    gm_holder = []
    block = Block()

    def backend(gm, example_inputs):
        gm_holder.append(gm)
        return gm

    # a module's forward, traced with its parameters read through get_attr/call_module
    code_owner = block.forward.__func__
    with observe.compile_context(observe.CompileId(3, 0)):
        observe.emit("dynamo_start", {"stack": [{"line": code_owner.__code__.co_firstlineno,
                                                 "name": "forward", "filename": __file__}]})
        gm = torch.fx.symbolic_trace(block)
        with observe.stage("backend_compile", graph_module=gm, example_inputs=[torch.randn(2, 8)]):
            backend(gm, None)
    folder = os.path.join(only_run_dir(tmp_path), "forward__3_0")
    script = os.path.join(folder, "fx_graph_runnable.py")
    assert os.path.exists(os.path.join(folder, "fx_graph_runnable_state.pt"))
    ns = runpy.run_path(script)
    inputs = ns["make_inputs"]()
    assert [tuple(t.shape) for t in inputs] == [(2, 8)] and inputs[0].dtype == torch.float32
    torch.testing.assert_close(ns["Repro"]()(*inputs), gm_holder[0](*inputs), rtol=0, atol=0)
    # and standalone, from another directory
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = gm_holder[0](*inputs)
    assert proc.stdout.strip() == f"output 0: (2, 4) torch.float32 sum={expected.double().sum().item():.6g}"


def test_runnable_keeps_dtypes_strides_and_python_values(tmp_path):
    from engine.debug import fx_runnable

    def fn(x, idx, mask, n: int, z):
        return x.t()[idx] * mask.float().sum() + n + z.imag.sum()

    gm = torch.fx.symbolic_trace(fn)
    inputs = [torch.randn(4, 3).t(), torch.tensor([0, 2, 1]), torch.tensor([True, False]), 3,
              torch.randn(2, dtype=torch.complex64)]
    path = fx_runnable.write(gm, inputs, str(tmp_path / "r.py"))
    ns = runpy.run_path(path)
    made = ns["make_inputs"]()
    assert made[0].stride() == (1, 3) and made[1].dtype == torch.int64 and made[2].dtype == torch.bool
    assert made[3] == 3
    assert made[4].dtype == torch.complex64 and made[4].imag.abs().sum() > 0
    torch.testing.assert_close(ns["run"](), gm(*made))


def test_later_stages_files_come_from_their_events(sink, tmp_path):
    with observe.compile_context(observe.CompileId(4, 0)):
        observe.emit("dynamo_start", {"stack": [{"line": 1, "name": "step", "filename": "s.py"}]})
        observe.emit("dynamo_output_graph", {"sizes": {}}, lambda: "class GraphModule(torch.nn.Module): ...")
        observe.emit("aot_forward_graph", {}, lambda: "def forward(self, primals_1): ...")
        observe.emit("aot_backward_graph", {}, lambda: "def forward(self, tangents_1): ...")
        observe.emit("artifact", {"name": "inductor_post_grad_graph", "encoding": "string"}, lambda: "post grad")
        observe.emit("artifact", {"name": "ir_pre_fusion", "encoding": "string"}, lambda: "buf0: SchedulerNode")
        observe.emit("artifact", {"name": "ir_post_fusion", "encoding": "string"}, lambda: "buf0_buf1: FusedNode")
        observe.emit("inductor_output_code", {"filename": "/c/x.py"}, lambda: "# forward kernel")
        observe.emit("inductor_output_code", {"filename": "/c/y.py"}, lambda: "# another graph")
        with observe.stage("aot_compile_backward"):   # codegen of the backward graph
            observe.emit("artifact", {"name": "ir_pre_fusion", "encoding": "string"}, lambda: "bwd ir")
            observe.emit("inductor_output_code", {"filename": "/c/z.py"}, lambda: "# backward kernel")
    folder = os.path.join(only_run_dir(tmp_path), "step__4_0")
    assert sorted(os.listdir(folder)) == [
        "aot_backward_graph.py", "aot_forward_graph.py", "fx_graph_readable.py", "fx_graph_transformed.py",
        "ir_post_fusion.txt", "ir_pre_fusion.txt", "ir_pre_fusion_backward.txt", "output_code.py",
        "output_code_1.py", "output_code_backward.py"]
    assert open(os.path.join(folder, "output_code.py")).read() == "# forward kernel\n"
    assert open(os.path.join(folder, "output_code_backward.py")).read() == "# backward kernel\n"
    assert open(os.path.join(folder, "ir_post_fusion.txt")).read() == "buf0_buf1: FusedNode\n"


def test_nothing_is_written_while_compile_debug_is_off(tmp_path):
    s = debug_dir.DebugDirSink(root=str(tmp_path)).start()
    try:
        with engine.config.patch(compile_debug=False):
            compile_graph(toy_example, [torch.randn(3), torch.randn(3)], frame_id=5)
        assert os.listdir(tmp_path) == []
        # off, it does not even ask for graph payloads: only dynamo_start reaches it
        assert s.on_event not in observe.bus._subscribers.get("dynamo_output_graph", ())
        with engine.config.patch(compile_debug=True):
            compile_graph(toy_example, [torch.randn(3), torch.randn(3)], frame_id=6)
        assert sorted(os.listdir(only_run_dir(tmp_path))) == ["config.json", "debug.log", "toy_example__6_0"]
    finally:
        s.stop()


def test_env_var_and_root_dir_from_the_environment(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {HERE!r})
        import engine
        from compile_events import compile_graph
        def toy_example(a, b):
            return a * b + 1
        compile_graph(toy_example, [torch.randn(3), torch.randn(3)])
        print(engine.debug.debug_dir.current_run_dir())
    """))
    root = tmp_path / "dbg"
    env = {**os.environ, "TORCH_COMPILE_DEBUG": "1", "TORCH_COMPILE_DEBUG_DIR": str(root), "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = proc.stdout.strip()
    assert os.path.dirname(run) == str(root)
    assert "fx_graph_runnable.py" in os.listdir(os.path.join(run, "toy_example__0_0"))


def test_aot_stage_graphs_land_beside_the_captured_graph(sink, tmp_path):
    from engine.backends import lookup_backend

    a = torch.randn(10, requires_grad=True)
    compiled = compile_graph(toy_example, [a, torch.randn(10)], lookup_backend("aot_eager"), frame_id=8)
    b = torch.randn(10)
    torch.testing.assert_close(compiled(a, b), toy_example(a, b))
    folder = os.path.join(only_run_dir(tmp_path), "toy_example__8_0")
    files = set(os.listdir(folder))
    assert {"aot_joint_graph.py", "aot_forward_graph.py", "aot_backward_graph.py"} <= files
    forward = open(os.path.join(folder, "aot_forward_graph.py")).read()
    assert "torch.ops.aten.abs" in forward or "aten.abs" in forward


def test_a_repeated_compile_id_after_reset_gets_its_own_folder(sink, tmp_path):
    compile_graph(toy_example, [torch.randn(3), torch.randn(3)], frame_id=0)
    compile_graph(toy_example, [torch.randn(3), torch.randn(3)], frame_id=0)   # after engine.reset()
    run = only_run_dir(tmp_path)
    assert {"toy_example__0_0", "toy_example__0_0-1"} <= set(os.listdir(run))
    assert os.listdir(os.path.join(run, "toy_example__0_0-1")) != []
