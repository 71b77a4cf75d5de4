"""The Triton emitter: renders one scheduled FusedKernel as a @triton.jit function.

Two kernel shapes:
  pointwise   every phase is elementwise over the outer loop: a 1-D block of XBLOCK
              elements of the flattened outer range (xindex), outer vars by div/mod.
  reduction   some phase loops over an inner range: a 2-D [XBLOCK, RBLOCK] tile, XBLOCK
              rows of the outer range by RBLOCK elements of the flattened inner range.
              Persistent (the whole row in one tile, loaded once and reused by every
              phase: softmax/layernorm read their input once) when the row size is static
              and fits; looped otherwise (one `for roffset` loop per phase, accumulators
              of the tile's shape, combined at the end of the loop).
  split       a looped reduction with too few rows to fill the GPU (column sums of a
              weight gradient, a full reduction): two kernels. `<name>_split` runs a
              grid of (row blocks, NSPLIT) programs, each reducing RSPLIT elements of the
              row into an fp32 partial; `<name>` combines the NSPLIT partials of each row
              and runs the epilogue. Deterministic (no atomics).

Values are computed in the IR's compute dtype (fp32 for bf16/fp16 buffers, as eager does)
and converted to the buffer's dtype on store. Sizes that are symbols arrive as kernel
arguments; every load and store is masked with the block's bounds, so any size works."""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import sympy
import torch

from .. import values as V
from ..index import VAR_RANGES, IMod, index_var, numel, unflatten
from ..index_printer import IndexPrinter
from ..scheduler import FusedKernel
from .heuristics import cdiv

TL_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

# Largest row (elements) kept whole in one tile; longer or dynamic rows loop.
PERSISTENT_MAX = 8192
# A looped reduction splits its rows when they are at least this long and the kernel
# would otherwise run fewer than SPLIT_MAX_PROGRAMS programs (rows per program as the
# split heuristic tiles them: 64 contiguous columns, or one row).
SPLIT_MIN_R = 1024
SPLIT_MAX_PROGRAMS = 512
_SPLITTABLE = {"sum", "prod", "max", "min", "any", "all"}

PRELUDE = '''\
import triton
import triton.language as tl
{gpu}

@triton.jit
def _max_nan(a, b):
    return tl.where((a != a) | (a > b), a, b)


@triton.jit
def _min_nan(a, b):
    return tl.where((a != a) | (a < b), a, b)


@triton.jit
def _sum(a, b):
    return a + b


@triton.jit
def _prod(a, b):
    return a * b


@triton.jit
def _argmax_combine(v1, i1, v2, i2):
    # NaN is the largest value (torch's argmax); ties keep the first index
    take2 = ((v2 != v2) & (v1 == v1)) | (v2 > v1) | ((v1 == v2) & (i2 < i1)) | ((v1 != v1) & (v2 != v2) & (i2 < i1))
    return tl.where(take2, v2, v1), tl.where(take2, i2, i1)


@triton.jit
def _argmin_combine(v1, i1, v2, i2):
    take2 = ((v2 != v2) & (v1 == v1)) | (v2 < v1) | ((v1 == v2) & (i2 < i1)) | ((v1 != v1) & (v2 != v2) & (i2 < i1))
    return tl.where(take2, v2, v1), tl.where(take2, i2, i1)


@triton.jit
def _ndtr(x):
    # The standard normal CDF: 1 - h(x) for x >= 0, else h(-x), where h(t) = Phi(-t) =
    # exp2(p(t)) and p is a degree-10 polynomial fitted to log2(Phi(-t)) on [0, 6]
    # (weighted least squares; it keeps falling past 6, so h goes to 0). Error: 1.1e-7
    # absolute (eager's 0.5 * (1 + erf(x / sqrt(2))): 6e-8), 3e-6 relative in the tail,
    # where eager's loses everything to cancellation; ~15 instructions to erf's ~30.
    t = tl.abs(x)
    p = t * -1.5222955e-08 + 5.0266317e-07
    p = p * t - 7.0714004e-06
    p = p * t + 5.335075e-05
    p = p * t - 0.00019903544
    p = p * t - 0.0001681125
    p = p * t + 0.0071504386
    p = p * t - 0.05257396
    p = p * t - 0.4591808
    p = p * t - 1.1511081
    p = p * t - 1.0
    h = tl.exp2(p)
    return tl.where(x >= 0, 1.0 - h, h)

'''


class Unsupported(Exception):
    """This kernel cannot be emitted as Triton (the graph then runs its aten ops)."""


class _TritonIndexPrinter(IndexPrinter):
    maximum = "tl.maximum"
    minimum = "tl.minimum"
    error = Unsupported


_TL_INDEX = _TritonIndexPrinter()


@functools.lru_cache(maxsize=1 << 16)
def tl_index(e) -> str:
    """A sympy index expression as Triton/Python integer arithmetic (operands are >= 0).
    Cached: equal expressions print alike, and sympy's printer is most of a kernel's render time."""
    return _TL_INDEX.print(e)


# A kernel-local value is found by buffer and index; two equal index expressions are the same
# place. Keyed by their text, as sympy prints it (cached: printing is slow).
_index_key = functools.lru_cache(maxsize=1 << 16)(str)


