"""engine/shapes on its own: a ShapeEnv-backed fake mode, symbols tied to sources, and
shape guards rendered in user terms, driven without the capture engine."""

import types

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic

import observe
from engine.guards import compile_guards
from engine.shapes import env as shapes_env, policy
from engine.shapes.guards import shape_guard_texts, shape_guards
from engine.shapes.printer import python_text
from engine.shapes.symbolic import python_expr


class Src:
    """An engine source: an expression over L and G."""

    def __init__(self, text):
        self.text = text

    def name(self):
        return self.text


def fn(x, y):
    return x


class Owner:
    """What the OutputGraph gives the shape env: the code, and the user line traced now."""

    def __init__(self):
        self.f_code = fn.__code__
        self.user_frame = ("script.py", 5, "fn", "z = torch.cat([x, y])")
        self.tensor_sources = {}


@pytest.fixture(autouse=True)
def _clean():
    policy.reset()
    yield
    policy.reset()
    policy.set_frame_options(None, None)


def fake_mode(dynamic=True):
    owner = Owner()
    policy.set_frame_options(fn.__code__, dynamic)
    return shapes_env.new_fake_mode(owner), owner


def test_symbols_are_numbered_and_named_after_their_source():
    mode, _ = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(3, 4), Src("L['x']"))
    env = mode.shape_env
    assert [str(s) for s in fx.shape] == ["s0", "s1"]
    names = {str(k): [s.name for s in v] for k, v in env.var_to_sources.items()}
    assert names == {"s0": ["L['x'].size()[0]"], "s1": ["L['x'].size()[1]"]}


def test_create_symbol_is_reported_on_the_bus_with_range_and_user_line():
    lines, events = [], []

    def sink(e):
        if e.name == "log":
            lines.append(e.metadata["msg"] % e.metadata["args"])
        else:
            events.append(e.metadata)

    observe.subscribe(sink, events=["create_symbol"], logs=["dynamic"])
    try:
        mode, _ = fake_mode()
        shapes_env.make_fake(mode, torch.randn(3), Src("L['x']"))
    finally:
        observe.unsubscribe(sink)
    assert lines == ["create_symbol s0 = 3 for L['x'].size()[0] [2, int_oo] at script.py:5 in fn"]
    assert events[0]["symbol"] == "s0" and events[0]["source"] == "L['x'].size()[0]"
    assert events[0]["vr"] == "[2, int_oo]" and events[0]["user_stack"][0]["line"] == 5


def test_sizes_zero_and_one_specialize_even_when_dynamic():
    mode, _ = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(1, 5), Src("L['x']"))
    assert fx.shape[0] == 1 and isinstance(fx.shape[0], int)
    assert isinstance(fx.shape[1], torch.SymInt)


def test_duck_sizing_gives_one_symbol_and_an_equality_guard_in_user_terms():
    mode, _ = fake_mode()
    shapes_env.make_fake(mode, torch.randn(3), Src("L['x']"))
    shapes_env.make_fake(mode, torch.randn(3), Src("L['y']"))
    texts = [t.text for t in shape_guard_texts(mode.shape_env)]
    assert texts == ["L['y'].size()[0] == L['x'].size()[0]", "2 <= L['x'].size()[0]"]


def test_a_branch_on_a_size_becomes_a_guard_unless_the_range_implies_it():
    mode, owner = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(6, 4), Src("L['x']"))
    fy = shapes_env.make_fake(mode, torch.randn(5, 4), Src("L['y']"))
    owner.user_frame = ("script.py", 7, "fn", "if x.shape[0] > y.shape[0]:")
    assert bool(fx.shape[0] > fy.shape[0])       # guard s0 > s1 (two symbols: stays)
    assert bool(fx.shape[0] > 3)                 # narrows s0's range to [4, oo]: shown as the range
    texts = shape_guard_texts(mode.shape_env)
    by_text = {t.text: t for t in texts}
    assert "L['x'].size()[0] > L['y'].size()[0]" in by_text
    assert by_text["L['x'].size()[0] > L['y'].size()[0]"].user_frame[1] == 7
    assert "4 <= L['x'].size()[0]" in by_text
    assert "L['x'].size()[0] > 3" not in by_text


