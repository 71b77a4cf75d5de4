"""Sweep PyTorch's own op samples (OpInfo `op_db`) through the engine, and through
torch.compile beside it, and classify each (op, dtype, backend).

    python -m tests.opinfo_sweep --backend eager|aot_eager|inductor [--dtypes float32,...]
        [--ops add,nn.functional.relu,...] [--samples 3] [--op-timeout 30] [--jobs 2]
        [--compare] [--json out.json] [--in-process]

For each OpInfo (`name` or `name.variant_test_name`) and dtype it supports on the CPU, the
first `--samples` sample inputs (`op.sample_inputs("cpu", dtype, requires_grad=False)`)
are called as `f(sample.input, *sample.args, **sample.kwargs)` with
`def f(*args, **kwargs): return op.op(*args, **kwargs)`: eagerly twice (the reference,
and a check that eager agrees with itself), then `engine.compile(f, backend=B)` and, with
--compare, `torch.compile(f, backend=B)`, each on its own exact copy of the inputs (same
sizes, strides, storage offsets and aliasing). Outputs and the inputs afterwards (values,
sizes, strides: an in-place op's mutations) are compared with eager: with the op's own
tolerance overrides where op_db gives them, else torch.testing's defaults. So is which
input's storage each output shares: an output that is a new tensor eagerly but a view of
an input compiled (or the reverse) is wrong, since writing to one changes the other.
Outputs of ops that return uninitialised memory (`empty*`, `new_empty*`, `resize_`)
compare sizes, dtypes and strides only; random ops (attention samples with dropout too,
and any sample on which eager disagrees with itself) compare sizes and dtypes only.
Every sample starts from `engine.reset()` / `torch._dynamo.reset()` and the same seed.

Each (op, dtype, impl) gets the worst category over its samples:

    wrong        an output or a mutated input differs from eager
    noise        a float output differs from eager beyond the op's tolerance, but is as
                 close to the op's float64 result (its float inputs widened) as eager's is:
                 the same arithmetic rounded differently (e.g. bfloat16 computed in float32
                 where eager rounds every step); listed, not a failure
    crash        the compiled call raised where eager did not (type and first line)
    timeout      the op's samples took more than --op-timeout seconds (the rest skipped)
    graph break  more than one graph, or a graph and a reported break
    no graph     the call ran without compiling a graph (reason: the first break reported)
    pass
    skip         no sample ran eagerly (or the op does not support the dtype)

The engine's graphs are counted by a counting backend wrapped around the real backend,
torch's by dynamo's `counters["stats"]["unique_graphs"]` (a restarted analysis calls the
backend twice for one graph); breaks are the engine's `graph_break` bus events and
torch's `counters["graph_break"]`.

op_db's own lambdas (`view`, `T`, `einsum`, dropout, ...) live in
torch/testing/_internal, which the engine skips as torch internals (GB0012) while Dynamo
inlines `torch.testing`; they are rebuilt as user code (file `<opinfo:NAME>`, module
`opinfo_sweep_ops`) so that the op they call is what is swept; their
`wrapper_set_seed(op, ...)` calls become plain `op(...)` (the sweep seeds the RNG before
every call itself). Other torch-internal Python functions (`torch.masked._ops`, window
functions, ...) are called as they are.

By default the ops run in worker subprocesses (`--jobs` of them): an op that kills its
process is a crash ("worker process died") and the sweep goes on with the next op.
Exit status 1 when the engine gives a wrong result.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings
from typing import Optional

import engine  # first: observe reads TORCH_LOGS / TORCH_TRACE before torch does
import observe
import torch

from tests.timeouts import TimeLimit, time_limit

CATEGORIES = ["pass", "noise", "no graph", "graph break", "crash", "wrong", "timeout", "skip"]
# which category an (op, dtype) gets when its samples disagree: the worst one
_SEVERITY = {"skip": 0, "pass": 1, "noise": 2, "no graph": 3, "graph break": 4, "timeout": 5, "crash": 6,
             "wrong": 7}
# A float result outside the op's tolerance is rounding noise, not a wrong result, when it
# is no further from the op's float64 result than eager's own is (times this, plus a tenth
# of the tolerance): the rule of PyTorch's benchmark harness, and of tests/fuzz.
NOISE_MULTIPLIER = 3.0

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "bool": torch.bool,
          "bfloat16": torch.bfloat16, "float16": torch.float16, "int32": torch.int32,
          "complex64": torch.complex64}
_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64", torch.int32: "i32", torch.bool: "b8",
          torch.bfloat16: "bf16", torch.float16: "f16", torch.complex64: "c64", torch.complex128: "c128",
          torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16"}

# torch.testing.assert_close's defaults (rtol, atol), a little looser for the low-precision ones
DEFAULT_TOL = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7), torch.complex64: (1.3e-6, 1e-5),
               torch.complex128: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}

# Outputs that are uninitialised memory: sizes, dtypes and strides only.
UNINITIALIZED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
                 "resize_", "resize_as_"}
# Random ops: sizes and dtypes only.
NONDETERMINISTIC = {"bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
                    "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randint", "randint_like",
                    "randn", "randn_like", "nn.functional.alpha_dropout", "nn.functional.dropout",
                    "nn.functional.dropout2d", "nn.functional.dropout3d",
                    "nn.functional.feature_alpha_dropout.with_train",
                    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
                    "nn.functional.rrelu", "pca_lowrank", "svd_lowrank"}



def sample_is_random(name: str, args: tuple, kwargs: dict) -> bool:
    """Samples of deterministic ops that use the RNG: attention with dropout."""
    p, training = kwargs.get("dropout_p", 0.0), kwargs.get("training", True)
    if name == "nn.functional.scaled_dot_product_attention" and len(args) > 4:
        p = args[4]
    if name == "nn.functional.multi_head_attention_forward":
        p = args[10] if len(args) > 10 else p
        training = args[13] if len(args) > 13 else training
    return isinstance(p, (int, float)) and p > 0 and bool(training)


# The CI subset (tests/test_opinfo.py): common ops of models and of the engine's own tests.
FAST_OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "true_divide", "pow", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "sin", "cos", "tanh", "sigmoid", "clamp", "where", "maximum", "minimum", "eq", "lt", "logical_and",
    "sum", "mean", "amax", "argmax", "var", "std", "prod", "cumsum", "softmax", "log_softmax",
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum",
    "view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand", "flatten", "cat", "stack",
    "split", "chunk", "narrow", "select", "index_select", "gather", "scatter_add", "masked_fill", "index_put",
    "clone", "contiguous", "zeros_like", "ones_like", "full_like", "arange", "tril", "triu", "topk", "sort",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.linear",
    "nn.functional.layer_norm", "nn.functional.embedding", "nn.functional.conv2d", "nn.functional.dropout",
    "nn.functional.scaled_dot_product_attention", "nn.functional.cross_entropy", "zero_", "fill",
]


def _first_line(text: str, limit: int = 200) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def error_text(exc: BaseException) -> str:
    """`Type: first line`, and the innermost cause where the error wraps another (a
    BackendCompilerFailed around the AOT stage's AssertionError)."""
    text = f"{type(exc).__name__}: {_first_line(str(exc))}"
    root = root_cause(exc)
    if root is not exc:
        text += f" [cause: {type(root).__name__}: {_first_line(str(root))}]"
    return text


def error_group(reason: str) -> str:
    """What crashes are grouped by: the innermost cause where there is one."""
    m = re.search(r"\[cause: (.*)\]$", reason or "")
    return m.group(1) if m else (reason or "")


# ---------------------------------------------------------------------------- ops

def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db
    return db


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _rehome_code(code: types.CodeType, name: str) -> types.CodeType:
    consts = tuple(_rehome_code(c, name) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=f"<opinfo:{name}>", co_consts=consts)


def _call_op(op, *args, **kwargs):
    """Stands for torch.testing._utils.wrapper_set_seed in op_db's lambdas: the sweep seeds
    the RNG itself before every call (eager and compiled alike)."""
    return op(*args, **kwargs)


_GLOBALS: dict = {}


def _lambda_globals(g: dict) -> dict:
    key = id(g)
    if key not in _GLOBALS:
        new = dict(g)
        if "wrapper_set_seed" in new:
            new["wrapper_set_seed"] = _call_op
        _GLOBALS[key] = new
    return _GLOBALS[key]


def op_callable(op):
    """op.op, with op_db's own Python functions (lambdas in torch/testing/_internal) rebuilt
    as user code: Dynamo inlines torch.testing, the engine would skip it. Their
    `wrapper_set_seed(op, ...)` (a seeded call that both compilers skip) becomes `op(...)`."""
    fn = op.op
    if isinstance(fn, types.FunctionType) and "torch/testing/_internal" in fn.__code__.co_filename.replace(os.sep, "/"):
        new = types.FunctionType(_rehome_code(fn.__code__, full_name(op)), _lambda_globals(fn.__globals__),
                                 fn.__name__, fn.__defaults__, fn.__closure__)
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__module__ = "opinfo_sweep_ops"   # the engine tells torch's functions by their module
        new.__qualname__ = f"opinfo[{full_name(op)}]"
        return new
    return fn


def make_f(fn):
    """The function that is compiled: one call of the op (a new function object per sample;
    the code object is the same, hence the resets between samples)."""
    def f(*args, **kwargs):
        return fn(*args, **kwargs)
    return f


def tolerance(op, dtype) -> tuple:
    """(rtol, atol): the largest of torch.testing's defaults and the op's toleranceOverride
    decorators for this dtype on the CPU (any test class)."""
    rtol, atol = DEFAULT_TOL.get(dtype, (0.0, 0.0))
    for info in getattr(op, "decorators", ()) or ():
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        for dec in getattr(info, "decorators", ()) or ():
            d = getattr(dec, "d", None)
            if isinstance(d, dict) and dtype in d:
                t = d[dtype]
                if isinstance(t, (int, float)):   # precisionOverride: an atol
                    atol = max(atol, float(t))
                else:                             # toleranceOverride: tol(atol, rtol)
                    atol, rtol = max(atol, t.atol), max(rtol, t.rtol)
    return rtol, atol


# ---------------------------------------------------------------------------- inputs

def exact_copy(obj, memo: Optional[dict] = None):
    """A copy of a sample's inputs with the same sizes, strides, storage offsets and
    storage sharing (two views of one storage stay views of one new storage)."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or type(obj) is not torch.Tensor or obj.is_quantized:
            return obj.clone()
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in memo or storage.nbytes() == 0:
            memo[key] = storage.clone()
        new = torch.empty(0, dtype=obj.dtype, device=obj.device)
        with torch.no_grad():
            new.set_(memo[key], obj.storage_offset(), obj.size(), obj.stride())
        new.requires_grad_(obj.requires_grad)
        return new
    if isinstance(obj, list):
        return [exact_copy(v, memo) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(exact_copy(v, memo) for v in obj)
    if isinstance(obj, dict):
        return {k: exact_copy(v, memo) for k, v in obj.items()}
    return obj


def sample_args(sample):
    return (sample.input, *sample.args), dict(sample.kwargs)


def describe(obj, depth: int = 0) -> str:
    if isinstance(obj, torch.Tensor):
        dt = _SHORT.get(obj.dtype, str(obj.dtype).replace("torch.", ""))
        s = f"{dt}{list(obj.shape)}"
        if obj.layout != torch.strided:
            s += f"({obj.layout})"
        elif obj.numel() > 1 and not obj.is_contiguous():
            s += f"(stride {tuple(obj.stride())})"
        if obj.numel() == 1 and obj.layout == torch.strided and obj.dtype != torch.bfloat16:
            try:
                s += f"={obj.item():.4g}" if obj.dtype.is_floating_point else f"={obj.item()}"
            except Exception:
                pass
        return s
    if isinstance(obj, (list, tuple)) and depth < 3:
        inner = ", ".join(describe(v, depth + 1) for v in list(obj)[:6])
        more = ", ..." if len(obj) > 6 else ""
        return f"[{inner}{more}]" if isinstance(obj, list) else f"({inner}{more})"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}={describe(v, depth + 1)}" for k, v in obj.items()) + "}"
    text = repr(obj)
    return text if len(text) < 60 else text[:57] + "..."


def describe_sample(args, kwargs) -> str:
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


# ---------------------------------------------------------------------------- comparing

def leaves(obj, path: str = "out", depth: int = 0) -> list:
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, complex, str,
                                                                         torch.dtype, torch.device)):
        return [(path, obj)]
    if depth > 6:
        return [(path, repr(obj))]
    if isinstance(obj, torch.Size):
        return [(path, tuple(obj))]
    if isinstance(obj, (tuple, list)):
        kind = type(obj).__name__
        return [(f"{path}:{kind}{len(obj)}", len(obj))] + \
            [leaf for i, v in enumerate(obj) for leaf in leaves(v, f"{path}[{i}]", depth + 1)]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in leaves(v, f"{path}[{k!r}]", depth + 1)]
    return [(path, obj)]


def _storage_key(t: torch.Tensor):
    if t.layout != torch.strided or t.numel() == 0 or type(t) is not torch.Tensor:
        return None
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return None


def _max_diff(a: torch.Tensor, e: torch.Tensor) -> str:
    try:
        if a.layout != torch.strided:
            a, e = a.to_dense(), e.to_dense()
        if e.dtype == torch.bool:
            return f"{int((a != e).sum())} of {e.numel()} elements differ"
        ad, ed = a.detach().to(torch.complex128 if e.is_complex() else torch.float64), \
            e.detach().to(torch.complex128 if e.is_complex() else torch.float64)
        diff = (ad - ed).abs()
        both_nan = ad.isnan() & ed.isnan()
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
        if diff.numel() == 0:
            return ""
        idx = int(diff.reshape(-1).argmax())
        rel = float(diff.reshape(-1)[idx] / max(float(ed.abs().reshape(-1)[idx]), 1e-30))
        n_bad = int((diff > 0).sum())
        return (f"max abs diff {float(diff.reshape(-1)[idx]):.3g} (rel {rel:.3g}) at flat index {idx}: "
                f"expected {ed.reshape(-1)[idx].item():.6g}, got {ad.reshape(-1)[idx].item():.6g}; "
                f"{n_bad} of {e.numel()} elements differ")
    except Exception as exc:
        return f"(diff failed: {error_text(exc)})"


def compare_tensor(e: torch.Tensor, a: torch.Tensor, mode: str, rtol: float, atol: float) -> Optional[str]:
    """mode: "values", "meta" (sizes, dtype, strides: uninitialised memory) or "shape"
    (sizes and dtype: random)."""
    if e.dtype != a.dtype:
        return f"dtype {e.dtype} vs {a.dtype}"
    if e.shape != a.shape:
        return f"shape {list(e.shape)} vs {list(a.shape)}"
    if e.layout != a.layout:
        return f"layout {e.layout} vs {a.layout}"
    if mode == "shape":
        return None
    if mode == "meta":
        if e.layout == torch.strided and e.stride() != a.stride() and e.numel() > 1:
            return f"strides {e.stride()} vs {a.stride()}"
        return None
    if e.is_quantized:
        e, a = e.dequantize(), a.dequantize()
    if rtol == atol == 0 and (e.is_floating_point() or e.is_complex()):
        # a float result of an op swept under an integer or bool dtype (a sample's own
        # float input, `_safe_softmax`): that float dtype's tolerance, not exact equality
        rtol, atol = DEFAULT_TOL.get(e.dtype, (0.0, 0.0))
    try:
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_device=True,
                                   check_dtype=True, check_layout=True, check_stride=False)
    except AssertionError:
        return _max_diff(a, e)
    except Exception as exc:  # e.g. a tensor subclass assert_close does not know
        try:
            if not torch.equal(a, e):
                return f"not equal ({error_text(exc)})"
        except Exception:
            return f"cannot compare: {error_text(exc)}"
    return None


def compare(expected, actual, mode: str, rtol: float, atol: float) -> Optional[str]:
    """None when `actual` matches `expected`, else what differs first (and how many leaves)."""
    exp, act = leaves(expected), leaves(actual)
    if [p for p, _ in exp] != [p for p, _ in act]:
        return f"structure differs: {[p for p, _ in exp][:4]} vs {[p for p, _ in act][:4]}"
    problems = []
    for (path, e), (_, a) in zip(exp, act):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            problems.append(f"{path}: {type(e).__name__} vs {type(a).__name__}")
        elif isinstance(e, torch.Tensor):
            why = compare_tensor(e, a, mode, rtol, atol)
            if why:
                problems.append(f"{path}: {why}")
        elif mode == "values":
            if isinstance(e, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
                if not (math.isclose(e, a, rel_tol=rtol, abs_tol=atol) or (math.isnan(e) and math.isnan(a))):
                    problems.append(f"{path}: {e!r} vs {a!r}")
            elif type(e) is not type(a) or e != a:
                problems.append(f"{path}: {e!r} ({type(e).__name__}) vs {a!r} ({type(a).__name__})")
        elif type(e) is not type(a) and not (isinstance(e, (int, float)) and isinstance(a, (int, float))):
            problems.append(f"{path}: {type(e).__name__} vs {type(a).__name__}")
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def compare_inputs(exp_inputs, act_inputs, mode: str, rtol: float, atol: float) -> Optional[str]:
    """The inputs after the call: an in-place op's values, and sizes/strides (resize_, t_)."""
    exp, act = leaves(exp_inputs, "arg"), leaves(act_inputs, "arg")
    for (path, e), (_, a) in zip(exp, act):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
            if e.shape != a.shape or (e.layout == torch.strided and e.numel() > 1 and e.stride() != a.stride()):
                return (f"input {path} after the call: size {list(e.shape)} stride {tuple(e.stride())} vs "
                        f"size {list(a.shape)} stride {tuple(a.stride())}")
            why = compare_tensor(e, a, mode, rtol, atol)
            if why:
                return f"input {path} after the call (mutation): {why}"
    return None


def aliasing(out, inputs) -> list:
    """For each tensor leaf of the output: the index of the input leaf whose storage it
    shares, or None."""
    where = {}
    for i, (_, v) in enumerate(leaves(inputs, "arg")):
        if isinstance(v, torch.Tensor):
            k = _storage_key(v)
            if k is not None:
                where.setdefault(k, i)
    result = []
    for path, v in leaves(out):
        if isinstance(v, torch.Tensor):
            k = _storage_key(v)
            result.append((path, where.get(k) if k is not None else "-"))
    return result


def compare_aliasing(exp_alias: list, act_alias: list) -> Optional[str]:
    for (path, e), (_, a) in zip(exp_alias, act_alias):
        if e == "-" or a == "-":
            continue
        if e != a:
            what = lambda i: f"a view of input leaf {i}" if i is not None else "a new tensor"  # noqa: E731
            return f"{path} is {what(e)} eagerly but {what(a)} compiled"
    return None


# ---------------------------------------------------------------------------- compiling

class EngineRun:
    """engine.compile with a counting backend; graph breaks from the bus."""

    name = "engine"

    def __init__(self, backend: str):
        from engine.backends import lookup_backend
        self.inner = lookup_backend(backend)
        self.backend_name = backend
        self.graphs = 0
        self.breaks: list = []

    def _on_break(self, event):
        md = event.metadata
        gid = md.get("graph_break_id")
        reason = _first_line(md.get("reason", "?"))
        self.breaks.append(f"[{gid}] {reason}" if gid else reason)

    def reset(self):
        engine.reset()
        self.graphs = 0
        self.breaks = []

    def call(self, f, args, kwargs):
        run = self

        def counting_backend(gm, example_inputs):
            run.graphs += 1
            return run.inner(gm, example_inputs)
        counting_backend.__name__ = self.backend_name
        compiled = engine.compile(f, backend=counting_backend)
        observe.subscribe(self._on_break, events=["graph_break"])
        try:
            return compiled(*args, **kwargs)
        finally:
            observe.unsubscribe(self._on_break)


class TorchRun:
    """torch.compile with the real backend; graphs and breaks from dynamo's counters."""

    name = "torch"

    def __init__(self, backend: str):
        self.backend_name = backend
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            self.inner = compile_fx
        else:
            from torch._dynamo.backends.registry import lookup_backend
            self.inner = lookup_backend(backend)
        self.graphs = 0
        self.breaks: list = []

    def reset(self):
        import torch._dynamo
        from torch._dynamo.utils import counters
        torch._dynamo.reset()
        counters.clear()
        self.graphs = 0
        self.breaks = []

    def call(self, f, args, kwargs):
        # Graphs: dynamo's unique_graphs, not calls of the backend: a restarted analysis
        # (e.g. float64 scalars, _tensorify_python_scalars) calls the backend twice for one graph.
        from torch._dynamo.utils import counters
        try:
            return torch.compile(f, backend=self.inner)(*args, **kwargs)
        finally:
            self.graphs = counters["stats"]["unique_graphs"]
            self.breaks = [_first_line(r) for r, n in counters["graph_break"].items() for _ in range(n)]


# ---------------------------------------------------------------------------- running

def _restore_globals(state):
    grad, dtype = state
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)


