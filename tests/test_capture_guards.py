"""Guards: every assumption the capture made is checked before a cache entry runs, so a
call with different inputs is never answered by stale code; a failing guard is explained
in words."""

import warnings

import torch

import engine
from engine.capture import runtime
from engine.guards import Guard, TensorMeta, compile_guards, global_state, render_guards
from engine_helpers import cache_entries as entries_of, fresh_engine  # noqa: F401 (fresh_engine: autouse)


def test_changed_inputs_recompile_instead_of_running_stale_code():
    def fn(x, alpha, mode="add"):
        y = x * alpha
        if mode == "add":
            return y + 1
        return y - 1

    compiled = engine.compile(fn, backend="eager")
    x = torch.randn(3)
    for args in [(x, 0.5), (x, 2.0), (torch.randn(5), 2.0), (x.double(), 2.0), (x, 2.0, "sub"),
                 (x.clone().requires_grad_(), 2.0)]:
        torch.testing.assert_close(compiled(*args), fn(*args))
    n = len(entries_of(fn))
    assert n >= 2  # each changed assumption compiled again (how many depends on dynamic shapes)
    compiled(x, 2.0)  # a hit: no new entry
    assert len(entries_of(fn)) == n


def test_globals_closures_and_object_attributes_are_guarded():
    scale = [2.0]

    class Cfg:
        def __init__(self, k):
            self.k = k

    def make():
        def fn(x, cfg):
            return x * scale[0] * cfg.k
        return fn

    fn = make()
    compiled = engine.compile(fn, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x, Cfg(3)), torch.full((2,), 6.0))
    scale[0] = 5.0
    torch.testing.assert_close(compiled(x, Cfg(3)), torch.full((2,), 15.0))
    torch.testing.assert_close(compiled(x, Cfg(1)), torch.full((2,), 5.0))


def test_grad_mode_is_part_of_the_global_state_guard():
    compiled = engine.compile(lambda w: w * 2, backend="eager")
    w = torch.randn(2, requires_grad=True)
    assert compiled(w).requires_grad
    with torch.no_grad():
        assert not compiled(w).requires_grad


def test_failing_guards_are_explained_in_words():
    x = torch.randn(3, 3)
    guards = [Guard("GLOBAL_STATE", "", global_state()), Guard("TENSOR_MATCH", "L['x']", TensorMeta.of(x)),
              Guard("EQUALS_MATCH", "L['alpha']", 0.5), Guard("LENGTH_CHECK", "L['xs']", 2)]
    compiled = compile_guards(guards)
    assert compiled.check({"x": x, "alpha": 0.5, "xs": [1, 2]}, {})
    L = {"x": torch.randn(4, 3), "alpha": 2.0, "xs": [1]}
    assert not compiled.check(L, {})
    assert compiled.failures(L, {}) == ["tensor 'L['x']' size mismatch at index 0. expected 3, actual 4",
                                        "L['alpha'] == 0.5: expected 0.5, got 2.0",
                                        "len(L['xs']) == 2: expected length 2, got length 1"]
    assert "def ___check_guards(L, G)" in compiled.code  # one generated function


def test_guards_render_with_their_user_line():
    def fn(x):
        return x + 1

    compiled = engine.compile(fn, backend="eager")
    compiled(torch.randn(2))
    [entry] = entries_of(fn)
    text = render_guards(entry.guards.guards)
    assert "TENSOR_MATCH: check_tensor(L['x'], Tensor, torch.float32" in text
    assert "size=[2], stride=[1]" in text and "GLOBAL_STATE" in text


