"""The C++ emitter: renders a FusedKernel as one `extern "C"` function with OpenMP
parallel outer loops and `#pragma omp simd` inner loops. All kernels of a graph go in one
translation unit, compiled once (cache.py)."""

from __future__ import annotations

import math

import sympy
import torch

from . import values as V
from .index import FloorDiv, IMod, numel
from .index_printer import IndexPrinter
from .scheduler import FusedKernel

CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.bfloat16: "uint16_t", torch.float16: "_Float16",
}

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <limits>

template <typename T> static inline T max_prop(T a, T b) { if (a != a) return a; if (b != b) return b; return a > b ? a : b; }
template <typename T> static inline T min_prop(T a, T b) { if (a != a) return a; if (b != b) return b; return a < b ? a : b; }
// eager's relu keeps NaN and -0.0 (atan2(-0.0, -0.0) is -pi): only values below 0 become 0
template <typename T> static inline T relu_prop(T a) { return a < T(0) ? T(0) : a; }
static inline float bf16_to_float(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t float_to_bf16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u); return uint16_t(u >> 16);
}
template <typename T> static inline T py_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == T(0)) return a / b;
    T m = std::fmod(a, b); T d = (a - m) / b;
    if (m != T(0) && ((b < T(0)) != (m < T(0)))) d -= T(1);
    if (d == T(0)) return std::copysign(T(0), a / b);
    T fd = std::floor(d); if (d - fd > T(0.5)) fd += T(1); return fd;
  } else {
    T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q;
  }
}
template <typename T> static inline T py_mod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T m = std::fmod(a, b); if (m != T(0) && ((b < T(0)) != (m < T(0)))) m += b; return m;
  } else {
    T m = a % b; if (m != 0 && ((b < 0) != (m < 0))) m += b; return m;
  }
}
template <typename T> static inline T ipow(T a, T b) { T r = 1; while (b > 0) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
template <typename T> static inline T sign_of(T a) { return T((T(0) < a) - (a < T(0))); }
"""

# glibc's libmvec has vector versions of these; declaring them `simd` (what <math.h> does
# under -ffast-math, which we do not use) lets `#pragma omp simd` loops call them.
_MVEC_FUNCS = ["exp", "log", "sin", "cos", "tan", "tanh", "erf", "erfc", "log1p", "expm1", "log2", "log10",
               "exp2", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"]
MVEC_DECLS = 'extern "C" {\n' + "".join(
    f'__attribute__((simd("notinbranch"))) float {f}f(float);\n'
    f'__attribute__((simd("notinbranch"))) double {f}(double);\n' for f in _MVEC_FUNCS) + (
    '__attribute__((simd("notinbranch"))) float powf(float, float);\n'
    '__attribute__((simd("notinbranch"))) double pow(double, double);\n'
    '__attribute__((simd("notinbranch"))) float atan2f(float, float);\n'
    '__attribute__((simd("notinbranch"))) double atan2(double, double);\n}\n')


def prelude(vector_math: bool) -> str:
    return PRELUDE + (MVEC_DECLS if vector_math else "")


class _CppIndexPrinter(IndexPrinter):
    floor_div = "/"
    maximum = "std::max<int64_t>"
    minimum = "std::min<int64_t>"

    def integer(self, n: int) -> str:
        return f"{n}L" if abs(n) > 2**31 - 1 else str(n)

    def floordiv(self, num, den) -> str:
        if _nonnegative(num):
            return f"({self.print(num)} / {self.print(den)})"
        # C++ division truncates; index math is floor division (masked-off lanes of a
        # cat or pad can make the numerator negative)
        return f"py_floordiv<int64_t>({self.print(num)}, {self.print(den)})"

    def mod(self, num, den) -> str:
        if _nonnegative(num):
            return f"({self.print(num)} % {self.print(den)})"
        return f"py_mod<int64_t>({self.print(num)}, {self.print(den)})"


_CPP_INDEX = _CppIndexPrinter()


def cpp_index(e) -> str:
    """Print a sympy index expression as C++ (int64_t arithmetic)."""
    return _CPP_INDEX.print(e)


def _nonnegative(e) -> bool:
    """Provably >= 0: a sum of products of non-negative symbols (loop variables, sizes),
    non-negative constants and floor divisions/modulos of such."""
    e = sympy.expand(e)
    for term in sympy.Add.make_args(e):
        coeff, rest = term.as_coeff_Mul()
        if coeff < 0:
            return False
        for f in sympy.Mul.make_args(rest):
            if f.is_Symbol:
                if not f.is_nonnegative:
                    return False
            elif isinstance(f, (FloorDiv, IMod)):
                if not _nonnegative(f.args[0]):
                    return False
            elif not (f.is_Integer and f >= 0) and f != 1:
                return False
    return True


def cpp_const(value, dtype) -> str:
    ct = CTYPES[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        if math.isnan(value):
            return f"std::numeric_limits<{ct}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{ct}>::infinity()"
        return f"{ct}({value!r})"
    if value == -(2**63):
        return "std::numeric_limits<int64_t>::lowest()"
    return f"{ct}({value}L)" if abs(value) > 2**31 - 1 else f"{ct}({value})"


_UNARY = {
    "neg": "(-{0})", "abs": "std::abs({0})", "exp": "std::exp({0})", "exp2": "std::exp2({0})",
    "expm1": "std::expm1({0})", "log": "std::log({0})", "log2": "std::log2({0})", "log10": "std::log10({0})",
    "log1p": "std::log1p({0})", "sqrt": "std::sqrt({0})", "rsqrt": "({T}(1) / std::sqrt({0}))",
    "sin": "std::sin({0})", "cos": "std::cos({0})", "tan": "std::tan({0})", "asin": "std::asin({0})",
    "acos": "std::acos({0})", "atan": "std::atan({0})", "sinh": "std::sinh({0})", "cosh": "std::cosh({0})",
    "tanh": "std::tanh({0})", "asinh": "std::asinh({0})", "acosh": "std::acosh({0})", "atanh": "std::atanh({0})",
    "erf": "std::erf({0})", "erfc": "std::erfc({0})",
    "ndtr": "({T}(0.5) * std::erfc({0} * {T}(-0.70710678118654752440)))", "lgamma": "std::lgamma({0})",
    "sigmoid": "({T}(1) / ({T}(1) + std::exp(-{0})))", "reciprocal": "({T}(1) / {0})",
    "floor": "std::floor({0})", "ceil": "std::ceil({0})", "round": "std::nearbyint({0})",
    "trunc": "std::trunc({0})", "sign": "sign_of<{T}>({0})", "isnan": "({0} != {0})",
    "isinf": "(std::abs({0}) == std::numeric_limits<{A}>::infinity())", "signbit": "std::signbit({0})",
    "logical_not": "(!{0})", "relu": "relu_prop<{T}>({0})",
}
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "floordiv": "py_floordiv<{T}>({0}, {1})", "remainder": "py_mod<{T}>({0}, {1})",
    "maximum": "max_prop<{T}>({0}, {1})", "minimum": "min_prop<{T}>({0}, {1})",
    "atan2": "std::atan2({0}, {1})", "copysign": "std::copysign({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
    "logical_xor": "(bool({0}) != bool({1}))", "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
}


class Scope:
    """Emitted statements with a value cache; a child scope sees its parent's values."""

    def __init__(self, parent=None, indent=""):
        self.parent = parent
        self.cache: dict = {}
        self.lines: list[str] = []
        self.indent = indent

    def lookup(self, v):
        s = self
        while s is not None:
            if id(v) in s.cache:
                return s.cache[id(v)]
            s = s.parent
        return None


class CppKernel:
    def __init__(self, fk: FusedKernel, layouts: dict, local_ok):
        self.fk = fk
        self.layouts = layouts          # buffer -> Layout
        self.params: dict = {}          # storage buffer -> param name
        self.written: set = set()
        self.counter = 0
        self.locals: dict = {}          # buffer -> C variable holding its value, when visible
        self.unstored = {m.name for m in fk.members} - set(fk.stored)
        self.symbols: set = set()
        self.load_guard = None          # C condition under which loads read real elements
        self.unmarked_nest = False      # a loop nest whose inner loop is not `omp simd`

    # -- values -----------------------------------------------------------------------
    def tmp(self) -> str:
        self.counter += 1
        return f"tmp{self.counter}"

    def param(self, buf: str, write=False) -> str:
        storage = self.fk.storage.get(buf, buf)
        if write:
            self.written.add(storage)
        if storage not in self.params:
            self.params[storage] = f"p_{storage}"
        return self.params[storage]

    def _guarded(self, index: str) -> str:
        """A load's index inside a branch-free masked value: element 0 where the mask is off."""
        return index if self.load_guard is None else f"({self.load_guard} ? {index} : 0)"

    def _branch_free_ok(self, body) -> bool:
        """A masked value can be computed whatever its mask: every buffer it loads has an
        element 0 (a static size of at least one element), and nothing in it can trap on
        the values a masked-off lane reads (integer division)."""
        for x in V.walk(body):
            if x.kind in ("load", "iload"):
                n = sympy.sympify(numel(self.layouts[x.name].sizes))
                if not (n.is_Integer and n > 0):
                    return False
            elif x.kind == "op" and x.name in ("truediv", "floordiv", "remainder") and \
                    not all(a.dtype.is_floating_point for a in x.args):
                return False
        return True

    def index(self, e) -> str:
        e = sympy.sympify(e)
        self.symbols |= {s for s in e.free_symbols if not str(s).startswith(("x", "r", "tmp"))}
        return cpp_index(e)

    def _emit(self, v, scope: Scope) -> str:
        hit = scope.lookup(v)
        if hit is not None:
            return hit
        T = CTYPES[v.dtype] if v.dtype not in (torch.bfloat16, torch.float16) else "float"
        if v.kind == "load":
            local = self.locals.get((v.name, str(v.extra)))
            if local is not None:
                return local
            if v.name in self.unstored:
                # a safety net: the scheduler kept it in registers but it is not visible here;
                # failing now makes the graph run uncompiled instead of reading garbage
                raise RuntimeError(f"{self.fk.name}: {v.name} is neither stored nor in scope")
            ptr = self.param(v.name)
            raw = f"{ptr}[{self._guarded(self.index(v.extra))}]"
            dt = self.layouts[v.name].dtype
            expr = f"bf16_to_float({raw})" if dt == torch.bfloat16 else (
                f"static_cast<float>({raw})" if dt == torch.float16 else raw)
        elif v.kind == "iload":
            expr_index, syms = v.extra
            names = [self._emit(a, scope) for a in v.args]
            sub = expr_index.subs({s: sympy.Symbol(n, integer=True) for s, n in zip(syms, names)})
            raw = f"{self.param(v.name)}[{self._guarded(self.index(sub))}]"
            dt = self.layouts[v.name].dtype
            expr = f"bf16_to_float({raw})" if dt == torch.bfloat16 else (
                f"static_cast<float>({raw})" if dt == torch.float16 else raw)
        elif v.kind == "const":
            return cpp_const(v.extra, v.dtype if v.dtype not in (torch.bfloat16, torch.float16) else torch.float32)
        elif v.kind == "index":
            expr = f"static_cast<{T}>({self.index(v.extra)})"
        elif v.kind == "masked":
            mask = self._emit(v.args[0], scope)
            name = self.tmp()
            other = cpp_const(v.extra, v.dtype if v.dtype not in (torch.bfloat16, torch.float16) else torch.float32)
            # Computed whatever the mask where its loads can be kept in bounds, then selected:
            # no conditional load for g++ to vectorize (it lost a cat's second half, fuzz 417442)
            branch_free = self._branch_free_ok(v.args[1])
            if branch_free:
                inner = Scope(scope, scope.indent)
                guard = mask if self.load_guard is None else f"({self.load_guard} && {mask})"
            else:
                scope.lines.append(f"{scope.indent}{T} {name} = {other};")
                scope.lines.append(f"{scope.indent}if ({mask}) {{")
                inner = Scope(scope, scope.indent + "  ")
                guard = None      # the branch keeps its loads in bounds
            outer_guard, self.load_guard = self.load_guard, guard
            try:
                body = self._emit(v.args[1], inner)
            finally:
                self.load_guard = outer_guard
            scope.lines.extend(inner.lines)
            if branch_free:
                scope.lines.append(f"{scope.indent}{T} {name} = ({mask} ? {body} : {other});")
            else:
                scope.lines.append(f"{inner.indent}{name} = {body};")
                scope.lines.append(f"{scope.indent}}}")
            scope.cache[id(v)] = name
            return name
        else:
            args = [self._emit(a, scope) for a in v.args]
            A = CTYPES.get(v.args[0].dtype, "float") if v.args else T
            if v.args and v.args[0].dtype in (torch.bfloat16, torch.float16):
                A = "float"
            if v.name == "to_dtype":
                if v.dtype == torch.bfloat16:
                    expr = f"bf16_to_float(float_to_bf16(static_cast<float>({args[0]})))"
                elif v.dtype == torch.float16:
                    expr = f"static_cast<float>(static_cast<_Float16>({args[0]}))"
                else:
                    expr = f"static_cast<{T}>({args[0]})"
            elif v.name == "where":
                expr = f"({args[0]} ? {args[1]} : {args[2]})"
            elif v.name == "pow":
                expr = (f"std::pow({args[0]}, {args[1]})" if v.dtype.is_floating_point
                        else f"ipow<{T}>({args[0]}, {args[1]})")
            elif v.name == "bitwise_not":
                expr = f"(!{args[0]})" if v.dtype == torch.bool else f"(~{args[0]})"
            elif v.name == "abs" and v.dtype == torch.bool:
                expr = args[0]
            elif v.name in _UNARY:
                expr = _UNARY[v.name].format(*args, T=T, A=A)
            else:
                expr = _BINARY[v.name].format(*args, T=T)
        name = self.tmp()
        scope.lines.append(f"{scope.indent}{T} {name} = {expr};")
        scope.cache[id(v)] = name
        return name

    def store(self, m, value: str, scope: Scope):
        dt = m.buf.layout.dtype
        ptr = self.param(m.name, write=True)
        if dt == torch.bfloat16:
            value = f"float_to_bf16({value})"
        elif dt == torch.float16:
            value = f"static_cast<_Float16>({value})"
        else:
            value = f"static_cast<{CTYPES[dt]}>({value})"
        scope.lines.append(f"{scope.indent}{ptr}[{self.index(m.store_index)}] = {value};")

    # -- loops ------------------------------------------------------------------------
    def render(self) -> str:
        if self._column_reduction():
            lines = self._render_column_reduction()
        else:
            lines = self._render_loops()
        params = []
        for storage, pname in self.params.items():
            ct = CTYPES[self.layouts[storage].dtype]
            const = "" if storage in self.written else "const "
            params.append(f"{const}{ct}* __restrict__ {pname}")
        params += [f"int64_t {s}" for s in sorted(self.symbols, key=str)]
        self.signature = list(self.params), sorted(self.symbols, key=str)
        # g++ 12 and 13 at -O3 vectorize a loop nest whose inner loop has no `omp simd`
        # across its outer loop, and got small ones wrong (a relu's mask on the wrong elements
        # of a 6x5 gradient, fuzz 418869): such a kernel is not auto-vectorized at all
        attr = '__attribute__((optimize("no-tree-loop-vectorize"))) ' if self.unmarked_nest else ""
        return f'extern "C" {attr}void {self.fk.name}({", ".join(params)}) {{\n' + "\n".join(lines) + "\n}\n"

    # -- reductions over a leading dim: vectorize across the outputs -----------------------
    def _column_reduction(self) -> bool:
        """One outer dim, one reduction phase whose loads walk the outer var with unit
        stride and the reduction var with a large one (a sum over rows, e.g. a bias
        gradient), then only per-output epilogues: accumulate a block of outputs at once,
        the block loop innermost and vectorized, instead of a strided reduction loop."""
        fk = self.fk
        if len(fk.outer) != 1 or not fk.phases:
            return False
        first = fk.phases[0]
        if not (first.reduction and first.inner) or any(ph.inner != () or ph.reduction for ph in fk.phases[1:]):
            return False
        if any(m.buf.is_reduction and m.buf.data.reduction_type not in ("sum", "prod", "max", "min")
               for m in first.members):
            return False
        x0, rl = fk.outer_vars[0], first.inner_vars[-1]
        # any load that walks the outputs contiguously and the reduction with a stride
        # (measured on a transformer backward: 36 ms vs 46 ms per step with a vote instead)
        for m in first.members:
            for ld in V.loads(m.value):
                if ld.kind == "load":
                    e = sympy.expand(ld.extra)
                    if e.coeff(x0) == 1 and e.coeff(rl) not in (0, 1):
                        return True
        return False

    def _render_column_reduction(self) -> list[str]:
        fk = self.fk
        # wide blocks read whole cache lines per row; keep enough blocks to feed the threads
        d = fk.outer[0]
        B = 256 if not d.is_Integer or int(d) >= 1024 else (128 if int(d) >= 256 else 64)
        ph = fk.phases[0]
        x0 = fk.outer_vars[0]
        size = self.index(fk.outer[0])
        work = self.index(numel(fk.outer) * numel(ph.inner))
        lines = [f"  #pragma omp parallel for if({work} >= 32768)",
                 f"  for (int64_t xb = 0; xb < {size}; xb += {B}) {{",
                 f"    const int64_t xn = ({size} - xb) < {B} ? ({size} - xb) : {B};"]
        accs = []
        for m in ph.members:
            if not m.buf.is_reduction:
                continue
            rt, dt = m.buf.data.reduction_type, m.value.dtype
            T = CTYPES[V.compute_dtype(dt)]
            if rt in ("sum", "prod") and T == "float":
                T = "double"   # one sequential accumulator per output: keep it accurate
            if rt in ("sum", "prod"):
                init = "0" if rt == "sum" else "1"
            elif dt.is_floating_point:
                init = ("-" if rt == "max" else "") + f"std::numeric_limits<{T}>::infinity()"
            elif dt == torch.bool:
                init = "false" if rt == "max" else "true"
            else:
                init = f"std::numeric_limits<{T}>::{'lowest' if rt == 'max' else 'max'}()"
            acc = f"acc_{m.name}"
            lines.append(f"    {T} {acc}[{B}];")
            lines.append(f"    for (int64_t xi = 0; xi < {B}; xi++) {acc}[xi] = {init};")
            nan = rt in ("max", "min") and dt.is_floating_point
            if nan:
                lines.append(f"    int {acc}_nan[{B}] = {{0}};")
            accs.append((m, rt, acc, T, nan))
        n = len(ph.inner)
        for k, (var, s) in enumerate(zip(ph.inner_vars, ph.inner)):
            lines.append("    " + "  " * k + f"for (int64_t {var} = 0; {var} < {self.index(s)}; {var}++) {{")
        pad = "    " + "  " * n
        lines.append(f"{pad}#pragma omp simd")
        lines.append(f"{pad}for (int64_t xi = 0; xi < xn; xi++) {{")
        scope = Scope(None, pad + "  ")
        scope.lines.append(f"{scope.indent}const int64_t {x0} = xb + xi;")
        for m in ph.members:
            val = self._emit(m.value, scope)
            if m.buf.is_reduction:
                _, rt, acc, _, nan = next(a for a in accs if a[0] is m)
                if rt == "sum":
                    scope.lines.append(f"{scope.indent}{acc}[xi] = {acc}[xi] + {val};")
                elif rt == "prod":
                    scope.lines.append(f"{scope.indent}{acc}[xi] = {acc}[xi] * {val};")
                else:
                    cmp = ">" if rt == "max" else "<"
                    scope.lines.append(f"{scope.indent}{acc}[xi] = ({val} {cmp} {acc}[xi]) ? {val} : {acc}[xi];")
                    if nan:
                        scope.lines.append(f"{scope.indent}{acc}_nan[xi] = {acc}_nan[xi] | ({val} != {val});")
            else:
                if m.name in fk.stored:
                    self.store(m, val, scope)
                self.locals[(m.name, str(m.store_index))] = val
        lines.extend(scope.lines)
        lines.append(f"{pad}}}")
        for k in reversed(range(n)):
            lines.append("    " + "  " * k + "}")
        self.locals = {}
        # per output: finish the reductions, then the epilogue phases
        lines.append("    for (int64_t xi = 0; xi < xn; xi++) {")
        tail = Scope(None, "      ")
        tail.lines.append(f"      const int64_t {x0} = xb + xi;")
        for m, rt, acc, T, nan in accs:
            res = f"res_{m.name}"
            tail.lines.append(f"      {T} {res} = {acc}[xi];")
            if nan:
                tail.lines.append(f"      if ({acc}_nan[xi]) {res} = std::numeric_limits<{T}>::quiet_NaN();")
            if m.name in fk.stored:
                self.store(m, res, tail)
            self.locals[(m.name, str(m.store_index))] = res
        for later in fk.phases[1:]:
            for m in later.members:
                val = self._emit(m.value, tail)
                if m.name in fk.stored:
                    self.store(m, val, tail)
                self.locals[(m.name, str(m.store_index))] = val
        lines.extend(tail.lines)
        lines.append("    }")
        lines.append("  }")
        return lines

    def _render_loops(self) -> list[str]:
        fk = self.fk
        outer_n = len(fk.outer)
        ind = "  " * (outer_n + 1)
        top = Scope(None, ind)
        pointwise_only = all(ph.inner == () and not ph.reduction for ph in fk.phases)
        self._plan_carry()
        for ph in fk.phases:
            if ph.inner == () and not ph.reduction:
                for m in ph.members:
                    val = self._emit(m.value, top)
                    if m.name in fk.stored:
                        self.store(m, val, top)
                    self.locals[(m.name, str(m.store_index))] = val
                continue
            self._phase(ph, top)
        work = numel(fk.outer) * max((numel(ph.inner) for ph in fk.phases), default=1)
        lines = []
        for k, (var, size) in enumerate(zip(fk.outer_vars, fk.outer)):
            pad = "  " * (k + 1)
            if k == 0:
                cond = self.index(work)
                if pointwise_only and outer_n == 1:
                    lines.append(f"{pad}#pragma omp parallel for simd if(parallel: {cond} >= 32768)")
                elif pointwise_only:
                    lines.append(f"{pad}#pragma omp parallel for collapse({outer_n - 1}) if({cond} >= 32768)")
                else:
                    lines.append(f"{pad}#pragma omp parallel for collapse({outer_n}) if({cond} >= 32768)")
            elif pointwise_only and k == outer_n - 1:
                lines.append(f"{pad}#pragma omp simd")
            lines.append(f"{pad}for (int64_t {var} = 0; {var} < {self.index(size)}; {var}++) {{")
        lines.extend(top.lines)
        for k in reversed(range(outer_n)):
            lines.append("  " * (k + 1) + "}")
        return lines

    def _plan_carry(self):
        """Softmax's exp(x - max) is computed in the sum phase and again in the phase that
        writes the output. When a later phase's stored member contains such a costly value
        that an earlier reduction phase over the same inner loop also computes, the earlier
        phase writes it to that member's own output element and the later phase reads it back
        (the same bits: same dtype, no rounding) before overwriting the element. Only for a
        fresh output buffer that nothing in the kernel reads."""
        self.carry_store: dict = {}    # id(phase) -> [(value, member)]
        self.carry_load: dict = {}     # id(phase) -> [(value, member)]
        self.carried: set = set()      # (id(value), member name) stored by an earlier phase
        fk = self.fk
        read = {ld.name for m in fk.members for ld in V.loads(m.value)}
        for b, ph in enumerate(fk.phases):
            if not ph.inner:
                continue
            for m in ph.members:
                dt = m.buf.layout.dtype
                if (m.buf.is_reduction or m.name not in fk.stored or m.name in read
                        or dt not in (torch.float32, torch.float64)):
                    continue
                for a in range(b):
                    pa = fk.phases[a]
                    if not pa.reduction or tuple(pa.inner) != tuple(ph.inner) or \
                            list(map(str, pa.inner_vars)) != list(map(str, ph.inner_vars)):
                        continue
                    there = set()
                    for ma in pa.members:
                        there |= _unmasked_ids(ma.value)
                    e = _largest_shared(m.value, there, dt)
                    if e is not None and m.name in fk.storage and not self._carry_in_place_ok(m, e, a, b):
                        e = None
                    if e is not None:
                        self.carry_store.setdefault(id(pa), []).append((e, m))
                        self.carry_load.setdefault(id(ph), []).append((e, m))
                        break

    def _carry_in_place_ok(self, m, e, a: int, b: int) -> bool:
        """m is computed in place over a buffer the kernel reads (a matmul's scores): once
        phase a has written e there, nothing up to phase b may read the old values, except
        through e itself."""
        fk = self.fk
        target = fk.storage[m.name]
        group = {target} | {n for n, t in fk.storage.items() if t == target}
        for p in fk.phases[a + 1:b + 1]:
            for other in p.members:
                stop = e if other is m else None
                if any(x.kind in ("load", "iload") and x.name in group for x in _walk_until(other.value, stop)):
                    return False
        return True

    def _phase(self, ph, top: Scope):
        ind = top.indent
        inner_vars = ph.inner_vars
        accs = []
        for m in ph.members:
            if m.buf.is_reduction:
                rt = m.buf.data.reduction_type
                dt = m.value.dtype
                T = CTYPES[V.compute_dtype(dt)]
                acc = f"acc_{m.name}"
                if rt in ("argmax", "argmin"):
                    init = ("-" if rt == "argmax" else "") + (
                        f"std::numeric_limits<{T}>::infinity()" if dt.is_floating_point else "")
                    if not dt.is_floating_point:
                        init = f"std::numeric_limits<{T}>::{'lowest' if rt == 'argmax' else 'max'}()"
                    top.lines.append(f"{ind}{T} {acc} = {init};")
                    top.lines.append(f"{ind}int64_t {acc}_i = 0;")
                else:
                    if rt in ("any", "all"):
                        T = "int"
                    init = {"sum": "0", "prod": "1", "any": "0", "all": "1"}.get(rt)
                    if init is None:
                        if dt == torch.bool:
                            init = "false" if rt == "max" else "true"
                        elif dt.is_floating_point:
                            init = ("-" if rt == "max" else "") + f"std::numeric_limits<{T}>::infinity()"
                        else:
                            init = f"std::numeric_limits<{T}>::{'lowest' if rt == 'max' else 'max'}()"
                    top.lines.append(f"{ind}{T} {acc} = {init};")
                accs.append((m, rt, acc))
        simd_ok = all(rt in ("sum", "prod", "any", "all", "max", "min") for _, rt, _ in accs)
        clauses = []
        for m, rt, acc in accs:
            if rt in ("max", "min"):
                clauses.append(f"reduction({rt}:{acc})")
                if m.value.dtype.is_floating_point:
                    top.lines.append(f"{ind}int {acc}_nan = 0;")
                    clauses.append(f"reduction(|:{acc}_nan)")
            elif rt in ("sum", "prod", "any", "all"):
                clauses.append(f"reduction({ {'sum': '+', 'prod': '*', 'any': '|', 'all': '&'}[rt] }:{acc})")
        red_clause = " ".join(clauses) if simd_ok else ""
        n = len(ph.inner)
        for k, (var, size) in enumerate(zip(inner_vars, ph.inner)):
            pad = ind + "  " * k
            # not over a few iterations, which gain nothing from SIMD: g++ 12 -O3 -fopenmp lost an
            # iteration of a 2-long `omp simd` sum over `cat` pieces in float64 (fuzz 414119)
            short = isinstance(size, (int, sympy.Integer)) and int(size) < 8
            if k == n - 1 and simd_ok and not short:
                top.lines.append(f"{pad}#pragma omp simd {red_clause}".rstrip())
            elif k == n - 1 and n > 1:
                self.unmarked_nest = True
            top.lines.append(f"{pad}for (int64_t {var} = 0; {var} < {self.index(size)}; {var}++) {{")
        scope = Scope(top, ind + "  " * n)
        saved = dict(self.locals)
        for e, m in getattr(self, "carry_load", {}).get(id(ph), []):
            if (id(e), m.name) in self.carried and scope.lookup(e) is None:
                name = self.tmp()
                T = CTYPES[m.buf.layout.dtype]
                scope.lines.append(f"{scope.indent}{T} {name} = {self.param(m.name, write=True)}[{self.index(m.store_index)}];")
                scope.cache[id(e)] = name
        for m in ph.members:
            val = self._emit(m.value, scope)
            if m.buf.is_reduction:
                rt = [a for a in accs if a[0] is m][0][1]
                acc = f"acc_{m.name}"
                if rt == "sum":
                    scope.lines.append(f"{scope.indent}{acc} = {acc} + {val};")
                elif rt == "prod":
                    scope.lines.append(f"{scope.indent}{acc} = {acc} * {val};")
                elif rt == "any":
                    scope.lines.append(f"{scope.indent}{acc} = {acc} | int({val} != 0);")
                elif rt == "all":
                    scope.lines.append(f"{scope.indent}{acc} = {acc} & int({val} != 0);")
                elif rt in ("max", "min"):
                    cmp = ">" if rt == "max" else "<"
                    scope.lines.append(f"{scope.indent}{acc} = ({val} {cmp} {acc}) ? {val} : {acc};")
                    if m.value.dtype.is_floating_point:
                        # NaN wins, as in eager; tracked apart so the loop still vectorizes
                        scope.lines.append(f"{scope.indent}{acc}_nan = {acc}_nan | ({val} != {val});")
                else:
                    cmp = ">" if rt == "argmax" else "<"
                    flat = self.index(sum((v * s for v, s in zip(inner_vars, _strides(ph.inner))), sympy.Integer(0)))
                    scope.lines.append(f"{scope.indent}if (!({acc} != {acc}) && ({val} != {val} || {val} {cmp} {acc})) "
                                       f"{{ {acc} = {val}; {acc}_i = {flat}; }}")
            else:
                if m.name in self.fk.stored:
                    self.store(m, val, scope)
                self.locals[(m.name, str(m.store_index))] = val
        for e, m in getattr(self, "carry_store", {}).get(id(ph), []):
            name = scope.cache.get(id(e))    # computed at the loop's own level (not under a mask)
            if name is not None:
                self.store(m, name, scope)
                self.carried.add((id(e), m.name))
        top.lines.extend(scope.lines)
        for k in reversed(range(n)):
            top.lines.append(ind + "  " * k + "}")
        if n:
            # values computed inside the loops die with them; a loop-less phase (a reduction
            # over size-1 dims) leaves its pointwise values in scope for later phases
            self.locals = saved
        for m, rt, acc in accs:
            if rt in ("max", "min") and m.value.dtype.is_floating_point:
                top.lines.append(f"{ind}if ({acc}_nan) {acc} = std::numeric_limits<{CTYPES[m.value.dtype]}>::quiet_NaN();")
            result = f"{acc}_i" if rt in ("argmax", "argmin") else acc
            if m.name in self.fk.stored:
                self.store(m, result, top)
            self.locals[(m.name, str(m.store_index))] = result


def _unmasked_ids(v, out=None) -> set:
    """ids of the values an expression computes outside any masked branch."""
    out = set() if out is None else out
    if id(v) in out:
        return out
    out.add(id(v))
    if v.kind != "masked":
        for a in v.args:
            _unmasked_ids(a, out)
    else:
        _unmasked_ids(v.args[0], out)
    return out


def _walk_until(v, stop):
    """Every value reachable from v without entering `stop`."""
    out, todo, seen = [], [v], set()
    while todo:
        x = todo.pop()
        if x is stop or id(x) in seen:
            continue
        seen.add(id(x))
        out.append(x)
        todo.extend(x.args)
    return out


def _largest_shared(v, there: set, dtype):
    """The first (outermost) sub-value of v, outside masked branches, that `there` computes
    too and that is worth carrying (it contains a transcendental op)."""
    todo, seen = [v], set()
    while todo:
        x = todo.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        if id(x) in there and x.dtype == dtype and x.kind == "op" and any(
                n.kind == "op" and n.name in _COSTLY for n in V.walk(x)):
            return x
        if x.kind != "masked":
            todo.extend(x.args)
    return None


_COSTLY = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "erf", "erfc", "ndtr", "tanh", "sigmoid", "sin",
           "cos", "tan", "pow", "atan", "atan2", "asin", "acos", "sinh", "cosh"}


def _strides(sizes):
    out, acc = [], sympy.Integer(1)
    for s in reversed(list(sizes)):
        out.append(acc)
        acc = acc * s
    return list(reversed(out))


def render_kernel(fk: FusedKernel, layouts: dict):
    """(C++ source of the kernel, parameter buffers in order, size symbols in order)."""
    k = CppKernel(fk, layouts, None)
    src = k.render()
    bufs, syms = k.signature
    return src, bufs, syms, k.written