def _global_state():
    return torch.is_grad_enabled(), torch.get_default_dtype()


def _eager(fn, args, kwargs, seed):
    a, k = exact_copy((args, kwargs))
    torch.manual_seed(seed)
    out = make_f(fn)(*a, **k)
    return out, (a, k)


def widened(obj):
    """A copy of a sample's inputs with every floating tensor in float64 (the same values)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(torch.float64) if obj.is_floating_point() else obj.clone()
    if isinstance(obj, list):
        return [widened(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(widened(v) for v in obj)
    if isinstance(obj, dict):
        return {k: widened(v) for k, v in obj.items()}
    return obj


def _rms(x: torch.Tensor, y: torch.Tensor) -> float:
    return (x.double() - y.double()).pow(2).mean().sqrt().item() if x.numel() else 0.0


def rounding_noise(fn, args, kwargs, seed, eager, compiled, rtol: float, atol: float) -> bool:
    """Whether every float leaf where `compiled` (out, inputs after) differs from `eager`
    is as close to the float64 call's as eager's leaf is. False where the float64 call
    fails, a leaf is not finite, or anything but a float value differs."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(seed)
            a, k = widened((args, kwargs))
            reference = (make_f(fn)(*a, **k), (a, k))
    except Exception:
        return False
    exp, act, ref = leaves(eager), leaves(compiled), leaves(reference)
    if not len(exp) == len(act) == len(ref):
        return False
    for (_, e), (_, c), (_, r) in zip(exp, act, ref):
        if not isinstance(e, torch.Tensor):
            continue
        if compare_tensor(e, c, "values", rtol, atol) is None:
            continue
        if not (isinstance(c, torch.Tensor) and isinstance(r, torch.Tensor) and e.is_floating_point()
                and e.layout == torch.strided and e.shape == c.shape == r.shape and e.dtype == c.dtype
                and r.is_floating_point()):
            return False
        if not all(bool(torch.isfinite(t).all()) for t in (e, c, r)):
            return False
        if _rms(c, r) > NOISE_MULTIPLIER * _rms(e, r) + atol / 10:
            return False
    return True


