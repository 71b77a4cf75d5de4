"""Code from installed libraries compiles, and no frame is lost: what a user of a real
library (transformers-style decorators, configs, model outputs) gets from engine.compile."""

import collections
import copy
import dataclasses
import functools
import keyword
import logging
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import torch

import engine
from engine_helpers import events, fresh_engine  # noqa: F401 (fresh_engine: autouse)
from engine.capture import skipfiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def explain(fn, *args, **kwargs):
    engine.reset()
    return engine.explain(fn)(*args, **kwargs)


def same(fn, *args, backend="eager"):
    engine.reset()
    expected = fn(*args)
    got = engine.compile(fn, backend=backend)(*args)
    again = engine.compile(fn, backend=backend)(*args)
    for out in (got, again):
        torch.testing.assert_close(out, expected)


# ---------------------------------------------------------------------- which code compiles


def _code_in(path):
    return compile("def f(x):\n    return x\n", os.path.join(path, "pkg", "mod.py"), "exec").co_consts[0]


def test_the_one_rule_says_what_compiles_and_why_not():
    paths = sysconfig.get_paths()
    assert skipfiles.skip_reason(_code_in(paths["purelib"])) is None
    assert skipfiles.skip_reason(_code_in(paths["stdlib"])) == "the standard library"
    assert skipfiles.skip_reason(_code_in(os.path.dirname(torch.__file__))) == "torch internals"
    assert skipfiles.skip_reason(torch.nn.Linear.forward.__code__) is None        # module forwards compile
    assert skipfiles.skip_reason(engine.compile.__code__) == "the engine itself"
    assert skipfiles.skip_reason(_code_in("/home/user/project")) is None


def test_a_package_installed_into_a_venv_compiles(tmp_path):
    # In a venv, sysconfig's platstdlib is <venv>/lib/python3.X: a prefix of its site-packages.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    pkg = os.path.join(site, "tinylib")
    os.makedirs(pkg)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write("import torch\n\ndef block(x):\n    return torch.relu(x) * 2 + 1\n")
    script = textwrap.dedent("""
        import engine, torch, tinylib
        out = engine.explain(tinylib.block)(torch.randn(4))
        print(out.graph_count, out.op_count)
    """)
    here = [p for p in sys.path if p.endswith("site-packages")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + here))
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[:2] == ["1", "3"], proc.stdout


