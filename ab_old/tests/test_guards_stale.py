"""Never a stale result: after each change a program can make between two calls (a
global, a module attribute, a parameter's requires_grad, grad mode, default dtype, a
dict's keys, a list's length, ...), the compiled function either recompiles or runs an
entry that is still valid. Every call is compared with eager."""

import torch

import engine
from engine_helpers import cache_entries as entries, fresh_engine, logs  # noqa: F401 (fresh_engine: autouse)


def check(compiled, eager, *args):
    got, want = compiled(*args), eager(*args)
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and got.device == want.device
        assert got.requires_grad == want.requires_grad
        torch.testing.assert_close(got, want)
    else:
        assert got == want
    return got


SCALE = 2.0
WEIGHT = torch.ones(3)


def scaled(x):
    return x * SCALE + WEIGHT


def test_changing_a_global_value_recompiles():
    global SCALE, WEIGHT
    f = engine.compile(scaled, backend="eager")
    x = torch.randn(3)
    check(f, scaled, x)
    try:
        SCALE = 5.0
        check(f, scaled, x)
        WEIGHT = torch.full((3,), 7.0)       # a different tensor object, same metadata
        check(f, scaled, x)
    finally:
        SCALE, WEIGHT = 2.0, torch.ones(3)


class Scaler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = 2
        self.use_bias = True

    def forward(self, x):
        y = self.lin(x) * self.scale
        if self.use_bias:
            y = y + 1
        return y


def test_changing_a_module_attribute_recompiles():
    m = Scaler()
    f = engine.compile(m, backend="eager")
    x = torch.randn(2, 3)
    check(f, m, x)
    m.scale = 3
    check(f, m, x)
    m.use_bias = False
    check(f, m, x)


def test_replacing_a_submodule_recompiles():
    m = Scaler()
    f = engine.compile(m, backend="eager")
    x = torch.randn(2, 3)
    check(f, m, x)
    m.lin = torch.nn.Linear(3, 3)
    check(f, m, x)


def test_a_parameters_requires_grad_is_guarded():
    m = Scaler()
    f = engine.compile(m, backend="eager")
    x = torch.randn(2, 3)
    assert check(f, m, x).requires_grad
    for p in m.parameters():
        p.requires_grad_(False)
    assert not check(f, m, x).requires_grad


def grad_sensitive(x):
    return (x * 2).sum()


def test_grad_mode_is_guarded():
    f = engine.compile(grad_sensitive, backend="eager")
    x = torch.randn(3, requires_grad=True)
    assert check(f, grad_sensitive, x).requires_grad
    with torch.no_grad():
        assert not check(f, grad_sensitive, x).requires_grad
    assert len(entries(grad_sensitive)) == 2
    assert check(f, grad_sensitive, x).requires_grad   # the first entry is still valid
    assert len(entries(grad_sensitive)) == 2


def makes_a_tensor(x):
    return x + torch.ones(3)


def test_default_dtype_is_guarded():
    f = engine.compile(makes_a_tensor, backend="eager")
    x = torch.randn(3, dtype=torch.float64)
    check(f, makes_a_tensor, x)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        check(f, makes_a_tensor, x)
    finally:
        torch.set_default_dtype(old)
    assert len(entries(makes_a_tensor)) == 2


def test_deterministic_algorithms_and_autocast_are_guarded():
    f = engine.compile(grad_sensitive, backend="eager")
    x = torch.randn(3)
    check(f, grad_sensitive, x)
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not old)
    try:
        check(f, grad_sensitive, x)
    finally:
        torch.use_deterministic_algorithms(old)
    assert len(entries(grad_sensitive)) == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f(x)
    assert len(entries(grad_sensitive)) == 3


def device_of_new(x):
    return x + 1, torch.ones(2).device     # the device is a trace-time constant


def test_default_device_is_guarded():
    f = engine.compile(device_of_new, backend="eager")
    x = torch.randn(3)
    assert f(x)[1] == torch.device("cpu")
    torch.set_default_device("meta")
    try:
        assert f(x)[1] == torch.device("meta")
    finally:
        torch.set_default_device(None)
    assert f(x)[1] == torch.device("cpu")
    assert len(entries(device_of_new)) == 2