def run_op(op, dtype, impls: list, max_samples: int = 3, op_timeout: float = 30.0) -> list:
    """One row per impl for (op, dtype): category, reason, sample, graphs, breaks."""
    name = full_name(op)
    rows = {r.name: {"op": name, "dtype": str(dtype).replace("torch.", ""), "impl": r.name,
                     "backend": r.backend_name, "status": None, "reason": None, "sample": None, "samples": 0,
                     "graphs": 0, "breaks": 0, "seconds": 0.0} for r in impls}
    if dtype not in op.supported_dtypes("cpu"):
        for row in rows.values():
            row["status"], row["reason"] = "skip", f"{dtype} not supported on cpu"
        return list(rows.values())
    fn = op_callable(op)
    rtol, atol = tolerance(op, dtype)
    base_mode = "shape" if name in NONDETERMINISTIC else "meta" if name in UNINITIALIZED else "values"
    state = _global_state()
    deadline = {r.name: op_timeout for r in impls}
    worst = {r.name: ("skip", "no sample ran eagerly", None) for r in impls}
    eager_errors = []
    modes = collections.Counter()   # how the samples were compared: values, meta, shape, eager-nondeterministic

    def note(impl, status, reason, sample):
        if _SEVERITY[status] > _SEVERITY[worst[impl][0]]:
            worst[impl] = (status, reason, sample)

    try:
        with time_limit(op_timeout * 2 + 30):   # sample generation and eager: a hang is a timeout of every impl
            samples = []
            for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
                if i >= max_samples:
                    break
                samples.append(s)
    except (Exception, TimeLimit) as exc:
        for row in rows.values():
            row["status"], row["reason"] = "skip", f"sample_inputs failed: {error_text(exc)}"
        return list(rows.values())

    for si, sample in enumerate(samples):
        args, kwargs = sample_args(sample)
        desc = describe_sample(args, kwargs)
        seed = 1234 + si
        mode = "shape" if base_mode == "values" and sample_is_random(name, args, kwargs) else base_mode
        try:
            with warnings.catch_warnings(), time_limit(op_timeout):
                warnings.simplefilter("ignore")
                ref, ref_inputs = _eager(fn, args, kwargs, seed)
                ref_alias = aliasing(ref, ref_inputs)
                if mode == "values":  # eager must agree with itself, else compare sizes only
                    again, again_inputs = _eager(fn, args, kwargs, seed)
                    if compare(ref, again, "values", rtol, atol) or \
                            compare_inputs(ref_inputs, again_inputs, "values", rtol, atol):
                        mode = "shape"
                        modes["eager disagrees with itself: shapes only"] += 1
            modes[mode] += 1
        except (Exception, TimeLimit) as exc:
            eager_errors.append(error_text(exc))
            _restore_globals(state)
            continue
        finally:
            _restore_globals(state)
        for impl in impls:
            row = rows[impl.name]
            if deadline[impl.name] <= 0:
                continue
            impl.reset()
            t0 = time.perf_counter()
            a, k = exact_copy((args, kwargs))
            try:
                with warnings.catch_warnings(), time_limit(deadline[impl.name]):
                    warnings.simplefilter("ignore")
                    torch.manual_seed(seed)
                    out = impl.call(make_f(fn), a, k)
                    why = compare(ref, out, mode, rtol, atol) or compare_inputs(ref_inputs, (a, k), mode, rtol, atol)
                    if not why and mode != "shape":
                        why = compare_aliasing(ref_alias, aliasing(out, (a, k)))
                        why = f"aliasing: {why}" if why else None
                if why and mode == "values" and rounding_noise(fn, args, kwargs, seed, (ref, ref_inputs),
                                                               (out, (a, k)), rtol, atol):
                    note(impl.name, "noise", f"{why}; as close to float64 as eager's", desc)
                elif why:
                    note(impl.name, "wrong", why, desc)
                elif impl.graphs == 0:
                    note(impl.name, "no graph", impl.breaks[0] if impl.breaks else "no graph, no break reported", desc)
                elif impl.graphs > 1 or impl.breaks:
                    note(impl.name, "graph break", impl.breaks[0] if impl.breaks else f"{impl.graphs} graphs", desc)
                else:
                    note(impl.name, "pass", None, desc)
            except TimeLimit as exc:
                note(impl.name, "timeout", f"{exc} (after {si} of {len(samples)} samples)", desc)
                deadline[impl.name] = 0
            except Exception as exc:
                note(impl.name, "crash", error_text(exc), desc)
                row["traceback"] = row.get("traceback") or traceback.format_exc(limit=-6)
            finally:
                _restore_globals(state)
                dt = time.perf_counter() - t0
                row["seconds"] += dt
                row["samples"] += 1
                row["graphs"] += impl.graphs
                row["breaks"] += len(impl.breaks)
                if deadline[impl.name] > 0:
                    deadline[impl.name] -= dt
                try:
                    impl.reset()
                except Exception:
                    pass
    for impl in impls:
        row = rows[impl.name]
        status, reason, sample = worst[impl.name]
        if status == "skip" and eager_errors:
            reason = f"eager raised on every sample: {eager_errors[0]}"
        elif status == "skip" and not samples:
            reason = "no samples"
        row["status"], row["reason"], row["sample"] = status, reason, sample
        row["seconds"] = round(row["seconds"], 3)
        row["compared"] = dict(modes)
    return list(rows.values())