def test_skipped_functions_are_logged_once_with_why(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import json, engine, torch

        @engine.compile(backend="eager")
        def fn(x):
            s = json.dumps([1, 2])     # the standard library: run at a graph break, never compiled
            return x + len(s)

        for _ in range(3):
            fn(torch.ones(2))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TORCH_LOGS="+dynamo", PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    skips = [ln for ln in proc.stderr.splitlines() if "skipping dumps" in ln]
    assert len(skips) == 1 and "the standard library" in skips[0], proc.stderr[-3000:]


# ---------------------------------------------------------------------- no frame is lost


def inner(x):
    return torch.sin(x) * 2


def test_a_frame_that_is_not_captured_still_compiles_what_it_calls():
    def outer(x):
        try:            # a break inside try: this frame cannot be split
            print("not traceable")
            y = inner(x)
        finally:
            pass
        return y

    out = explain(outer, torch.randn(3))
    assert out.graph_count == 1 and out.ops_per_graph[0]  # inner's graph
    same(outer, torch.randn(3))


def test_a_frame_over_the_cache_limit_still_compiles_what_it_calls():
    def outer(x, n):
        return inner(x) + n

    engine.reset()
    with engine.config.patch(cache_size_limit=1), pytest.warns(RuntimeWarning, match="cache_size_limit"):
        compiled = engine.compile(outer, backend="eager")
        for n in range(3):   # a new int each call: recompiles until the limit
            torch.testing.assert_close(compiled(torch.ones(2), n), outer(torch.ones(2), n))
    from engine.capture import runtime
    assert runtime._CACHES[inner.__code__].entries  # inner compiled below the frame over the limit


def test_generators_and_their_callees():
    def gen(xs):
        for x in xs:
            yield inner(x)

    def outer(xs):
        return sum(gen(xs))

    out = explain(outer, [torch.ones(2), torch.zeros(2)])
    assert out.graph_count >= 1
    same(outer, [torch.ones(2), torch.zeros(2)])


def test_routed_copies_keep_every_calling_convention():
    from engine.capture import routed
    seen = []

    def trampoline(fn, *a, **k):
        seen.append(getattr(fn, "__name__", type(fn).__name__))
        return fn(*a, **k)

    class A:
        def m(self, x, y=1):
            return x + y

    class B(A):
        def m(self, x, y=1):
            return super().m(x, y) + 100

    def g(*a, **k):
        return a, k

    def f(x, xs):
        r = [A().m(x), B().m(x, y=5), len(xs), g(*xs, **{"k": 1}), g(1, *xs), sorted(xs, key=lambda v: -v)]
        try:
            int("bad")
        except ValueError as e:
            r.append(str(e)[:7])
        with open(os.devnull) as fh:
            r.append(fh.name)
        return r

    assert routed.routed_function(f, trampoline, -1)(3, [1, -2]) == f(3, [1, -2])
    assert {"m", "g", "len", "sorted", "open"} <= set(seen)


# ---------------------------------------------------------------------- breaks at any instruction


class Config:
    @property
    def scale(self):
        print("reading scale")   # a break inside the property: the frame breaks at its LOAD_ATTR
        return 2.0


def test_a_break_inside_a_property_resumes_after_the_attribute_load():
    def fn(x, cfg):
        y = x * 2
        z = y + cfg.scale
        return z.relu().sum()

    out = explain(fn, torch.randn(3), Config())
    assert out.graph_count == 2 and out.graph_break_count == 1
    same(fn, torch.randn(3), Config())


# ---------------------------------------------------------------------- what libraries write


@dataclasses.dataclass
class Output(collections.OrderedDict):     # transformers' ModelOutput, in small
    logits: torch.Tensor = None
    loss: torch.Tensor = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __setattr__(self, name, value):
        if value is not None and name in {f.name for f in dataclasses.fields(self)}:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


class AliasConfig:
    attribute_map = {"hidden_size": "d_model"}

    def __init__(self):
        self.d_model = 4
        self.return_dict = True

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def returns_tuple_unless_config_says(func):
    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        return_dict = kwargs.pop("return_dict", self.config.return_dict)
        out = func(self, *args, **kwargs)
        return out if return_dict else out.to_tuple()
    return wrapper


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = AliasConfig()
        self.lin = torch.nn.Linear(4, 4)

    @returns_tuple_unless_config_says
    def forward(self, x, labels=None):
        import torch.nn.functional as F   # an import of a loaded module inside forward
        if torch.compiler.is_compiling():
            x = x + 0
        h = F.relu(self.lin(x)) * self.config.hidden_size
        act = torch.nn.GELU()             # a stateless module built in forward
        cfg = copy.deepcopy(self.config)
        h = act(h) + cfg.d_model
        loss = None if labels is None else F.mse_loss(h, labels)
        return Output(logits=h, loss=loss)


def test_a_library_style_model_is_one_graph_with_the_same_results():
    m = Model()
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    out = explain(m, x, y)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(r) for r in out.break_reasons]
    engine.reset()
    compiled = engine.compile(m, backend="aot_eager")
    got, expected = compiled(x, y), m(x, y)
    assert type(got) is Output and list(got.keys()) == ["logits", "loss"]
    torch.testing.assert_close(got.logits, expected.logits)
    torch.testing.assert_close(got["loss"], expected["loss"])
    torch.testing.assert_close(compiled(x, return_dict=False)[0], m(x, return_dict=False)[0])


def test_logging_and_warnings_are_replayed_after_the_graph_without_a_break(caplog):
    import logging
    import warnings
    logger = logging.getLogger("tests.mylib")

    def fn(x):
        logger.warning("scaling by %s", 2)
        warnings.warn("x is large")
        return x * 2

    out = explain(fn, torch.ones(2))
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    engine.reset()
    with caplog.at_level(logging.WARNING, logger="tests.mylib"), pytest.warns(UserWarning, match="x is large"):
        torch.testing.assert_close(engine.compile(fn, backend="eager")(torch.ones(2)), torch.full((2,), 2.0))
    assert "scaling by 2" in caplog.text


