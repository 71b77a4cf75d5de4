"""Compile a cache entry's guards into ONE generated Python function (the fast path)
and keep a slow path that lists every failing guard as a sentence."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import os
import sys
from typing import Any, Callable, Optional

import torch
import torch.utils._device as _utils_device

from .chains import SharedPrefixes
from .guard import Guard, TensorMeta, global_state
from .program import Program
from .program import build as build_program
from .render import expression, user_suffix


def _device_test(v: str, device: torch.device, k: str) -> str:
    # `t.device` builds a torch.device per call; these flags are a third of the cost
    if device.type == "cpu":
        return f"{v}.is_cpu"
    if device.type == "cuda" and device.index is not None:
        return f"{v}.is_cuda and {v}.get_device() == {device.index}"
    return f"{v}.device == {k}_device"


# GLOBAL_STATE fields checked one by one with the cheapest C call for each (the slow path
# and the rendering still use global_state()'s dict).
_STATE_TESTS = {
    "grad_mode": lambda v: f"___grad_enabled() is {bool(v)}",
    "deterministic_algorithms": lambda v: f"___deterministic() is {bool(v)}",
    "inference_mode": lambda v: f"___inference_mode() is {bool(v)}",
}


def _global_state_test(e: dict, k: str, ns: dict) -> str:
    ns.update(___grad_enabled=torch._C.is_grad_enabled, ___deterministic=torch.are_deterministic_algorithms_enabled,
              ___inference_mode=torch.is_inference_mode_enabled, ___utils_device=_utils_device,
              ___default_dtype=torch.get_default_dtype, ___any_autocast=getattr(torch._C, "_is_any_autocast_enabled", None))
    parts, rest = [], []
    for name, value in e.items():
        if name in _STATE_TESTS:
            parts.append(_STATE_TESTS[name](value))
        elif name == "default_dtype" and isinstance(getattr(torch, str(value).replace("torch.", ""), None), torch.dtype):
            ns[k + "_dtype"] = getattr(torch, str(value).replace("torch.", ""))
            parts.append(f"___default_dtype() is {k}_dtype")
        elif name == "default_device":
            ns[k + "_device"] = value
            parts.append(f"___utils_device.CURRENT_DEVICE == {k}_device")
        elif name.startswith("autocast_") and ns["___any_autocast"] is not None and not any(
                e[n] for n in e if n.startswith("autocast_")):
            if not any(p.startswith("(not ___any_autocast()") for p in parts):
                # autocast off everywhere is one call; on for another device: compare the whole state
                ns[k] = tuple(e.values())
                parts.append(f"(not ___any_autocast() or ___global_state() == {k})")
        else:
            rest.append(name)
    if rest:  # fields without a fast test: compare the whole state
        ns[k] = tuple(e.values())
        parts.append(f"___global_state() == {k}")
    return " and ".join(parts) or "True"


def _condition(g: Guard, i: int, ns: dict, s: Optional[str] = None) -> str:
    s = g.source if s is None else s
    e = g.expected
    k = f"___e{i}"
    if g.kind == "TENSOR_MATCH":
        m: TensorMeta = e
        ns[k + "_type"], ns[k + "_dtype"], ns[k + "_device"] = m.type, m.dtype, m.device
        ns[k + "_sizes"], ns[k + "_strides"] = tuple(m.sizes), tuple(m.strides)
        v = f"___t{i}"
        head = (f"type({v} := {s}) is {k}_type and {v}.dtype is {k}_dtype and {_device_test(v, m.device, k)} "
                f"and {v}.requires_grad is {bool(m.requires_grad)}")
        if None in m.sizes or None in m.strides:
            # symbolic dims (engine/shapes) are not compared here; SHAPE_ENV guards relate them
            sz, st = f"___sz{i}", f"___st{i}"
            checks = [f"len({sz} := {v}.size()) == {len(m.sizes)}", f"({st} := {v}.stride()) is not None"]
            checks += [f"{sz}[{d}] == {n}" for d, n in enumerate(m.sizes) if n is not None]
            checks += [f"{st}[{d}] == {n}" for d, n in enumerate(m.strides) if n is not None]
            return head + " and " + " and ".join(checks)
        return head + f" and {v}.shape == {k}_sizes and {v}.stride() == {k}_strides"
    if g.kind == "TYPE_MATCH":
        ns[k] = e
        return f"type({s}) is {k}"
    if g.kind == "ID_MATCH":
        ns[k] = e
        return f"{s} is {k}"
    if g.kind == "EQUALS_MATCH":
        if e is None or e is True or e is False or e is Ellipsis:
            return f"{s} is {e!r}"
        ns[k], ns[k + "_type"] = e, type(e)
        return f"type(___v{i} := {s}) is {k}_type and ___v{i} == {k}"
    if g.kind == "LENGTH_CHECK":
        return f"len({s}) == {int(e)}"
    if g.kind == "DICT_KEYS":
        ns[k] = list(e)
        return f"list({s}.keys()) == {k}"
    if g.kind == "HASATTR":
        name, present = e
        return f"hasattr({s}, {name!r}) is {bool(present)}"
    if g.kind == "GLOBAL_STATE":
        return _global_state_test(e, k, ns)
    if g.kind == "DUPLICATE_INPUT":
        return f"{s} is {e}"
    if g.kind == "NO_TENSOR_ALIASING":
        return _distinct_test(e)
    if g.kind == "SHAPE_ENV":  # a relation between sizes, already Python over L and G (engine/shapes)
        return f"({e})"
    raise ValueError(f"unknown guard kind {g.kind}")


def _distinct_test(exprs: list) -> str:
    """NO_TENSOR_ALIASING's test: the expressions are distinct objects."""
    return f"len({{{', '.join(f'id({x})' for x in exprs)}}}) == {len(exprs)}"