def run_op_safely(op, dtype, impls: list, max_samples: int = 3, op_timeout: float = 30.0) -> list:
    """run_op, with an error of the sweep itself (not of a compiler) as a skip of every impl."""
    try:
        return run_op(op, dtype, impls, max_samples, op_timeout)
    except (Exception, TimeLimit) as exc:
        return [{"op": full_name(op), "dtype": str(dtype).replace("torch.", ""), "impl": r.name,
                 "backend": r.backend_name, "status": "skip", "reason": f"sweep error: {error_text(exc)}",
                 "sample": None, "traceback": traceback.format_exc(limit=-6)} for r in impls]


def make_impls(backend: str, compare_torch: bool) -> list:
    impls = [EngineRun(backend)]
    if compare_torch:
        impls.append(TorchRun(backend))
    return impls


def select_ops(names: Optional[list] = None) -> list:
    db = op_db()
    if not names:
        return list(db)
    wanted = set(names)
    chosen = [op for op in db if full_name(op) in wanted or op.name in wanted]
    unknown = wanted - {full_name(op) for op in chosen} - {op.name for op in chosen}
    if unknown:
        raise SystemExit(f"unknown ops: {', '.join(sorted(unknown))}")
    return chosen


def sweep(backend: str, dtypes: list, ops: Optional[list] = None, compare_torch: bool = False,
          max_samples: int = 3, op_timeout: float = 30.0, progress=None) -> list:
    """In this process: the rows of every (op, dtype, impl)."""
    warnings.simplefilter("ignore")
    impls = make_impls(backend, compare_torch)
    rows = []
    for op in select_ops(ops):
        for dt in dtypes:
            t0 = time.perf_counter()
            op_rows = run_op_safely(op, DTYPES[dt], impls, max_samples, op_timeout)
            rows.extend(op_rows)
            if progress:
                progress(op_rows, time.perf_counter() - t0)
    return rows


