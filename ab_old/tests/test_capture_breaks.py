"""Graph breaks: the graph so far is compiled, the unsupported code runs eagerly, a
resume function (compiled in turn) continues. fullgraph=True refuses instead."""

import time

import pytest
import torch

import engine
from engine.capture import graph_breaks
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)


def test_print_splits_the_function_into_two_graphs(capsys):
    def fn(x):
        y = torch.sin(x) + 1
        print("checkpoint", y.shape)
        return torch.cos(y) * 2

    x = torch.randn(4, 4)
    out = engine.explain(fn)(x)
    assert (out.graph_count, out.graph_break_count) == (2, 1)
    [reason] = out.break_reasons
    assert reason.graph_break_id == "GB0001" and "print" in reason.reason
    assert reason.user_stack[-1][1] == fn.__code__.co_firstlineno + 2
    assert "reorderable_logging_functions" in reason.hint
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), fn(x))
    assert "checkpoint" in capsys.readouterr().out


def test_data_dependent_branch_takes_the_right_side_each_call():
    def fn(x):
        y = x * 2
        if y.sum() > 0:
            return y + 1
        return y - 1

    compiled = engine.compile(fn, backend="eager")
    pos, neg = torch.rand(3) + 0.1, -torch.rand(3) - 0.1
    torch.testing.assert_close(compiled(pos), pos * 2 + 1)
    torch.testing.assert_close(compiled(neg), neg * 2 - 1)
    out = engine.explain(fn)(pos)
    assert out.break_reasons[0].graph_break_id == "GB0003"
    assert "torch.cond" in out.break_reasons[0].hint


def test_break_inside_a_helper_breaks_at_the_call_site_and_compiles_the_helper():
    def stamp():
        return time.time()

    def fn(x):
        y = torch.sin(x)
        ok = stamp() > 0
        return torch.cos(y) if ok else y

    x = torch.randn(3)
    out = engine.explain(fn)(x)
    assert (out.graph_count, out.graph_break_count) == (2, 1)
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), torch.cos(torch.sin(x)))


def test_break_inside_a_loop_keeps_the_loop_state(capsys):
    def fn(x):
        acc = x
        for i in range(3):
            acc = acc * 2
            print("step", i)
            acc = acc + i
        return acc

    x = torch.randn(2)
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), fn(x))
    assert capsys.readouterr().out.count("step") == 6


def test_item_breaks_unless_asked_and_graph_break_forces_one():
    def fn(x):
        s = x.relu().sum().item()
        engine.graph_break()
        return x * s

    x = torch.randn(5)
    out = engine.explain(fn)(x)
    assert [r.graph_break_id for r in out.break_reasons] == ["GB0004", "GB0005"]
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), fn(x))


def test_disabled_function_runs_eagerly_and_breaks_the_graph():
    calls = []

    @engine.disable
    def side(t):
        calls.append(t.shape)
        return t + 1

    def fn(x):
        return side(x * 2) * 3

    x = torch.randn(2)
    out = engine.explain(fn)(x)
    assert out.break_reasons[0].graph_break_id == "GB0006"
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), (x * 2 + 1) * 3)


def test_reorderable_logging_functions_do_not_break(capsys):
    def fn(x):
        y = x + 1
        print("value shape", y.shape)
        return y * 2

    with engine.config.patch(reorderable_logging_functions={print}):
        out = engine.explain(fn)(torch.ones(2))
        assert (out.graph_count, out.graph_break_count) == (1, 0)
    assert "value shape torch.Size([2])" in capsys.readouterr().out


def test_fullgraph_names_the_user_line_and_reason():
    def fn(x):
        y = torch.exp(x)
        print("not allowed")
        return y

    compiled = engine.compile(fn, backend="eager", fullgraph=True)
    with pytest.raises(engine.Unsupported) as info:
        compiled(torch.randn(3))
    text = str(info.value)
    assert f"{__file__}:{fn.__code__.co_firstlineno + 2}" in text
    assert "GB0001" in text and 'print("not allowed")' in text


def test_every_registry_entry_has_an_id_reason_explanation_and_hint():
    ids = [k.id for k in graph_breaks.KINDS]
    assert len(ids) == len(set(ids))
    for k in graph_breaks.KINDS:
        assert k.id.startswith("GB") and k.reason and k.explanation and k.hint


def test_docs_list_the_registry():
    import pathlib
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "graph_breaks.md").read_text()
    assert graph_breaks.render_markdown() in doc