@dataclasses.dataclass(eq=False)
class CompiledGuards:
    guards: list
    check: Callable[[dict, dict], bool]   # the generated fast path
    code: str                             # its source, for debugging
    namespace: dict
    program: Optional[Program] = None       # the guards the C++ checker can test (program.py)
    program_code: Optional[str] = None      # the fast path calling it, with the other guards in Python

    def use_native(self) -> None:
        """Switch the fast path to the C++ checker (engine/guards/native.py)."""
        from . import native
        checker = native.checker(self.program) if self.program is not None else None
        if checker is None:
            return
        ns = dict(self.namespace, ___program=checker)
        exec(compile(self.program_code, "<engine guards>", "exec"), ns)
        self.check, self.code = ns["___check_guards"], self.program_code

    def failures(self, L: dict, G: dict) -> list[str]:
        """Every failing guard as a sentence (the slow path, used for recompile reasons):
        what it expected, what it got, and the user line that made the capture rely on it."""
        return [str(f) for f in self.explain(L, G)]

    def explain(self, L: dict, G: dict) -> list["GuardFailure"]:
        """Every failing guard, as data (GuardFailure)."""
        out = []
        for i, g in enumerate(self.guards):
            f = explain_guard(g, i, L, G, self.namespace)
            if f is not None:
                out.append(f)
        return out


@dataclasses.dataclass(frozen=True)
class GuardFailure:
    """One failing guard: the sentence that says why, the expected value, the value seen."""

    guard: Guard
    reason: str          # "L['c'] == 2.5: expected 2.5, got 3.0" (tensors: PyTorch's sentence)
    expected: str = ""
    actual: str = ""

    @property
    def user_line(self) -> str:
        """"file.py:12 in fn" of the code that created the guard ("" when unknown)."""
        f = self.guard.user_frame
        return f"{os.path.basename(f[0])}:{f[1]} in {f[2]}" if f else ""

    @property
    def user_code(self) -> str:
        f = self.guard.user_frame
        return (f[3] or "").strip() if f else ""

    def __str__(self) -> str:
        return self.reason + user_suffix(self.guard)


def _base_namespace() -> dict:
    from .guard import global_state_tuple
    return {"___global_state": global_state_tuple, "__builtins__": builtins, "sys": sys, "torch": torch}


