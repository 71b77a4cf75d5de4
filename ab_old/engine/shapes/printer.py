"""Sympy expressions over shape symbols, printed in user terms: each symbol becomes the
source it was read from (`s0` -> `L['x'].size()[0]`). The text is valid Python over `L`
and `G`, so the same string is shown in logs and evaluated by the guard check."""

from __future__ import annotations

import sympy
from torch.utils._sympy.printers import PythonPrinter


class SourcePrinter(PythonPrinter):
    def __init__(self, names: dict) -> None:
        super().__init__()
        self.names = names  # sympy.Symbol -> source text

    def _print_Symbol(self, expr) -> str:
        name = self.names.get(expr)
        if name is None:
            raise KeyError(f"symbol {expr} has no source")
        return name

    def _print_Relational(self, expr) -> str:
        lhs, rhs = expr.lhs, expr.rhs
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        return f"{self._print(lhs)} {op} {self._print(rhs)}"

    def _print_ToFloat(self, expr) -> str:
        # guards and generated code see plain ints, never SymInts: float() is exact there
        return f"float({self._print(expr.args[0])})"

    def _print_Not(self, expr) -> str:
        return f"not ({self._print(expr.args[0])})"


def python_text(expr, names: dict) -> str:
    if expr is sympy.true:
        return "True"
    if expr is sympy.false:
        return "False"
    return SourcePrinter(names).doprint(expr)
