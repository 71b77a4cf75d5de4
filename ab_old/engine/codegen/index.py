"""Index expressions: sympy over loop variables, plus integer floor-division and modulo
that simplify when the ranges of the variables are known (a reshape of a contiguous
buffer then becomes plain linear indexing again)."""

from __future__ import annotations

import math

import sympy


class FloorDiv(sympy.Function):
    """a // b for non-negative integer a and positive b (indices only)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        return None


class IMod(sympy.Function):
    """a % b for non-negative integer a and positive b (indices only)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


# loop variable -> its (exclusive) upper bound; filled as kernels/loaders create variables
VAR_RANGES: dict[sympy.Symbol, sympy.Expr] = {}


def index_var(name: str, size) -> sympy.Symbol:
    s = sympy.Symbol(name, integer=True, nonnegative=True)
    VAR_RANGES[s] = sympy.sympify(size)
    return s


def _upper(expr) -> int | None:
    """Largest value a non-negative linear index expression can take, if known."""
    expr = sympy.expand(expr)
    total = 0
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1:
            if not coeff.is_Integer or coeff < 0:
                return None
            total += int(coeff)
            continue
        if not coeff.is_Integer or coeff < 0:
            return None
        if isinstance(rest, sympy.Symbol) and rest in VAR_RANGES and VAR_RANGES[rest].is_Integer:
            total += int(coeff) * (int(VAR_RANGES[rest]) - 1)
        elif isinstance(rest, (FloorDiv, IMod)):
            inner = _upper(rest.args[0]) if isinstance(rest, FloorDiv) else None
            if isinstance(rest, IMod) and rest.args[1].is_Integer:
                total += int(coeff) * (int(rest.args[1]) - 1)
            elif inner is not None and rest.args[1].is_Integer:
                total += int(coeff) * (inner // int(rest.args[1]))
            else:
                return None
        else:
            return None
    return total


def _split(expr, c):
    """Split a linear expression into terms whose coefficient is a multiple of c and the rest."""
    multiple, rest = [], []
    for term in sympy.Add.make_args(expr):
        coeff, _ = term.as_coeff_Mul()
        if c.is_Integer and coeff.is_Integer:
            (multiple if int(coeff) % int(c) == 0 else rest).append(term)
        elif sympy.fraction(sympy.cancel(term / c))[1] == 1:
            multiple.append(term)
        else:
            rest.append(term)
    return sympy.Add(*multiple), sympy.Add(*rest)


def _memo(fn):
    """Cache on the arguments and the ranges of their variables (simplification depends
    on them; sympy is the bulk of lowering time on large graphs)."""
    cache: dict = {}

    def wrapper(a, b):
        a, b = sympy.sympify(a), sympy.sympify(b)
        key = (a, b, tuple(sorted(((s, VAR_RANGES.get(s)) for s in a.free_symbols), key=lambda p: str(p[0]))))
        hit = cache.get(key)
        if hit is None:
            if len(cache) > 200_000:
                cache.clear()
            hit = cache[key] = fn(a, b)
        return hit
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _gcd_split(a, b):
    """(big, small, g): a = big + small where g divides b and every coefficient of big,
    and 0 <= small < g, so a // b == (big/g) // (b/g) and a % b == ((big/g) % (b/g))*g + small."""
    if not b.is_Integer:
        return None
    terms = list(sympy.Add.make_args(sympy.expand(a)))
    coeffs = []
    for t in terms:
        c, _ = t.as_coeff_Mul()
        if not c.is_Integer or c < 0:
            return None
        coeffs.append(int(c))
    order = sorted(range(len(terms)), key=lambda k: -coeffs[k])
    for k in range(1, len(order)):
        big = [order[j] for j in range(k)]
        small = [order[j] for j in range(k, len(order))]
        g = int(b)
        for j in big:
            g = math.gcd(g, coeffs[j])
        if g <= 1:
            continue
        s = sympy.Add(*[terms[j] for j in small])
        ub = _upper(s)
        if ub is not None and ub < g:
            return sympy.Add(*[terms[j] for j in big]), s, g
    return None


@_memo
def floordiv(a, b):
    a, b = sympy.sympify(a), sympy.sympify(b)
    if b == 1:
        return a
    split = _gcd_split(a, b)
    if split is not None:
        big, _, g = split
        return floordiv(sympy.expand(big / g), b / g)
    multiple, rest = _split(a, b)
    ub = _upper(rest)
    if ub is not None and b.is_Integer and ub < int(b):
        return sympy.expand(multiple / b)
    if multiple != 0:
        return sympy.expand(multiple / b) + FloorDiv(rest, b)
    return FloorDiv(a, b)


@_memo
def mod(a, b):
    a, b = sympy.sympify(a), sympy.sympify(b)
    if b == 1:
        return sympy.Integer(0)
    split = _gcd_split(a, b)
    if split is not None:
        big, small, g = split
        return sympy.expand(mod(sympy.expand(big / g), b / g) * g + small)
    _, rest = _split(a, b)
    ub = _upper(rest)
    if ub is not None and b.is_Integer and ub < int(b):
        return rest
    return IMod(rest, b)


def contiguous_strides(sizes) -> list:
    strides, acc = [], sympy.Integer(1)
    for s in reversed(list(sizes)):
        strides.append(acc)
        acc = acc * s
    return list(reversed(strides))


def flatten(index, sizes):
    return sympy.expand(sum((i * s for i, s in zip(index, contiguous_strides(sizes))), sympy.Integer(0)))


def unflatten(flat, sizes) -> list:
    out = []
    for s, st in zip(sizes, contiguous_strides(sizes)):
        out.append(sympy.Integer(0) if s == 1 else mod(floordiv(flat, st), s))
    return out


def numel(sizes):
    n = sympy.Integer(1)
    for s in sizes:
        n = n * s
    return n


def simplify(expr):
    """Fold k*c*(a // c) + k*(a % c) back into k*a (what a reshape followed by a reshape
    back produces)."""
    expr = sympy.expand(expr)
    changed = True
    while changed:
        changed = False
        terms = list(sympy.Add.make_args(expr))
        for t in terms:
            coeff, rest = t.as_coeff_Mul()
            if isinstance(rest, IMod):
                a, c = rest.args
                partner = sympy.expand(coeff * c * FloorDiv(a, c))
                if partner in terms:
                    terms.remove(t)
                    terms.remove(partner)
                    expr = sympy.expand(sympy.Add(*terms) + coeff * a)
                    changed = True
                    break
    return expr
