"""Compile a cache entry's guards into ONE generated Python function (the fast path)
and keep a slow path that lists every failing guard as a sentence."""

from __future__ import annotations

import builtins
import dataclasses
import sys
from typing import Any, Callable

import torch
import torch.utils._device as _utils_device

from .guard import Guard, TensorMeta, global_state
from .render import expression


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


def _condition(g: Guard, i: int, ns: dict) -> str:
    s = g.source
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
    if g.kind == "SHAPE_ENV":  # a relation between sizes, already Python over L and G (engine/shapes)
        return f"({e})"
    raise ValueError(f"unknown guard kind {g.kind}")


@dataclasses.dataclass
class CompiledGuards:
    guards: list
    check: Callable[[dict, dict], bool]   # the generated fast path
    code: str                             # its source, for debugging
    namespace: dict

    def failures(self, L: dict, G: dict) -> list[str]:
        """Every failing guard as a sentence (the slow path, used for recompile reasons)."""
        out = []
        for i, g in enumerate(self.guards):
            msg = explain_failure(g, i, L, G, self.namespace)
            if msg:
                out.append(msg)
        return out


def _base_namespace() -> dict:
    from .guard import global_state_tuple
    return {"___global_state": global_state_tuple, "__builtins__": builtins, "sys": sys, "torch": torch}


def compile_guards(guards: list[Guard]) -> CompiledGuards:
    ns = _base_namespace()
    conds = [_condition(g, i, ns) for i, g in enumerate(guards)]
    body = "\n".join(f"        if not ({c}):\n            return False" for c in conds) or "        pass"
    code = ("def ___check_guards(L, G):\n"
            "    try:\n"
            f"{body}\n"
            "    except Exception:\n"
            "        return False\n"
            "    return True\n")
    exec(compile(code, "<engine guards>", "exec"), ns)
    return CompiledGuards(list(guards), ns["___check_guards"], code, ns)


def _eval(expr: str, L: dict, G: dict, ns: dict) -> Any:
    return eval(expr, {**ns, "L": L, "G": G})


def explain_failure(g: Guard, i: int, L: dict, G: dict, ns: dict) -> str | None:
    try:
        if g.kind == "TENSOR_MATCH":
            v = _eval(g.source, L, G, ns)
            m: TensorMeta = g.expected
            name = g.source
            if not isinstance(v, torch.Tensor):
                return f"{name} is not a tensor (got {type(v).__name__})"
            if type(v) is not m.type:
                return f"tensor '{name}' type mismatch. expected {m.type.__name__}, actual {type(v).__name__}"
            if v.dtype != m.dtype:
                return f"tensor '{name}' dtype mismatch. expected {m.dtype}, actual {v.dtype}"
            if v.device != m.device:
                return f"tensor '{name}' device mismatch. expected {m.device}, actual {v.device}"
            if v.requires_grad != m.requires_grad:
                return f"tensor '{name}' requires_grad mismatch. expected requires_grad={int(m.requires_grad)}"
            if v.dim() != len(m.sizes):
                return f"tensor '{name}' rank mismatch. expected {len(m.sizes)}, actual {v.dim()}"
            for d, (a, b) in enumerate(zip(m.sizes, v.size())):
                if a is not None and a != b:
                    return f"tensor '{name}' size mismatch at index {d}. expected {a}, actual {b}"
            for d, (a, b) in enumerate(zip(m.strides, v.stride())):
                if a is not None and a != b:
                    return f"tensor '{name}' stride mismatch at index {d}. expected {a}, actual {b}"
            return None
        local_ns = dict(ns)
        cond = _condition(g, i, local_ns)
        if _eval(cond, L, G, local_ns):
            return None
        if g.kind == "GLOBAL_STATE":
            now = global_state()
            diffs = [f"{k}: expected {g.expected[k]}, actual {now.get(k)}" for k in g.expected if now.get(k) != g.expected[k]]
            return "global state changed: " + "; ".join(diffs)
        return expression(g)
    except Exception as exc:
        return f"{expression(g)} (evaluating it raised {type(exc).__name__}: {exc})"