# ---------------------------------------------------------------------------- workers

def _worker_main(args) -> int:
    """--worker: run the ops of --ops-file, one JSON line per row (and a "start" line
    before each op, so that the parent knows which op killed the process)."""
    with open(args.ops_file) as fh:
        names = json.load(fh)
    by_name = {full_name(op): op for op in op_db()}
    impls = make_impls(args.backend, args.compare)
    warnings.simplefilter("ignore")
    with open(args.out, "a") as out:
        for name in names:
            for dt in args.dtypes.split(","):
                out.write(json.dumps({"start": name, "dtype": dt}) + "\n")
                out.flush()
                for row in run_op_safely(by_name[name], DTYPES[dt], impls, args.samples, args.op_timeout):
                    out.write(json.dumps(row) + "\n")
                out.flush()
    return 0


def _read_rows(path: str):
    rows, started = [], None
    if not os.path.exists(path):
        return rows, started
    with open(path) as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "start" in rec:
                started = (rec["start"], rec["dtype"])
            else:
                rows.append(rec)
                started = None if (rec["op"], rec["dtype"]) == started else started
    return rows, started


def sweep_in_workers(args, names: list, log=sys.stderr) -> list:
    """Run the ops in `args.jobs` worker processes (ops dealt round-robin); a worker that
    dies is restarted after the op it died on, which is a crash of every impl."""
    dtypes = args.dtypes.split(",")
    impl_names = ["engine"] + (["torch"] if args.compare else [])
    tmp = tempfile.mkdtemp(prefix="opinfo-sweep-")
    shards = [names[i::max(1, args.jobs)] for i in range(max(1, args.jobs))]
    shards = [s for s in shards if s]
    pending = {i: list(s) for i, s in enumerate(shards)}
    procs, all_rows = {}, []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    t_start = time.perf_counter()
    done = 0
    total = len(names) * len(dtypes)

    def start(i):
        ops_file = os.path.join(tmp, f"ops{i}.json")
        out = os.path.join(tmp, f"rows{i}.jsonl")
        with open(ops_file, "w") as fh:
            json.dump(pending[i], fh)
        open(out, "w").close()
        cmd = [sys.executable, "-m", "tests.opinfo_sweep", "--worker", "--backend", args.backend, "--dtypes",
               args.dtypes, "--samples", str(args.samples), "--op-timeout", str(args.op_timeout),
               "--ops-file", ops_file, "--out", out] + (["--compare"] if args.compare else [])
        procs[i] = (subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
                    out, 0)

    for i in pending:
        start(i)
    seen = {i: 0 for i in pending}
    while procs:
        time.sleep(0.5)
        for i in list(procs):
            proc, out, _ = procs[i]
            rows, started = _read_rows(out)
            new = rows[seen[i]:]
            seen[i] = len(rows)
            for r in new:
                all_rows.append(r)
                if r["impl"] == "engine":
                    done += 1
                    t = time.perf_counter() - t_start
                    others = " ".join(f"{x['impl']}={x['status']}" for x in new if x["op"] == r["op"]
                                      and x["dtype"] == r["dtype"])
                    print(f"[{done}/{total} {t:6.0f}s] {r['op']} {r['dtype']}: {others}", file=log, flush=True)
            if proc.poll() is None:
                continue
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            del procs[i]
            finished = {(r["op"], r["dtype"]) for r in rows}
            remaining = [n for n in pending[i] if any((n, d) not in finished for d in dtypes)]
            if not remaining:
                continue
            if started is None:   # died before starting an op: give up on this shard
                for n in remaining:
                    for d in dtypes:
                        for impl in impl_names:
                            all_rows.append({"op": n, "dtype": d, "impl": impl, "backend": args.backend,
                                             "status": "crash", "reason": f"worker failed to start: "
                                             f"{_first_line(err[-2000:])}", "sample": None})
                continue
            dead_op, dead_dt = started
            sig = -proc.returncode if proc.returncode < 0 else None
            how = f"signal {signal.Signals(sig).name}" if sig else f"exit {proc.returncode}"
            why = f"worker process died ({how})"
            for d in dtypes:
                if (dead_op, d) not in finished and dtypes.index(d) >= dtypes.index(dead_dt):
                    for impl in impl_names:
                        all_rows.append({"op": dead_op, "dtype": d, "impl": impl, "backend": args.backend,
                                         "status": "crash", "reason": why, "sample": None,
                                         "stderr": err[-3000:]})
                    done += 1
            print(f"  {dead_op}: {why}", file=log, flush=True)
            pending[i] = remaining[remaining.index(dead_op) + 1:] if dead_op in remaining else remaining
            if pending[i]:
                seen[i] = 0
                start(i)
    shutil.rmtree(tmp, ignore_errors=True)
    return all_rows