def test_specializing_a_symbol_guards_its_value():
    mode, _ = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(6, 4), Src("L['x']"))
    assert int(fx.shape[1]) == 4                  # e.g. range(x.shape[1]) in user code
    texts = [t.text for t in shape_guard_texts(mode.shape_env)]
    assert "L['x'].size()[1] == 4" in texts
    assert "2 <= L['x'].size()[1]" not in texts


def test_shape_guards_compile_into_the_fast_check_and_explain_failures():
    mode, _ = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(6), Src("L['x']"))
    shapes_env.make_fake(mode, torch.randn(6), Src("L['y']"))
    compiled = compile_guards(shape_guards(mode.shape_env))
    assert compiled.check({"x": torch.randn(9), "y": torch.randn(9)}, {})
    assert not compiled.check({"x": torch.randn(9), "y": torch.randn(8)}, {})
    assert not compiled.check({"x": torch.randn(1), "y": torch.randn(1)}, {})
    assert compiled.failures({"x": torch.randn(9), "y": torch.randn(8)}, {}) == [
        "L['y'].size()[0] == L['x'].size()[0]: expected true, got false (8 == 9)  # z = torch.cat([x, y])  # script.py:5 in fn"]


def test_symbolic_strides_are_guarded_against_the_sizes():
    mode, owner = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(3, 5), Src("L['x']"))
    assert str(fx.stride()[0]) == "s1"
    inputs = [(Src("L['x']"), None, types.SimpleNamespace(fake=fx))]
    texts = [g.expected for g in shape_guards(mode.shape_env, inputs)]
    assert "L['x'].stride()[0] == L['x'].size()[1]" in texts
    check = compile_guards(shape_guards(mode.shape_env, inputs)).check
    assert check({"x": torch.randn(4, 7)}, {})
    assert not check({"x": torch.randn(7, 4).t()}, {})   # same sizes, transposed layout


def test_non_dense_inputs_stay_static():
    mode, _ = fake_mode()
    base = torch.randn(6, 8)
    fx = shapes_env.make_fake(mode, base[:, ::2], Src("L['x']"))
    assert all(isinstance(s, int) for s in fx.shape)


def test_python_expressions_of_symbolic_values_read_the_inputs():
    mode, _ = fake_mode()
    fx = shapes_env.make_fake(mode, torch.randn(6, 4), Src("L['x']"))
    assert python_expr(fx.shape[0]) == "L['x'].size()[0]"
    assert python_expr(fx.shape[0] * 2 + 1) == "int(1 + 2*L['x'].size()[0])"
    assert python_expr(fx.shape) == "___torch_Size([L['x'].size()[0], L['x'].size()[1]])"
    L = {"x": torch.randn(10, 3)}
    assert eval(python_expr(fx.shape[0] * 2 + 1), {"L": L}) == 21


def test_policy_automatic_dynamic_marks_only_the_dims_that_changed():
    code = fn.__code__
    assert policy.automatic_dynamic_dims(code, "L['x']", (3, 4)) == set()
    assert policy.automatic_dynamic_dims(code, "L['x']", (5, 4)) == {0}
    assert policy.automatic_dynamic_dims(code, "L['x']", (7, 4)) == {0}
    assert policy.automatic_dynamic_dims(code, "L['x']", (7, 9)) == {0, 1}


def test_policy_marks_and_options():
    t = torch.randn(3, 4)
    S, D, K = DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.DUCK
    assert policy.dim_policy(t, "L['t']", None, False, False) == [S, S]
    assert policy.dim_policy(t, "L['t']", None, True, False) == [K, K]
    assert policy.dim_policy(t, "L['t']", None, True, True) == [S, S]    # module state stays static
    t._dynamo_dynamic_indices = {1}
    assert policy.dim_policy(t, "L['t']", None, None, False) == [S, D]
    t._dynamo_static_indices = {0}
    assert policy.dim_policy(t, "L['t']", None, True, False) == [S, D]


def test_printer_uses_sources_for_symbols():
    import sympy
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    names = {s0: "L['x'].size()[0]", s1: "L['y'].size()[0]"}
    assert python_text(sympy.Eq(s0, s1), names) == "L['x'].size()[0] == L['y'].size()[0]"
    assert python_text(sympy.Le(2, s0), names) == "2 <= L['x'].size()[0]"
