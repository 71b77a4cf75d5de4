"""Guards checked in one C++ call (engine/guards/native.py, program.py): the same answers
as the generated Python tests, for every property a tensor guard reads and every change to
a module a guard watches, and a graph is reused exactly when it would be with the Python
guards."""

import copy

import pytest
import torch

import engine
from engine import config
from engine.guards import native
from engine_helpers import cache_entries as entries, fresh_engine  # noqa: F401 (fresh_engine: autouse)


@pytest.fixture(autouse=True)
def native_built():
    if not native.wait(timeout=600):
        pytest.skip(f"the C++ tensor checker did not build here: {native.build_error()}")


def scale(x, w):
    return x * w.sum()


def compiles(f, *args):
    """How many graphs a call of f compiles, and its result."""
    before = len(entries(scale))
    out = f(*args)
    return len(entries(scale)) - before, out


def test_every_tensor_property_a_guard_reads_is_checked_in_cpp():
    f = engine.compile(scale, backend="eager", dynamic=False)
    x, w = torch.randn(4, 3), torch.nn.Parameter(torch.randn(3))
    assert compiles(f, x, w)[0] == 1
    assert all("___program(L, G)" in e.guards.code for e in entries(scale)), entries(scale)[0].guards.code
    assert compiles(f, torch.randn(4, 3), w)[0] == 0                  # new values: the same graph
    changed = {
        "dtype": (x.double(), w),
        "size": (torch.randn(5, 3), w),
        "stride": (torch.randn(3, 4).t(), w),
        "requires_grad": (x.clone().requires_grad_(), w),
        "type": (x, w.detach().clone()),                              # a Tensor where a Parameter was
    }
    for what, args in changed.items():
        n, out = compiles(f, *args)
        assert n == 1, what                                          # each one recompiles
        torch.testing.assert_close(out, scale(*args))
        assert compiles(f, *args)[0] == 0, what                       # and is then served


def test_a_symbolic_size_is_left_to_the_shape_guards():
    f = engine.compile(scale, backend="eager", dynamic=True)
    w = torch.randn(3)
    assert compiles(f, torch.randn(4, 3), w)[0] == 1
    for n in (5, 9, 2):
        got, out = compiles(f, torch.randn(n, 3), w)
        assert got == 0 and out.shape == (n, 3)
    assert compiles(f, torch.randn(4, 3).double(), w.double())[0] == 1   # still checked: the dtype


def test_switched_off_the_guards_stay_python():
    with config.patch(native_guards=False):
        f = engine.compile(scale, backend="eager")
        f(torch.randn(2, 3), torch.randn(3))
    code = entries(scale)[0].guards.code
    assert "___program" not in code and ".stride() ==" in code


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.scale = 2.0
        self.opts = {"act": "relu"}

    def forward(self, x):
        y = self.norm(self.lin(x)) * self.scale
        if self.opts["act"] == "relu":
            y = y.relu()
        return y * 2 if hasattr(self, "doubled") else y


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def run(m, x):
    return m(x)


def python_check(compiled):
    """The same guards as generated Python alone (the fast path before the C++ switch)."""
    from engine.guards.check import _conditions, _source
    from engine.guards.chains import SharedPrefixes
    ns = dict(compiled.namespace)
    exec(compile(_source(_conditions(compiled.guards, range(len(compiled.guards)), ns, SharedPrefixes())),
                 "<python guards>", "exec"), ns)
    return ns["___check_guards"]


def change(what):
    """A fresh copy of the model and input with one thing changed."""
    def wrap(m, x):
        m, x = copy.deepcopy(m), x.clone()
        what(m, x)
        return m, x
    return wrap