class OnceLogger(logging.Logger):
    """transformers' `logger.warning_once`: an lru_cache'd function set on the class, so each
    `logger.warning_once` read makes a new bound method."""

    @functools.lru_cache(None)
    def warning_once(self, msg):
        self.warning(msg)


once_logger = OnceLogger("tests.once")


def test_a_bound_method_read_from_a_global_is_not_a_recompile_on_every_call(events):
    def fn(x):
        once_logger.warning_once("said once")
        return x * 2

    compiled = engine.compile(fn, backend="eager")
    for _ in range(3):
        torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 2.0))
    assert sum(e.name == "compilation_metrics" for e in events) == 1


def test_a_module_with_hooks_still_compiles_its_forward():
    seen = []
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    m[0].register_forward_hook(lambda mod, i, o: seen.append(tuple(o.shape)))

    def step(x):
        return m(x).sum()

    x = torch.randn(2, 4)
    out = explain(step, x)                       # the hook is traced with the forward: one graph
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    seen.clear()
    engine.reset()
    torch.testing.assert_close(engine.compile(step, backend="eager")(x), step(x))
    assert seen == [(2, 4), (2, 4)]              # the hook ran once per call, compiled and eager


def test_disable_without_recursion_still_compiles_the_callees():
    def helper(x):
        print("eager")          # disabled: never traced
        return inner(x)

    plain = engine.disable(helper, recursive=False)

    def fn(x):
        return plain(x) + 1

    engine.reset()
    compiled = engine.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(2)), fn(torch.ones(2)))
    from engine.capture import runtime
    assert runtime._CACHES[inner.__code__].entries   # inner compiled below the disabled frame
    assert helper.__code__ not in runtime._CACHES or not runtime._CACHES[helper.__code__].entries


def test_what_a_routed_frame_cannot_route_runs_eagerly_and_correctly():
    # docs/capture.md "No frame is lost": calls made by C code in a frame that is not captured
    def key(v):
        return float(torch.sin(torch.tensor(v)))

    class Holder:
        def __init__(self, x):
            self.y = torch.cos(x)

    def outer(xs, x):
        try:
            print("not traceable")
            order = sorted(xs, key=key)     # sorted calls key from C
            h = Holder(x)                   # type.__call__ runs __init__ from C
        finally:
            pass
        return order, h.y + inner(x)

    engine.reset()
    got = engine.compile(outer, backend="eager")([3.0, 1.0, 2.0], torch.ones(2))
    assert got[0] == [3.0, 1.0, 2.0] and torch.allclose(got[1], outer([3.0, 1.0, 2.0], torch.ones(2))[1])
    from engine.capture import runtime
    compiled = {c.co_name for c, cache in runtime._CACHES.items() if cache.entries}
    assert "inner" in compiled and "key" not in compiled and "__init__" not in compiled


def test_torch_helpers_libraries_call_are_traced():
    # nn.MultiheadAttention's fast-path checks, torch._assert on shapes (torchvision's ViT),
    # @torch.no_grad() as a decorator (rotary embeddings), a layer's own __call__ ending in
    # super().__call__ (transformers' GradientCheckpointingLayer)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()

    class Rot(torch.nn.Module):
        @torch.no_grad()
        def forward(self, x):
            return x.cos()

    class Layer(torch.nn.Linear):
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs)

    rot, layer = Rot(), Layer(16, 16)

    def f(x):
        torch._assert(x.shape[-1] == 16, "bad dim")
        y, _ = mha(x, x, x, need_weights=False)
        return layer(y) + rot(x)

    x = torch.randn(2, 5, 16)
    out = explain(f, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(r) for r in out.break_reasons]
    same(f, x, backend="aot_eager")