# ---------------------------------------------------------------------------- reporting

def per_op(rows: list) -> dict:
    """{(op, dtype): {impl: row}}"""
    out = collections.OrderedDict()
    for r in rows:
        out.setdefault((r["op"], r["dtype"]), {})[r["impl"]] = r
    return out


def summarize(rows: list) -> dict:
    out = collections.defaultdict(collections.Counter)
    for r in rows:
        out[r["impl"]][r["status"]] += 1
    return {impl: dict(c) for impl, c in out.items()}


def _short(text, width: int = 150) -> str:
    text = text or ""
    return text if len(text) <= width else text[:width - 3] + "..."


def print_report(rows: list, backend: str, out=sys.stdout) -> None:
    counts = summarize(rows)
    impls = [i for i in ("engine", "torch") if i in counts]
    label = {"engine": "ours", "torch": "torch.compile"}
    print(f"\nOpInfo sweep, backend={backend}: (op, dtype) pairs per category", file=out)
    head = f"{'category':<12}" + "".join(f"{label[i]:>15}" for i in impls)
    print(head, file=out)
    print("-" * len(head), file=out)
    for cat in CATEGORIES:
        print(f"{cat:<12}" + "".join(f"{counts[i].get(cat, 0):>15}" for i in impls), file=out)
    print(f"{'total':<12}" + "".join(f"{sum(counts[i].values()):>15}" for i in impls), file=out)
    table = per_op(rows)

    def theirs(key):
        t = table[key].get("torch")
        if not t:
            return ""
        why = f": {_short(t['reason'], 90)}" if t["status"] != "pass" and t["reason"] else ""
        return f"   [torch.compile: {t['status']}{why}]"

    for cat in ["wrong", "crash", "timeout", "noise", "graph break", "no graph"]:
        keys = [k for k, r in table.items() if r.get("engine", {}).get("status") == cat]
        if not keys:
            continue
        print(f"\n== ours: {cat} ({len(keys)}) ==", file=out)
        if cat == "crash":   # grouped by error message
            groups = collections.OrderedDict()
            for k in keys:
                groups.setdefault(_short(error_group(table[k]["engine"]["reason"]), 200), []).append(k)
            for reason, ks in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                print(f"  {reason}  ({len(ks)})", file=out)
                for k in ks:
                    r = table[k]["engine"]
                    print(f"      {k[0]} [{k[1]}]: {_short(r['reason'], 160)}{theirs(k)}", file=out)
                    print(f"          sample: {_short(r['sample'], 200)}", file=out)
            continue
        for k in keys:
            r = table[k]["engine"]
            print(f"  {k[0]} [{k[1]}]: {_short(r['reason'], 220)}{theirs(k)}", file=out)
            if cat in ("wrong", "noise"):
                print(f"      sample: {_short(r['sample'], 400)}", file=out)
    if "torch" in impls:
        ng = [k for k, r in table.items() if r.get("engine", {}).get("status") == "no graph"
              and r.get("torch", {}).get("status") in ("pass", "noise", "graph break", "wrong")]
        gb = [k for k, r in table.items() if r.get("engine", {}).get("status") == "graph break"
              and r.get("torch", {}).get("status") in ("pass", "noise", "wrong")]
        print(f"\n== ours: no graph, torch.compile: a graph ({len(ng)}) ==", file=out)
        for k in ng:
            print(f"  {k[0]} [{k[1]}]: {_short(table[k]['engine']['reason'], 200)}", file=out)
        print(f"\n== ours: graph break, torch.compile: none ({len(gb)}) ==", file=out)
        for k in gb:
            print(f"  {k[0]} [{k[1]}]: {_short(table[k]['engine']['reason'], 200)}", file=out)
        print("\n== torch.compile: not pass (for reference) ==", file=out)
        for cat in ["wrong", "crash", "timeout", "noise", "graph break", "no graph"]:
            keys = [k for k, r in table.items() if r.get("torch", {}).get("status") == cat]
            if keys:
                print(f"  {cat} ({len(keys)}):", file=out)
                for k in keys:
                    print(f"    {k[0]} [{k[1]}]: {_short(table[k]['torch']['reason'], 160)}", file=out)
    selfdiff = [k for k, r in table.items()
                if (r.get("engine", {}).get("compared") or {}).get("eager disagrees with itself: shapes only")]
    if selfdiff:
        print(f"\neager disagrees with itself (compared by shape only) ({len(selfdiff)}): "
              + ", ".join(f"{k[0]} [{k[1]}]" for k in selfdiff), file=out)
    skipped = [k for k, r in table.items() if r.get("engine", {}).get("status") == "skip"]
    if skipped:
        reasons = collections.Counter(_short(table[k]["engine"]["reason"], 60) for k in skipped)
        print(f"\nskipped ({len(skipped)}): " + "; ".join(f"{n}x {r}" for r, n in reasons.most_common(5)), file=out)