def compile_guards(guards: list[Guard], lookup: Optional[Callable[[str], Any]] = None) -> CompiledGuards:
    """lookup: a source's value in the frame being compiled (SharedPrefixes)."""
    from . import native
    ns = _base_namespace()
    code = _source(_conditions(guards, range(len(guards)), ns, SharedPrefixes(lookup)))
    exec(compile(code, "<engine guards>", "exec"), ns)
    compiled = CompiledGuards(list(guards), ns["___check_guards"], code, ns)
    program = build_program(guards, SharedPrefixes(lookup)) if native.wanted() else None
    if program is not None:
        # the guards the program does not test, in order, in Python; the program called
        # where its first guard stood (True only if every guard holds: the order of the
        # tests does not change the answer)
        in_program = set(program.native)
        rest = [i for i in range(len(guards)) if i not in in_program]
        conds = _conditions(guards, rest, ns, SharedPrefixes(lookup))
        conds.insert(sum(i < program.native[0] for i in rest), "___program(L, G)")
        compiled.program, compiled.program_code = program, _source(conds)
        native.when_ready(compiled)
    return compiled


def _conditions(guards: list[Guard], which, ns: dict, shared: SharedPrefixes) -> list[str]:
    """The Python test of each guard in `which`, in order; the prefixes they read shared."""
    conds, bound = [], {}     # bound: source -> the name its TENSOR_MATCH test binds (___t3)
    for i in which:
        g = guards[i]
        if g.kind == "NO_TENSOR_ALIASING":   # the tensors the guards before it already read
            conds.append(_distinct_test([bound.get(src) or shared.expression(src) for src in g.expected]))
            continue
        conds.append(_condition(g, i, ns, shared.expression(g.source) if g.source else None))
        if g.kind == "TENSOR_MATCH":
            bound[g.source] = f"___t{i}"
    return conds


def _source(conds: list) -> str:
    """The fast path's text: each condition in turn."""
    lines = [f"        if not ({c}):\n            return False" for c in conds]
    return ("def ___check_guards(L, G):\n"
            "    try:\n"
            f"{chr(10).join(lines) or '        pass'}\n"
            "    except Exception:\n"
            "        return False\n"
            "    return True\n")


def _eval(expr: str, L: dict, G: dict, ns: dict) -> Any:
    return eval(expr, {**ns, "L": L, "G": G})


def _short(v: Any, limit: int = 80) -> str:
    """A value as the user would write it, cut to one short line."""
    if isinstance(v, type):
        text = v.__qualname__ if v.__module__ == "builtins" else f"{v.__module__}.{v.__qualname__}"
    elif callable(v) and hasattr(v, "__qualname__") and not isinstance(v, torch.Tensor):
        text = f"<{type(v).__name__} {v.__qualname__}>"
    elif isinstance(v, torch.nn.Module):
        text = f"<{type(v).__name__} module at {hex(id(v))}>"
    elif isinstance(v, torch.Tensor):
        text = f"a tensor of size {list(v.size())}"
    else:
        try:
            text = repr(v)
        except Exception:
            text = f"<{type(v).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _tensor_failure(g: Guard, v: Any) -> Optional[GuardFailure]:
    """PyTorch's sentences for a tensor that no longer matches (they name expected and actual)."""
    m: TensorMeta = g.expected
    name = g.source

    def fail(what: str, expected: Any, actual: Any, sentence: Optional[str] = None) -> GuardFailure:
        return GuardFailure(g, sentence or f"tensor '{name}' {what} mismatch. expected {expected}, actual {actual}",
                            str(expected), str(actual))

    if not isinstance(v, torch.Tensor):
        return fail("type", "a tensor", type(v).__name__, f"{name} is not a tensor (got {type(v).__name__})")
    if type(v) is not m.type:
        return fail("type", m.type.__name__, type(v).__name__)
    if v.dtype != m.dtype:
        return fail("dtype", m.dtype, v.dtype)
    if v.device != m.device:
        return fail("device", m.device, v.device)
    if v.requires_grad != m.requires_grad:
        return GuardFailure(g, f"tensor '{name}' requires_grad mismatch. expected requires_grad={int(m.requires_grad)}",
                            f"requires_grad={m.requires_grad}", f"requires_grad={v.requires_grad}")
    if v.dim() != len(m.sizes):
        return fail("rank", len(m.sizes), v.dim())
    for d, (a, b) in enumerate(zip(m.sizes, v.size())):
        if a is not None and a != b:
            return fail(f"size", a, b, f"tensor '{name}' size mismatch at index {d}. expected {a}, actual {b}")
    for d, (a, b) in enumerate(zip(m.strides, v.stride())):
        if a is not None and a != b:
            return fail("stride", a, b, f"tensor '{name}' stride mismatch at index {d}. expected {a}, actual {b}")
    return None