def test_a_break_deep_in_the_call_stack_is_reported_once():
    def leaf(x):
        print("inside")           # the one break
        return x + 1

    def middle(x):
        return leaf(x * 2) * 3

    def top(x):
        return middle(x - 1).sum()

    out = explain(top, torch.ones(2))
    assert len(out.break_reasons) == 1, [str(r) for r in out.break_reasons]
    assert [f[2] for f in out.break_reasons[0].user_stack] == ["top", "middle", "leaf"]
    same(top, torch.ones(2))


def test_context_managers_enums_typing_and_masked_attention_in_one_graph():
    import contextlib
    import enum
    import typing
    import torch.nn.functional as F

    class Mode(enum.Enum):
        A = 1
        B = 2

    @contextlib.contextmanager
    def scaled(k):
        yield k * 2

    @functools.lru_cache
    def cached(n):
        return n * 3

    def fn(x, mode=Mode.A, seq=(1, 2)):
        with scaled(3) as k:
            y = x * k
        if mode is Mode.A and isinstance(seq, typing.Sequence):
            y = y + mode.value
        mask = torch.ones(4, 4, dtype=torch.bool).tril()
        att = F.scaled_dot_product_attention(y[None, None], y[None, None], y[None, None], attn_mask=mask)
        return att + torch.finfo(x.dtype).eps + cached(2)

    x = torch.randn(4, 4)
    out = explain(fn, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(r) for r in out.break_reasons]
    same(fn, x)


def test_module_hooks_are_traced_into_the_graph(events):
    lin = torch.nn.Linear(4, 4)
    calls = []

    def scale_input(module, args):          # a pre-hook that replaces the input
        return (args[0] * 2,)

    def add_kw(module, args, kwargs):         # a pre-hook with kwargs
        return args, kwargs

    def shift_output(module, args, output):  # a forward hook that replaces the output
        return output + 1

    def watch(module, args, output):          # one that only looks
        calls.append("seen")

    handles = [lin.register_forward_pre_hook(scale_input), lin.register_forward_pre_hook(add_kw, with_kwargs=True),
               lin.register_forward_hook(shift_output), lin.register_forward_hook(watch)]

    def fn(x):
        return lin(x).relu()

    x = torch.randn(3, 4)
    out = explain(fn, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    engine.reset()
    compiled = engine.compile(fn, backend="aot_eager")
    torch.testing.assert_close(compiled(x), fn(x))
    handles[2].remove()                       # a hook removed after compiling: the guard sees it
    torch.testing.assert_close(compiled(x), fn(x))
    lin.register_full_backward_hook(lambda m, gi, go: None)
    out = explain(fn, x)
    assert any("backward hooks" in str(b.reason) for b in out.break_reasons)


def test_a_partial_made_in_the_trace_is_called_through():
    def fn(x, scale):
        f = functools.partial(torch.mul, other=scale)
        return f(x) + functools.partial(torch.add, x)(1)

    out = explain(fn, torch.ones(2), 3.0)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    same(fn, torch.ones(2), 3.0)


def test_huggingface_gradient_checkpointing_compiles_whole():
    pytest.importorskip("transformers")
    from tests.zoo import models
    model, inputs = models.build("GPT2LMHeadModel", "train")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    twin = copy.deepcopy(model)

    def loss(m):
        return m(**inputs).loss

    out = explain(loss, model)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    engine.reset()
    expected = loss(model)
    got = engine.compile(loss, backend="aot_eager")(twin)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got, list(twin.parameters()))
    want = torch.autograd.grad(expected, list(model.parameters()))
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_torch_python_level_windows_are_traced():
    def fn(x):
        return x * torch.signal.windows.hann(8) + torch.signal.windows.gaussian(8, std=2.0) + \
            torch.signal.windows.kaiser(8, beta=4.0)

    out = explain(fn, torch.ones(8))
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    same(fn, torch.ones(8), backend="aot_eager")