def tl_const(value, dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return f'float("{"-" if value < 0 else ""}inf")'
        return repr(float(value))
    return str(int(value))


# op -> template (only builtins: triton.language's @jit helpers such as tl.sum or
# tl.sigmoid do not run under an interpreter started after triton was imported). {0},{1},{2}: operands. GPU-only entries use libdevice, which the CPU
# interpreter lacks; `_INTERP` gives the interpreter an equivalent (tests), or the op is
# unsupported there.
_OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "logical_and": "(({0} != 0) & ({1} != 0))", "logical_or": "(({0} != 0) | ({1} != 0))",
    "logical_xor": "(({0} != 0) != ({1} != 0))", "logical_not": "({0} == 0)",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "neg": "(-{0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})",
    "log2": "tl.log2({0})", "sqrt": "tl.sqrt_rn({0})", "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "erf": "tl.erf({0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))", "reciprocal": "(1.0 / {0})", "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == float(\"inf\"))", "where": "tl.where({0}, {1}, {2})",
    "erfc": "(1.0 - tl.erf({0}))", "ndtr": "_ndtr({0})",
}
_LIBDEVICE = {
    "tanh": "libdevice.tanh({0})", "expm1": "libdevice.expm1({0})", "log1p": "libdevice.log1p({0})",
    "log10": "libdevice.log10({0})", "tan": "libdevice.tan({0})", "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})", "atan": "libdevice.atan({0})", "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})", "asinh": "libdevice.asinh({0})", "acosh": "libdevice.acosh({0})",
    "atanh": "libdevice.atanh({0})", "lgamma": "libdevice.lgamma({0})", "round": "libdevice.nearbyint({0})",
    "trunc": "libdevice.trunc({0})", "atan2": "libdevice.atan2({0}, {1})", "copysign": "libdevice.copysign({0}, {1})",
    "pow": "libdevice.pow({0}, {1})", "signbit": "(libdevice.signbit({0}) != 0)", "erfc": "libdevice.erfc({0})",
}
_INTERP = {
    "tanh": "(2.0 / (1.0 + tl.exp(-2.0 * {0})) - 1.0)", "expm1": "(tl.exp({0}) - 1.0)", "log1p": "tl.log(1.0 + {0})",
    "log10": "(tl.log({0}) * 0.4342944819032518)", "tan": "(tl.sin({0}) / tl.cos({0}))",
    "sinh": "(0.5 * (tl.exp({0}) - tl.exp(-{0})))", "cosh": "(0.5 * (tl.exp({0}) + tl.exp(-{0})))",
    "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    "round": "tl.where((tl.floor({0}) + 0.5 == {0}) & (tl.floor({0}) % 2 == 0), tl.floor({0}), tl.floor({0} + 0.5))",
}


@dataclasses.dataclass
class KernelSource:
    name: str
    source: str                 # the @triton.jit function
    buffers: list               # storage buffer names, in parameter order
    written: set                # storage buffers the kernel writes
    read: set                   # storage buffers the kernel reads
    symbols: list               # size symbols passed as arguments, in order
    kind: str                   # "pointwise" | "reduction"
    persistent: bool
    xnumel: sympy.Expr
    rnumel: sympy.Expr          # the largest inner range (1 for pointwise kernels)
    x_contiguous: bool          # reduction whose loads are contiguous along the outer dim
    elem_bytes: int
    split_slots: int = 0        # a split reduction: fp32 partials per row and split (its reductions)


_MASK_OPS = {"ge": lambda a, b: a >= b, "gt": lambda a, b: a > b, "le": lambda a, b: a <= b,
             "lt": lambda a, b: a < b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
             "logical_and": lambda a, b: a & b, "logical_or": lambda a, b: a | b}


def _holds_somewhere(masks: list, vars_of, limit: int = 1 << 22) -> bool:
    """Whether the conjunction of masks (conditions on index variables: a pad's or a cat's
    bounds) is true at some point of its variables' ranges, found by evaluating it over
    all of them; False when that cannot be shown (an unknown op, a dynamic range, too many
    points)."""
    import numpy as np
    syms = sorted(set().union(*[vars_of(m) for m in masks]), key=str)
    sizes = [VAR_RANGES.get(s) for s in syms]
    if any(n is None or not sympy.sympify(n).is_Integer for n in sizes) or math.prod(int(n) for n in sizes) > limit:
        return False
    grid = np.meshgrid(*[np.arange(int(n)) for n in sizes], indexing="ij", sparse=True) if syms else []
    env = dict(zip(syms, grid))

    def ev(v):
        if v.kind == "const" and isinstance(v.extra, (bool, int)):
            return np.asarray(v.extra)
        if v.kind == "index":
            e = sympy.sympify(v.extra)
            if not all(isinstance(a, (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul)) for a in sympy.preorder_traversal(e)):
                return None
            return sympy.lambdify(list(env), e, "numpy")(*env.values()) if env else np.asarray(int(e))
        if v.kind == "op" and v.name in _MASK_OPS and len(v.args) == 2:
            a, b = ev(v.args[0]), ev(v.args[1])
            return None if a is None or b is None else _MASK_OPS[v.name](a, b)
        return None
    acc = np.asarray(True)
    for m in masks:
        val = ev(m)
        if val is None:
            return False
        acc = acc & val
    return bool(np.any(acc))


class _Scope:
    def __init__(self, indent: str):
        self.indent = indent
        self.lines: list[str] = []
        self.cache: dict = {}


class TritonKernel:
    def __init__(self, fk: FusedKernel, layouts: dict, interpret: bool, needed=None):
        self.fk = fk
        self.layouts = layouts
        self.interpret = interpret
        self.params: dict = {}           # storage -> param name
        self.written: set = set()
        self.read: set = set()
        self.counter = 0
        self.locals: dict = {}           # (buffer, index str) -> (var, is_r_level, phase inner)
        # Phases share the symbols r0, r1, ... over different ranges: r-level values, locals
        # and index rewrites belong to the phase (inner ranges) they were made in.
        self.cur_inner = None
        self.cur_vars = None
        self.loop_vars: set = set(fk.outer_vars)
        for ph in fk.phases:
            self.loop_vars |= set(ph.inner_vars)
        self.r_vars: set = set()
        self.mask_values: dict = {}      # emitted mask variable -> the masked region's condition
        self.needed_masks: dict = {}     # (id(value), mask context) -> the masks its loads need
        self.vars_memo: dict = {}        # id(value) -> the loop variables it depends on
        for ph in fk.phases:
            self.r_vars |= set(ph.inner_vars)
        self.xflat = sympy.Symbol("xindex", integer=True, nonnegative=True)
        self.rflat = sympy.Symbol("rindex", integer=True, nonnegative=True)
        self.loop_vars |= {self.xflat, self.rflat}
        self.symbols: set = set()
        self._rdefined = None           # inner ranges whose rmask/r vars are defined (persistent)
        # a sum over dims of size 1 (a Linear's bias gradient at batch 1) has no inner range
        # left after squeezing, and is still a reduction: a tile of one column
        self.reduction = any(ph.inner != () or ph.reduction for ph in fk.phases)
        self.r_numels = [numel(ph.inner) for ph in fk.phases if ph.inner != () or ph.reduction]
        static = all(n.is_Integer for n in self.r_numels)
        self.x_contiguous = self._x_contiguous()
        # a whole row in one tile, unless the rows are strided (a leading-dim reduction):
        # then short r steps over many contiguous columns load better
        self.persistent = self.reduction and static and max(int(n) for n in self.r_numels) <= (
            PERSISTENT_MAX if not self.x_contiguous else 512)
        self.int64 = self._needs_int64()
        self.index_type = "tl.int64" if self.int64 else "tl.int32"
        self.big_index = 2 ** 62 if self.int64 else 2 ** 31 - 1
        # The scheduler stores a value read by a later phase (a C++ loop cannot keep a row);
        # a persistent tile keeps it in registers, so only outputs and values other steps
        # read are written.
        self.stored = set(fk.stored)
        if self.persistent and needed is not None:
            self.stored = {n for n in fk.stored if n in needed}
        self.split = self._splittable()
        self.split_slots = 0
        self._split_lines = None        # (loop start, loop end) in the body; tail of <name>_split

    # -- helpers ----------------------------------------------------------------------
    def _splittable(self) -> bool:
        """One looped reduction phase first, associative fp32 reductions, static sizes, and
        too few programs without a split."""
        if not self.reduction or self.persistent:
            return False
        looped = [ph for ph in self.fk.phases if ph.inner != ()]
        if len(looped) != 1 or self.fk.phases[0] is not looped[0]:
            return False
        reds = [m for m in looped[0].members if m.buf.is_reduction]
        if not reds or any(m.buf.data.reduction_type not in _SPLITTABLE
                           or self._acc_dtype(m.buf.data.reduction_type, m.value.dtype) != torch.float32
                           for m in reds):
            return False
        xn, rn = numel(self.fk.outer), numel(looped[0].inner)
        if not (xn.is_Integer and rn.is_Integer) or int(rn) < SPLIT_MIN_R:
            return False
        per_program = 64 if self.x_contiguous else 1
        return cdiv(int(xn), per_program) < SPLIT_MAX_PROGRAMS

    def _needs_int64(self) -> bool:
        for m in self.fk.members:
            for ld in V.loads(m.value):
                lay = self.layouts.get(ld.name)
                if lay is None:
                    continue
                n = numel(lay.sizes)
                if not n.is_Integer or int(n) * 2 >= 2 ** 31:
                    return True
            n = numel(m.buf.layout.sizes)
            if not n.is_Integer or int(n) * 2 >= 2 ** 31:
                return True
        return False

    def local(self, name, index, inner="current"):
        """(var, is_r, inner) of a value this kernel computed, if visible in the current phase."""
        hit = self.locals.get((name, _index_key(index)))
        inner = self.cur_inner if inner == "current" else inner
        if hit is None or (hit[1] and hit[2] != inner):
            return None
        return hit

    def tmp(self) -> str:
        self.counter += 1
        return f"tmp{self.counter}"

    def param(self, buf: str, write=False) -> str:
        storage = self.fk.storage.get(buf, buf)
        (self.written if write else self.read).add(storage)
        if storage not in self.params:
            self.params[storage] = f"p_{storage}"
        return self.params[storage]

    def index(self, e) -> str:
        e = sympy.sympify(e)
        e = _collapse(e, list(self.fk.outer_vars), list(self.fk.outer), self.xflat)
        if self.cur_inner is not None:
            e = _collapse(e, list(self.cur_vars), list(self.cur_inner), self.rflat)
        self.symbols |= {s for s in e.free_symbols if s not in self.loop_vars}
        return tl_index(e)

    def is_r(self, v: V.Value) -> bool:
        """Whether a value varies along the inner (reduction) range of the tile."""
        for node in V.walk(v):
            if node.kind == "iload" and sympy.sympify(node.extra[0]).free_symbols & self.r_vars:
                return True
            if node.kind in ("load", "index"):
                if node.kind == "load":
                    hit = self.local(node.name, node.extra)
                    if hit is not None:
                        if hit[1]:
                            return True
                        continue
                if sympy.sympify(node.extra).free_symbols & self.r_vars:
                    return True
        return False

    # -- values -----------------------------------------------------------------------
    def emit(self, v: V.Value, scope: _Scope, top: _Scope, mask_ctx: tuple = ()) -> str:
        """The variable holding v. Values that do not vary along r are hoisted to `top`."""
        target = scope
        r = self.is_r(v)
        if mask_ctx and not r:
            mask_ctx = self._masks_needed(v, mask_ctx)
        if scope is not top and not mask_ctx and not r:
            target = top      # hoisted out of the r loop
        key = (id(v), mask_ctx, self.cur_inner if r else None)
        for s in (target, top) if target is not top else (top,):
            if key in s.cache:
                return s.cache[key]
        if v.kind == "load" and self.local(v.name, v.extra) is not None:
            return self.local(v.name, v.extra)[0]       # a value this kernel computed
        expr = self._expr(v, target, top, mask_ctx)
        if v.kind == "const":
            return expr
        name = self.tmp()
        target.lines.append(f"{target.indent}{name} = {expr}")
        target.cache[key] = name
        return name

    def _expr(self, v, scope, top, mask_ctx) -> str:
        if v.kind == "load":
            hit = self.local(v.name, v.extra)
            if hit is not None:
                return hit[0]
            ptr = self.param(v.name)
            e = sympy.sympify(v.extra)
            masks = list(mask_ctx)
            syms = e.free_symbols
            if syms & self.r_vars:
                masks.insert(0, "rmask")
            if syms & set(self.fk.outer_vars) or (syms & self.r_vars and self.reduction):
                masks.insert(0, "xmask")
            buf_dt = self.layouts[v.name].dtype
            if masks and not syms & self.loop_vars:
                # one address (a 0-dim tensor) inside a masked region (a pad): Triton takes a
                # block mask only with a block of pointers, so the address is broadcast to it
                mask = " & ".join(masks)
                load = f"tl.load({ptr} + {self.index(e)} + ({mask}).to(tl.int32) * 0, {mask}, other=0)"
            elif masks:
                load = f"tl.load({ptr} + {self.index(e)}, {' & '.join(masks)}, other=0)"
            else:
                load = f"tl.load({ptr} + {self.index(e)})"
            if buf_dt != v.dtype:
                load += f".to({TL_TYPES[v.dtype]})"
            return load
        if v.kind == "iload":
            return self._indirect_load(v, scope, top, mask_ctx)
        if v.kind == "const":
            dt = v.dtype
            return f"tl.full([{', '.join(['1'] * (2 if self.reduction else 1))}], {tl_const(v.extra, dt)}, {TL_TYPES[dt]})"
        if v.kind == "index":
            e = sympy.sympify(v.extra)
            if not e.free_symbols & self.loop_vars:
                return f"tl.full([{', '.join(['1'] * (2 if self.reduction else 1))}], {self.index(e)}, {TL_TYPES[v.dtype]})"
            return f"({self.index(e)}).to({TL_TYPES[v.dtype]})"
        if v.kind == "masked":
            mask = self.emit(v.args[0], scope, top, mask_ctx)
            self.mask_values[mask] = v.args[0]
            body = self.emit(v.args[1], scope, top, mask_ctx + (mask,))
            return f"tl.where({mask}, {body}, {tl_const(v.extra, v.dtype)})"
        args = [self.emit(a, scope, top, mask_ctx) for a in v.args]
        return self._op(v, args)

    # -- masks of padded regions ---------------------------------------------------------
    def _vars_of(self, v: V.Value) -> set:
        """The loop variables a value depends on."""
        hit = self.vars_memo.get(id(v))
        if hit is not None:
            return hit
        out = set()
        for node in V.walk(v):
            if node.kind in ("load", "index"):
                out |= sympy.sympify(node.extra).free_symbols
            elif node.kind == "iload":
                out |= sympy.sympify(node.extra[0]).free_symbols
        self.vars_memo[id(v)] = out = out & self.loop_vars
        return out

    def _masks_needed(self, v: V.Value, mask_ctx: tuple) -> tuple:
        """The masks of mask_ctx that v's loads need. A mask whose variables none of the
        loads' addresses (nor the masks kept) depend on, and that holds somewhere, guards
        nothing: each address is also read where it holds. Without it a value that does
        not vary along the row is computed once a row before the loop instead of once an
        element inside it (a padded logits gradient re-read its row's label, log-sum and
        count per element behind the padding's column mask: 0.82 ms on an H200 for GPT-2's
        4096 x 50264, where the same work unpadded took 0.44)."""
        key = (id(v), mask_ctx)
        hit = self.needed_masks.get(key)
        if hit is not None:
            return hit
        loads = [n for n in V.walk(v) if n.kind == "iload"
                 or n.kind == "load" and self.local(n.name, n.extra) is None]
        if any(n.kind == "iload" for n in loads):
            kept = mask_ctx
        else:
            near = set().union(*[self._vars_of(n) for n in loads]) if loads else set()
            kept, grew = [], bool(loads)
            while grew:
                more = [m for m in mask_ctx if m not in kept and self._vars_of(self.mask_values[m]) & near]
                kept += more
                near |= set().union(*[self._vars_of(self.mask_values[m]) for m in more]) if more else set()
                grew = bool(more)
            dropped = [m for m in mask_ctx if m not in kept]
            if dropped and not _holds_somewhere([self.mask_values[m] for m in dropped], self._vars_of):
                kept = list(mask_ctx)
            kept = tuple(m for m in mask_ctx if m in kept)
        self.needed_masks[key] = kept
        return kept

    def _indirect_load(self, v, scope, top, mask_ctx) -> str:
        """A gather (embedding, index_select): the address holds values loaded first (the
        bindings, e.g. token ids), which the index expression names by placeholder symbols."""
        expr, syms = v.extra
        names = [self.emit(a, scope, top, mask_ctx) for a in v.args]
        e = sympy.sympify(expr)
        text = self.index(e)
        self.symbols -= set(syms)                  # placeholders, not kernel arguments
        for sym, name in zip(syms, names):
            text = re.sub(rf"\b{re.escape(str(sym))}\b", f"({name})", text)
        used = e.free_symbols - set(syms)
        for a in v.args:
            for ld in V.loads(a):
                x = ld.extra[0] if ld.kind == "iload" else ld.extra
                used |= sympy.sympify(x).free_symbols
        masks = list(mask_ctx)
        if used & self.r_vars:
            masks.insert(0, "rmask")
        if used & set(self.fk.outer_vars) or (used & self.r_vars and self.reduction):
            masks.insert(0, "xmask")
        ptr = self.param(v.name)
        load = f"tl.load({ptr} + ({text}), {' & '.join(masks)}, other=0)" if masks else f"tl.load({ptr} + ({text}))"
        if self.layouts[v.name].dtype != v.dtype:
            load += f".to({TL_TYPES[v.dtype]})"
        return load

    def _op(self, v, args) -> str:
        name, dt = v.name, v.dtype
        a_dt = v.args[0].dtype if v.args else dt
        if name == "to_dtype":
            if dt == torch.bool:
                return f"({args[0]} != 0)"
            return f"{args[0]}.to({TL_TYPES[dt]})"
        if name in ("maximum", "minimum"):
            fn = "_max_nan" if name == "maximum" else "_min_nan"
            return f"{fn}({args[0]}, {args[1]})" if dt.is_floating_point else \
                f"tl.{name}({args[0]}, {args[1]})"
        if name == "relu":
            # eager keeps NaN and -0.0: only values below 0 become 0
            return f"tl.where({args[0]} < 0, 0, {args[0]})" \
                if dt.is_floating_point else f"tl.maximum({args[0]}, 0)"
        if name == "sign":
            return f"(({args[0]} > 0).to({TL_TYPES[dt]}) - ({args[0]} < 0).to({TL_TYPES[dt]}))"
        if name == "bitwise_not":
            return f"({args[0]} == 0)" if dt == torch.bool else f"(~{args[0]})"
        if name == "abs" and dt == torch.bool:
            return args[0]
        if name == "sqrt" and dt == torch.float64:
            return f"tl.sqrt({args[0]})"    # sqrt_rn takes fp32 only; fp64's square root is rounded right
        if name in ("floordiv", "remainder"):
            a, b = args
            if dt.is_floating_point:
                # Python's float // and %, from fmod (Triton's float %), as eager computes them
                m = f"({a} % {b})"
                fix = f"(({m} != 0) & (({b} < 0) != ({m} < 0)))"
                if name == "remainder":
                    return f"tl.where({fix}, {m} + {b}, {m})"
                d = f"tl.where({fix}, ({a} - {m}) / {b} - 1.0, ({a} - {m}) / {b})"
                fd = f"tl.where({d} - tl.floor({d}) > 0.5, tl.floor({d}) + 1.0, tl.floor({d}))"
                q = f"({a} / {b})"
                zero = f"({q} * 0.0)"      # copysign(0, a / b): q is finite wherever d == 0
                return f"tl.where({b} == 0, {a} / {b}, tl.where({d} == 0, {zero}, {fd}))"
            # triton's integer // and % truncate toward zero (C); torch floors (Python)
            q, r = f"({a} // {b})", f"({a} % {b})"
            fix = f"(({r} != 0) & (({a} < 0) != ({b} < 0)))"
            if name == "floordiv":
                return f"({q} - {fix}.to({TL_TYPES[dt]}))"
            return f"tl.where({fix}, {r} + {b}, {r})"
        if name == "pow" and not dt.is_floating_point:
            raise Unsupported("integer pow")
        if dt == torch.float64 and name == "ndtr":       # _ndtr is fp32-accurate
            return f"(0.5 * (1.0 + tl.erf({args[0]} * 0.7071067811865476)))" if self.interpret else \
                f"(0.5 * libdevice.erfc({args[0]} * -0.7071067811865476))"
        if name == "rsqrt" and dt == torch.float32 and not self.interpret:
            return f"_rsqrt({args[0]})"
        if name in _OPS and not (name == "erfc" and not self.interpret):
            return _OPS[name].format(*args)
        if self.interpret:
            if name in _INTERP:
                return _INTERP[name].format(*args)
            raise Unsupported(f"{name} has no Triton interpreter form (libdevice is GPU-only)")
        if name in _LIBDEVICE:
            if a_dt not in (torch.float32, torch.float64):
                args = [f"{x}.to(tl.float32)" for x in args]
            return _LIBDEVICE[name].format(*args)
        raise Unsupported(f"op {name}")

    def store(self, m, value: str, scope: _Scope, r_level_index: bool):
        dt = m.buf.layout.dtype
        ptr = self.param(m.name, write=True)
        e = sympy.sympify(m.store_index)
        masks = []
        if self.reduction or e.free_symbols & set(self.fk.outer_vars):
            masks.append("xmask")
        if r_level_index:
            masks.append("rmask")
        if not masks:
            masks.append("xmask")
        if m.value.dtype != dt:
            value = f"{value}.to({TL_TYPES[dt]})"
        idx = self.index(e)
        if not e.free_symbols & self.loop_vars:
            idx = f"{idx} + 0 * xindex"      # a pointer block (a scalar one cannot take a block value)
        scope.lines.append(f"{scope.indent}tl.store({ptr} + {idx}, {value}, {' & '.join(masks)})")

    # -- structure --------------------------------------------------------------------
    def render(self) -> KernelSource:
        fk = self.fk
        ind = "    "
        top = _Scope(ind)
        idx_t = "tl.int64" if self.int64 else None
        head = []
        xnumel = numel(fk.outer)
        xidx = index_var("xindex", xnumel)
        pid = "tl.program_id(0).to(tl.int64)" if idx_t else "tl.program_id(0)"
        if self.reduction:
            head.append(f"{ind}xindex = ({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]")
        else:
            head.append(f"{ind}xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        head.append(f"{ind}xmask = xindex < xnumel")
        for var, e in zip(fk.outer_vars, unflatten(xidx, fk.outer)):
            head.append(f"{ind}{var} = {self.index(e)}")
        if self.persistent:
            head.append(f"{ind}rindex = tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if idx_t else ""))
        top.lines = head

        stored_in_kernel: set = set()
        for p, ph in enumerate(fk.phases):
            if ph.inner == () and not ph.reduction:
                for m in ph.members:
                    val = self.emit(m.value, top, top)
                    if m.name in self.stored:
                        self.store(m, val, top, False)
                        stored_in_kernel.add(m.name)
                    self.locals[(m.name, _index_key(m.store_index))] = (val, False, None)
                continue
            reads = {ld.name for m in ph.members for ld in V.loads(m.value)
                     if self.local(ld.name, ld.extra, ph.inner) is None}
            if reads & stored_in_kernel and not self.persistent:
                top.lines.append(f"{ind}tl.debug_barrier()")
            self._phase(ph, top, stored_in_kernel)

        loop_vars = {str(v) for v in fk.outer_vars} | {str(v) for v in self.r_vars}
        if self._split_lines:
            start, end, tail = self._split_lines
            bodies = {f"{fk.name}_split": top.lines[:end] + tail, fk.name: top.lines[:start] + top.lines[end:]}
        else:
            bodies = {fk.name: top.lines}
        bodies = {name: _drop_unused_vars(lines, loop_vars) for name, lines in bodies.items()}
        symbols = sorted({s for s in self.symbols if any(_used(str(s), b) for b in bodies.values())}, key=str)
        # Under the CPU interpreter a runtime scalar cannot bound range() (numpy 2 refuses
        # int() of its 1-element array): there, size symbols are constexpr.
        sym_params = [f"{s}: tl.constexpr" if self.interpret else str(s) for s in symbols]
        params = (["p_split_ws"] if self.split_slots else []) + [self.params[s] for s in self.params]
        params += sym_params + ["xnumel"]
        if self.split_slots:
            params += ["RSPLIT: tl.constexpr", "NSPLIT: tl.constexpr"]
        params += ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.reduction else [])
        src = "\n\n".join(f"@triton.jit\ndef {name}({', '.join(params)}):\n" + "\n".join(lines) + "\n"
                          for name, lines in bodies.items())
        elem = max((self.layouts[b].dtype.itemsize for b in self.params if b in self.layouts), default=4)
        return KernelSource(fk.name, src, list(self.params), set(self.written), set(self.read), symbols,
                            "reduction" if self.reduction else "pointwise", self.persistent, xnumel,
                            self._rnumel(), self.x_contiguous, elem, self.split_slots)

    def _rnumel(self):
        if not self.r_numels:
            return sympy.Integer(1)
        if all(n.is_Integer for n in self.r_numels):
            return max(self.r_numels)
        return self.r_numels[0]

    def _x_contiguous(self) -> bool:
        if not self.reduction or not self.fk.outer_vars:
            return False
        last_x = self.fk.outer_vars[-1]
        loop = set(self.fk.outer_vars) | self.r_vars
        x_votes = r_votes = 0
        for m in self.fk.members:
            for ld in V.loads(m.value):
                e = sympy.sympify(ld.extra)
                if not isinstance(e, sympy.Expr):   # several index parts (a gathered load): no vote
                    continue
                rs = [r for r in e.free_symbols & self.r_vars]
                if not rs:
                    continue
                if e.free_symbols - loop:     # symbolic sizes: read the linear coefficients
                    e = sympy.expand(e)
                    x_votes += e.coeff(last_x) == 1
                    r_votes += any(e.coeff(r) == 1 for r in rs)
                    continue
                # the address step of +1 along x vs along r, at a point inside the ranges
                # (div/mod index math from views hides the coefficients)
                point = {v: 1 for v in loop}

                def step(v):
                    return abs(int(e.subs({**point, v: 2})) - int(e.subs(point)))
                try:
                    x_votes += step(last_x) == 1
                    r_votes += any(step(r) == 1 for r in rs)
                except TypeError:
                    continue
        return x_votes > r_votes

    def _phase(self, ph, top: _Scope, stored_in_kernel: set):
        self.cur_inner, self.cur_vars = ph.inner, ph.inner_vars
        try:
            self._phase_body(ph, top, stored_in_kernel)
        finally:
            self.cur_inner, self.cur_vars = None, None

    def _phase_body(self, ph, top: _Scope, stored_in_kernel: set):
        ind = top.indent
        rn = numel(ph.inner)
        rn_s = self.index(rn)
        ridx = index_var("rindex", rn)
        if self.persistent:
            scope = top
            if self._rdefined == ph.inner:
                rdefs = []
            else:
                rdefs = [f"{ind}rmask = rindex < {rn_s}"] + [
                    f"{ind}{var} = {self.index(e)}" for var, e in zip(ph.inner_vars, unflatten(ridx, ph.inner))]
                self._rdefined = ph.inner
        else:
            scope = _Scope(ind + "    ")
            # r vars from the flattened inner index
            rdefs = [f"{scope.indent}{var} = {self.index(e)}" for var, e in zip(ph.inner_vars, unflatten(ridx, ph.inner))]
        accs = []
        pre = []
        for m in ph.members:
            if not m.buf.is_reduction:
                continue
            rt = m.buf.data.reduction_type
            dt = m.value.dtype
            acc = f"acc_{m.name}"
            ident = self._identity(rt, dt)
            adt = self._acc_dtype(rt, dt)
            if not self.persistent:
                pre.append(f"{ind}{acc} = tl.full([XBLOCK, RBLOCK], {ident}, {TL_TYPES[adt]})")
                if rt in ("argmax", "argmin"):
                    pre.append(f"{ind}{acc}_i = tl.full([XBLOCK, RBLOCK], {self.big_index}, {self.index_type})")
            accs.append((m, rt, acc, ident, adt))
        if not self.persistent:
            scope.lines.append(f"{scope.indent}rindex = roffset + tl.arange(0, RBLOCK)[None, :]"
                               + (".to(tl.int64)" if self.int64 else ""))
            scope.lines.append(f"{scope.indent}rmask = rindex < {rn_s}")
        if self.persistent:
            top.lines.extend(rdefs)
        else:
            scope.lines.extend(rdefs)
        saved = dict(self.locals)
        flat = "rindex"
        results = []
        for m in ph.members:
            val = self.emit(m.value, scope, top)
            val_r = self.is_r(m.value)
            if not m.buf.is_reduction:
                if m.name in self.stored:
                    self.store(m, val, scope, True)
                    stored_in_kernel.add(m.name)
                self.locals[(m.name, _index_key(m.store_index))] = (val, val_r, ph.inner)
                continue
            _, rt, acc, ident, adt = next(a for a in accs if a[0] is m)
            if not val_r:
                val = f"tl.broadcast_to({val}, [XBLOCK, RBLOCK])"
            vcast = f"{val}.to({TL_TYPES[adt]})" if adt != m.value.dtype else val
            masked = f"tl.where(rmask & xmask, {vcast}, {ident})"
            if self.persistent:
                results.append((m, rt, self._finish(rt, masked, f"tl.broadcast_to({flat}, [XBLOCK, RBLOCK])", top,
                                                    m.name)))
            else:
                sl = scope.lines
                si = scope.indent
                if rt == "sum":
                    sl.append(f"{si}{acc} = {acc} + {masked}")
                elif rt == "prod":
                    sl.append(f"{si}{acc} = {acc} * {masked}")
                elif rt in ("max", "any"):
                    sl.append(f"{si}{acc} = _max_nan({acc}, {masked})")
                elif rt in ("min", "all"):
                    sl.append(f"{si}{acc} = _min_nan({acc}, {masked})")
                else:
                    comb = "_argmax_combine" if rt == "argmax" else "_argmin_combine"
                    sl.append(f"{si}{acc}, {acc}_i = {comb}({acc}, {acc}_i, {masked}, "
                              f"tl.where(rmask & xmask, tl.broadcast_to({flat}, [XBLOCK, RBLOCK]), {self.big_index}))")
        if self.split:
            self._split_phase(top, pre, scope, accs, rn_s, results)
            self.locals = saved
        elif not self.persistent:
            # hoisted (r-invariant) values were appended to `top` while the body was built
            top.lines.extend(pre)
            top.lines.append(f"{ind}for roffset in range(0, {rn_s}, RBLOCK):")
            top.lines.extend(scope.lines)
            self.locals = saved
            for m, rt, acc, ident, adt in accs:
                results.append((m, rt, self._finish(rt, acc, f"{acc}_i", top, m.name, looped=True)))
        for m, rt, res in results:
            if m.buf.layout.dtype in (torch.bfloat16, torch.float16) and rt not in ("argmax", "argmin"):
                # consumers read the buffer's value: rounded to its dtype, as eager stores it
                rounded = f"{res}_r"
                top.lines.append(f"{ind}{rounded} = {res}.to({TL_TYPES[m.buf.layout.dtype]}).to(tl.float32)")
                res = rounded
            if m.name in self.stored:
                self.store(m, res, top, False)
                stored_in_kernel.add(m.name)
            self.locals[(m.name, _index_key(m.store_index))] = (res, False, None)

    def _split_phase(self, top: _Scope, pre, scope: _Scope, accs, rn_s, results):
        """The body's loop covers one split (RSPLIT elements of the row) and stores each
        accumulator's partial (<name>_split's tail); after it, <name> loads the NSPLIT
        partials of its rows and combines them: the epilogue that follows is shared."""
        ind = top.indent
        start = len(top.lines)
        pid = "tl.program_id(1)" + (".to(tl.int64)" if self.int64 else "")
        top.lines.extend(pre)
        top.lines.append(f"{ind}rstart = {pid} * RSPLIT")
        # static trip count (the interpreter cannot bound range() by a program id); the
        # last split's tail is masked by rmask like any row end
        top.lines.append(f"{ind}for rstep in range(0, RSPLIT, RBLOCK):")
        top.lines.append(f"{scope.indent}roffset = rstart + rstep")
        top.lines.extend(scope.lines)
        end = len(top.lines)
        tail = _Scope(ind)
        top.lines.append(f"{ind}sindex = tl.arange(0, NSPLIT)[None, :]")
        for k, (m, rt, acc, ident, adt) in enumerate(accs):
            part = self._finish(rt, acc, None, tail, f"{m.name}_part")
            tail.lines.append(f"{ind}tl.store(p_split_ws + ({k} * NSPLIT + {pid}) * xnumel + xindex, {part}, xmask)")
            top.lines.append(f"{ind}{acc}_parts = tl.load(p_split_ws + ({k} * NSPLIT + sindex) * xnumel + xindex, "
                             f"xmask, other={ident})")
            results.append((m, rt, self._finish(rt, f"{acc}_parts", None, top, m.name, looped=True)))
        self.split_slots = len(accs)
        self._split_lines = (start, end, tail.lines)

    def _finish(self, rt, tile, index_tile, top, name, looped=False) -> str:
        """Combine a [XBLOCK, RBLOCK] tile along r into a [XBLOCK, 1] value."""
        ind = top.indent
        out = f"red_{name}"
        if rt == "sum":
            e = f"tl.reduce({tile}, 1, _sum)[:, None]"
        elif rt == "prod":
            e = f"tl.reduce({tile}, 1, _prod)[:, None]"
        elif rt in ("max", "any"):
            e = f"tl.reduce({tile}, 1, _max_nan)[:, None]"
        elif rt in ("min", "all"):
            e = f"tl.reduce({tile}, 1, _min_nan)[:, None]"
        else:
            comb = "_argmax_combine" if rt == "argmax" else "_argmin_combine"
            top.lines.append(f"{ind}_, {out} = tl.reduce(({tile}, {index_tile}), 1, {comb})")
            top.lines.append(f"{ind}{out} = {out}[:, None]")
            return out
        if rt in ("any", "all"):
            e = f"({e} != 0)"
        top.lines.append(f"{ind}{out} = {e}")
        return out

    @staticmethod
    def _acc_dtype(rt, dt):
        if rt in ("any", "all") or dt == torch.bool:
            return torch.int32 if rt not in ("sum", "prod") else torch.int64
        return dt

    @staticmethod
    def _identity(rt, dt) -> str:
        if rt in ("sum", "any"):
            return "0"
        if rt in ("prod", "all"):
            return "1"
        big = rt in ("min", "argmin")
        if dt.is_floating_point:
            return 'float("inf")' if big else 'float("-inf")'
        if dt == torch.bool:
            return "1" if big else "0"
        info = torch.iinfo(dt)
        return str(info.max if big else info.min)


def _used(name: str, lines) -> bool:
    pat = re.compile(rf"\b{re.escape(name)}\b")
    return any(pat.search(ln.split("=", 1)[1] if re.match(rf"\s*{re.escape(name)} = ", ln) else ln)
               for ln in lines)


def _drop_unused_vars(lines, names):
    """Loop variable definitions nothing reads (flat indexing made them unnecessary)."""
    out = list(lines)
    for name in names:
        if not _used(name, out):
            out = [ln for ln in out if not re.match(rf"\s*{re.escape(name)} = ", ln)]
    return out


def _collapse(e, vars_, sizes, flat):
    """Rewrite c*(x0*s1*s2 + x1*s2 + x2) as c*xindex (or c*(xindex % n) for a trailing run),
    so loads are visibly contiguous in the flat block index (Triton vectorizes them)."""
    if not vars_ or not (e.free_symbols & set(vars_)):
        return e
    e = sympy.expand(e)
    coeffs = [e.coeff(v) for v in vars_]
    if any(c.free_symbols & set(vars_) for c in coeffs):
        return e
    n = len(vars_)
    c_last = coeffs[-1]
    if c_last == 0:
        return e
    j, acc = n - 1, sympy.Integer(1)
    while j > 0:
        acc = acc * sizes[j]
        if sympy.expand(coeffs[j - 1] - c_last * acc) != 0:
            break
        j -= 1
    if j == n - 1 and n > 1:
        return e
    rest = sympy.expand(e - sum((coeffs[k] * vars_[k] for k in range(j, n)), sympy.Integer(0)))
    if j == 0:
        return rest + c_last * flat
    return rest + c_last * IMod(flat, numel(sizes[j:]))


def render_kernel(fk: FusedKernel, layouts: dict, interpret: bool = False, needed=None) -> KernelSource:
    """needed: buffers read outside this kernel or returned (None: store what the scheduler stores)."""
    for m in fk.members:
        if m.buf.layout.dtype not in TL_TYPES:
            raise Unsupported(f"dtype {m.buf.layout.dtype}")
    return TritonKernel(fk, layouts, interpret, needed).render()


# GPU-only helpers (the interpreter has no libdevice or PTX)
GPU_PRELUDE = '''\
from triton.language.extra import libdevice


@triton.jit
def _rsqrt(x):
    # PTX's rsqrt.approx.ftz, which libdevice's rsqrtf is, without linking libdevice
    # into the kernel (~50 ms of its compile)
    return tl.inline_asm_elementwise("rsqrt.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)
'''


def module_prelude(interpret: bool) -> str:
    return PRELUDE.format(gpu="" if interpret else GPU_PRELUDE)
