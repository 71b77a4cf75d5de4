"""TORCH_LOGS=guards: each compiled frame's guards as PyTorch's TREE_GUARD_MANAGER, one
manager per source nested by access path, shape guards as LAMBDA_GUARDs at the end; and
the tree renderer on its own over Guard data."""

import contextlib

import torch

import engine
import observe
from engine.guards import Guard, TensorMeta
from engine.guards.tree import render_guard_tree
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)


@contextlib.contextmanager
def guard_logs():
    out = []
    sink = observe.subscribe(lambda e: out.append(e.payload_fn()), logs=["guards"])
    try:
        yield out
    finally:
        observe.unsubscribe(sink)


def fn(x):
    return x + 1


def test_a_tensor_input_gets_a_manager_and_a_tensor_match_at_its_first_use():
    f = engine.compile(fn, backend="eager")
    with guard_logs() as trees:
        f(torch.randn(3, 3))
    lines = trees[0].splitlines()
    assert lines[1:3] == ["TREE_GUARD_MANAGER:", "+- RootGuardManager"]
    assert lines[3].startswith("| +- GLOBAL_STATE: ___check_global_state() against grad_mode=True,")
    assert lines[4] == ("| +- GuardManager: source=L['x'], accessed_by=FrameLocalsGuardAccessor(key='x'), "
                        "type=<class 'torch.Tensor'>")
    assert lines[5].startswith("| | +- TENSOR_MATCH: check_tensor(L['x'], Tensor, torch.float32, device=cpu, "
                               "requires_grad=False, size=[3, 3], stride=[3, 1])")
    assert lines[5].endswith(f"  # return x + 1  # test_guards_tree.py:{fn.__code__.co_firstlineno + 1} in fn")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = "relu"

    def forward(self, x):
        if self.act == "relu":
            return torch.relu(self.lin(x))
        return self.lin(x)


def test_module_attributes_nest_under_their_owner():
    with guard_logs() as trees:
        engine.compile(Block(), backend="eager")(torch.randn(2, 4))
    tree = trees[0]
    i_self = tree.index("| +- GuardManager: source=L['self'], accessed_by=FrameLocalsGuardAccessor(key='self')")
    i_lin = tree.index("| | +- GuardManager: source=L['self'].lin, accessed_by=GetAttrGuardAccessor(lin)")
    assert i_self < i_lin
    assert "| | +- GuardManager: source=L['self'].act, accessed_by=GetAttrGuardAccessor(act)" in tree
    assert "L['self'].act == 'relu'" in tree


def test_globals_nest_under_G_and_shape_guards_come_last():
    def two(x, y):
        return torch.cat([x, y]).sum() * x.shape[0]

    f = engine.compile(two, backend="eager", dynamic=True)
    with guard_logs() as trees:
        f(torch.randn(3, 2), torch.randn(3, 2))
    lines = trees[0].splitlines()
    assert "| +- GuardManager: source=G, accessed_by=GlobalsGuardAccessor, type=<class 'dict'>" in lines
    assert any(l.startswith("| | +- GuardManager: source=G['torch'], accessed_by=DictGetItemGuardAccessor('torch')")
               for l in lines)
    lambdas = [l for l in lines if l.startswith("+- LAMBDA_GUARD: ")]
    assert lines[-len(lambdas):] == lambdas
    texts = [l[len("+- LAMBDA_GUARD: "):].split("  #")[0] for l in lambdas]
    assert "L['y'].size()[0] == L['x'].size()[0]" in texts
    assert "2 <= L['x'].size()[0]" in texts


def test_the_renderer_works_on_plain_guard_data():
    meta = TensorMeta(torch.Tensor, torch.float32, torch.device("cpu"), (3,), (1,), False)
    guards = [
        Guard("TENSOR_MATCH", "L['xs'][0]", meta, ("script.py", 6, "fn", "return xs[0] + 1")),
        Guard("LENGTH_CHECK", "L['xs']", 2),
        Guard("TYPE_MATCH", "L['xs']", list),
        Guard("EQUALS_MATCH", "L['cfg']['k']", 3),
        Guard("DICT_KEYS", "L['cfg']", ("k",)),
        Guard("SHAPE_ENV", "", "2 <= L['xs'][0].size()[0]"),
    ]
    assert render_guard_tree(guards).splitlines()[1:] == [
        "TREE_GUARD_MANAGER:",
        "+- RootGuardManager",
        "| +- GuardManager: source=L['xs'], accessed_by=FrameLocalsGuardAccessor(key='xs'), type=<class 'list'>",
        "| | +- LENGTH_CHECK: len(L['xs']) == 2",
        "| | +- TYPE_MATCH: type(L['xs']) is list",
        "| | +- GuardManager: source=L['xs'][0], accessed_by=GetItemGuardAccessor(0), type=<class 'torch.Tensor'>",
        "| | | +- TENSOR_MATCH: check_tensor(L['xs'][0], Tensor, torch.float32, device=cpu, requires_grad=False, "
        "size=[3], stride=[1])  # return xs[0] + 1  # script.py:6 in fn",
        "| +- GuardManager: source=L['cfg'], accessed_by=FrameLocalsGuardAccessor(key='cfg')",
        "| | +- DICT_KEYS: list(L['cfg'].keys()) == ['k']",
        "| | +- GuardManager: source=L['cfg']['k'], accessed_by=GetItemGuardAccessor('k'), type=<class 'int'>",
        "| | | +- EQUALS_MATCH: L['cfg']['k'] == 3",
        "+- LAMBDA_GUARD: 2 <= L['xs'][0].size()[0]",
    ]