def test_an_unbound_tensor_method_is_the_method():
    def fn(x):
        y = torch.Tensor.__radd__(x, 2) * torch.Tensor.__rmul__(x, 3)
        noise = torch.Tensor.uniform_(torch.empty_like(x), 0, 1)   # random: compared by range below
        return y, noise

    out = explain(fn, torch.ones(4))
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    engine.reset()
    y, noise = engine.compile(fn, backend="aot_eager")(torch.ones(4))
    torch.testing.assert_close(y, torch.full((4,), 9.0))
    assert noise.shape == (4,) and bool(((noise >= 0) & (noise <= 1)).all())


# ---------------------------------------------------------------------- library idioms inside forward

class _Act(torch.nn.Module):        # transformers' activations: built by ACT2FN[...] on each call
    def __init__(self, slope=0.1):
        super().__init__()
        self.slope = slope

    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, self.slope)


class _NoisyInit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.noise = torch.randn(3)       # a tensor attribute: a new one each construction

    def forward(self, x):
        return x + self.noise


def test_a_library_module_built_inside_forward_compiles_when_it_holds_no_tensor():
    def f(x):
        return _Act(0.2)(x) * 2
    r = explain(f, torch.randn(4))
    assert (r.graph_count, r.graph_break_count) == (1, 0), [b.reason for b in r.break_reasons]
    same(f, torch.randn(4))

    def g(x):
        return _NoisyInit()(x)
    r = explain(g, torch.randn(3))     # built each call in eager (new noise): a break, with the reason
    assert any("creating an nn.Module" in str(b.reason) for b in r.break_reasons), r.break_reasons


_probes = []


@functools.lru_cache
def _version_probe(name):   # transformers' is_torch_greater_or_equal: an install probe
    _probes.append(name)
    return len(name) > 3


_version_probe.__wrapped__._dynamo_marked_constant = True   # torch._dynamo.assume_constant_result's marker


def test_a_function_marked_constant_is_called_at_trace_time():
    """transformers marks its version probes (they read package metadata from disk) with
    torch._dynamo.assume_constant_result's marker: the engine calls them while tracing and
    keeps the answer, as torch.compile does, instead of tracing into importlib."""
    def f(x):
        return x * 2 if _version_probe("torch") else x
    r = explain(f, torch.randn(3))
    assert (r.graph_count, r.graph_break_count) == (1, 0), [b.reason for b in r.break_reasons]
    assert _probes == ["torch"]
    same(f, torch.randn(3))


@pytest.mark.parametrize("name", ["sum", "amax", "mean", "var", "norm", "softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_torch_masked_ops_trace_into_one_graph(name, backend):
    """torch.masked's functions define an autograd.Function class on every call (used only
    for MaskedTensor inputs): the class statement is left unbuilt, and the op is traced."""
    op = getattr(torch.masked, name)
    x = torch.randn(4, 6)
    mask = x > -0.5

    def fn(x, m):
        return op(x, 2.0, 1, mask=m) if name == "norm" else op(x, 1, mask=m)

    out = explain(fn, x, mask)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(r) for r in out.break_reasons]
    engine.reset()
    torch.testing.assert_close(engine.compile(fn, backend=backend)(x, mask), fn(x, mask), equal_nan=True)


def test_a_class_defined_in_traced_code_breaks_where_it_is_used():
    def make(x):
        class Scale:
            k = 3
        return x * Scale.k                       # the class is used: a break, run eagerly

    def unused(x):
        class Unused:
            pass
        return x + 1                             # defined and dropped: traced on

    def fn(x):
        return make(x.sin()) + unused(x)

    out = explain(fn, torch.ones(3))
    assert out.graph_break_count >= 1
    reasons = " ".join(str(r.reason) for r in out.break_reasons)
    assert "class Scale, defined in traced code, is used" in reasons, reasons
    assert "Unused" not in reasons
    same(fn, torch.ones(3))

    def top(x):
        class Here:
            pass
        return x * 2
    out = explain(top, torch.ones(3))
    assert "a class statement in the compiled function itself" in " ".join(str(r.reason) for r in out.break_reasons)
    same(top, torch.ones(3))


def test_classmethods_of_builtin_types_on_constants_are_traced():
    # transformers' hybrid-model cache (Qwen3.5): `dict.fromkeys(range(n))`, then filled in
    def fn(x, n):
        states = dict.fromkeys(range(n))
        for i in states:
            states[i] = x * i
        return states, int.from_bytes(b"\x02", "little") * x

    x = torch.randn(3)
    out = explain(fn, x, 3)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    same(fn, x, 3)


def test_multihead_attention_takes_its_composite_path_as_under_torch_compile():
    """nn.MultiheadAttention in eval under no_grad has a fused fast path
    (`torch._native_multi_head_attention`) whose only decomposition is math attention; torch.compile
    takes the module's composite path instead, whose `scaled_dot_product_attention` stays a
    flash / cuDNN kernel on a GPU. The engine does the same."""
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 7, 32)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    def f(x):
        with torch.no_grad():
            return mha(x, x, x, need_weights=False)[0]

    engine.reset()
    got = engine.compile(f, backend=backend)(x)
    torch.testing.assert_close(got, f(x))
    assert len(graphs) == 1 and "multi_head_attention_forward" in graphs[0], graphs
    assert "_native_multi_head_attention" not in graphs[0]


