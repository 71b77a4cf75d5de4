"""Dynamic shapes through engine.compile: automatic dynamic (dynamic=None), dynamic=True
and False, mark_dynamic / mark_static, symbolic sizes inside graphs and in returned values.
Every call is compared with eager."""

import torch

import engine
from engine_helpers import cache_entries as entries, fresh_engine, logs  # noqa: F401 (fresh_engine: autouse)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.allclose(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def batch_norm(x, w):
    h = torch.relu(x @ w)
    return h / h.shape[0], torch.cat([h, h], 0).shape


def test_automatic_dynamic_recompiles_once_then_serves_every_size():
    f = engine.compile(batch_norm, backend="eager")
    w = torch.randn(8, 4)
    with logs("dynamic", "recompiles") as lines:
        for n in (3, 5, 9, 2, 17):
            x = torch.randn(n, 8)
            assert same(f(x, w), batch_norm(x, w))
    assert len(entries(batch_norm)) == 2
    text = "\n".join(lines)
    assert "tensor 'L['x']' size mismatch at index 0. expected 3, actual 5" in text
    assert "create_symbol s0 = 5 for L['x'].size()[0] [2, int_oo]" in text
    assert text.count("Recompiling function batch_norm") == 1


def test_the_symbolic_graph_takes_the_size_as_an_input():
    f = engine.compile(batch_norm, backend="eager")
    w = torch.randn(8, 4)
    f(torch.randn(3, 8), w)
    with logs("graph_code") as lines:
        f(torch.randn(4, 8), w)
    assert 'L_x_size_0_: "Sym(s0)"' in lines[0] and '"f32[s0, 8][8, 1]cpu"' in lines[0]


def view_by_batch(x):
    b = x.shape[0]
    h = x.view(b, 2, 3).sum(-1)
    return h * b, x.mean(0), b


def test_dynamic_true_is_symbolic_up_front_and_returns_python_ints():
    f = engine.compile(view_by_batch, backend="eager", dynamic=True)
    for n in (4, 7, 16):
        x = torch.randn(n, 6)
        out = f(x)
        assert same(out, view_by_batch(x)) and type(out[2]) is int
    assert len(entries(view_by_batch)) == 1


def test_dynamic_true_still_specializes_size_one():
    f = engine.compile(view_by_batch, backend="eager", dynamic=True)
    f(torch.randn(4, 6))
    x = torch.randn(1, 6)
    assert same(f(x), view_by_batch(x))
    assert len(entries(view_by_batch)) == 2      # the [2, oo] range excludes 1


def test_dynamic_false_compiles_every_size():
    f = engine.compile(view_by_batch, backend="eager", dynamic=False)
    for n in (4, 7, 16):
        x = torch.randn(n, 6)
        assert same(f(x), view_by_batch(x))
    assert len(entries(view_by_batch)) == 3


def double(x):
    return x * 2


def test_mark_dynamic_makes_the_first_compile_symbolic():
    f = engine.compile(double, backend="eager")
    x = torch.randn(5, 3)
    engine.mark_dynamic(x, 0)
    with logs("guards") as lines:
        f(x)
    assert "size=[None, 3]" in lines[0]
    assert "2 <= L['x'].size()[0]" in lines[0]
    y = torch.randn(11, 3)
    assert same(f(y), double(y)) and len(entries(double)) == 1


def test_mark_static_keeps_a_dim_static_under_dynamic_true():
    f = engine.compile(double, backend="eager", dynamic=True)
    x = torch.randn(5, 3)
    engine.mark_static(x, 0)
    with logs("guards") as lines:
        f(x)
    assert "size=[5, None]" in lines[0]


def branch_on_sizes(x, y):
    if x.shape[0] > y.shape[0]:
        return x[: y.shape[0]] + y
    return x + y[: x.shape[0]]


def test_branches_on_sizes_are_guarded_in_user_terms():
    f = engine.compile(branch_on_sizes, backend="eager", dynamic=True)
    with logs("guards") as lines:
        a, b = torch.randn(6), torch.randn(4)
        assert same(f(a, b), branch_on_sizes(a, b))
    assert "L['x'].size()[0] > L['y'].size()[0]" in lines[0]
    a, b = torch.randn(9), torch.randn(3)                   # same branch: no recompile
    assert same(f(a, b), branch_on_sizes(a, b)) and len(entries(branch_on_sizes)) == 1
    a, b = torch.randn(3), torch.randn(9)                   # other branch: recompile, right answer
    assert same(f(a, b), branch_on_sizes(a, b)) and len(entries(branch_on_sizes)) == 2


def add(x, y):
    return x + y


def test_duck_sizing_guard_relates_two_inputs():
    f = engine.compile(add, backend="eager", dynamic=True)
    with logs("guards") as lines:
        f(torch.randn(4), torch.randn(4))
    assert "+- LAMBDA_GUARD: L['y'].size()[0] == L['x'].size()[0]" in lines[0]
    x, y = torch.randn(7), torch.randn(7)
    assert same(f(x, y), add(x, y)) and len(entries(add)) == 1


