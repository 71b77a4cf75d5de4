"""mode="reduce-overhead" on a real GPU: each compiled graph replays as a CUDA graph, with
eager's results, for inference and training loops; new shapes capture again; inputs written
in place, outputs that alias inputs and random ops behave as without CUDA graphs.
Run with `pytest -m gpu tests/test_cudagraphs.py` on a machine with an NVIDIA GPU."""

from __future__ import annotations

import copy

import pytest
import torch

import engine
from engine_helpers import logs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = "cuda"
nn = torch.nn


@pytest.fixture(autouse=True)
def fresh():
    engine.reset()
    yield
    engine.reset()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 64)).to(DEV)


def test_inference_replays_one_graph_with_eagers_results_and_kept_outputs_stay():
    model = mlp().eval()
    with logs("cudagraphs") as shown, torch.no_grad():
        f = engine.compile(model, mode="reduce-overhead")
        xs = [torch.randn(8, 64, device=DEV) for _ in range(5)]
        outs = [f(x) for x in xs]           # kept: a later replay must not overwrite them
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    captured = [s for s in shown if "captured for input shapes" in s]
    # the replay after the capture found the capture's output still held (in `outs`): it
    # captured again into fresh memory, and copies outputs out of it from then on
    assert len(captured) == 2 and any("still held" in s for s in shown), shown
    assert "2 copied" not in captured[0] and "1 copied" in captured[0]   # x is copied; the weights are read in place


def test_outputs_dropped_before_the_next_call_are_the_graphs_own_memory():
    model = mlp().eval()
    with logs("cudagraphs") as shown, torch.no_grad():
        f = engine.compile(model, mode="reduce-overhead")
        addresses = []
        for _ in range(6):
            x = torch.randn(8, 64, device=DEV)
            out = f(x)
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
            addresses.append(out.data_ptr())
            del out
    # every replay hands out the same memory (no copy), and nothing is captured again
    assert len(set(addresses[1:])) == 1, addresses
    assert len([s for s in shown if "captured for input shapes" in s]) == 1, shown
    assert not any("still held" in s for s in shown), shown


def test_a_new_shape_captures_again():
    model = mlp().eval()
    with logs("cudagraphs") as shown, torch.no_grad():
        f = engine.compile(model, mode="reduce-overhead", dynamic=False)
        for n in (8, 8, 8, 16, 16, 16, 8):
            x = torch.randn(n, 64, device=DEV)
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-4)
    assert len([s for s in shown if "captured for input shapes" in s]) == 2, shown


def step(m, o, x):
    loss = m(x).pow(2).mean()
    loss.backward()
    o.step()
    o.zero_grad()
    return loss


def twins_with_adamw():
    """Two equal models, each with its AdamW: one for eager, one for the compiled step."""
    model = mlp()
    twin = copy.deepcopy(model)
    return ((model, torch.optim.AdamW(model.parameters(), lr=1e-2)),
            (twin, torch.optim.AdamW(twin.parameters(), lr=1e-2)))


def test_training_steps_with_adamw_match_eager():
    (model, opt), (twin, twin_opt) = twins_with_adamw()
    compiled = engine.compile(step, mode="reduce-overhead")
    with logs("cudagraphs") as shown:
        for _ in range(6):
            x = torch.randn(8, 64, device=DEV)
            torch.testing.assert_close(compiled(twin, twin_opt, x), step(model, opt, x), rtol=1e-3, atol=1e-4)
    for a, b in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    captured = [s for s in shown if "captured for input shapes" in s]
    assert any("forward graph" in s for s in captured), shown
    # the backward's saved tensors are the forward graph's outputs: read in place from the
    # backward's first capture, not copied into buffers of its own
    backward = [s for s in captured if "backward graph" in s]
    assert backward and "(0 of them another graph's outputs)" not in backward[0], shown


def test_a_training_loop_that_keeps_its_losses_copies_only_the_loss():
    (model, opt), (twin, twin_opt) = twins_with_adamw()
    compiled = engine.compile(step, mode="reduce-overhead")
    xs = [torch.randn(8, 64, device=DEV) for _ in range(6)]
    with logs("cudagraphs") as shown:
        losses = [compiled(twin, twin_opt, x) for x in xs]      # each loss is kept: none is overwritten
    expected = [step(model, opt, x) for x in xs]
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected), rtol=1e-3, atol=1e-4)
    # the forward graph found its last loss held once: it copies that one buffer out of each
    # replay from then on, and its saved tensors stay in its own memory
    held = [s for s in shown if "still held" in s]
    assert len(held) == 1 and "forward graph" in held[0] and "(1 of " in held[0], shown
    assert not any("copied from now on" in s for s in shown), shown


def test_the_backward_captures_into_the_forwards_memory_pool():
    (model, opt), (twin, twin_opt) = twins_with_adamw()
    compiled = engine.compile(step, mode="reduce-overhead")
    with logs("cudagraphs") as shown:
        for _ in range(4):
            compiled(twin, twin_opt, torch.randn(8, 64, device=DEV))
    backward = [s for s in shown if "captured for input shapes" in s and "backward graph" in s]
    assert backward and all("in forward graph" in s and "memory pool" in s for s in backward), shown


