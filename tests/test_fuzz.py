"""The differential fuzzer (tests/fuzz) over a fixed range of seeds: random programs with
in-place ops, views, aliasing, control flow, globals, closures, modules and gradients, each
called several times with changed inputs, eagerly and through engine.compile.

A wrong result (call 0 differs from eager) or a stale one (a later call, after the
inputs, globals or module changed, differs) fails, with the shrunk repro scripts and
their programs in the message. Crashes (the engine raised where eager did not) are printed
and warned about, not failures. More seeds: `python -m tests.fuzz --help`."""

import json
import logging
import os
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import engine  # noqa: E402
from tests.fuzz import gen, harness, program, runner  # noqa: E402

# (backend, seeds): about 60 s together on 2 cores, plus a few seconds of shrinking per failure
CASES = [("eager", range(0, 60)), ("aot_eager", range(1000, 1050)), ("inductor", range(2000, 2008))]


# programs that once gave a wrong or stale result (or a crash of ours alone), each with the
# backend it failed on
FIXED = [(404182, "inductor"),    # sub(z, y[0], out=z), z a strided view that is y: now a graph break
         (404034, "inductor"),    # the std of one silu'd element: inf where eager gives nan
         (405199, "inductor"),    # torch.tensor([...]) handed over a break as the graph's constant itself
         # not a compiler fix: `x.float().mean(0)` of a float64 x, summed in double, 1 float32 ulp
         # from eager; the float64 reference now widens `.float()` too, and sees it is no further
         (409974, "inductor"),
         (411215, "inductor"),    # maximum(w, x, out=z) with z of another size: eager resizes z
         (313332, "aot_eager"),   # sub(a, t[mask], out=y): the resize check asked a data-dependent size
         # crashes of ours alone: a view made under the trace's no_grad, then written
         (411326, "inductor"),    # a view written under no_grad, sliced with grad on: an inference trace
         (313377, "aot_eager"),   # x[0].mul_(z): the forward saved a view of x, which the call then wrote
         (312158, "aot_eager"),
         (313345, "aot_eager"),   # select, then transpose_ of its base: the view's gradient misplaced
         (316766, "aot_eager"),   # two returned views of one intermediate, one then written in place
         (414119, "inductor"),    # a 2-iteration omp simd sum in float64: g++ 12 lost an iteration
         # g++ vectorizing loops nobody marked: a cat's second half lost, a relu mask misplaced
         (417442, "inductor"), (418869, "inductor"),
         (423863, "inductor"),    # an FMA: std of two equal values 1.5e-18, and its gradient -0.41
         (418293, "inductor"),    # a detached alias of an input, written with grad across a break
         (328441, "aot_eager"),   # a data-dependent size read after an in-place transpose
         (429014, "inductor"),    # an unused output's zero gradient through sqrt: 0/0 in x's gradient
         # the zeros for a missing gradient were given an expanded layout (the first fix's own bug)
         (432520, "inductor"), (439227, "inductor"),
         # min-cut saved an input only to recompute a forward op, and the caller then wrote it
         (425449, "inductor"), (420327, "inductor"),
         (902531, "inductor"),    # the same with an input that gets a gradient: y.mul_ after a break
         (345578, "aot_eager"),   # a tensor saved only for an unused output, then written by the caller
         (444319, "inductor"),    # w.detach().addcmul_(y, y) returned: rebuilt as a view of w, no gradient
         (451298, "inductor"),    # a LayerNorm output saved for its backward, then written under no_grad
         (375436, "aot_eager"),   # a view rebuilt from another output's fallback, outside the view family
         (375527, "aot_eager"),   # an input no output depends on kept its history: a stale saved tensor
         (378473, "aot_eager"),   # a view from an inference graph, marked as made under no_grad
         (700055, "eager")]       # a cache-held registry (`count`): a new dict on each compiled call


@pytest.mark.parametrize("seed,backend", FIXED)
def test_a_fuzz_program_that_once_failed_matches_eager(seed, backend):
    prog, _ = gen.generate(seed)
    outcome = runner.check(prog, "engine", backend)
    assert outcome.category == "pass", outcome.line()