CHANGES = {
    "nothing": lambda m, x: None,
    "a float attribute's value": lambda m, x: setattr(m.blocks[1], "scale", 3.0),
    "a float attribute's type": lambda m, x: setattr(m.blocks[1], "scale", 2),
    "a dict's keys": lambda m, x: m.blocks[0].opts.update(gate=1),
    "a dict's value": lambda m, x: m.blocks[0].opts.update(act="gelu"),
    "an attribute added": lambda m, x: setattr(m.blocks[2], "doubled", True),
    "a submodule added": lambda m, x: setattr(m.blocks[2], "doubled", torch.nn.Identity()),
    "a buffer added": lambda m, x: m.blocks[1].register_buffer("doubled", torch.ones(())),
    "a parameter added": lambda m, x: setattr(m.blocks[0], "doubled", torch.nn.Parameter(torch.ones(()))),
    "a module appended": lambda m, x: m.blocks.append(Block()),
    "a module replaced": lambda m, x: setattr(m.blocks[1], "norm", torch.nn.Identity()),
    "a module's setting": lambda m, x: setattr(m.blocks[0].norm, "eps", 1e-3),
    "a weight's strides": lambda m, x: setattr(m.blocks[1].lin, "weight", torch.nn.Parameter(torch.randn(4, 4).t())),
    "a weight's requires_grad": lambda m, x: m.blocks[2].lin.bias.requires_grad_(False),
    "a buffer where a parameter was": lambda m, x: delattr(m.blocks[0].lin, "weight") or
    m.blocks[0].lin.register_buffer("weight", torch.randn(4, 4)),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_the_program_answers_as_the_python_guards_do(what):
    """One C++ program checks nearly every guard of a model (module types, attribute values,
    dict keys, hasattr, lengths, tensors); for each change to the model it says what the
    generated Python says, and a changed model recompiles with eager's result."""
    model, x = Net(), torch.randn(2, 4)
    f = engine.compile(run, backend="eager")
    f(model, x)
    compiled = entries(run)[0].guards
    assert compiled.program is not None and "___program(L, G)" in compiled.code
    assert len(compiled.program.native) >= len(compiled.guards) - 1    # all but the global state
    m, y = change(CHANGES[what])(model, x)
    L, G = {"m": m, "x": y}, run.__globals__
    assert compiled.check(L, G) == python_check(compiled)(L, G)
    assert compiled.check(L, G) is (what == "nothing"), what
    torch.testing.assert_close(f(m, y), run(m, y))


def test_two_arguments_that_are_one_tensor_are_told_apart():
    """The aliasing guards (one tensor passed twice, or two distinct ones) run in the program too."""
    def add(a, b):
        return a + b

    f = engine.compile(add, backend="eager")
    x, y = torch.randn(3), torch.randn(3)
    f(x, y)
    f(x, x)
    for e in entries(add):
        for args in ((x, y), (x, x)):
            L = {"a": args[0], "b": args[1]}
            assert e.guards.check(L, add.__globals__) == python_check(e.guards)(L, add.__globals__)
    assert sorted(e.guards.check({"a": x, "b": x}, add.__globals__) for e in entries(add)) == [False, True]


def test_a_class_changed_after_compiling_is_read_again():
    """`hasattr(module, name)` is answered from the module's dicts while its class is the one
    compiled against; a class given the attribute afterwards changes the answer."""
    model, x = Net(), torch.randn(2, 4)
    f = engine.compile(run, backend="eager")
    f(model, x)
    compiled = entries(run)[0].guards
    L, G = {"m": model, "x": x}, run.__globals__
    assert compiled.check(L, G)
    Block.doubled = True
    try:
        assert compiled.check(L, G) is False and python_check(compiled)(L, G) is False
        torch.testing.assert_close(f(model, x), run(model, x))
    finally:
        del Block.doubled
    assert compiled.check(L, G)


class Dynamic(torch.nn.Module):
    """A module whose own __getattr__ makes up an attribute."""

    def __getattr__(self, name):
        if name == "extra" and self.__dict__.get("on"):
            return 1
        return super().__getattr__(name)

    def forward(self, x):
        return x * 2 if hasattr(self, "extra") else x


def test_a_module_with_its_own_getattr_is_asked_the_usual_way():
    """`hasattr` on a module whose class has its own __getattr__ is asked through it: the
    answer from the module's dicts would miss the attribute it makes up."""
    from engine.guards.program import OPS

    m, x = Dynamic(), torch.randn(3)
    f = engine.compile(run, backend="eager")
    torch.testing.assert_close(f(m, x), x)
    ops = [OPS[i[0]] for i in entries(run)[0].guards.program.code]
    assert "HASATTR" in ops and "MODULE_HASATTR" not in ops
    m.on = True
    torch.testing.assert_close(f(m, x), x * 2)


class Gained(Block):
    gain = 1                     # a class-level default the forward reads

    def forward(self, x):
        return super().forward(x) * self.gain


class GainedNet(Net):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Gained() for _ in range(3)])


