"""Inputs a graph updates are written where they are: an optimizer step compiled with the
inductor backend runs one fused kernel per parameter (its foreach ops taken tensor by
tensor) that stores the new parameter and moments in the caller's tensors, with no copy
back. Where a later read still needs an input's old value, the new value gets its own
buffer and is copied back as before; results always match eager."""

import pytest
import torch

import engine
from engine_helpers import fresh_engine, logs  # noqa: F401  (fresh_engine: autouse)

OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, foreach=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, foreach=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5, foreach=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2, foreach=True),
}


def params():
    torch.manual_seed(0)
    return [torch.randn(6, 5, requires_grad=True), torch.randn(7, requires_grad=True),
            torch.randn(3, 4, 2, requires_grad=True)]


def steps_match(eager_step, step, ref, mine, n):
    """n steps of both optimizers on equal random gradients; the parameters stay eager's."""
    for _ in range(n):
        for a, b in zip(ref, mine):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        eager_step()
        step()
    for a, b in zip(ref, mine):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_foreach_optimizer_step_updates_its_tensors_in_place_like_eager(name):
    ref, mine = params(), params()
    eager_opt, opt = OPTIMIZERS[name](ref), OPTIMIZERS[name](mine)
    step = engine.compile(opt.step, backend="inductor")
    ptrs = [p.data_ptr() for p in mine]
    with logs("output_code") as code, logs("perf_hints") as hints:
        steps_match(eager_opt.step, step, ref, mine, 3)
    for a, b in zip(ref, mine):
        for key, value in eager_opt.state[a].items():
            other = opt.state[b]
            torch.testing.assert_close(other[key], value, rtol=1e-5, atol=1e-6, msg=f"state {key}")
    assert [p.data_ptr() for p in mine] == ptrs
    hints, code = "\n".join(hints), "\n".join(code)
    assert "_foreach_" not in hints, hints          # no foreach op left as an aten call
    assert code.count("written in its memory") >= len(mine), code   # at least each parameter


def test_an_optimizer_step_is_one_kernel_per_parameter_and_one_for_all_step_counts():
    ps = params()
    opt = torch.optim.AdamW(ps, lr=1e-2, foreach=True)
    for p in ps:
        p.grad = torch.randn_like(p)
    with logs("schedule") as sched:
        engine.compile(opt.step, backend="inductor")()
    sched = "\n".join(sched)
    kernels = [ln for ln in sched.splitlines() if ": outer " in ln]
    assert len([k for k in kernels if ": outer []" not in k]) == len(ps), sched    # over each parameter
    assert len([k for k in kernels if ": outer []" in k]) == 1, sched              # every step count + 1
    assert sched.count("written in its memory") == 4 * len(ps), sched   # parameter, moments, step count
    for name in ("arg0", "arg1", "arg2"):   # the parameters are inputs 0..2
        assert f"new value of input {name}: written in its memory" in sched, sched


def no_grad_programs():
    """Each updates its input x under no_grad; some still need x's old value after the update."""
    def add_inplace(x):
        x.add_(1)
        return x.sum()

    def old_value_read_after(x):
        y = x * 2
        x.mul_(3)
        return y + x.sum()          # y's kernel reads the old x; the sum the new one

    def flipped(x):
        x.copy_(x.flip(0))          # each element reads another one
        return x

    def transposed(x):
        x.copy_(x.t() + 1)
        return x * 1

    def read_by_extern_after(x):
        x.sub_(0.5)
        return x @ x

    def two_updates(x):
        x.mul_(2)
        x.add_(x.sum())             # the sum of the new x: a reduction before the update
        return x.clone()

    def read_by_extern_before(x):
        y = x @ x                   # a matmul reads the old x, then x is updated: as an optimizer
        x.mul_(0.5).add_(y[0, 0])   # after the backward's matmuls (written in x's memory)
        return y

    def viewed_by_extern_before(x):
        v = x.t().contiguous()[0]   # a view of a copy; the copy, not x, lives on in v
        x.add_(1)
        return v * 1

    def both_sides_of_an_update(x):
        a = x @ x.t()
        x.sub_(0.25)
        return a, x @ x             # read before and after: the new x must not land while a reads x

    return [add_inplace, old_value_read_after, flipped, transposed, read_by_extern_after, two_updates,
            read_by_extern_before, viewed_by_extern_before, both_sides_of_an_update]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("fn", no_grad_programs(), ids=lambda f: f.__name__)
def test_updates_of_an_input_under_no_grad_match_eager(fn, backend):
    torch.manual_seed(0)
    x = torch.randn(6, 6)
    want_x = x.clone()
    compiled = engine.compile(fn, backend=backend)
    for _ in range(2):      # twice: the second call reuses the compiled graph
        with torch.no_grad():
            got = compiled(x)
            want = fn(want_x)
        torch.testing.assert_close(x, want_x)
        torch.testing.assert_close(got, want)


def test_an_input_read_at_other_elements_is_not_overwritten_while_read():
    x = torch.randn(6, 6)
    want = x.flip(0)
    with logs("schedule") as sched, torch.no_grad():
        engine.compile(no_grad_programs()[2], backend="inductor")(x)
    torch.testing.assert_close(x, want)
    assert "written in its memory" not in "\n".join(sched)


