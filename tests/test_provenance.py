"""Provenance both ways: which of my lines did each kernel come from, and which kernels did
each of my lines become? Forward and backward, in the output code, the
`kernel_provenance` log and the report's kernels page."""

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import engine
from engine_helpers import fresh_engine, logs  # noqa: F401  (fixture)
from engine.user_frames import user_frames
from tlparse.cli import main


def step(x, w):
    y = torch.sin(x) * 2          # LINE_SIN
    z = y @ w                     # LINE_MM
    return torch.relu(z).sum()    # LINE_RELU


def _line(marker: str) -> int:
    src, start = inspect.getsourcelines(step)
    return start + next(i for i, s in enumerate(src) if marker in s)


def _compiled_graphs(fn, *args, backward=True):
    """Run fn compiled with inductor; the kernel_provenance records and output code it logged."""
    with logs("kernel_provenance") as prov, logs("output_code") as code:
        out = engine.compile(fn, backend="inductor")(*args)
        if backward:
            out.backward()
    return [json.loads(p) for p in prov], code


def test_each_kernel_names_the_user_lines_it_computes_forward_and_backward():
    # parameters, which min-cut saves for free: the backward recomputes cos(x) from x (an
    # input the caller might write is not saved to recompute from; cos(x) would be)
    x, w = torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8, 8))
    graphs, _ = _compiled_graphs(step, x, w)
    assert [g["graph"] for g in graphs] == ["forward", "backward"]
    here = os.path.abspath(__file__)

    def lines_of(g, pred):
        return {ln["line"] for k in g["kernels"] if pred(k) for ln in k["lines"] if ln["file"] == here}

    forward, backward = graphs
    assert lines_of(forward, lambda k: "sin" in k["aten"]) == {_line("LINE_SIN")}
    assert lines_of(forward, lambda k: k["op"] == "aten.mm.default") == {_line("LINE_MM")}
    # the backward of sin (cos) and of the matmul (two mms) are charged to the forward lines
    assert lines_of(backward, lambda k: "cos" in k["aten"]) == {_line("LINE_SIN")}
    mm_kernels = [k for k in backward["kernels"] if k["op"] == "aten.mm.default"]
    assert len(mm_kernels) == 2 and all(k["fx"] == ["matmul"] for k in mm_kernels)
    assert lines_of(backward, lambda k: k["op"] == "aten.mm.default") == {_line("LINE_MM")}
    # every kernel of both graphs has a line, and each line has its code
    for g in graphs:
        for k in g["kernels"]:
            assert k["lines"], k
            assert all(ln["code"] and ln["function"] == "step" for ln in k["lines"])


def test_output_code_has_a_comment_above_each_kernel():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    graphs, code = _compiled_graphs(step, x, w, backward=False)
    (wrapper,) = code
    call = wrapper.split("def call(args):", 1)[1].splitlines()
    for k in graphs[0]["kernels"]:
        comment = next(i for i, s in enumerate(call) if s.strip().startswith(f"# {k['kernel']}:"))
        # the next statement calls that kernel (or computes that extern's result)
        assert k["kernel"] in call[comment + 1]
    assert f"test_provenance.py:{_line('LINE_SIN')}" in wrapper
    assert f"test_provenance.py:{_line('LINE_RELU')}" in wrapper


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.norm(x)
        h = torch.nn.functional.gelu(self.up(h))
        h = h.view(*x.shape[:-1], -1).transpose(0, 1).transpose(0, 1)   # views only: no kernel of their own
        return x + self.down(h)


def _coverage(model, *args):
    """(kernels without a user line, user lines of the captured graph without a kernel)."""
    captured = []

    def backend(gm, example_inputs):
        captured.append(gm)
        return engine.backends.registry.lookup_backend("inductor")(gm, example_inputs)

    with logs("kernel_provenance") as prov:
        engine.compile(model, backend=backend)(*args).sum().backward()
    kernels = [k for p in prov for k in json.loads(p)["kernels"]]
    covered = {(ln["file"], ln["line"]) for k in kernels for ln in k["lines"]}
    lines = set()
    for gm in captured:
        for n in gm.graph.nodes:
            frames = user_frames(n) if n.op.startswith("call_") else []
            if frames:
                lines.add((frames[-1].file, frames[-1].line))
    return kernels, [k["kernel"] for k in kernels if not k["lines"]], sorted(lines - covered)


def test_every_kernel_has_a_line_and_every_line_a_kernel():
    model = torch.nn.Sequential(Block(16), Block(16))
    kernels, no_line, no_kernel = _coverage(model, torch.randn(2, 5, 16))
    assert len(kernels) > 10
    assert no_line == [] and no_kernel == []     # the views' line counts: its kernel reads through them


def test_a_zoo_model_maps_both_ways():
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.zoo.models import build
    model, inputs = build("GPT2LMHeadModel")
    captured = []

    def backend(gm, example_inputs):
        captured.append(gm)
        return engine.backends.registry.lookup_backend("inductor")(gm, example_inputs)

    with logs("kernel_provenance") as prov:
        out = engine.compile(model, backend=backend)(**inputs)
        out.logits.float().sum().backward()
    kernels = [k for p in prov for k in json.loads(p)["kernels"]]
    assert len(kernels) > 50
    assert [k["kernel"] for k in kernels if not k["lines"]] == []
    covered = {(ln["file"], ln["line"]) for k in kernels for ln in k["lines"]}
    computing = set()
    for gm in captured:
        for n in gm.graph.nodes:
            frames = user_frames(n) if n.op.startswith("call_") else []
            if frames:
                computing.add((frames[-1].file, frames[-1].line))
    assert computing and computing <= covered, sorted(computing - covered)


PROGRAM = textwrap.dedent('''
    import torch
    import engine

    def loss(x, w):
        h = torch.tanh(x @ w)
        return (h * h).mean()

    x, w = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    engine.compile(loss, backend="inductor")(x, w).backward()
''')


def test_the_report_shows_kernels_by_line_and_lines_by_kernel(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace")}
    env.pop("TORCH_LOGS", None)
    proc = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "report"
    assert main([str(tmp_path / "trace"), "-o", str(out), "--no-browser"]) == 0
    page = (out / "kernels.html").read_text()
    by_line, by_kernel = page.split('id="kernels"')
    # the line of the matmul lists the forward extern mm and the backward ones
    row = next(r for r in by_line.split("<tr") if "<code>h = torch.tanh(x @ w)</code>" in r)
    assert "extern" in row and "forward" in row and "backward" in row
    assert row.count("backward") >= 2                    # dL/dx and dL/dw: two backward mms
    # each graph's table names the FX nodes and the line of each kernel
    assert "forward graph" in by_kernel and "backward graph" in by_kernel
    assert "tanh" in by_kernel and "prog.py:6" in by_kernel and "prog.py:7" in by_kernel
    compile_pages = [p.read_text() for p in (out / "compiles").glob("*.html")]
    assert any("kernels.html#c-" in p for p in compile_pages)
    assert 'href="kernels.html"' in (out / "index.html").read_text()


def test_kernels_are_named_after_the_users_ops_not_their_decomposition():
    # a batch norm lowers to unsqueeze, sub, mul, add, ...: the kernel is named batch_norm
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(8), torch.nn.ReLU()).eval()
    with logs("output_code") as code, torch.no_grad():
        engine.compile(model, backend="inductor")(torch.randn(4, 8))
    names = set(re.findall(r"\bkernel\d+_\w+", "".join(code)))
    assert names and all("batch_norm_relu" in n for n in names), names