IN_PLACE = {
    **CHANGES,
    "a value written through __dict__": lambda m, x: vars(m.blocks[1]).__setitem__("scale", 4.0),
    "a class-level default changed": lambda m, x: setattr(Gained, "gain", 2),
    "an instance value over a class default": lambda m, x: setattr(m.blocks[0], "gain", 3),
    "a property over an instance value": lambda m, x: setattr(Gained, "scale", property(lambda self: 5.0)),
    "a module's class swapped": lambda m, x: setattr(m.blocks[1], "__class__", Block),
}


@pytest.mark.parametrize("what", list(IN_PLACE))
def test_a_change_made_in_place_after_passing_checks_fails_them(what):
    """The checker replays the reads of its last passing run through dicts whose version tags
    have not changed since; the same model changed in place after two passing calls fails
    the guards as the Python guards do, and the call gives eager's result."""
    model, x = GainedNet(), torch.randn(2, 4)
    f = engine.compile(run, backend="eager")
    f(model, x)
    f(model, x)
    compiled = entries(run)[0].guards
    L, G = {"m": model, "x": x}, run.__globals__
    assert compiled.check(L, G) and compiled.check(L, G)
    saved = dict(vars(Gained))
    try:
        IN_PLACE[what](model, x)
        assert compiled.check(L, G) == python_check(compiled)(L, G)
        assert compiled.check(L, G) is (what == "nothing"), what
        torch.testing.assert_close(f(model, x), run(model, x))
    finally:
        for name in set(vars(Gained)) - set(saved):
            delattr(Gained, name)
        for name, value in saved.items():
            if vars(Gained).get(name) is not value and not name.startswith("__"):
                setattr(Gained, name, value)


def test_a_second_check_replays_the_reads_of_the_first():
    """A model's guards read its modules through dicts (`_modules`, `_parameters`, each
    module's `__dict__`); a check of the unchanged model replays those reads instead of
    looking each one up (on 3.13 an object's attributes live outside its dict, so only
    the plain dicts' reads are replayed)."""
    import sys

    model, x = Net(), torch.randn(2, 4)
    f = engine.compile(run, backend="eager")
    f(model, x)
    compiled = entries(run)[0].guards
    program = compiled.check.__globals__["___program"]
    L, G = {"m": model, "x": x}, run.__globals__
    assert compiled.check(L, G)
    before = program.counts()
    assert compiled.check(L, G)
    replayed, looked_up = (a - b for a, b in zip(program.counts(), before))
    assert replayed > 0
    if sys.version_info < (3, 13):
        assert looked_up == 0


def test_models_made_and_dropped_in_turn_are_told_apart():
    """A model made after another was freed may take its objects' addresses; the replayed
    reads are keyed by dict version tags, which no two dicts share, so the new model's
    settings are read, never the old one's."""
    f = engine.compile(run, backend="eager")
    x = torch.randn(2, 4)
    for i in range(24):
        m = GainedNet()
        m.blocks[1].scale = (2.0, 3.0)[i % 2]
        m.blocks[0].opts["act"] = ("relu", "gelu")[i // 2 % 2]
        torch.testing.assert_close(f(m, x), run(m, x))
        del m
    assert len(entries(run)) == 4