_SOURCE_ROOTS = ("L", "G")


def _is_source(node: ast.AST) -> bool:
    """`L['x'].size()[0]`, `G['n']`: an expression that reads the frame's values."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id in _SOURCE_ROOTS


def substitute_values(text: str, L: dict, G: dict, ns: dict) -> str:
    """A shape guard with the values it read put in: `L['y'].size()[0] == L['x'].size()[0]`
    -> `8 == 9`. Parts that cannot be evaluated stay as written."""

    class Sub(ast.NodeTransformer):
        def visit(self, node):
            if isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)) and _is_source(node):
                try:
                    value = eval(compile(ast.Expression(node), "<guard>", "eval"), {**ns, "L": L, "G": G})
                except Exception:
                    return node
                if isinstance(value, (int, float, bool)) or value is None:
                    return ast.copy_location(ast.Constant(value), node)
                return node
            return self.generic_visit(node)

    try:
        tree = Sub().visit(ast.parse(text, mode="eval"))
        return ast.unparse(ast.fix_missing_locations(tree))
    except Exception:
        return text


def explain_guard(g: Guard, i: int, L: dict, G: dict, ns: dict) -> Optional[GuardFailure]:
    """The failure of guard `g` on these frame values, or None when it passes."""
    try:
        if g.kind == "TENSOR_MATCH":
            return _tensor_failure(g, _eval(g.source, L, G, ns))
        local_ns = dict(ns)
        cond = _condition(g, i, local_ns)
        if _eval(cond, L, G, local_ns):
            return None
        text, e = expression(g), g.expected
        if g.kind == "GLOBAL_STATE":
            now = global_state()
            changed = [k for k in e if now.get(k) != e[k]]
            exp = ", ".join(f"{k}={e[k]}" for k in changed)
            got = ", ".join(f"{k}={now.get(k)}" for k in changed)
            return GuardFailure(g, f"global state changed: expected {exp}, got {got}", exp, got)
        if g.kind == "SHAPE_ENV":
            got = substitute_values(str(e), L, G, ns)
            return GuardFailure(g, f"{text}: expected true, got false ({got})", "true", f"false ({got})")
        if g.kind == "DUPLICATE_INPUT":
            return GuardFailure(g, f"{text}: expected the same object as {e}, got a different one",
                                f"the same object as {e}", "a different object")
        if g.kind == "NO_TENSOR_ALIASING":
            seen, same = {}, ""
            for src in e:
                first = seen.setdefault(id(_eval(src, L, G, ns)), src)
                if first != src:
                    same = f"{src} is {first}"
                    break
            return GuardFailure(g, f"{text}: expected distinct tensors, got {same}", "distinct tensors", same)
        v = _eval(g.source, L, G, ns)
        if g.kind == "EQUALS_MATCH":
            exp, got = _short(e), _short(v)
            if type(v) is not type(e) and not (e is None or isinstance(e, bool)):
                exp, got = f"{exp} ({type(e).__name__})", f"{got} ({type(v).__name__})"
        elif g.kind == "TYPE_MATCH":
            exp, got = _short(e), _short(type(v))
        elif g.kind == "ID_MATCH":
            exp, got = _short(e), _short(v)
            if exp == got:
                exp, got = f"{exp} at {hex(id(e))}", f"another {got} at {hex(id(v))}"
        elif g.kind == "LENGTH_CHECK":
            exp, got = f"length {e}", f"length {len(v)}"
        elif g.kind == "DICT_KEYS":
            exp, got = _short(list(e)), _short(list(v.keys()))
        elif g.kind == "HASATTR":
            name, present = e
            exp = f"attribute {name!r} {'present' if present else 'absent'}"
            got = f"attribute {name!r} {'absent' if present else 'present'}"
        else:
            return GuardFailure(g, text)
        return GuardFailure(g, f"{text}: expected {exp}, got {got}", exp, got)
    except Exception as exc:
        return GuardFailure(g, f"{expression(g)} (evaluating it raised {type(exc).__name__}: {exc})")


def explain_failure(g: Guard, i: int, L: dict, G: dict, ns: dict) -> str | None:
    """The failure of guard `g` as one sentence (with its user line), or None when it passes."""
    f = explain_guard(g, i, L, G, ns)
    return None if f is None else str(f)
