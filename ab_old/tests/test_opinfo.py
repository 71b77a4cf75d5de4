"""PyTorch's own op samples (OpInfo `op_db`) through the engine, compared with eager
(tests/opinfo_sweep.py). Any wrong result fails; crashes, graph breaks and ops that ran
without a graph are printed (`pytest -s`), not failures: the sweep's table
(`python -m tests.opinfo_sweep --backend B --compare`) puts them beside torch.compile's.

CI: the common ops of FAST_OPS in float32 with the eager and aot_eager backends, in this
process. Marked slow: every op in float32 for each backend, and the other dtypes
(float64, int64, bool, bfloat16) where the op supports them, in worker processes."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _need_op_db():
    # torch.testing._internal imports expecttest (a test dependency of PyTorch's own)
    try:
        import torch.testing._internal.common_methods_invocations  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"torch.testing._internal is not importable ({exc}); pip install expecttest")


def _report(rows, backend):
    from tests import opinfo_sweep
    opinfo_sweep.print_report(rows, backend)


def _check(rows):
    wrong = [r for r in rows if r["impl"] == "engine" and r["status"] == "wrong"]
    assert not wrong, "wrong results:\n" + "\n".join(
        f"  {r['op']} [{r['dtype']}]: {r['reason']}\n      sample: {r['sample']}" for r in wrong)
    assert any(r["status"] == "pass" for r in rows), "the sweep passed no op"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_opinfo_fast_subset_has_no_wrong_results(backend):
    _need_op_db()
    from tests import opinfo_sweep

    rows = opinfo_sweep.sweep(backend, ["float32"], opinfo_sweep.FAST_OPS, compare_torch=False, max_samples=3,
                              op_timeout=30)
    _report(rows, backend)
    _check(rows)
    # the subset is chosen to compile: most of it must get a graph, not only avoid wrong results
    passed = sum(r["status"] == "pass" for r in rows)
    assert passed >= 0.8 * len(rows), f"only {passed} of {len(rows)} fast ops pass"


def test_opinfo_sweep_compares_and_classifies():
    """The sweep's own machinery: an exact copy keeps strides, offsets and aliasing; a
    mutated input and an output that differs are seen."""
    _need_op_db()
    import torch
    from tests import opinfo_sweep as s

    base = torch.arange(12.).reshape(3, 4)
    view = base.t()[1:]
    a, b = s.exact_copy([view, base])
    assert a.stride() == view.stride() and a.storage_offset() == view.storage_offset()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert s.compare(torch.ones(3), torch.ones(3), "values", 1.3e-6, 1e-5) is None
    assert "max abs diff" in s.compare(torch.ones(3), torch.tensor([1., 2., 1.]), "values", 1.3e-6, 1e-5)
    assert s.compare(torch.ones(3), torch.zeros(3), "meta", 0, 0) is None
    # swept under int64 (exact), a float result keeps its float tolerance; an int one stays exact
    assert s.compare(torch.tensor([0.576117]), torch.tensor([0.576117]).nextafter(torch.tensor(1.0)),
                     "values", 0, 0) is None
    assert "max abs diff" in s.compare(torch.tensor([3]), torch.tensor([4]), "values", 0, 0)
    assert "strides" in s.compare(torch.ones(2, 3), torch.ones(3, 2).t(), "meta", 0, 0)
    x = torch.ones(2)
    assert "mutation" in s.compare_inputs(((x,), {}), ((x + 1,), {}), "values", 0, 0)
    assert s.tolerance(next(op for op in s.op_db() if op.name == "add"), torch.float32) >= (1.3e-6, 1e-5)


def _run_cli(tmp_path, backend, dtypes, jobs=2, timeout=5400):
    _need_op_db()
    out = tmp_path / f"opinfo-{backend}.json"
    cmd = [sys.executable, "-m", "tests.opinfo_sweep", "--backend", backend, "--dtypes", dtypes, "--jobs", str(jobs),
           "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    print(f"\n$ {' '.join(cmd[1:])}\n{proc.stdout}")
    assert out.exists(), f"the sweep wrote no results (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())["rows"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_opinfo_full_sweep_float32(backend, tmp_path):
    _check(_run_cli(tmp_path, backend, "float32"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_opinfo_full_sweep_other_dtypes(backend, tmp_path):
    _check(_run_cli(tmp_path, backend, "float64,int64,bool,bfloat16"))


def test_a_bfloat16_result_closer_to_float64_than_eager_is_noise_and_one_further_is_wrong():
    """eager rounds bfloat16 `cross` to bfloat16 at every step; a compiler that keeps the
    steps in float32 differs from eager beyond bfloat16's tolerance, yet is nearer the
    float64 result: noise. A result off by more than eager's own error is wrong."""
    _need_op_db()
    import torch
    from tests import opinfo_sweep as s

    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(64, 3, generator=g).mul(9).to(torch.bfloat16) for _ in range(2))
    args, kwargs = (x, y), {"dim": 1}
    eager = torch.linalg.cross(x, y, dim=1)
    in_float32 = torch.linalg.cross(x.float(), y.float(), dim=1).to(torch.bfloat16)
    rtol, atol = s.DEFAULT_TOL[torch.bfloat16]
    assert s.compare(eager, in_float32, "values", rtol, atol), "the sample must differ beyond tolerance"
    assert s.rounding_noise(torch.linalg.cross, args, kwargs, 0, (eager, (args, kwargs)),
                            (in_float32, (args, kwargs)), rtol, atol)
    off = in_float32 + 1.0
    assert not s.rounding_noise(torch.linalg.cross, args, kwargs, 0, (eager, (args, kwargs)),
                                (off, (args, kwargs)), rtol, atol)
    nan = in_float32.clone()
    nan[0, 0] = float("nan")
    assert not s.rounding_noise(torch.linalg.cross, args, kwargs, 0, (eager, (args, kwargs)),
                                (nan, (args, kwargs)), rtol, atol)