def _one_graph(fn, *args):
    """fn compiled: (its result, the op names of each graph)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    engine.reset()
    return engine.compile(fn, backend=backend, fullgraph=True)(*args), graphs


def test_torch_python_apis_trace_as_under_torch_compile():
    """Python in torch over torch ops (low-rank SVD, a loss given a distance function, a
    torch.library custom op, an options dataclass) is one graph, as under torch.compile
    (PyTorch's OpInfo samples found each as "no graph" here)."""
    a = torch.randn(6, 4)

    def lowrank(a):
        u, s, v = torch.svd_lowrank(a, q=4)     # random projections: compare the product
        return u @ torch.diag(s) @ v.T
    got, graphs = _one_graph(lowrank, a)
    torch.testing.assert_close(got, a, atol=1e-4, rtol=1e-4)
    assert len(graphs) == 1 and any("qr" in op for op in graphs[0]), graphs

    anchor, pos, neg = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)

    def triplet(a, p, n):
        return torch.nn.functional.triplet_margin_with_distance_loss(
            a, p, n, distance_function=lambda x, y: (x - y).abs().sum(-1), margin=0.5)
    got, graphs = _one_graph(triplet, anchor, pos, neg)
    torch.testing.assert_close(got, triplet(anchor, pos, neg))
    assert len(graphs) == 1

    @torch.library.custom_op("enginetest::scaled_sin", mutates_args=())
    def scaled_sin(x: torch.Tensor, k: float) -> torch.Tensor:
        return torch.sin(x) * k

    @scaled_sin.register_fake
    def _(x, k):
        return torch.empty_like(x)

    x = torch.randn(5)
    got, graphs = _one_graph(lambda x: scaled_sin(x, 2.0) + 1, x)
    torch.testing.assert_close(got, torch.sin(x) * 2 + 1)
    assert len(graphs) == 1 and any("scaled_sin" in op for op in graphs[0]), graphs


@pytest.mark.skipif(not hasattr(torch.nn.functional, "linear_cross_entropy"), reason="torch without linear_cross_entropy")
def test_linear_cross_entropy_with_its_options_dataclass_is_one_graph():
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    x, w, y = torch.randn(8, 4), torch.randn(10, 4), torch.randint(0, 10, (8,))

    def loss(x, w, y):
        return torch.nn.functional.linear_cross_entropy(x, w, y, options=LinearCrossEntropyOptions())
    got, graphs = _one_graph(loss, x, w, y)
    torch.testing.assert_close(got, loss(x, w, y))
    assert len(graphs) == 1