def loop_over_rows(x):
    acc = x[0]
    for i in range(1, x.shape[0]):      # range() needs a real int: the size specializes
        acc = acc + x[i]
    return acc


def test_sizes_needed_as_python_ints_specialize_and_stay_correct():
    f = engine.compile(loop_over_rows, backend="eager", dynamic=True)
    for n in (3, 5, 3):
        x = torch.randn(n, 2)
        assert same(f(x), loop_over_rows(x))
    assert len(entries(loop_over_rows)) == 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x).sum(0)


def test_parameters_stay_static_while_the_batch_goes_dynamic():
    net = Net()
    f = engine.compile(net, backend="eager")
    with logs("guards") as lines:
        for n in (2, 3, 5):
            x = torch.randn(n, 4)
            assert same(f(x), net(x))
    tree = lines[-1]
    assert "size=[None, 4]" in tree and "size=[3, 4], stride=[4, 1]" in tree


def test_transposed_input_with_equal_sizes_does_not_hit_a_contiguous_entry():
    f = engine.compile(double, backend="eager", dynamic=True)
    f(torch.randn(3, 5))
    x = torch.randn(5, 3).t()
    assert same(f(x), double(x))
    assert len(entries(double)) == 2


def test_mark_dynamic_with_a_range_guards_both_bounds():
    f = engine.compile(double, backend="eager")
    x = torch.randn(5, 3)
    engine.mark_dynamic(x, 0, min=2, max=16)
    with logs("guards") as lines:
        f(x)
    assert "2 <= L['x'].size()[0]" in lines[0] and "L['x'].size()[0] <= 16" in lines[0]
    z = torch.randn(16, 3)
    assert same(f(z), double(z)) and len(entries(double)) == 1
    y = torch.randn(17, 3)
    assert same(f(y), double(y)) and len(entries(double)) == 2


def scale_by(x, n):
    return x * n + n, n * 2


def test_an_int_argument_goes_dynamic_after_it_changes_like_pytorch():
    f = engine.compile(scale_by, backend="eager")
    with logs("recompiles", "dynamic") as lines:
        for n in (2, 3, 4, -5, 0):
            x = torch.randn(3)
            assert same(f(x, n), scale_by(x, n))
    assert len(entries(scale_by)) == 2
    text = "\n".join(lines)
    assert "- 0/0: L['n'] == 2" in text
    assert "create_symbol s0 = 3 for L['n'] [-int_oo, int_oo]" in text


def route(x, sizes):
    """A mixture-of-experts router (JetMoE's): split sizes that change on every call."""
    return [chunk * (i + 1) for i, chunk in enumerate(torch.split(x, sizes))]


def route_after_a_break(x, counts):
    sizes = counts.tolist()         # a graph break: the resume function receives the list
    return route(x, sizes)


def test_ints_in_a_list_argument_go_dynamic_after_they_change():
    for fn in (route, route_after_a_break):
        engine.reset()
        f = engine.compile(fn, backend="aot_eager")
        with logs("recompiles") as lines:
            for sizes in ([3, 5, 2], [4, 2, 4], [2, 3, 5], [5, 3, 2]):
                x = torch.randn(10, 2, requires_grad=True)
                arg = sizes if fn is route else torch.tensor(sizes)
                got, want = f(x, arg), fn(x, arg)
                assert same(got, want)
                grads = [torch.autograd.grad(sum(t.sum() for t in out), x)[0] for out in (got, want)]
                assert same(*grads)
        # specialized, then symbolic once the sizes changed: one recompile, not one per call
        assert "\n".join(lines).count("Recompiling function") == 1, lines


def describe(x):
    return x + 1, f"batch={x.shape[0]}", str(x.shape), isinstance(x.shape[0], int)


def test_text_made_from_a_size_shows_the_size_not_the_symbol():
    f = engine.compile(describe, backend="eager", dynamic=True)
    for n in (4, 6, 4):
        x = torch.randn(n, 2)
        assert same(f(x), describe(x))


def clamp_count(x, n):
    return torch.arange(n) if n >= 0 else x


def test_guards_on_int_arguments_keep_their_sign():
    f = engine.compile(clamp_count, backend="eager", dynamic=True)
    with logs("guards") as lines:
        assert same(f(torch.randn(2), 3), clamp_count(torch.randn(2), 3))
    assert "0 <= L['n']" in lines[0]
    x = torch.randn(2)
    assert same(f(x, -3), clamp_count(x, -3))


def plus_shape(x, y):
    return x + y.sum(), y.shape


def test_inputs_that_are_views_of_each_other_stay_correct():
    # one real tensor seen through two sources (y is x's view base) shares one FakeTensor;
    # every symbolic size of every input is still tied to what the graph assumed
    f = engine.compile(plus_shape, backend="eager", dynamic=True)
    for n in (3, 4, 5):
        b = torch.randn(n, n)
        for args in [(b, b.t()), (b[0], b[1:]), (b.view(-1), b)]:
            assert same(f(*args), plus_shape(*args))


