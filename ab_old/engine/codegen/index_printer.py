"""Printing sympy index expressions as integer arithmetic in a kernel language. The C++
and Triton emitters print the same shapes of expression and differ only in how their
language writes floor division, modulo, max/min and large constants."""

from __future__ import annotations

import sympy

from .index import FloorDiv, IMod


class IndexPrinter:
    floor_div = "//"           # the operator for a floor division of non-negative operands
    maximum = "max"
    minimum = "min"
    error = NotImplementedError

    def integer(self, n: int) -> str:
        return str(n)

    def floordiv(self, num, den) -> str:
        return f"({self.print(num)} {self.floor_div} {self.print(den)})"

    def mod(self, num, den) -> str:
        return f"({self.print(num)} % {self.print(den)})"

    def print(self, e) -> str:
        e = sympy.sympify(e)
        if e.is_Integer:
            return self.integer(int(e))
        if e.is_Symbol:
            return str(e)
        if isinstance(e, FloorDiv):
            return self.floordiv(e.args[0], e.args[1])
        if isinstance(e, IMod):
            return self.mod(e.args[0], e.args[1])
        if e.is_Add:
            return "(" + " + ".join(self.print(a) for a in sympy.Add.make_args(e)) + ")"
        if e.is_Mul:
            coeff, rest = e.as_coeff_Mul()
            if coeff == -1:
                return f"(-{self.print(rest)})"
            return "(" + " * ".join(self.print(a) for a in e.args) + ")"
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return f"({self.print(num)} {self.floor_div} {self.print(den)})"
        if isinstance(e, sympy.Max):
            return f"{self.maximum}({self.print(e.args[0])}, {self.print(sympy.Max(*e.args[1:]))})"
        if isinstance(e, sympy.Min):
            return f"{self.minimum}({self.print(e.args[0])}, {self.print(sympy.Min(*e.args[1:]))})"
        if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([self.print(e.base)] * int(e.exp)) + ")"
        raise self.error(f"index expression {e}")