def test_a_module_cast_to_the_dtype_it_has_is_no_break_and_a_real_cast_still_casts():
    # SwitchTransformers' router, every call: `self.classifier = self.classifier.to(self.dtype)`
    class Router(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.classifier = torch.nn.Linear(8, 4)

        def forward(self, x):
            self.classifier = self.classifier.to(x.dtype)
            return self.classifier(x).softmax(-1)

    router, x = Router(), torch.randn(3, 8)
    out = explain(router, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(r) for r in out.break_reasons]
    engine.reset()
    compiled = engine.compile(router, backend="aot_eager")
    torch.testing.assert_close(compiled(x), router(x))
    router.classifier.double()      # between calls: the guards see it, and the graph compiles again
    torch.testing.assert_close(compiled(x.double()), router(x.double()))
    got = compiled(x)               # a cast that converts: traced as Python, and it converts
    assert router.classifier.weight.dtype == torch.float32
    torch.testing.assert_close(got, router(x))


class _Recipe:
    """What a pattern parser hands back (einops' TransformRecipe): slots, built once per pattern."""
    __slots__ = ("order",)

    def __init__(self, order):
        self.order = order


PARSED = []


def _parse_order(pattern: str) -> tuple:
    """"b h w -> w b h" as einops parses a pattern: char by char, with str, set and keyword."""
    sides = []
    for side in pattern.split("->"):
        names, current = [], ""
        for char in side + " ":
            if str.isalnum(char) or char == "_":
                current += char
            elif current:
                if keyword.iskeyword(current):
                    raise ValueError(f"{current!r} is a keyword")
                names.append(current)
                current = ""
        sides.append(names)
    left, right = sides
    if set.symmetric_difference(set(left), set(right)):
        raise ValueError(f"bad pattern {pattern!r}")
    return tuple(left.index(axis) for axis in right)


@functools.lru_cache(16)
def _parse(pattern: str) -> _Recipe:
    PARSED.append(pattern)
    return _Recipe(_parse_order(pattern))


def test_a_pattern_parsed_by_a_cached_function_is_no_break():
    # einops: `rearrange(x, "b h w -> b w h")` parses its pattern with str and set methods in
    # an lru_cache'd function and returns a slotted recipe: called at trace time, as eager
    # calls it, it is a constant of the graph
    def f(x):
        return x.permute(*_parse("b h w -> w b h").order) * 2

    x = torch.randn(2, 3, 4)
    out = explain(f, x)
    assert out.graph_count == 1 and not out.break_reasons, [str(r) for r in out.break_reasons]
    same(f, x, backend="aot_eager")
    assert PARSED.count("b h w -> w b h") == 1      # the cache's one parse, shared with eager


def test_a_cached_function_whose_answer_is_a_tensor_is_traced_through():
    @functools.lru_cache(4)
    def freqs(n):
        return torch.arange(n) * 0.5

    def f(x):
        return x + freqs(x.shape[-1])

    x = torch.randn(3, 4)
    out = explain(f, x)
    assert out.graph_count == 1 and not out.break_reasons, [str(r) for r in out.break_reasons]
    assert any(n.target is torch.arange for g in out.graphs for n in g.graph.nodes)   # computed in the graph
    same(f, x, backend="aot_eager")


def test_a_cached_registry_the_program_fills_is_the_caches_own():
    # `@functools.cache def registry(): return {}`: every call gets the same dict, and what
    # one call puts in it the next one reads. Traced through, each call got a new dict.
    @functools.cache
    def registry():
        return {}

    def count(x, key):
        reg = registry()
        reg[key] = reg.get(key, 0) + 1
        return x * reg[key]

    compiled, x = engine.compile(count, backend="eager"), torch.ones(2)
    assert [compiled(x, "a")[0].item() for _ in range(3)] == [1.0, 2.0, 3.0]
    assert registry() == {"a": 3}
    out = explain(count, x, "b")
    assert any("hands back the cache's dict" in str(r.reason) for r in out.break_reasons), out.break_reasons


def test_methods_of_constant_strings_and_sets_fold():
    # the same parser, not cached: str.isalnum, keyword.iskeyword (a frozenset's bound
    # __contains__) and set.symmetric_difference on constants fold to constants
    def f(x):
        return x.permute(*_parse_order("b h w -> h w b")) + 1

    x = torch.randn(2, 3, 4)
    out = explain(f, x)
    assert out.graph_count == 1 and not out.break_reasons, [str(r) for r in out.break_reasons]
    same(f, x, backend="aot_eager")