def _program_lines(src):
    """The program without its fixed header (imports, DEVNULL, LOG) and blank lines."""
    header = src.split("DEVNULL = Sink()\n", 1)[0] + "DEVNULL = Sink()\n"
    return [x for x in src[len(header):].splitlines() if x.strip() and not x.startswith("LOG =")]


@pytest.mark.parametrize("backend,seeds", CASES, ids=[c[0] for c in CASES])
def test_fuzz_matches_eager(backend, seeds, tmp_path):
    trace_log = logging.getLogger("torch.__trace")   # its DEBUG records would flood the captured log
    level = trace_log.level
    trace_log.setLevel(logging.WARNING)
    try:
        results = runner.fuzz(backend, list(seeds), out=str(tmp_path), shrink_budget=8.0, log=lambda s: None)
    finally:
        trace_log.setLevel(level)
    print(runner.summarize(results, backend, compare=False))
    crashes = [r for r in results if r.engine.category == "crash"]
    for r in crashes:
        msg = f"fuzz {backend} seed {r.seed}: {r.engine.line()}  [{r.repro}]"
        print(msg)
        warnings.warn(msg, stacklevel=1)
    bad = [r for r in results if r.engine.category in ("wrong", "stale")]
    if bad:
        parts = []
        for r in bad:
            parts.append(f"--- seed {r.seed}: {r.shrunk.line()}\n    repro: {r.repro}\n"
                         + "\n".join("    " + x for x in _program_lines(r.shrunk_source)))
        pytest.fail(f"{len(bad)} of {len(results)} fuzz programs ({backend}) give results that differ from eager:\n"
                    + "\n".join(parts), pytrace=False)
    assert results, "the generator made no programs"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fuzz_with_the_backward_inside_the_compiled_call_matches_eager(backend, tmp_path, monkeypatch):
    """`--backward-inside`: each program runs its own backward (loss.backward() traced into
    the graph where the engine can, engine/capture/backward.py); grads and outputs as eager's."""
    monkeypatch.setattr(program, "BACKWARD_INSIDE", True)
    with engine.config.patch(backward_in_graph=True):
        results = runner.fuzz(backend, list(range(950000, 950016)), out=str(tmp_path), shrink_budget=8.0,
                              log=lambda s: None)
    bad = [f"seed {r.seed}: {r.engine.line()}" for r in results if r.engine.category not in ("pass", "noise")]
    assert results and not bad, bad


def test_fuzz_through_the_triton_emitter_matches_eager(tmp_path):
    """The inductor backend's Triton emitter (the GPU's code), run on CPU tensors under
    Triton's interpreter (`engine.config.triton_interpret`): random programs give eager's
    results. Crashes are warned about (some are the interpreter's limits: a bool `|` of 0-d
    values); this found a sum over size-1 dims and a float64 sqrt that did not compile."""
    pytest.importorskip("triton")
    with engine.config.patch(triton_interpret=True):
        results = runner.fuzz("inductor", list(range(970000, 970016)), out=str(tmp_path), shrink_budget=8.0,
                              log=lambda s: None)
    for r in results:
        if r.engine.category == "crash":
            warnings.warn(f"fuzz triton seed {r.seed}: {r.engine.line()}", stacklevel=1)
    bad = [f"seed {r.seed}: {r.engine.line()}" for r in results if r.engine.category in ("wrong", "stale")]
    passed = [r for r in results if r.engine.category in ("pass", "noise")]
    assert results and not bad and len(passed) >= len(results) // 2, (bad, [r.engine.line() for r in results])