def test_cache_size_limit_falls_back_to_eager_with_a_warning():
    def fn(x, mode):
        return x * len(mode)

    compiled = engine.compile(fn, backend="eager")
    with engine.config.patch(cache_size_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mode in ["a", "bb", "ccc", "dddd"]:  # a string constant is specialized: one entry each
            torch.testing.assert_close(compiled(torch.ones(1), mode), torch.full((1,), float(len(mode))))
    assert len(entries_of(fn)) == 2
    assert any("cache_size_limit" in str(w.message) for w in caught)


def test_reset_clears_every_cache():
    compiled = engine.compile(lambda t: t + 1, backend="eager")
    compiled(torch.ones(1))
    assert runtime._CACHES
    engine.reset()
    assert not runtime._CACHES


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = 2.0

    def forward(self, x):
        x = self.lin(x).relu()
        print("between the graphs")     # a graph break inside every block
        return x * self.scale


class _Stack(torch.nn.Module):
    def __init__(self, n, block=_Block):
        super().__init__()
        self.layers = torch.nn.ModuleList([block() for _ in range(n)])
        self.flag = True

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * 2 if self.flag else x


def test_a_stack_of_blocks_shares_one_entry_per_frame_as_under_torch_compile(capsys):
    # Modules are guarded by type (parameters are graph inputs), so twelve blocks that each
    # break compile the block's frames once, as three blocks do: no cache limit reached, no
    # block left eager (with modules guarded by identity each block compiled again).
    x = torch.randn(2, 4)
    counts = []
    for depth in (3, 12):
        engine.reset()
        model = _Stack(depth)
        counts.append(engine.explain(model)(x).graph_count)
        # two entries: the first block's input does not require grad, the others' do
        assert len(entries_of(_Block.forward)) == 2
        engine.reset()
        torch.testing.assert_close(engine.compile(model, backend="eager")(x), model(x))
    assert counts[0] == counts[1] <= 4


class _WholeBlock(_Block):
    def forward(self, x):
        return self.lin(x).relu() * self.scale


def test_a_module_changed_after_the_compile_is_not_answered_by_stale_code():
    model, x = _Stack(2, _WholeBlock), torch.randn(2, 4)
    compiled = engine.compile(model, backend="eager")
    torch.testing.assert_close(compiled(x), model(x))
    changes = [lambda: model.layers.append(_WholeBlock()),     # a layer more: the loop is guarded
               lambda: setattr(model, "flag", False),           # an attribute the trace read
               lambda: model.layers.__setitem__(0, _WholeBlock()),  # a layer replaced by another
               lambda: setattr(model.layers[1], "scale", 3.0),
               lambda: setattr(model.layers[1].lin, "weight", torch.nn.Parameter(torch.randn(4, 4))),
               lambda: model.layers.pop(0),
               lambda: model.eval()]
    for change in changes:
        change()
        torch.testing.assert_close(compiled(x), model(x))


class _FirstTwo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        layers = self.layers[:2]       # a new ModuleList, live across the break
        print("between the graphs")
        for layer in layers:
            x = layer(x)
        return x


def test_two_instances_of_a_module_class_each_get_their_own_layers(capsys):
    # One compiled forward serves both instances where everything it holds is read again
    # from `self`; a slice of a ModuleList held across a break is this module's own, so the
    # entry made with it is guarded on the list's identity.
    f = engine.compile(_FirstTwo.forward, backend="eager")
    x = torch.randn(2, 4)
    for m in (_FirstTwo(), _FirstTwo(), _Stack(2, _WholeBlock), _Stack(2, _WholeBlock)):
        torch.testing.assert_close(engine.compile(m, backend="eager")(x), m(x))
        if isinstance(m, _FirstTwo):
            torch.testing.assert_close(f(m, x), m(x))


def test_a_dict_read_for_one_key_is_guarded_on_that_key_only():
    """transformers' config reads `__dict__.get(...)` for one name on every attribute
    access. The dict's keys are guarded; of its values, only the ones read: changing
    another attribute reuses the entry, changing the one read compiles again, and a dict
    walked whole is guarded whole."""
    class Cfg:
        def __init__(self):
            self.scale, self.name, self.depth = 2.0, "bert", 12

    def one_key(x, cfg):
        return x * cfg.__dict__.get("scale") if "scale" in cfg.__dict__ else x

    def whole(x, d):
        return x * sum(v for v in d.values())

    x, cfg = torch.randn(3), Cfg()
    f = engine.compile(one_key, backend="eager")
    torch.testing.assert_close(f(x, cfg), x * 2.0)
    cfg.name, cfg.depth = "gpt2", 24
    torch.testing.assert_close(f(x, cfg), x * 2.0)
    assert len(entries_of(one_key)) == 1
    sources = [g.source for g in entries_of(one_key)[0].guards.guards]
    assert not any("'name'" in s or "'depth'" in s for s in sources), sources
    cfg.scale = 3.0
    torch.testing.assert_close(f(x, cfg), x * 3.0)
    assert len(entries_of(one_key)) == 2
    del cfg.scale                               # the key is gone: its absence is seen too
    torch.testing.assert_close(f(x, cfg), x)

    g, d = engine.compile(whole, backend="eager"), {"a": 1.0, "b": 2.0}
    torch.testing.assert_close(g(x, d), x * 3.0)
    d["b"] = 5.0
    torch.testing.assert_close(g(x, d), x * 6.0)


class GenerationMode(str, __import__("enum").Enum):     # as transformers' generation modes
    GREEDY = "greedy"
    SAMPLE = "sample"


class Scale:
    pass


SCALES = {GenerationMode.GREEDY: 2.0, GenerationMode.SAMPLE: 3.0}


class Registry(dict):
    pass


REGISTRY = Registry({Scale: 5.0, "bias": 1.0})


def test_a_dict_keyed_by_enum_members_or_classes_is_guarded_by_valid_code():
    # a str enum member's repr, `<GenerationMode.GREEDY: 'greedy'>`, is no expression: the
    # guards name such keys by their module path (transformers' generate() read
    # GENERATION_MODES_MAPPING[mode] and its guards did not compile)
    def fn(x):
        return x * SCALES[GenerationMode.GREEDY] + REGISTRY[Scale] + REGISTRY.get("bias")

    compiled = engine.compile(fn, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), fn(x))
    SCALES[GenerationMode.GREEDY] = 4.0      # a guarded value changed: compiled again, right
    REGISTRY[Scale] = 6.0
    try:
        torch.testing.assert_close(compiled(x), fn(x))
        assert len(entries_of(fn)) == 2
    finally:
        SCALES[GenerationMode.GREEDY] = 2.0
        REGISTRY[Scale] = 5.0