def test_config_knobs_change_the_default_policy():
    with engine.config.patch(automatic_dynamic_shapes=False):
        f = engine.compile(double, backend="eager")
        for n in (2, 3, 4):
            f(torch.randn(n, 3))
        assert len(entries(double)) == 3
    engine.reset()
    with engine.config.patch(assume_static_by_default=False):
        f = engine.compile(double, backend="eager")
        for n in (2, 3, 4):
            x = torch.randn(n, 3)
            assert same(f(x), double(x))
        assert len(entries(double)) == 1


def test_the_inductor_backend_compiles_the_recompiled_graph_for_each_new_size():
    # after the recompile the captured graph takes x.shape[-1] as an input; each AOT
    # entry is traced for concrete sizes and bakes it in: the unused input must not send
    # the graph to its aten ops
    def layer_norm_gelu(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b))

    f = engine.compile(layer_norm_gelu)
    with logs("perf_hints") as hints:
        for rows, cols in ((16, 128), (8, 64), (4, 32)):
            x, w, b = torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)
            torch.testing.assert_close(f(x, w, b), layer_norm_gelu(x, w, b), rtol=1e-5, atol=1e-5)
    assert len(entries(layer_norm_gelu)) == 2
    assert not any("runs uncompiled" in h for h in hints), hints


def test_a_size_returned_is_read_before_the_graph_changes_an_input_shape_in_place():
    # found by tests/fuzz (seed 714): the size came from L['x'] after x.unsqueeze_(0) ran
    import engine

    def fn(x, d):
        x.unsqueeze_(0)
        return {"a": torch.sin(d["a"]).shape[0]}

    engine.reset()
    compiled = engine.compile(fn, backend="eager")
    for n in (6, 7, 8):   # the second size makes the dim dynamic (one symbol for x and d['a'])
        assert compiled(torch.randn(n, 5), {"a": torch.randn(n, 5)}) == {"a": n}


SHIFT = torch.randn(3)


def positives_plus_shift(w):
    return (w[w > 0] + SHIFT) * 2     # broadcasts when one entry is positive


def test_an_op_that_would_assume_a_data_dependent_size_breaks_the_graph():
    # fuzz seed 301212: adding the mask's result (u0 entries) to a 3-vector traced as if
    # u0 == 3, and the backward failed when one entry was positive
    for backend in ("aot_eager", "inductor"):
        engine.reset()
        f = engine.compile(positives_plus_shift, backend=backend)
        with logs("graph_breaks") as lines:
            for rows in ([[-1., 2., 3.], [4., -1., -1.]], [[-1., 2., -3.], [-1., -1., -1.]]):
                wc = torch.tensor(rows, requires_grad=True)
                we = torch.tensor(rows, requires_grad=True)
                got, want = f(wc), positives_plus_shift(we)
                torch.testing.assert_close(got, want)
                got.sum().backward()
                want.sum().backward()
                torch.testing.assert_close(wc.grad, we.grad)
        assert any("GB0008" in x and "would assume Eq(u0, 3) of a data-dependent size" in x for x in lines), lines


def three_positives_doubled(w):
    t = w[w > 0]
    torch._check(t.shape[0] == 3)      # the user's promise about a data-dependent size
    return t * 2


def test_torch_check_on_a_data_dependent_size_is_checked_in_the_graph():
    f = engine.compile(three_positives_doubled, backend="aot_eager")
    w = torch.tensor([[-1., 2., 3.], [4., -1., -1.]])
    with logs("graph_breaks") as lines:
        torch.testing.assert_close(f(w), three_positives_doubled(w))
    assert lines == [] and len(entries(three_positives_doubled)) == 1
    two = torch.tensor([[-1., 2., 3.], [-4., -1., -1.]])
    for fn in (three_positives_doubled, f):     # eager raises, and so does the graph
        try:
            fn(two)
            raise AssertionError(f"{fn} accepted two positives")
        except RuntimeError:
            pass


def causal_lm_labels(logits, labels):
    # transformers' ForCausalLMLoss: the labels shifted left by padding one -100 at the end
    labels = torch.nn.functional.pad(labels, (0, 1), value=-100)
    shift = labels[..., 1:].contiguous()
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), shift.view(-1))


def test_ops_cpp_implements_over_concrete_sizes_stay_symbolic():
    # F.pad's C++ implementation reads the input's sizes as integers; traced as it stands it
    # pinned the sequence length, and a causal LM recompiled for every new length. With
    # symbolic sizes the capture takes the op's symbolic decomposition, as torch.compile does.
    f = engine.compile(causal_lm_labels, backend="inductor")
    with logs("recompiles", "dynamic") as lines:
        for n in (5, 7, 11, 7, 3):
            logits, labels = torch.randn(2, n, 10), torch.randint(0, 10, (2, n))
            torch.testing.assert_close(f(logits, labels), causal_lm_labels(logits, labels))
    assert len(entries(causal_lm_labels)) == 2
    assert not [ln for ln in lines if "Eq(s" in ln and "guard added" in ln], lines
