"""The hit path of a compiled call (engine/capture/runtime.py): which cache entry a call
tries first, and that the shortcuts taken on it (should_compile cached per code, the
per-thread disabled flag) change nothing a user can see."""

import inspect
import threading

import pytest
import torch

import engine
from engine import config
from engine.capture import runtime
from engine_helpers import cache_entries as entries, fresh_engine  # noqa: F401 (fresh_engine: autouse)


def served_by(f, orig, *args):
    """Call the compiled `f` and return (its result, the compile id of the entry that ran)."""
    ran = []
    saved = [(e, e.fn) for e in entries(orig)]
    for e, fn in saved:
        e.fn = (lambda fn, cid: lambda *a: ran.append(cid) or fn(*a))(fn, e.compile_id)
    try:
        out = f(*args)
    finally:
        for e, fn in saved:
            e.fn = fn
    return out, ran


def double(x):
    return x * 2


def test_the_newer_more_general_entry_serves_sizes_the_older_one_also_matches():
    f = engine.compile(double, backend="eager")
    f(torch.randn(3))
    f(torch.randn(4))                       # automatic dynamic: entry 0/1 has a symbolic size
    assert [e.compile_id for e in entries(double)] == ["0/0", "0/1"]
    x = torch.randn(3)                      # both entries match; the newest is tried first
    out, ran = served_by(f, double, x)
    assert ran == ["0/1"] and torch.equal(out, x * 2)


def scale(x, c):
    return x * c


def test_a_hit_on_an_older_entry_moves_it_to_the_front_and_still_gives_its_answer():
    f = engine.compile(scale, backend="eager")
    x = torch.randn(3)
    f(x, 0.5)
    f(x, 1.5)                               # a float constant: one entry per value
    out, ran = served_by(f, scale, x, 0.5)
    assert ran == ["0/0"] and torch.equal(out, x * 0.5)
    assert [e.compile_id for e in runtime.cache_for(scale.__code__).lookup[f._engine_opts.key]] == ["0/0", "0/1"]
    # the compile order (recompile reasons, explain) is unchanged
    assert [e.compile_id for e in entries(scale)] == ["0/0", "0/1"]
    out, ran = served_by(f, scale, x, 1.5)
    assert ran == ["0/1"] and torch.equal(out, x * 1.5)
    assert len(entries(scale)) == 2        # no entry was compiled again


def test_each_compile_option_set_has_its_own_entries():
    eager = engine.compile(double, backend="eager")
    aot = engine.compile(double, backend="aot_eager")
    x = torch.randn(3)
    assert torch.equal(eager(x), x * 2) and torch.equal(aot(x), x * 2)
    assert len(entries(double)) == 2
    _, ran = served_by(aot, double, x)
    assert ran == ["0/1"]


def test_a_function_inside_torch_is_not_compiled_unless_forced():
    # the answer is cached per code object: ask twice, both ways
    fn = torch.nn.functional.softsign
    for _ in range(2):
        assert runtime.should_compile(fn) is False
        assert runtime.should_compile(fn, force=True) is True
        assert runtime.should_compile(double) is True


def test_disable_and_debug_function_are_read_on_every_call():
    f = engine.compile(double, backend="eager")
    x = torch.randn(3)
    f(x)
    double._engine_disabled = True          # what engine.disable marks its wrapper with
    try:
        out, ran = served_by(f, double, x)
        assert ran == [] and torch.equal(out, x * 2)
    finally:
        del double._engine_disabled
    old = config.debug_function
    config.debug_function = "something_else"
    try:
        out, ran = served_by(f, double, x)
        assert ran == [] and torch.equal(out, x * 2)
    finally:
        config.debug_function = old
    _, ran = served_by(f, double, x)
    assert ran == ["0/0"]


def test_a_disabled_region_in_one_thread_does_not_disable_another():
    f = engine.compile(double, backend="eager")
    x = torch.randn(3)
    f(x)
    seen = []
    with runtime.disabled_region():
        assert served_by(f, double, x)[1] == []
        t = threading.Thread(target=lambda: seen.append(served_by(f, double, x)[1]))
        t.start()
        t.join()
    assert seen == [["0/0"]]
    assert served_by(f, double, x)[1] == ["0/0"]


@pytest.mark.parametrize("native", [False, True], ids=["python", "c++"])
def test_guards_walk_to_each_module_once_per_check(monkeypatch, native):
    """A model's guards (its parameters' TENSOR_MATCH, its modules' attributes) read each
    module on the way once per check, not once per guard, and through the module's own dicts
    (`_modules['0']`, `_parameters['weight']`), never Module.__getattr__, in the generated
    Python and in the C++ program alike; a changed parameter still fails."""
    from engine.guards import native as cpp
    from engine.guards.program import OPS
    if native and not cpp.wait(timeout=600):
        pytest.skip(f"the C++ guard checker did not build here: {cpp.build_error()}")
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
                                  for _ in range(3)])

    def fwd(m, x):
        return m(x)

    with config.patch(native_guards=native):
        f = engine.compile(fwd, backend="eager")
        x = torch.randn(2, 4)
        f(model, x)
    (entry,) = runtime.cache_for(fwd.__code__).entries
    calls = []
    real = torch.nn.Module.__getattr__
    monkeypatch.setattr(torch.nn.Module, "__getattr__", lambda self, name: calls.append(name) or real(self, name))
    assert entry.guards.check({"m": model, "x": x}, fwd.__globals__)
    assert calls == []
    if native:
        reads = [(OPS[op], a) for op, _, _, _, _, a, _, _ in entry.guards.program.code]
        assert "___program(L, G)" in entry.guards.code
        assert reads.count(("ATTR", "_modules")) == 4 and ("ITEM", "1") in reads and ("ITEM", "weight") in reads
    else:
        assert "._modules['1']" in entry.guards.code and "._parameters['weight']" in entry.guards.code
    monkeypatch.undo()
    model[1][0].weight = torch.nn.Parameter(torch.randn(4, 5))
    assert not entry.guards.check({"m": model, "x": x}, fwd.__globals__)


def test_an_optimizer_steps_guards_look_up_each_parameters_state_once(monkeypatch):
    """AdamW's step reads `self.state[p]` for every parameter; the guards key that lookup by
    the parameter they already read (no second walk to it) and hash each parameter once per
    check; a state tensor that changed still fails."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = engine.compile(opt.step, backend="eager")
    model(torch.randn(3, 4)).sum().backward()
    step()
    step()
    (entry,) = [e for c in runtime._CACHES.values() for e in c.entries
                if any(".state" in g.source for g in e.guards.guards)]
    frame = {"self": opt, "closure": None}
    step_globals = inspect.unwrap(type(opt).step).__globals__
    with torch.no_grad():
        assert entry.guards.check(frame, step_globals)
        hashed = []
        real = torch.Tensor.__hash__
        monkeypatch.setattr(torch.Tensor, "__hash__", lambda t: hashed.append(1) or real(t))
        assert entry.guards.check(frame, step_globals)
        monkeypatch.undo()
        assert len(hashed) == 4          # one state lookup per parameter
        if entry.guards.program is not None and "___program" in entry.guards.code:    # the C++ checker
            from engine.guards.program import OPS
            assert [OPS[i[0]] for i in entry.guards.program.code].count("ITEM_REG") == 4
        else:
            assert "state)) is" in entry.guards.code and "[___p" in entry.guards.code
        opt.state[model[0].weight]["exp_avg"] = torch.zeros(5, 4)
        assert not entry.guards.check(frame, step_globals)