def _perturbed(fn, change):
    """fn, with `change` applied to each tensor it returns (a deliberately wrong compiler)."""
    def run(*args):
        out = fn(*args)
        if isinstance(out, dict):
            return {k: change(v) if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        if isinstance(out, (list, tuple)):
            return type(out)(change(v) if isinstance(v, torch.Tensor) else v for v in out)
        return change(out) if isinstance(out, torch.Tensor) else out
    return run


def _float_program():
    """The first generated program whose first output is a float32 tensor that eager
    computes the same twice."""
    for seed in range(100):
        prog, _ = gen.generate(seed)
        ns, calls, gnames = gen.load(prog)
        res = harness.run_call(ns, ns["fn"], calls[0], gnames)
        flat = list(harness.flat_tensors(res.get("out", ("value", None))[1])) if "error" not in res else []
        if flat and res["out"][0] == "tensor" and res["out"][1].dtype == torch.float32 and res["out"][1].numel() > 1:
            return prog
    raise AssertionError("no float program in 100 seeds")


def test_a_wrong_value_is_wrong_and_rounding_is_noise(monkeypatch):
    # A compiler whose result is off by 1e-2 gives a wrong result, also in float64;
    # one that rounds float32 results to bfloat16 is exact in float64: that is what rounding
    # noise looks like (the same arithmetic, rounded differently), and it is counted apart.
    prog = _float_program()
    monkeypatch.setattr(runner, "compiler", lambda impl, backend: lambda fn: _perturbed(fn, lambda t: t + 1e-2))
    wrong = runner._check(prog, "engine", "eager")
    assert wrong.category == "wrong"
    compile(runner.repro_source(prog, "engine", "eager", wrong), "repro.py", "exec")   # the repro is Python
    rounded = lambda t: t.to(torch.bfloat16).to(t.dtype) if t.dtype == torch.float32 else t  # noqa: E731
    monkeypatch.setattr(runner, "compiler", lambda impl, backend: lambda fn: _perturbed(fn, rounded))
    out = runner._check(prog, "engine", "eager")
    assert out.category == "noise" and not out.failed and "values differ" in out.detail
    monkeypatch.setattr(runner, "compiler", lambda impl, backend: lambda fn: fn)
    assert runner._check(prog, "engine", "eager").category == "pass"


class _FlipNearZeroComparisons(torch.overrides.TorchFunctionMode):
    """A compiler that rounds a sum that is 0 in exact arithmetic to the other side of 0."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.gt and args[0].numel() == 1 and abs(float(args[0])) < 1e-5:
            return out.logical_not()
        return out


class _OtherZeroOfMaximum(torch.overrides.TorchFunctionMode):
    """A compiler whose maximum of 0.0 and -0.0 is the other zero: eager's vector loop's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.maximum:
            return func(*args, **(kwargs or {}))
        a, b = args
        ties = (a == 0) & (b == 0) & (torch.signbit(a) != torch.signbit(b))
        out = func(*args, **(kwargs or {}))
        with torch.no_grad():
            out.copy_(torch.where(ties, -out, out))
        return out


class _FlipTiedElements(torch.overrides.TorchFunctionMode):
    """A compiler that rounds `sqrt(|z|)**2` differently: `t1 > z` flips for a few z > 0
    (in exact arithmetic t1 == z there). With tied=False it flips elements that do not tie."""

    def __init__(self, tied=True):
        super().__init__()
        self.tied = tied

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.gt, torch.Tensor.__gt__) and isinstance(args[1], torch.Tensor) and out.numel() > 1:
            a, b = args[0].detach().double(), args[1].detach().double()
            near = (a - b).abs() <= 1e-6 * torch.maximum(a.abs(), b.abs()).clamp(min=1)
            flat = out.flatten().clone()
            idx = (near if self.tied else ~near).flatten().nonzero().flatten()[:3]
            flat[idx] = ~flat[idx]
            return flat.view(out.shape)
        return out