def sum_values(d):
    out = 0
    for k in d:
        out = out + d[k]
    return out


def test_dict_keys_are_guarded():
    f = engine.compile(sum_values, backend="eager")
    d = {"a": torch.ones(2), "b": torch.ones(2)}
    check(f, sum_values, d)
    d["c"] = torch.full((2,), 5.0)
    check(f, sum_values, d)
    del d["a"]
    check(f, sum_values, d)


def sum_list(xs):
    return sum(xs)


def test_list_length_is_guarded():
    f = engine.compile(sum_list, backend="eager")
    xs = [torch.ones(2), torch.ones(2)]
    check(f, sum_list, xs)
    xs.append(torch.full((2,), 3.0))
    check(f, sum_list, xs)
    xs.pop(0)
    xs.pop(0)
    check(f, sum_list, xs)


class Config:
    pass


def uses_optional(x, cfg):
    if hasattr(cfg, "shift"):
        return x + cfg.shift
    return x


def test_hasattr_is_guarded():
    f = engine.compile(uses_optional, backend="eager")
    cfg = Config()
    x = torch.randn(3)
    check(f, uses_optional, x, cfg)
    cfg.shift = 4.0
    check(f, uses_optional, x, cfg)


def times(x, alpha):
    return x * alpha


def test_python_floats_specialize_and_tensor_wrapped_ones_do_not():
    f = engine.compile(times, backend="eager")
    x = torch.randn(4)
    for a in (0.5, 2.0, -1.25):
        check(f, times, x, a)
    assert len(entries(times)) == 3
    engine.reset()
    for a in (0.5, 2.0, -1.25):
        check(f, times, x, torch.tensor(a))
    assert len(entries(times)) == 1


def test_dtype_and_requires_grad_of_inputs_are_guarded():
    f = engine.compile(grad_sensitive, backend="eager")
    check(f, grad_sensitive, torch.randn(3))
    check(f, grad_sensitive, torch.randn(3, dtype=torch.float64))
    check(f, grad_sensitive, torch.randn(3, requires_grad=True))
    assert len(entries(grad_sensitive)) == 3


def make_adder(n):
    def add_n(x):
        return x + n
    return add_n


def test_closure_values_are_guarded():
    add2, add3 = make_adder(2), make_adder(3)
    f2, f3 = engine.compile(add2, backend="eager"), engine.compile(add3, backend="eager")
    x = torch.randn(3)
    check(f2, add2, x)
    check(f3, add3, x)     # same code object, a different cell value


def test_a_state_entry_keeps_hitting_while_the_state_lasts():
    f = engine.compile(grad_sensitive, backend="eager")
    x = torch.randn(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            f(x)
    torch.set_default_device("cpu")
    try:
        for _ in range(3):
            f(x)
    finally:
        torch.set_default_device(None)
    assert len(entries(grad_sensitive)) == 2


def test_the_global_state_tuple_matches_the_state_dict():
    from engine.guards.guard import global_state, global_state_tuple
    assert tuple(global_state().values()) == global_state_tuple()


def transpose_one_index_other(x, y):
    y.t_()                                  # when y is x, x's shape changes too
    x[torch.arange(0, x.shape[0], 2)] = 2
    return x.shape


def test_passing_one_tensor_twice_does_not_reuse_a_graph_traced_for_two():
    # fuzz seed 200494: the graph for distinct x, y read x.shape as (6, 4) after y.t_()
    f = engine.compile(transpose_one_index_other, backend="eager")
    check(f, transpose_one_index_other, torch.randn(6, 4), torch.randn(6, 4))
    a = torch.randn(6, 4)
    b = a.clone()
    with logs("recompiles") as lines:
        assert f(a, a) == transpose_one_index_other(b, b) == torch.Size([4, 6])
    torch.testing.assert_close(a, b)
    assert len(entries(transpose_one_index_other)) == 2
    assert "check_no_aliasing(L['x'], L['y']): expected distinct tensors, got L['y'] is L['x']" in "\n".join(lines)
