"""The bytecode layer: decode -> assemble is exact for unmodified code, and edited
instruction lists (inserted code, grown jumps, new names and constants) assemble into
code that behaves like the original. Runs without torch, so `python3.12 -m pytest` on a
bare interpreter checks the 3.12 side:  python3.12 -m pytest tests/test_capture_bytecode.py
"""

import importlib
import pathlib
import types

import bare_capture  # noqa: F401,E402 (before engine.capture: loads it without torch)

import pytest  # noqa: E402

from engine.capture.bytecode import (AssemblyError, Instruction, assemble,  # noqa: E402
                                     create_instruction, decode, format_code, offset_map,
                                     stack_depths)
from engine.capture.bytecode_builder import BytecodeBuilder  # noqa: E402


def _all_codes(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _all_codes(c)


def _func(code, like):
    return types.FunctionType(code, like.__globals__, code.co_name, like.__defaults__, like.__closure__)


# ---------------------------------------------------------------- exact round trips

@pytest.mark.parametrize("modname", ["json.decoder", "dis", "inspect", "collections", "typing",
                                     "argparse", "ast", "asyncio.tasks", "difflib"])
def test_every_function_of_a_stdlib_module_reassembles_to_identical_code(modname):
    mod = importlib.import_module(modname)
    top = compile(pathlib.Path(mod.__file__).read_text(), mod.__file__, "exec")
    checked = 0
    for code in _all_codes(top):
        new = assemble(decode(code), template=code)
        for field in ("co_code", "co_linetable", "co_exceptiontable", "co_stacksize",
                      "co_consts", "co_names", "co_varnames", "co_nlocals"):
            assert getattr(new, field) == getattr(code, field), (code.co_qualname, field)
        checked += 1
    assert checked >= 10


def test_roundtripped_stdlib_functions_behave_the_same():
    import json
    import textwrap

    for fn, args in [(json.dumps, ({"a": [1, 2.5, None]},)), (json.loads, ('{"x": [1, 2]}',)),
                     (textwrap.dedent, ("   a\n   b\n",)), (textwrap.wrap, ("hello world " * 5, 20))]:
        clone = _func(assemble(decode(fn.__code__), template=fn.__code__), fn)
        clone.__kwdefaults__ = fn.__kwdefaults__
        assert clone(*args) == fn(*args)


# ---------------------------------------------------------------- decode


def test_decode_drops_caches_folds_extended_arg_and_resolves_jumps():
    src = "def many(x):\n    " + "\n    ".join(f"v{i} = {i}.5" for i in range(300)) + \
          "\n    if x:\n        return v299\n    return v0\n"
    ns = {}
    exec(src, ns)
    code = ns["many"].__code__
    insts = decode(code)
    assert not any(i.opname in ("CACHE", "EXTENDED_ARG") for i in insts)
    big = [i for i in insts if i.opname == "LOAD_CONST" and i.argval == 299.5]
    assert big and big[0].arg > 255
    jumps = [i for i in insts if i.is_jump()]
    assert jumps and all(isinstance(j.target, Instruction) for j in jumps)
    # every offset of an instruction, its EXTENDED_ARG prefix included, finds it
    omap = offset_map(code)
    assert omap[big[0].offset - 2] is omap[big[0].offset]


def test_decode_keeps_exception_table_entries_as_shared_objects():
    def f(x):
        try:
            return 1 / x
        except ZeroDivisionError:
            return None

    insts = decode(f.__code__)
    protected = [i for i in insts if i.exn_tab_entry is not None]
    div = next(i for i in insts if i.opname == "BINARY_OP")
    assert div.exn_tab_entry is not None
    assert div.exn_tab_entry.target.opname == "PUSH_EXC_INFO"
    assert len({id(i.exn_tab_entry) for i in protected}) >= 2  # body and handler cleanup


# ---------------------------------------------------------------- edited code


def _insert_nops(fn, every=3):
    insts = decode(fn.__code__)
    out = []
    for k, inst in enumerate(insts):
        # (3.11 needs PRECALL directly before CALL: never split that pair)
        if k % every == 1 and inst.opname not in ("RESUME", "CALL"):
            nop = create_instruction("NOP")
            nop.exn_tab_entry = inst.exn_tab_entry  # stay inside the same try block
            nop.lineno = inst.lineno
            out.append(nop)
            # a jump to `inst` must now land on the NOP: retarget by swapping identities
            for other in insts:
                if other.target is inst:
                    other.target = nop
                if other.exn_tab_entry is not None and other.exn_tab_entry.target is inst:
                    other.exn_tab_entry.target = nop
        out.append(inst)
    return _func(assemble(out, template=fn.__code__), fn)


def test_try_except_and_with_still_work_after_inserting_instructions():
    import contextlib

    log = []

    @contextlib.contextmanager
    def cm():
        log.append("enter")
        try:
            yield
        finally:
            log.append("exit")

    def f(x):
        total = 0
        for i in range(3):
            try:
                total += 10 // (x - i)
            except ZeroDivisionError:
                total -= 100
            finally:
                total += 1
        with cm():
            if x > 5:
                raise ValueError("big")
        return total

    g = _insert_nops(f)
    assert len(g.__code__.co_code) > len(f.__code__.co_code)
    for x in (0, 1, 2, 4):
        assert g(x) == f(x)
    with pytest.raises(ValueError, match="big"):
        g(9)
    assert log[-1] == "exit"


def test_closures_and_cells_survive_a_round_trip():
    def outer(a):
        b = a * 2

        def inner(c):
            nonlocal b
            b += c
            return a + b

        return inner(1), inner(1), b

    new = _insert_nops(outer)
    assert new(5) == outer(5)
    inner_code = next(c for c in outer.__code__.co_consts if isinstance(c, types.CodeType))
    assert assemble(decode(inner_code), template=inner_code).co_code == inner_code.co_code


def test_jumps_grow_extended_arg_when_code_is_inserted():
    def f(x):
        y = 0
        while x > 0:
            if x % 2:
                y += x
            x -= 1
        return y

    insts = decode(f.__code__)
    body = next(i for i in insts if i.opname == "BINARY_OP" and i.argrepr in ("+=",))
    pos = insts.index(body)
    # 200 no-ops (LOAD_CONST + POP_TOP) inside the loop: the backward jump and the
    # forward exits now span more than 255 code units and need EXTENDED_ARG
    filler = []
    for k in range(200):
        filler += [create_instruction("LOAD_CONST", argval=k), create_instruction("POP_TOP")]
    new_code = assemble(insts[:pos] + filler + insts[pos:], template=f.__code__)
    raw = list(__import__("dis").get_instructions(new_code))
    assert any(i.opname == "EXTENDED_ARG" for i in raw)
    g = _func(new_code, f)
    assert [g(n) for n in range(8)] == [f(n) for n in range(8)]
    assert new_code.co_stacksize == f.__code__.co_stacksize + 1  # filler sits on y, x


def test_new_instructions_get_their_args_from_argval():
    def f(x):
        return x

    insts = decode(f.__code__)
    ret = insts[-1]
    new = insts[:-1] + [
        create_instruction("STORE_FAST", argval="tmp"),
        create_instruction("LOAD_GLOBAL", argval="len", push_null=True),
        create_instruction("LOAD_FAST", argval="tmp"),
        create_instruction("BUILD_TUPLE", arg=1),
        create_instruction("LOAD_CONST", argval=(1, 1.0, True)),
        create_instruction("LOAD_CONST", argval=1.0),
        create_instruction("LOAD_CONST", argval=True),
        create_instruction("BUILD_TUPLE", arg=3),
        create_instruction("BINARY_OP", arg=0),  # tuple + tuple
        *BytecodeBuilder_call(1),
        ret,
    ]
    code = assemble(new, template=f.__code__)
    assert "tmp" in code.co_varnames and code.co_nlocals == 2
    assert "len" in code.co_names
    assert _func(code, f)("ab") == 4
    kinds = [type(c) for c in code.co_consts]
    assert float in kinds and bool in kinds  # 1, 1.0 and True stay distinct constants


def BytecodeBuilder_call(n):
    b = BytecodeBuilder()
    b.call(n)
    return b.instructions


def test_assembly_errors_name_the_problem():
    def f(x):
        return x

    insts = decode(f.__code__)
    stray = create_instruction("NOP")
    jump = create_instruction("JUMP", target=stray)
    with pytest.raises(AssemblyError, match="not in the list"):
        assemble(insts[:1] + [jump] + insts[1:], template=f.__code__)
    with pytest.raises(AssemblyError, match="underflow"):
        assemble(insts[:1] + [create_instruction("POP_TOP")] + insts[1:], template=f.__code__)


def test_stack_depths_track_the_for_iterator():
    def f(xs):
        t = 0
        for x in xs:
            t += x
        return t

    insts = decode(f.__code__)
    depths = stack_depths(f.__code__)
    store_x = next(i for i in insts if i.opname == "STORE_FAST" and i.argval == "x")
    assert depths[store_x.offset] == 2  # iterator and the item
    assert depths[insts[-1].offset] == 1  # RETURN_VALUE


# ---------------------------------------------------------------- builder and listing


def test_builder_loop_with_labels_backward_conditional_and_extended_arg():
    def template(n):
        pass

    b = BytecodeBuilder()
    with b.region("original"):
        b.load_const(0)
        b.store_fast("acc")
        top = b.new_label("top")
        done = b.new_label("done")
        b.place(top)
        b.load_fast("n")
        b.load_const(0)
        b.compare_op(">")
        b.jump_if_false(done)
        for _ in range(150):  # pad the body so the jumps need EXTENDED_ARG
            b.nop()
        b.load_fast("acc")
        b.load_fast("n")
        b.binary_op("+=")
        b.store_fast("acc")
        b.load_fast("n")
        b.load_const(1)
        b.binary_op("-=")
        b.store_fast("n")
        b.load_fast("n")
        b.load_const(0)
        b.compare_op(">")
        b.jump_if_true(top)  # backward conditional: rewritten on 3.12
        b.place(done)
        b.load_fast("acc")
        b.return_value()
    gen = b.build(template.__code__, "summed")
    fn = types.FunctionType(gen.code, {})
    assert [fn(k) for k in range(6)] == [sum(range(k + 1)) for k in range(6)]
    assert gen.regions[0][2] == "prologue" and gen.regions[1][2] == "original"


def test_builder_calls_methods_keywords_closures_and_rot_n():
    def template(o, a):
        pass

    def helper(a, b, *, k):
        return (a, b, k)

    b = BytecodeBuilder()
    b.push_callable_const(helper)     # helper and its NULL
    b.load_fast("o")
    b.load_method("upper")
    b.call(0)                         # o.upper()
    b.load_fast("a")
    b.load_const(3)
    b.call(3, kw_names=("k",))        # helper(o.upper(), a, k=3)
    b.load_const(1)
    b.load_const(2)
    b.rot_n(3)                        # result, 1, 2 -> 2, result, 1
    b.build_tuple(3)
    b.return_value()
    gen = b.build(template.__code__, "calls")
    fn = types.FunctionType(gen.code, {})
    assert fn("x", 7) == (2, ("X", 7, 3), 1)

    def outer(v):
        def template2():
            return v
        return template2

    inner = outer(41).__code__
    b = BytecodeBuilder()
    b.null_before()
    b.make_function(inner, closure_names=("v",))  # a new function sharing this frame's cell
    b.null_after()                                # NULL below (3.11, 3.12) or above (3.13) it
    b.call(0)
    b.return_value()
    gen = b.build(outer.__code__, "outer_gen")
    assert types.FunctionType(gen.code, {})(41) == 41


def test_format_code_lists_offsets_lines_and_regions():
    def f(x):
        return x + 1

    text = format_code(f.__code__)
    assert "f (" in text.splitlines()[0]
    assert "LOAD_FAST" in text and "BINARY_OP" in text and " x" in text
    labelled = format_code(f.__code__, labels=[(0, 4, "prologue")])
    first = labelled.splitlines()[1]
    assert first.rstrip().endswith("[prologue]") and "RESUME" in first
    cur = next(i for i in decode(f.__code__) if i.opname == "BINARY_OP").offset
    assert any(l.lstrip().startswith("-->") and "BINARY_OP" in l
               for l in format_code(f.__code__, current_offset=cur).splitlines())