# ---------------------------------------------------------------------------- CLI

def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.opinfo_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="eager", choices=["eager", "aot_eager", "aot_eager_decomp_partition",
                                                           "inductor"])
    ap.add_argument("--dtypes", default="float32", help="comma-separated: " + ",".join(DTYPES))
    ap.add_argument("--ops", default=None, help="comma-separated OpInfo names (name or name.variant)")
    ap.add_argument("--fast", action="store_true", help="the CI subset of ops (FAST_OPS)")
    ap.add_argument("--samples", type=int, default=3, help="samples per op and dtype (default 3)")
    ap.add_argument("--op-timeout", type=float, default=30.0, help="seconds per op, dtype and impl (default 30)")
    ap.add_argument("--compare", action="store_true", help="also run torch.compile on the same samples")
    ap.add_argument("--json", default=None, help="write every row here")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--in-process", action="store_true", help="no worker processes")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ops-file", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for d in args.dtypes.split(","):
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}; one of {', '.join(DTYPES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return _worker_main(args)
    names = args.ops.split(",") if args.ops else (FAST_OPS if args.fast else None)
    ops = [full_name(op) for op in select_ops(names)]
    t0 = time.perf_counter()
    if args.in_process:
        def progress(op_rows, dt):
            r = op_rows[0]
            print(f"{r['op']} {r['dtype']}: " + " ".join(f"{x['impl']}={x['status']}" for x in op_rows)
                  + f" ({dt:.1f}s)", file=sys.stderr, flush=True)
        rows = sweep(args.backend, args.dtypes.split(","), ops, args.compare, args.samples, args.op_timeout,
                     progress)
    else:
        rows = sweep_in_workers(args, ops)
        order = {n: i for i, n in enumerate(ops)}
        rows.sort(key=lambda r: (order.get(r["op"], 0), r["dtype"], r["impl"]))
    elapsed = time.perf_counter() - t0
    print_report(rows, args.backend)
    print(f"\n{len(ops)} ops x {args.dtypes} in {elapsed:.0f}s (backend {args.backend}, {args.samples} samples "
          f"per op, {'torch.compile beside' if args.compare else 'engine only'})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"backend": args.backend, "dtypes": args.dtypes, "samples": args.samples,
                       "seconds": round(elapsed, 1), "torch": torch.__version__, "summary": summarize(rows),
                       "rows": rows}, fh, indent=1)
    wrong = [r for r in rows if r["impl"] == "engine" and r["status"] == "wrong"]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