def test_an_input_a_matmul_read_before_its_update_is_written_in_place():
    """A whole training step's graph reads each weight in its matmuls, forward and backward,
    then updates it: the new value is stored where the weight is, not in a buffer copied
    back after the graph."""
    x = torch.randn(6, 6)
    want = x.clone()
    with logs("schedule") as sched, torch.no_grad():
        got = engine.compile(no_grad_programs()[6], backend="inductor")(x)
        expected = no_grad_programs()[6](want)
    torch.testing.assert_close(x, want)
    torch.testing.assert_close(got, expected)
    assert "written in its memory" in "\n".join(sched), sched


def test_the_triton_emitter_writes_inputs_in_place_too():
    """Under the Triton interpreter (CPU) with SGD + momentum (Adam's pow needs libdevice,
    which only the GPU has; the GPU tests run AdamW)."""
    pytest.importorskip("triton")
    ref, mine = params(), params()
    eager_opt, opt = OPTIMIZERS["sgd_nesterov"](ref), OPTIMIZERS["sgd_nesterov"](mine)
    with engine.config.patch(triton_interpret=True), logs("output_code") as code, logs("perf_hints") as hints:
        step = engine.compile(opt.step, backend="inductor")
        steps_match(eager_opt.step, step, ref, mine, 2)
    assert not any("uncompiled" in h for h in hints), hints
    code = "\n".join(code)
    assert "@triton.jit" in code or "Launcher(" in code, code[:2000]
    assert code.count("written in its memory") >= len(mine), code


def test_an_embeddings_gradient_is_scattered_into_its_zeros_in_place():
    # The functional backward's `index_put(zeros, [ids], grads, accumulate=True)` held two
    # [vocabulary, dim] tensors at once; the zeros die at the call, so it writes them.
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    ids = torch.randint(0, 50, (4, 6))
    with logs("output_code") as code:
        engine.compile(lambda i: emb(i).pow(2).sum(), backend="inductor")(ids).backward()
    got = emb.weight.grad.clone()
    emb.weight.grad = None
    emb(ids).pow(2).sum().backward()
    torch.testing.assert_close(got, emb.weight.grad)
    assert any("aten.index_put_.default(" in c for c in code), code


def test_a_scatter_into_a_buffer_read_later_stays_out_of_place():
    def fn(i, v):
        z = torch.zeros(10) * 2
        y = z.index_put((i,), v, accumulate=True)
        return y, z + 1

    i, v = torch.tensor([1, 1, 3]), torch.tensor([1.0, 2.0, 3.0])
    for got, want in zip(engine.compile(fn, backend="inductor")(i, v), fn(i, v)):
        torch.testing.assert_close(got, want)


def test_a_backwards_outputs_are_computed_where_the_graph_computes_them():
    # Weight gradients cast to float32 under autocast were all computed at the end of the
    # backward, each bfloat16 gradient alive until then; now each cast follows its matmul.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    x = torch.randn(8, 16)

    def loss(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float().pow(2).mean()

    with logs("output_code") as code:
        engine.compile(loss, backend="inductor")(x).backward()
    backward = [c for c in code if "def call" in c][-1]
    lines = [ln.strip() for ln in backward[backward.index("def call"):].splitlines()]
    calls = [ln for ln in lines if ln.startswith(("kernel", "extern")) and "(" in ln]
    mms = [k for k, ln in enumerate(calls) if "torch.mm(" in ln]
    # the casts of the weight gradients: kernels named after the Linear they differentiate
    casts = [k for k, ln in enumerate(calls) if ln.startswith("kernel") and "linear" in ln.split("(")[0]]
    assert len(mms) >= 6 and casts and min(casts) < max(mms), calls


def test_an_output_another_op_also_reads_is_computed_beside_its_matmul():
    # A KV cache: each layer's value projection is copied into the cache the model returns
    # and read by the layer's attention. The copies were all made at the end of the forward,
    # every projection alive until then (32 MiB more at the peak of a 1B Llama's forward).
    torch.manual_seed(0)
    ws = [torch.randn(16, 16) for _ in range(3)]
    empty = torch.zeros(2, 4, 0, 4)

    def forward(h):
        caches = []
        for w in ws:
            v = (h @ w).view(2, 8, 4, 4).transpose(1, 2)       # (batch, heads, tokens, dim)
            cache = torch.cat([empty, v], dim=-2)
            caches.append(cache)
            h = h + cache.transpose(1, 2).reshape(16, 16).relu()
        return h, caches

    h = torch.randn(16, 16)
    with logs("output_code") as code:
        got = engine.compile(forward, backend="inductor")(h)
    torch.testing.assert_close(got, forward(h))
    wrapper = [c for c in code if "def call" in c][-1]
    lines = [ln.strip() for ln in wrapper[wrapper.index("def call"):].splitlines()]
    calls = [ln for ln in lines if ln.startswith(("kernel", "extern")) and "(" in ln]
    mms = [k for k, ln in enumerate(calls) if "torch.mm(" in ln]
    assert len(mms) == 3, calls
    for this, after_next in zip(mms, mms[1:]):
        result = calls[this].split(" = ")[0]          # extern0
        readers = [k for k, ln in enumerate(calls) if k > this and f"{result}." in ln]
        assert readers and max(readers) < after_next, calls    # its last reader comes before the next matmul
