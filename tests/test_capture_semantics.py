"""Compiled equals eager on small programs that stress Python semantics: guards, side
effects, graph breaks in loops / closures / methods / expressions, exceptions, generators,
containers. Each case runs eagerly and compiled on the same (deep-copied) inputs, for
every argument set in turn (later sets exercise guards and recompiles); results, raised
exception types and the inputs after the call must match."""

import collections
import copy
import dataclasses
import functools
import io
import itertools
import math
import time
import types

import pytest
import torch

import engine
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)

CASES = []


def case(*argsets):
    def register(fn):
        CASES.append(pytest.param(fn, argsets, id=fn.__name__))
        return fn
    return register


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and a.requires_grad == b.requires_grad and torch.allclose(a.detach(), b.detach(), equal_nan=True))
    if type(a) is not type(b):
        return False
    if isinstance(a, types.GeneratorType):
        return same(list(a), list(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dict__") and not callable(a):
        return same(vars(a), vars(b))
    return a == b


X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


class Obj:
    def __init__(self):
        self.v = 1
        self.t = torch.ones(2)


@dataclasses.dataclass
class DC:
    a: torch.Tensor
    n: int = 3
    tags: list = dataclasses.field(default_factory=list)


class Base:
    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v


class Child(Base):
    def __init__(self, v, w):
        super().__init__(v)
        self.w = w

    def get(self):
        return super().get() + self.w


class Scaler:
    def __init__(self, k):
        self.k = k

    def scale(self, t):
        return t * self.k

    def run(self, t):
        t = self.scale(t)
        print("scaled")
        return t + self.k


def _helper(a, *, b):
    print("helper")
    return a * b


def _deep2(t):
    print("deep")
    return t * 2


def _deep1(t):
    return _deep2(t + 1) - 1


def _gen(n):
    for i in range(n):
        yield i * 2


def _stamp():
    return time.time()


# ---------------------------------------------------------------------- guards & recompiles

@case(([X, X + 1], 2), ([X, X + 1, X + 2], 2), ([X], 3))
def list_length_and_constant(xs, n):
    return sum(xs) * n, len(xs)


@case((X,), (X.double(),), (X.int(),), (X.t(),), (X.clone().requires_grad_(),))
def dtype_stride_requires_grad(t):
    return t + 1


@case((X, 0.5), (X, 2.0), (X, -1.0))
def float_branch(t, alpha):
    y = t * alpha
    if alpha > 1.0:
        y = y - 1
    return y, alpha * 2


@case((X, True), (X, False))
def optional_value(t, flag):
    y = t if flag else None
    if y is None:
        return t.sum()
    return y.mean()


# ---------------------------------------------------------------------- side effects

@case(({"a": 1, "b": X}, X), ({"a": 2, "b": X, "c": 3}, X))
def dict_mutation(d, t):
    d["new"] = t * 2
    d.pop("a")
    return t + 1


@case((Obj(), torch.randn(2)))
def object_attribute_mutation(o, t):
    o.v += 1
    o.t = o.t * t
    return o.v, o.t


@case(([X],))
def return_mutated_input(xs):
    xs.append(1)
    return xs


@case(([0, 1, 2],))
def list_slice_assignment(xs):
    xs[1:2] = [9, 9]
    del xs[0]
    xs += [5]
    return xs


@case((X,))
def dataclass_mutation_across_break(t):
    d = DC(t)
    d.tags.append("x")
    print("mid")
    d.n += 1
    return d, d.n


# ---------------------------------------------------------------------- graph breaks

@case((X,), (X + 1,))
def print_inside_loop(t):
    acc = t
    for i in range(3):
        acc = acc * 2
        print("i", i)
        acc = acc + i
    return acc


@case((X,), (-X,))
def data_dependent_if_in_loop(t):
    for _ in range(3):
        if t.sum() > 0:
            t = t - 1
        else:
            t = t + 2
    return t


@case((torch.rand(3) * 3,))
def data_dependent_while(t):
    n = 0
    while t.sum() > 0:
        t = t - 1
        n += 1
    return t, n


@case((X,))
def live_containers_and_closure_at_break(t):
    lst = [t, t + 1]
    d = {"k": t * 2}

    def inner(u):
        return u + lst[0]

    print("mid")
    return inner(d["k"]), lst


@case((X,))
def nonlocal_across_break(t):
    count = 0

    def inc():
        nonlocal count
        count += 1

    inc()
    print("p")
    inc()
    return t * count


@case((Scaler(2), X), (Scaler(3), X))
def method_with_break(o, t):
    return o.run(t)


@case((X,))
def keyword_call_at_break(t):
    return t + _helper(t, b=2) * 2


@case((X, []))
def break_with_method_on_stack(t, lst):
    lst.append(print("z"))
    return t


@case((X,))
def break_while_building_a_list(t):
    return [t, print("a"), t + 1]


@case((X,))
def break_two_calls_deep(t):
    return _deep1(t) * 3


@case((X,))
def c_function_in_helper(t):
    y = torch.sin(t)
    return torch.cos(y) if _stamp() > 0 else y


@case((X,), (torch.ones(3),))
def item_then_branch(t):
    v = t.max().item()
    if v > 0.5:
        return t * v
    return t


@case((X,))
def break_inside_comprehension(t):
    return [print(i) or t * i for i in range(2)]


@case((X,))
def raise_after_break(t):
    print("before")
    raise KeyError("boom")


@case((torch.randn(3, requires_grad=True),))
def break_inside_no_grad_block(t):
    with torch.no_grad():
        y = t * 2
        print("in")
        z = y + 1
    return z, torch.is_grad_enabled()


# ---------------------------------------------------------------------- Python semantics

@case((X, 0), (X, 2))
def exception_caught_in_frame(t, k):
    try:
        if k == 0:
            raise ValueError("zero")
        r = t / k
    except ValueError:
        r = t
    return r


@case((X.clone(),))
def finally_runs_after_return_value(t):
    try:
        return t + 1
    finally:
        t.mul_(2)


@case((X, 2), (X, -1))
def assert_statement(t, n):
    assert n > 0, "n must be positive"
    return t * n


@case((X,))
def inheritance_and_super(t):
    b = Child(t, 2)
    return b.get(), b


@case((X,))
def generators_consumed_and_returned(t):
    return t * sum(_gen(3)), list(_gen(2)), (i for i in range(3))


@case((X,))
def zip_enumerate_map_objects(t):
    return list(zip([t, t], [1, 2])), dict(enumerate([t])), list(map(lambda v: v + 1, [t]))


@case(({"b": 2, "a": 1, "c": 0},))
def dict_iteration(d):
    return sorted(d.items()), [k for k in d], {v: k for k, v in d.items()}, max(d, key=d.get), d.keys()


@case((X,))
def strings_math_itertools(t):
    s = "a,b,c".split(",")
    j = "-".join(s)
    prod = [a * b for a, b in itertools.product([1, 2], [3])]
    return t * len(j), j.replace("-", "+"), f"{j!r}:{3:>4}", math.floor(2.7), prod, "%s-%d" % ("x", 2)


@case((X, 3), (X, 9))
def loop_control(t, n):
    out = []
    for i in range(n):
        if i % 2:
            continue
        if i > 4:
            break
        out.append(t[i % 3] * i)
    else:
        out.append(t[0])
    return out


@case((X,))
def functools_partial_and_reduce(t):
    add = functools.partial(torch.add, alpha=2)
    return add(t, t), functools.reduce(lambda a, b: a * b, [t, t, 2])


P = collections.namedtuple("P", "a b")


@case((X,))
def namedtuple_and_ordereddict(t):
    d = collections.OrderedDict()
    d["z"] = t
    d["a"] = t * 2
    return P(t, 1)._replace(b=2), d


@case((X,))
def tensor_iteration_and_indexing(t):
    rows = [row.sum() for row in t]
    return torch.stack(rows), t[None, ..., 1:], t[[0, 1]], t[t > 0]


@case((X,))
def multi_output_ops(t):
    vals, idx = t.max(dim=0)
    return vals, idx, t.topk(2).indices, t.chunk(2, dim=1), torch.unbind(t)


@pytest.mark.parametrize("fn,argsets", CASES)
def test_compiled_equals_eager(fn, argsets, capsys):
    compiled = engine.compile(fn, backend="eager")
    for args in argsets:
        eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
        try:
            expected, expected_exc = fn(*eager_args), None
        except Exception as exc:  # noqa: BLE001 - the program's own error
            expected, expected_exc = None, type(exc)
        if expected_exc is not None:
            with pytest.raises(expected_exc):
                compiled(*compiled_args)
            continue
        got = compiled(*compiled_args)
        assert same(expected, got), f"{fn.__name__}{args!r:.80}: eager {expected!r:.200} compiled {got!r:.200}"
        assert same(eager_args, compiled_args), f"{fn.__name__}: inputs after the call differ"


def test_globals_closures_and_class_attributes_are_read_fresh():
    scale = [2]

    def make():
        def g(t):
            return t * scale[0]
        return g

    g = engine.compile(make(), backend="eager")
    g(X)
    scale[0] = 7
    assert same(g(X), X * 7)

    class Counter:
        n = 0

    def bump(t):
        Counter.n += 1
        return t * Counter.n

    compiled = engine.compile(bump, backend="eager")
    assert same(compiled(X), X) and Counter.n == 1
    assert same(compiled(X), X * 2) and Counter.n == 2


def test_modules_nested_compiled_functions_and_hooks():
    lin = torch.nn.Linear(4, 4)
    inner = engine.compile(lambda t: t * 2, backend="eager")
    compiled_lin = engine.compile(lin, backend="eager")

    def outer(t):
        return inner(t) + compiled_lin(t)

    out = engine.explain(outer)(X)
    assert out.graph_count == 1
    assert same(engine.compile(outer, backend="eager")(X), outer(X))
    hooked = torch.nn.Linear(4, 4)
    hooked.register_forward_hook(lambda mod, i, o: o * 0)
    assert same(engine.compile(hooked, backend="eager")(X), hooked(X))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_view_made_under_no_grad_whose_base_changed_in_place_crosses_a_break(backend):
    """Under no_grad, `t = x[:n]` and then `x.relu_()`: autograd refuses to describe t from
    then on (`t.is_leaf` raises), which broke turning it into a graph input after the next
    graph break (fuzz seed 84089). Eager uses its values; so does the engine."""
    sink = io.StringIO()

    def f(x, y):
        n = int((y > 0).sum())                 # a break: what follows is a resume function
        t = x[:n + 1]
        acc = t * 2
        x.relu_()
        print("t", t.shape, file=sink)         # another break: t is an input of the next graph
        return {"acc": acc, "t": t}

    x0 = torch.randn(5, 7, requires_grad=True)
    x1, x2 = x0.clone(), x0.clone()            # made with grad on: not leaves, requiring grad
    y = torch.randn(5, 7)
    with torch.no_grad():
        want = f(x1, y)
        got = engine.compile(f, backend=backend)(x2, y)
    for k in want:      # compared detached: autograd refuses these views in eager too
        torch.testing.assert_close(got[k].detach(), want[k].detach())
    torch.testing.assert_close(x2.detach(), x1.detach())


def test_a_profiler_range_changes_no_value_and_breaks_no_graph():
    """`with torch.profiler.record_function(name):` around traced code: one graph, eager's
    values (the range itself is not recorded inside compiled code, as under torch.compile)."""
    def f(x):
        with torch.profiler.record_function("scale"):
            y = x.sin() * 2
        with torch.autograd.profiler.record_function("shift") as rf:
            y = y + 1
        return y, rf is not None

    x = torch.randn(4, 3)
    report = engine.explain(f)(x)
    assert (report.graph_count, report.break_reasons) == (1, [])
    assert same(engine.compile(f, backend="eager")(x), f(x))


def test_a_break_inside_a_profiler_range_resumes_inside_it():
    """A graph break inside a record_function block (and a no_grad block within it) splits
    the frame as torch.compile does: 3 graphs, 2 breaks, not a frame left uncompiled; eager's
    values, the grad mode restored, an exception raised after the break propagates."""
    def f(x):
        y = x * 2
        with torch.profiler.record_function("block"):
            y = y + 1
            print("one", file=io.StringIO())
            y = y * 3
            with torch.no_grad():
                z = y.cos()
                print("two", file=io.StringIO())
                z = z + 1
        return y.sin() + z

    def g(x):
        with torch.profiler.record_function("raising"):
            y = x + 1
            print("three", file=io.StringIO())
            raise ValueError(f"boom {y.shape[0]}")

    x = torch.randn(4, requires_grad=True)
    report = engine.explain(f)(x)
    assert (report.graph_count, report.graph_break_count) == (3, 2), report
    assert same(engine.compile(f, backend="eager")(x), f(x)) and torch.is_grad_enabled()
    with pytest.raises(ValueError, match="boom 4"):
        engine.compile(g, backend="eager")(x)