def test_gradients_accumulated_over_micro_batches_are_not_overwritten_by_the_next_forward():
    """Two forward/backward passes a step: the first backward's gradients, kept in .grad,
    live in the memory pool both graphs share while the second forward replays."""
    (model, opt), (twin, twin_opt) = twins_with_adamw()

    def micro(m, x):
        loss = m(x).pow(2).mean()
        loss.backward()
        return loss

    compiled = engine.compile(micro, mode="reduce-overhead")
    with logs("cudagraphs") as shown:
        for _ in range(6):
            xs = [torch.randn(8, 64, device=DEV) for _ in range(2)]
            for x in xs:
                torch.testing.assert_close(compiled(twin, x), micro(model, x), rtol=1e-3, atol=1e-5)
            for a, b in zip(twin.parameters(), model.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5)
            opt.step()
            twin_opt.step()
            opt.zero_grad()
            twin_opt.zero_grad()
    for a, b in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    # the second forward found the first backward's gradients alive, which were not at its
    # capture: it captured again around them, and the backward copies them out from then on
    assert any("forward graph" in s and "may lie in its scratch" in s for s in shown), shown
    assert not any("without CUDA graphs" in s for s in shown), shown
    assert len([s for s in shown if "captured for input shapes" in s]) <= 6, shown


def test_gradients_kept_from_the_last_step_stay_as_they_were():
    (model, opt), (twin, twin_opt) = twins_with_adamw()

    def grads(m, x):
        m(x).pow(2).mean().backward()
        return [p.grad for p in m.parameters()]

    compiled = engine.compile(grads, mode="reduce-overhead")
    kept = []
    for i in range(5):
        x = torch.randn(8, 64, device=DEV)
        got = compiled(twin, x)
        want = grads(model, x)
        kept.append((got, [g.clone() for g in want]))
        for p in (*twin.parameters(), *model.parameters()):
            p.grad = None          # the list returned still holds each step's gradients
    for got, want in kept:         # none was written over by a later step's graphs
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_inputs_written_in_place_and_outputs_that_alias_inputs():
    def f(x, y):
        x.add_(1)                  # the caller's x changes, as in eager
        return x.view(-1), y * 2   # the first result is a view of the caller's x

    g = engine.compile(f, mode="reduce-overhead")
    for _ in range(4):
        x, y = torch.randn(4, 4, device=DEV), torch.randn(4, 4, device=DEV)
        ex = x.clone()
        v, out = g(x, y)
        torch.testing.assert_close(x, ex + 1)
        torch.testing.assert_close(out, y * 2)
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_random_ops_draw_new_numbers_on_each_replay():
    f = engine.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) * 1, mode="reduce-overhead")
    x = torch.ones(4096, device=DEV)
    outs = [f(x) for _ in range(4)]
    assert all(((o == 0) | (o == 2)).all() for o in outs)
    assert not torch.equal(outs[2], outs[3])      # two replays: two different masks


def test_cpu_inputs_run_without_cuda_graphs_and_say_why():
    with logs("cudagraphs") as shown:
        f = engine.compile(lambda x, n: x * n, mode="reduce-overhead")
        out = f(torch.ones(4, device=DEV), torch.tensor(3.0))     # a CPU scalar tensor
    torch.testing.assert_close(out, torch.full((4,), 3.0, device=DEV))
    assert any("runs without CUDA graphs: input 1 is a cpu tensor" in s for s in shown), shown


def test_an_output_kept_past_the_backward_only_in_later_steps_keeps_its_values():
    """The first steps drop the model's output before the backward (whose capture may then
    reuse its memory); later steps keep it: the backward must not write over it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 64)).to(DEV)
    twin = copy.deepcopy(model)

    def fwd(m, x):
        out = m(x)
        return out, out.pow(2).mean()

    compiled = engine.compile(fwd, mode="reduce-overhead")
    for i in range(6):
        x = torch.randn(8, 64, device=DEV)
        out, loss = compiled(twin, x)
        want, want_loss = fwd(model, x)
        kept = out if i >= 3 else None
        del out
        loss.backward()
        want_loss.backward()
        if kept is not None:
            torch.testing.assert_close(kept, want, rtol=1e-4, atol=1e-5)
        for a, b in zip(twin.parameters(), model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5)
            a.grad = b.grad = None


def test_a_training_steps_peak_memory_with_cuda_graphs_is_that_of_the_compiled_step_without():
    """The backward's capture frees each saved activation after its last use (into the pool
    it shares with the forward), as the compiled backward does without CUDA graphs."""
    def peak(mode):
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.GELU())]).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        compiled = engine.compile(step, mode=mode)
        x = torch.randn(4096, 1024, device=DEV)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for _ in range(5):
            compiled(model, opt, x)
        torch.cuda.synchronize()
        engine.reset()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    default, graphs = peak("default"), peak("reduce-overhead")
    assert graphs <= default * 1.1, (graphs, default)


def test_an_output_kept_after_its_compiled_function_is_gone_keeps_its_values():
    """A replay's output lies in the graph's memory pool, which the allocator does not count
    as allocated: the pool stays while the output is alive, after engine.reset() too."""
    import gc
    model = mlp().eval()
    x = torch.randn(8, 64, device=DEV)
    with torch.no_grad():
        f = engine.compile(model, mode="reduce-overhead")
        for _ in range(3):
            out = None
            out = f(x)          # the third call replays: out is over the graph's own memory
        want = model(x)
    del f
    engine.reset()
    gc.collect()
    torch.cuda.empty_cache()
    junk = [torch.full((1 << 20,), 7.0, device=DEV) for _ in range(8)]   # would take freed memory
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    del junk
