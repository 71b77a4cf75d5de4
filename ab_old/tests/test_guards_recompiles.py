"""Recompiles: what TORCH_LOGS=recompiles / recompiles_verbose show, the cache limits and
the eager fallback after them, and the guard tree and reasons in TORCH_TRACE."""

import glob
import json
import os
import warnings

import torch

import engine
from observe import trace
from engine_helpers import cache_entries as entries, fresh_engine, logs  # noqa: F401 (fresh_engine: autouse)


def fn(x):
    return x * 2 + 1


def test_a_size_change_is_explained_with_the_failing_guard():
    f = engine.compile(fn, backend="eager", dynamic=False)
    f(torch.randn(3, 3))
    with logs("recompiles") as lines:
        f(torch.randn(4, 3))
    assert lines == [
        f"Recompiling function fn in {__file__}:{fn.__code__.co_firstlineno}\n"
        "    triggered by the following guard failure(s):\n"
        "    - 0/0: tensor 'L['x']' size mismatch at index 0. expected 3, actual 4"
        "  # return x * 2 + 1  # test_guards_recompiles.py:17 in fn"]


def scale(x, c):
    return x * c


def test_a_new_float_constant_recompiles_and_the_log_says_which():
    f = engine.compile(scale, backend="eager")
    x = torch.randn(3)
    f(x, 0.5)
    with logs("recompiles") as lines:
        f(x, 1.5)
        f(x, torch.tensor(2.5))       # a tensor is not specialized on its value
        f(x, torch.tensor(3.5))
    assert len(lines) == 2
    line = scale.__code__.co_firstlineno + 1
    assert f"- 0/0: L['c'] == 0.5: expected 0.5, got 1.5  # return x * c  # test_guards_recompiles.py:{line} in scale" \
        in lines[0]
    assert len(entries(scale)) == 3


def blend(x, y, c):
    out = x * c            # the float guard is made here
    return out + y         # the shape relation between x and y is made here


def test_every_failing_guard_of_every_entry_says_expected_got_and_where():
    f = engine.compile(blend, backend="eager", dynamic=True)
    f(torch.randn(4), torch.randn(4), 2.5)
    with logs("recompiles") as lines:
        f(torch.randn(6), torch.randn(1), 3.0)      # y broadcasts now, and c changed
    line = blend.__code__.co_firstlineno
    assert lines[0].splitlines()[2:] == [
        "    - 0/0: L['c'] == 2.5: expected 2.5, got 3.0"
        f"  # out = x * c            # the float guard is made here  # test_guards_recompiles.py:{line + 1} in blend",
        "    - 0/0: L['y'].size()[0] == L['x'].size()[0]: expected true, got false (1 == 6)"
        "  # return out + y         # the shape relation between x and y is made here"
        f"  # test_guards_recompiles.py:{line + 2} in blend"]
    with logs("recompiles") as lines:
        f(torch.randn(1), torch.randn(1), 3.0)      # a size of 1 was specialized
    text = lines[0]
    assert ("- 0/1: tensor 'L['y']' size mismatch at index 0. expected 1, actual 1" not in text)
    assert "- 0/1: 2 <= L['x'].size()[0]: expected true, got false (2 <= 1)" in text
    assert "- 0/0: L['c'] == 2.5: expected 2.5, got 3.0" in text


def test_a_changed_argument_type_names_both_types():
    f = engine.compile(scale, backend="eager")
    x = torch.randn(3)
    f(x, 2.0)
    with logs("recompiles") as lines:
        f(x, 2)
    assert "L['c'] == 2.0: expected 2.0 (float), got 2 (int)" in lines[0]


def test_recompiles_verbose_lists_every_failure_of_every_entry():
    f = engine.compile(scale, backend="eager", dynamic=False)
    f(torch.randn(3), 0.5)
    f(torch.randn(4), 0.5)
    with logs("recompiles_verbose") as lines:
        f(torch.randn(5, dtype=torch.float64), 1.5)
    text = lines[0]
    assert "guard 0 failures:" in text and "guard 1 failures:" in text
    assert "- 0/1: tensor 'L['c']'" not in text
    assert "- 0/1: tensor 'L['x']' dtype mismatch. expected torch.float32, actual torch.float64" in text
    assert "- 0/1: L['c'] == 0.5" in text
    assert "- 0/0: L['c'] == 0.5" in text


def test_cache_size_limit_warns_once_and_then_runs_eagerly():
    f = engine.compile(scale, backend="eager")
    x = torch.randn(3)
    with engine.config.patch(cache_size_limit=3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for c in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
                assert torch.equal(f(x, c), x * c)
        assert len(entries(scale)) == 3
        msgs = [str(w.message) for w in caught if "cache_size_limit" in str(w.message)]
        assert len(msgs) == 1
        assert msgs[0].startswith("engine hit config.cache_size_limit (3)\n")
        assert f"function: 'scale' ({__file__}:{scale.__code__.co_firstlineno})" in msgs[0]
        assert "last reason: 0/2: L['c'] == 3.0" in msgs[0]
        assert torch.equal(f(x, 2.0), x * 2.0)     # an existing entry still serves hits


def test_accumulated_cache_size_limit_counts_every_entry_of_the_frame():
    x = torch.randn(3)
    with engine.config.patch(cache_size_limit=100, accumulated_cache_size_limit=2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = engine.compile(scale, backend="eager")
            b = engine.compile(scale, backend="eager")   # other options: its own entries, same frame
            a(x, 1.0)
            b(x, 1.0)
            assert torch.equal(a(x, 3.0), x * 3.0)
        assert any("engine hit config.accumulated_cache_size_limit (2)" in str(w.message) for w in caught)
    assert len(entries(scale)) == 2


def test_guard_trees_and_recompile_reasons_are_in_torch_trace(tmp_path):
    trace.start(str(tmp_path))
    try:
        f = engine.compile(fn, backend="eager", dynamic=False)
        f(torch.randn(3))
        f(torch.randn(4))
    finally:
        trace.stop()
    text = "".join(open(p).read() for p in glob.glob(os.path.join(str(tmp_path), "*")))
    assert text.count('{"dynamo_cpp_guards_str"') == 2
    assert "TREE_GUARD_MANAGER:" in text
    assert '"name": "recompile_reasons"' in text
    assert "tensor 'L['x']' size mismatch at index 0. expected 3, actual 4" in text