class _ReluOfResidue(torch.overrides.TorchFunctionMode):
    """A compiler whose BatchNorm of equal rows leaves other rounding residue: its ReLU
    passes two elements eager's zeroes, or zeroes two it passes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.relu:
            x = args[0]
            idx = (x.detach().abs() < 1e-3).flatten().nonzero().flatten()[:2]
            flip = torch.zeros(x.numel(), dtype=torch.bool)
            flip[idx] = True
            return torch.where(flip.view(x.shape), torch.where(x > 0, x * 0, x), out)
        return out


# Fuzz seed 460607 loops `while t4.sum() > 0`, t4 a LayerNorm's output: its sum is 0 in exact
# arithmetic, and eager's rounding (-1.5e-6) and a compiler's (+1.1e-6) branch apart. Seed
# 491267 takes `torch.maximum(t0, t4, out=t4)` of 0.0 and -0.0 (`x * 0` of a negative x),
# then atan2 of it with a negative y: pi or -pi; eager's own maximum answers 0.0 for 8 such
# pairs and -0.0 for 16 (its scalar and vector loops).
TIES = [(460607, _FlipNearZeroComparisons, ["a branch rounding decides: line", "compares"]),
        (491267, _OtherZeroOfMaximum, ["a tie eager breaks either way: line", "maximum of 0.0 and -0.0"]),
        (487916, _FlipTiedElements, ["line", "compares", "elements that tie in float64: 3 of them"]),
        (490508, _ReluOfResidue, ["line", "takes the ReLU of", "elements that tie in float64: all 2"])]


@pytest.mark.parametrize("seed,mode,shown", TIES, ids=["branch on a zero sum", "maximum of signed zeros",
                                                     "elementwise comparison", "ReLU of a BatchNorm of equal rows"])
def test_a_tie_eager_breaks_either_way_is_noise_but_a_wrong_value_beside_it_is_not(monkeypatch, seed, mode, shown):
    prog, _ = gen.generate(seed)
    other = lambda fn: lambda *a: _run_under(mode(), fn, *a)  # noqa: E731
    monkeypatch.setattr(runner, "compiler", lambda impl, backend: other)
    out = runner._check(prog, "engine", "eager")
    assert out.category == "noise", out.line()
    assert all(s in out.detail for s in shown), out.detail
    # the tie broken the other way, and a value off by 1e-2 besides: breaking eager's tie
    # does not explain that, and it stays wrong
    monkeypatch.setattr(runner, "compiler", lambda impl, backend: lambda fn: _perturbed(other(fn), lambda t: t + 1e-2))
    assert runner._check(prog, "engine", "eager").category in ("wrong", "stale")


def test_flipping_elements_that_do_not_tie_is_wrong(monkeypatch):
    prog, _ = gen.generate(487916)
    other = lambda fn: lambda *a: _run_under(_FlipTiedElements(tied=False), fn, *a)  # noqa: E731
    monkeypatch.setattr(runner, "compiler", lambda impl, backend: other)
    assert runner._check(prog, "engine", "eager").category == "wrong"


def _run_under(mode, fn, *args):
    with mode:
        return fn(*args)


def test_a_float_difference_no_larger_than_eagers_own_error_passes():
    eager = ("tensor", torch.tensor([1.0, 2.0]), False)
    compiled = ("tensor", torch.tensor([1.001, 2.0]), False)
    near = {"out": ("tensor", torch.tensor([1.0006, 2.0], dtype=torch.float64), False)}
    far = {"out": ("tensor", torch.tensor([1.0, 2.0], dtype=torch.float64), False)}
    res = lambda out: {"out": out, "alias": {}, "inputs": ("dict", []), "globals": ("dict", []), "module": None}  # noqa: E731
    assert harness.compare(res(eager), res(compiled)) is not None
    assert harness.compare(res(eager), res(compiled), far) is not None
    assert harness.compare(res(eager), res(compiled), near) is None


def test_a_run_stops_starting_programs_at_its_deadline(tmp_path, capsys):
    """`--minutes` bounds a run on a lent machine: no program starts after it, and the summary
    and the JSON cover the programs that finished (here, with 0 minutes, none)."""
    runner.main(["--backend", "eager", "--seed", "5", "--count", "6", "--jobs", "2", "--minutes", "0",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "backend eager: 0 programs" in out
    assert "0 of the 6 programs asked for ran" in out
    assert json.load(open(tmp_path / "results-eager-5-6.json")) == []
    worker_log = (tmp_path / "worker-0.log").read_text()
    assert "deadline: stopped after 0 of 3 programs" in worker_log
