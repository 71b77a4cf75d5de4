"""The per-version bytecode tables (engine/capture/pyversion.py) and what the engine does
on a Python that has none."""

import dis
import sys
import warnings

import pytest
import torch

import engine
from engine.capture import pyversion
from engine.capture.bytecode import assemble, decode


def test_the_running_python_has_a_table_whose_opcodes_exist():
    v = pyversion.require()
    assert v.version == sys.version_info[:2] and pyversion.V is v
    named = {v.method_load, *v.for_iter_exit, *v.fused_local_ops, *(op for pair in v.fused_local_ops.values()
                                                                     for op in pair), *v.name_flag_bits}
    named.add("CALL_KW" if v.kw_call == "CALL_KW" else "KW_NAMES")
    named.add(v.format_ops)
    if v.make_function == "SET_FUNCTION_ATTRIBUTE":
        named.add("SET_FUNCTION_ATTRIBUTE")
    if v.to_bool:
        named.add("TO_BOOL")
    if v.precall:
        named.add("PRECALL")
    if v.return_const:
        named.add("RETURN_CONST")
    missing = sorted(op for op in named if op not in dis.opmap)
    assert not missing, f"the {v.name} table names opcodes this Python lacks: {missing}"


def test_tables_are_data_for_every_supported_version():
    assert set(pyversion.SUPPORTED) >= {(3, 11), (3, 12), (3, 13)}
    fields = pyversion.PyVersion.__dataclass_fields__
    for version, table in pyversion.TABLES.items():
        assert table.version == version
        assert all(hasattr(table, f) for f in fields)


def test_the_version_dependent_opcodes_round_trip():
    def f(a, b, o, *xs):
        c, d = a, b                       # 3.13: STORE_FAST_STORE_FAST
        s = f"{c!r:>4}{d}"                # 3.13: CONVERT_VALUE, FORMAT_WITH_SPEC, FORMAT_SIMPLE
        if c and not d:                   # 3.13: TO_BOOL
            s += o.upper(k=1)             # 3.13: CALL_KW; a method load
        for x in xs:                      # 3.12: END_FOR; 3.13: END_FOR, POP_TOP
            s += str(x)

        def inner():                      # 3.13: LOAD_FAST of a cell, SET_FUNCTION_ATTRIBUTE
            return c + d
        return s, inner, [c for c in xs]  # an inlined comprehension (3.12+)

    code = f.__code__
    again = assemble(decode(code), template=code)
    assert again.co_code == code.co_code
    assert again.co_linetable == code.co_linetable and again.co_exceptiontable == code.co_exceptiontable


def _compiled_sum():
    def fn(x):
        return x.sum() + 1
    return fn


def test_an_unknown_python_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(pyversion, "CURRENT", None)
    monkeypatch.setattr(pyversion, "RUNNING", (3, 99))
    monkeypatch.setattr(pyversion.unsupported_message, "__defaults__", ((3, 99),))
    with pytest.raises(pyversion.UnsupportedPython) as info:
        engine.compile(_compiled_sum(), backend="eager")
    msg = str(info.value)
    assert "CPython 3.99" in msg and "3.11, 3.12, 3.13" in msg and "tlparse" in msg


def test_an_unknown_python_with_suppress_errors_runs_eagerly_and_says_so_once(monkeypatch):
    from engine import api

    monkeypatch.setattr(pyversion, "CURRENT", None)
    monkeypatch.setattr(pyversion.unsupported_message, "__defaults__", ((3, 99),))
    monkeypatch.setattr(api, "_warned", set())
    x = torch.ones(3)
    with engine.config.patch(suppress_errors=True), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn = _compiled_sum()
        assert engine.compile(fn, backend="eager") is fn
        assert engine.compile(_compiled_sum(), backend="eager")(x) == 4
    said = [w for w in seen if "CPython 3.99" in str(w.message)]
    assert len(said) == 1
