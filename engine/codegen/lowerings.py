"""The lowerings table: one small function per aten op, from TensorValues (and python
scalars) to a new TensorValue (a loader over indices) or a realized reduction buffer.
An op missing here runs as an extern kernel (an aten call) and is reported on perf_hints."""

from __future__ import annotations

import itertools

import sympy
import torch

from . import values as V
from .graph import GraphLowering, Unsupported, fake_of, to_sympy
from .index import flatten, floordiv, index_var, mod, unflatten
from .ir import ComputedBuffer, Reduction, TensorValue

aten = torch.ops.aten
prims = torch.ops.prims
LOWERINGS: dict = {}


def register(*ops):
    def wrap(fn):
        for op in ops:
            LOWERINGS[op] = fn
        return fn
    return wrap


# -- helpers -----------------------------------------------------------------------------
def out_meta(g: GraphLowering):
    fake = fake_of(g.current_node)
    if not isinstance(fake, torch.Tensor):
        raise Unsupported(f"{g.current_node.target}: no tensor metadata")
    return tuple(to_sympy(s) for s in fake.shape), fake.dtype, fake.device


def broadcast_loader(x, out_sizes):
    """x (TensorValue or python scalar) read at an index of the broadcast output shape."""
    if not isinstance(x, TensorValue):
        return None
    nd = len(out_sizes)
    xs = x.sizes
    lead = nd - len(xs)

    def loader(idx):
        sub = [sympy.Integer(0) if (xs[d] == 1 and out_sizes[lead + d] != 1) else idx[lead + d] for d in range(len(xs))]
        return x.loader(sub)
    return loader


def value_of(x, out_sizes, dtype, idx):
    """x cast to compute dtype `dtype` at output index idx."""
    if isinstance(x, TensorValue):
        return V.cast(broadcast_loader(x, out_sizes)(idx), dtype)
    if isinstance(x, (bool, int, float)):
        return V.const(x, dtype)
    if isinstance(x, sympy.Expr):
        return V.cast(V.index_value(x), dtype)
    raise Unsupported(f"operand {type(x).__name__}")


def pointwise(sizes, dtype, device, fn) -> TensorValue:
    if dtype in (torch.bfloat16, torch.float16):
        # eager rounds every op's result to the low-precision type; so do we
        inner = fn

        def fn(idx):
            return V.cast(V.cast(inner(idx), dtype), torch.float32)
    return TensorValue(tuple(sizes), dtype, device, fn)


def meta_tensor(x):
    if isinstance(x, TensorValue):
        return torch.empty([int(s) if s.is_Integer else 2 for s in x.sizes], dtype=x.dtype, device="meta")
    return x


def promoted(a, b):
    ta, tb = meta_tensor(a), meta_tensor(b)
    if not isinstance(ta, torch.Tensor):
        ta, tb = tb, ta
    return torch.result_type(ta, tb)


# -- pointwise ---------------------------------------------------------------------------
def binary(opname, *, compute="out"):
    def lower(g, a, b, *, alpha=None, **kw):
        if kw:
            return NotImplemented
        sizes, dtype, device = out_meta(g)
        cdt = V.compute_dtype(promoted(a, b) if compute == "inputs" else dtype)
        def fn(idx):
            x, y = value_of(a, sizes, cdt, idx), value_of(b, sizes, cdt, idx)
            if alpha is not None and alpha != 1:
                y = V.op("mul", y, V.const(alpha, cdt), dtype=cdt)
            return V.cast(V.op(opname, x, y, dtype=cdt if compute == "out" else torch.bool), V.compute_dtype(dtype))
        return pointwise(sizes, dtype, device, fn)
    return lower


for _name, _ops in {
    "add": [aten.add], "sub": [aten.sub], "mul": [aten.mul], "maximum": [aten.maximum],
    "minimum": [aten.minimum], "atan2": [aten.atan2], "remainder": [aten.remainder],
    "floordiv": [aten.floor_divide], "bitwise_and": [aten.bitwise_and], "bitwise_or": [aten.bitwise_or],
    "bitwise_xor": [aten.bitwise_xor], "copysign": [aten.copysign],
}.items():
    register(*_ops)(binary(_name))
for _name in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"):
    register(getattr(aten, _name))(binary(_name, compute="inputs"))


@register(aten.div)
def div(g, a, b, *, rounding_mode=None):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)

    def fn(idx):
        x, y = value_of(a, sizes, cdt, idx), value_of(b, sizes, cdt, idx)
        if rounding_mode is None:
            return V.op("truediv", x, y, dtype=cdt)
        if rounding_mode == "floor":
            return V.op("floordiv", x, y, dtype=cdt)
        if rounding_mode == "trunc":
            if cdt.is_floating_point:
                return V.op("trunc", V.op("truediv", x, y, dtype=cdt), dtype=cdt)
            raise Unsupported("integer trunc division")
        raise Unsupported(f"rounding_mode={rounding_mode}")
    if rounding_mode == "trunc" and not cdt.is_floating_point:
        return NotImplemented
    return pointwise(sizes, dtype, device, fn)


@register(aten.pow)
def pow_(g, a, b):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b in (0, 1, 2, 3, 0.5, -1, -0.5):
        def fn(idx):
            x = value_of(a, sizes, cdt, idx)
            if b == 2:
                return V.op("mul", x, x, dtype=cdt)
            if b == 3:
                return V.op("mul", V.op("mul", x, x, dtype=cdt), x, dtype=cdt)
            if b == 1:
                return x
            if b == 0:
                return V.const(1, cdt)
            if not cdt.is_floating_point:
                return V.op("pow", x, V.const(b, cdt), dtype=cdt)
            if b == 0.5:
                return V.op("sqrt", x, dtype=cdt)
            if b == -0.5:
                return V.op("rsqrt", x, dtype=cdt)
            return V.op("reciprocal", x, dtype=cdt)
        return pointwise(sizes, dtype, device, fn)
    if not cdt.is_floating_point:
        return NotImplemented   # integer pow with negative exponents raises in eager

    def fn(idx):
        return V.op("pow", value_of(a, sizes, cdt, idx), value_of(b, sizes, cdt, idx), dtype=cdt)
    return pointwise(sizes, dtype, device, fn)


def unary(opname, *, float_only=False, bool_out=False):
    def lower(g, a, **kw):
        if kw:
            return NotImplemented
        sizes, dtype, device = out_meta(g)
        cdt = V.compute_dtype(a.dtype if bool_out else dtype)
        if float_only and not cdt.is_floating_point:
            return NotImplemented

        def fn(idx):
            x = value_of(a, sizes, cdt, idx)
            return V.op(opname, x, dtype=torch.bool if bool_out else cdt)
        return pointwise(sizes, dtype, device, fn)
    return lower


for _name in ("neg", "abs", "floor", "ceil", "trunc", "sign", "relu", "bitwise_not"):
    register(getattr(aten, _name))(unary(_name))
_relu = unary("relu")


@register(aten.relu)
def relu(g, a, **kw):
    from engine import config

    if config.inject_relu_bug_TESTING_ONLY:   # the minifier's tests: a broken relu on purpose
        return _relu_with_injected_bug(g, a, config.inject_relu_bug_TESTING_ONLY)
    return _relu(g, a, **kw)


def _relu_with_injected_bug(g, a, bug: str):
    why = f"engine.config.inject_relu_bug_TESTING_ONLY={bug!r}"
    if bug == "compile_error":
        raise RuntimeError(f"relu: injected compile error ({why})")
    if bug == "runtime_error":   # an extern call that raises when the compiled graph runs
        return g.extern(aten._assert_scalar.default, (False, f"relu: injected runtime error ({why})"), {},
                        fake_of(g.current_node), fallback=False)
    if bug == "accuracy":
        sizes, dtype, device = out_meta(g)
        cdt = V.compute_dtype(dtype)
        return pointwise(sizes, dtype, device, lambda idx: V.op(
            "add", V.op("relu", value_of(a, sizes, cdt, idx), dtype=cdt), V.const(1, cdt), dtype=cdt))
    raise ValueError(f"{why}: expected 'compile_error', 'runtime_error' or 'accuracy'")


register(aten.round.default)(unary("round", float_only=True))
for _name in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan",
              "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
              "sigmoid", "reciprocal", "lgamma"):
    register(getattr(aten, _name).default)(unary(_name, float_only=True))
register(aten.signbit.default)(unary("signbit", bool_out=True))


def _false_for_integers(lowering):
    """isnan / isinf of an integer or bool tensor: False everywhere (the float test on an
    integer compared it with infinity cast to an integer: isinf(0) came out True)."""
    def lower(g, a):
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return lowering(g, a)
        sizes, dtype, device = out_meta(g)
        return pointwise(sizes, dtype, device, lambda idx: V.const(False, torch.bool))
    return lower


for _name in ("isnan", "isinf"):
    register(getattr(aten, _name).default)(_false_for_integers(unary(_name, bool_out=True)))


@register(aten.gelu.default)
def gelu(g, a, approximate="none"):
    """x * Phi(x), Phi the standard normal CDF ("ndtr"): eager's 0.5*x*(1 + erf(x/sqrt(2)))
    is the same function; the 1 + erf form loses the negative tail to cancellation."""
    if approximate != "none":
        return NotImplemented
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)

    def fn(idx):
        x = value_of(a, sizes, cdt, idx)
        return V.op("mul", x, V.op("ndtr", x, dtype=cdt), dtype=cdt)
    return pointwise(sizes, dtype, device, fn)


@register(aten.logical_not.default)
def logical_not(g, a):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(a.dtype)
    return pointwise(sizes, dtype, device,
                     lambda idx: V.op("logical_not", value_of(a, sizes, cdt, idx), dtype=torch.bool))


@register(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where(g, cond, a, b):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    return pointwise(sizes, dtype, device, lambda idx: V.op(
        "where", value_of(cond, sizes, torch.bool, idx), value_of(a, sizes, cdt, idx), value_of(b, sizes, cdt, idx),
        dtype=cdt))


@register(aten.clamp_min, aten.clamp_max)
def clamp_one(g, a, bound):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    opname = "maximum" if g.current_node.target.overloadpacket is aten.clamp_min else "minimum"
    return pointwise(sizes, dtype, device, lambda idx: V.op(
        opname, value_of(a, sizes, cdt, idx), value_of(bound, sizes, cdt, idx), dtype=cdt))


@register(aten.clamp.default)
def clamp(g, a, min=None, max=None):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)

    def fn(idx):
        x = value_of(a, sizes, cdt, idx)
        if min is not None:
            x = V.op("maximum", x, value_of(min, sizes, cdt, idx), dtype=cdt)
        if max is not None:
            x = V.op("minimum", x, value_of(max, sizes, cdt, idx), dtype=cdt)
        return x
    return pointwise(sizes, dtype, device, fn)


def _cast_lowering(g, a, dtype=None, **kw):
    sizes, out_dtype, device = out_meta(g)
    if device != a.device or kw.get("layout") not in (None, torch.strided):
        return NotImplemented
    cdt = V.compute_dtype(out_dtype)
    src = V.compute_dtype(a.dtype)

    def fn(idx):
        v = a.loader(list(idx))
        if out_dtype in (torch.bfloat16, torch.float16) and a.dtype != out_dtype:
            # round through the low-precision type as eager's cast does
            return V.cast(V.cast(V.cast(v, src), out_dtype), cdt)
        return V.cast(v, cdt)
    if a.dtype == out_dtype:
        return a
    return pointwise(sizes, out_dtype, device, fn)


register(aten._to_copy.default)(_cast_lowering)


@register(prims.convert_element_type.default)
def convert_element_type(g, a, dtype):
    return _cast_lowering(g, a)


@register(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def identity(g, a, **kw):
    value = TensorValue(a.sizes, a.dtype, a.device, a.loader)
    if kw.get("memory_format") is torch.channels_last:    # a copy, laid out as the node's metadata says
        return g.realize(value, copy=True)
    if kw.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return NotImplemented
    return value


@register(aten.copy.default)
def copy(g, dst, src, non_blocking=False):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    if isinstance(src, TensorValue) and src.device != device:
        return NotImplemented
    return pointwise(sizes, dtype, device, lambda idx: value_of(src, sizes, cdt, idx))


def _full(g, value):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    if isinstance(value, TensorValue):
        return pointwise(sizes, dtype, device, lambda idx: value_of(value, sizes, cdt, idx))
    c = V.const(value, cdt)
    return pointwise(sizes, dtype, device, lambda idx: c)


@register(aten.full.default)
def full(g, size, fill_value, **kw):
    return _full(g, fill_value)


@register(aten.full_like.default)
def full_like(g, a, fill_value, **kw):
    return _full(g, fill_value)


@register(aten.scalar_tensor.default)
def scalar_tensor(g, value, **kw):
    return _full(g, value)


@register(aten.fill.Scalar, aten.fill.Tensor)
def fill(g, a, value):
    return _full(g, value)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(g, *args, **kw):
    sizes, dtype, device = out_meta(g)
    nums = [a for a in args]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    else:
        start, step = nums[0], nums[2]
    if not all(isinstance(x, int) for x in (start, step)) and dtype != torch.float32 and dtype != torch.float64:
        return NotImplemented
    cdt = V.compute_dtype(dtype)
    if cdt.is_floating_point and not all(isinstance(x, int) for x in (start, step)):
        return NotImplemented   # eager computes float ranges in double; keep it exact
    return pointwise(sizes, dtype, device, lambda idx: V.cast(V.index_value(start + idx[0] * step), cdt))


@register(prims.iota.default)
def iota(g, length, *, start, step, dtype, device, requires_grad):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    return pointwise(sizes, dtype, device, lambda idx: V.cast(V.index_value(start + idx[0] * step), cdt))


# -- views: index rewrites ---------------------------------------------------------------
def view_of(g, a, sizes, index_fn):
    return TensorValue(tuple(sizes), a.dtype, a.device, lambda idx: a.loader(index_fn(list(idx))))


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view.dtype)
def view(g, a, shape=None):
    if not isinstance(shape, (list, tuple)):
        return NotImplemented
    sizes, dtype, device = out_meta(g)
    if dtype != a.dtype:
        return NotImplemented
    in_sizes = a.sizes
    return view_of(g, a, sizes, lambda idx: unflatten(flatten(idx, sizes), in_sizes))


@register(aten.permute.default)
def permute(g, a, dims):
    nd = len(a.sizes)
    dims = [d % nd for d in dims]
    sizes = [a.sizes[d] for d in dims]

    def fn(idx):
        src = [None] * nd
        for k, d in enumerate(dims):
            src[d] = idx[k]
        return src
    return view_of(g, a, sizes, fn)


@register(aten.t.default)
def t(g, a):
    return permute(g, a, list(reversed(range(len(a.sizes)))))


@register(aten.transpose.int)
def transpose(g, a, d0, d1):
    nd = len(a.sizes)
    dims = list(range(nd))
    if nd:
        dims[d0 % nd], dims[d1 % nd] = dims[d1 % nd], dims[d0 % nd]
    return permute(g, a, dims)


@register(aten.expand.default)
def expand(g, a, size, *, implicit=False):
    sizes, _, _ = out_meta(g)
    return TensorValue(tuple(sizes), a.dtype, a.device, broadcast_loader(a, sizes))


@register(aten.unsqueeze.default)
def unsqueeze(g, a, dim):
    nd = len(a.sizes) + 1
    dim = dim % nd
    sizes = list(a.sizes[:dim]) + [sympy.Integer(1)] + list(a.sizes[dim:])
    return view_of(g, a, sizes, lambda idx: idx[:dim] + idx[dim + 1:])


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(g, a, dims=None):
    sizes, _, _ = out_meta(g)
    nd = len(a.sizes)
    if dims is None:
        drop = {d for d in range(nd) if a.sizes[d] == 1}
    else:
        dims = [dims] if isinstance(dims, int) else dims
        drop = {d % nd for d in dims if a.sizes[d % nd] == 1} if nd else set()

    def fn(idx):
        it = iter(idx)
        return [sympy.Integer(0) if d in drop else next(it) for d in range(nd)]
    return view_of(g, a, sizes, fn)


@register(aten.slice.Tensor)
def slice_(g, a, dim=0, start=None, end=None, step=1):
    sizes, _, _ = out_meta(g)
    dim = dim % len(a.sizes)
    n = a.sizes[dim]
    start = 0 if start is None else start
    if isinstance(start, int) and n.is_Integer:
        start = max(0, start + int(n)) if start < 0 else min(start, int(n))
    elif not isinstance(start, int):
        return NotImplemented

    def fn(idx):
        idx = list(idx)
        idx[dim] = start + idx[dim] * step
        return idx
    return view_of(g, a, sizes, fn)


@register(aten.select.int)
def select(g, a, dim, index):
    dim = dim % len(a.sizes)
    n = a.sizes[dim]
    if isinstance(index, int) and index < 0:
        index = index + n
    sizes = list(a.sizes[:dim]) + list(a.sizes[dim + 1:])
    return view_of(g, a, sizes, lambda idx: idx[:dim] + [sympy.sympify(index)] + idx[dim:])


@register(aten.as_strided.default)
def as_strided(g, a, size, stride, storage_offset=None):
    view = g.as_strided(a)
    if view is None or not g.buffer_layouts[view[0]].is_contiguous() or not view[1].is_contiguous():
        return NotImplemented
    buf, _ = view
    sizes, _, _ = out_meta(g)
    strides = [to_sympy(s) for s in stride]
    off = to_sympy(storage_offset or 0)
    cdt = V.compute_dtype(a.dtype)
    return TensorValue(tuple(sizes), a.dtype, a.device,
                       lambda idx: V.load(buf, sympy.expand(off + sum((i * s for i, s in zip(idx, strides)), 0)), cdt))


_cat_vars = itertools.count()


@register(aten.cat.default)
def cat(g, tensors, dim=0):
    sizes, dtype, device = out_meta(g)
    dim = dim % len(sizes)
    parts = [t for t in tensors if not (len(t.sizes) == 1 and t.sizes[0] == 0)]
    cdt = V.compute_dtype(dtype)

    def fn(idx):
        offsets, acc = [], sympy.Integer(0)
        for t in parts:
            offsets.append(acc)
            acc = acc + t.sizes[dim]
        # every part's loads are masked: an out-of-bounds address is never formed, even on
        # the branch not taken (the C++ compiler may assume it is not, and did)
        result = None
        for k, (t, off) in enumerate(reversed(list(zip(parts, offsets)))):
            sub = list(idx)
            if len(parts) > 1:
                # the part's loads run only where idx[dim] - off is in [0, its size): index
                # it with a variable of that range so the view's floor divisions and modulos
                # simplify as they would for the part alone, then put idx[dim] - off back
                local = index_var(f"xcat{next(_cat_vars)}", t.sizes[dim])
                sub[dim] = local
                body = V.subs(V.cast(t.loader(sub), cdt), {local: idx[dim] - off})
            else:
                sub[dim] = idx[dim] - off
                body = V.cast(t.loader(sub), cdt)
            if result is None:
                if len(parts) == 1:
                    return body
                mask = V.op("ge", V.index_value(idx[dim]), V.index_value(off), dtype=torch.bool)
                result = V.masked(mask, body, 0)
                continue
            mask = V.op("lt", V.index_value(idx[dim]), V.index_value(off + t.sizes[dim]), dtype=torch.bool)
            if off != 0:
                # a middle part: below its offset its (then negative) addresses must not be read
                mask = V.op("logical_and", V.op("ge", V.index_value(idx[dim]), V.index_value(off),
                                                 dtype=torch.bool), mask, dtype=torch.bool)
            result = V.op("where", mask, V.masked(mask, body, 0), result, dtype=cdt)
        return result
    if len(parts) > 8:
        return NotImplemented
    return pointwise(sizes, dtype, device, fn)


def _load_within(x: TensorValue, sub: list, dims) -> "V.Value":
    """x read at sub, where each sub[d] of dims is known to lie inside x's range there (the
    caller masks the load to it): the index is built over symbols with x's ranges and the
    positions put in after, so that views of x simplify as over x itself. Built over the
    caller's range, `(1003*x0 + r0) // 1003` stays a division where r0 runs past 1003 (a
    padded row), and every element pays for it."""
    dims = [d for d in dims if sympy.sympify(x.sizes[d]).is_Integer]
    inside, at = list(sub), {}
    for d in dims:
        p = index_var(f"within{d}_{int(x.sizes[d])}", x.sizes[d])
        inside[d], at[p] = p, sub[d]
    return V.subs(x.loader(inside), at) if at else x.loader(sub)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(g, a, pad, value=0):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    nd = len(sizes)
    if any(p < 0 for p in pad):
        return NotImplemented

    def fn(idx):
        sub = list(idx)
        mask = None
        for k in range(len(pad) // 2):
            d = nd - 1 - k
            lo = pad[2 * k]
            sub[d] = idx[d] - lo
            conds = [V.op("ge", V.index_value(idx[d]), V.index_value(sympy.Integer(lo)), dtype=torch.bool),
                     V.op("lt", V.index_value(idx[d]), V.index_value(lo + a.sizes[d]), dtype=torch.bool)]
            for c in conds:
                mask = c if mask is None else V.op("logical_and", mask, c, dtype=torch.bool)
        if mask is None:
            return V.cast(a.loader(sub), cdt)
        padded = [nd - 1 - k for k in range(len(pad) // 2) if pad[2 * k] or pad[2 * k + 1]]
        body = V.cast(_load_within(a, sub, padded), cdt)
        return V.op("where", mask, V.masked(mask, body, 0), V.const(value, cdt), dtype=cdt)
    return pointwise(sizes, dtype, device, fn)


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(g, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Each output is the max of its window's taps, read where they lie inside the input:
    a pointwise kernel (fused with the batch norm and relu before it in a ResNet), not
    aten's pooling kernel. The indices, where something reads them, are the flat H*W
    position of the tap eager picks: the first valid one, then each later one that is
    greater or NaN (so NaN wins, as in aten)."""
    vals_fake, idx_fake = fake_of(g.current_node)
    nd = len(x.sizes)
    if nd not in (3, 4) or not x.dtype.is_floating_point:
        return NotImplemented

    def pair(v):
        v = [v] if isinstance(v, int) else list(v)
        return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])
    (kh, kw), (ph, pw), (dh, dw) = pair(kernel_size), pair(padding), pair(dilation)
    sh, sw = pair(stride) if stride else (kh, kw)
    if kh * kw > 49:
        return NotImplemented   # a window that wide is a reduction, not a row of loads
    if kh * kw > 1 and not x.realized and not g._cheap_to_recompute(x, per_element=kh * kw):
        x = g.realize(x, fake_of(g.current_node.args[0]))     # stored once, not recomputed per tap
    H, W = x.sizes[-2], x.sizes[-1]
    sizes = tuple(to_sympy(s) for s in vals_fake.shape)
    OH, OW = sizes[-2], sizes[-1]
    cdt = V.compute_dtype(x.dtype)

    def bounds(o, stride_, pad, dil, k, extent, out_extent):
        """The tap's position and the conditions that keep it inside [0, extent)."""
        pos = o * stride_ - pad + k * dil
        conds = []
        if k * dil - pad < 0:
            conds.append(V.op("ge", V.index_value(pos), V.index_value(sympy.Integer(0)), dtype=torch.bool))
        last = (out_extent - 1) * stride_ - pad + k * dil
        if not (sympy.sympify(last - extent).is_negative is True):
            conds.append(V.op("lt", V.index_value(pos), V.index_value(extent), dtype=torch.bool))
        return pos, conds

    def taps(idx):
        for i in range(kh):
            h, hc = bounds(idx[-2], sh, ph, dh, i, H, OH)
            for j in range(kw):
                w, wc = bounds(idx[-1], sw, pw, dw, j, W, OW)
                mask = None
                for c in hc + wc:
                    mask = c if mask is None else V.op("logical_and", mask, c, dtype=torch.bool)
                sub = list(idx[:-2]) + [h, w]
                if mask is None:
                    value = V.cast(x.loader(sub), cdt)
                else:
                    value = V.masked(mask, V.cast(_load_within(x, sub, [nd - 2, nd - 1]), cdt), float("-inf"))
                yield mask, value, h * W + w

    def values(idx):
        best = None
        for _, v, _ in taps(idx):
            best = v if best is None else V.op("maximum", best, v, dtype=cdt)
        return best

    def indices(idx):
        found = list(taps(idx))
        pos = V.index_value(found[-1][2])
        for mask, _, p in reversed(found[:-1]):    # the first tap inside the input
            pos = V.index_value(p) if mask is None else V.op("where", mask, V.index_value(p), pos, dtype=torch.int64)
        best = V.const(float("-inf"), cdt)
        for mask, v, p in found:
            take = V.op("logical_or", V.op("gt", v, best, dtype=torch.bool), V.op("isnan", v, dtype=torch.bool),
                        dtype=torch.bool)
            if mask is not None:
                take = V.op("logical_and", mask, take, dtype=torch.bool)
            best = V.op("where", take, v, best, dtype=cdt)
            pos = V.op("where", take, V.index_value(p), pos, dtype=torch.int64)
        return pos
    return (pointwise(sizes, x.dtype, x.device, values),
            TensorValue(tuple(to_sympy(s) for s in idx_fake.shape), torch.int64, x.device, indices))


# -- reductions --------------------------------------------------------------------------
def make_reduction(g, x: TensorValue, dims, keepdim, rtype, out_dtype=None, acc_dtype=None):
    sizes, dtype, device = out_meta(g)
    out_dtype = out_dtype or dtype
    nd = len(x.sizes)
    dims = sorted({d % nd for d in dims}) if dims else list(range(nd))
    if nd == 0:
        dims = []
    kept = [d for d in range(nd) if d not in dims]
    rranges = [x.sizes[d] for d in dims]
    if any(r == 0 for r in rranges):
        return NotImplemented   # empty reductions: identity values are aten's business
    src_cdt = acc_dtype or (V.compute_dtype(out_dtype) if rtype in ("sum", "prod") else V.compute_dtype(x.dtype))
    out_sizes = list(sizes)

    def fn(idx, ridx):
        # idx is over the output shape (keepdim ones included)
        if keepdim and nd:
            kept_idx = [idx[d] for d in kept]
        else:
            kept_idx = list(idx)
        full, ki, ri = [], iter(kept_idx), iter(ridx)
        for d in range(nd):
            full.append(next(ri) if d in dims else next(ki))
        return V.cast(x.loader(full), src_cdt)

    name = g.new_name()
    layout = g.dense_layout(out_sizes, out_dtype, device, fake_of(g.current_node))
    buf = ComputedBuffer(name, layout, Reduction(out_sizes, rranges, rtype, fn, src_cdt))
    return g.add_buffer(buf)


def _dims(dim):
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(g, x, dim=None, keepdim=False, *, dtype=None):
    d = _dims(dim)
    if d is not None and len(d) == 0:
        d = None
    return make_reduction(g, x, d, keepdim, "sum")


@register(aten.prod.dim_int, aten.prod.default)
def prod(g, x, dim=None, keepdim=False, *, dtype=None):
    return make_reduction(g, x, _dims(dim), keepdim, "prod")


@register(aten.amax.default)
def amax(g, x, dim=(), keepdim=False):
    if not x.dtype.is_floating_point and x.dtype != torch.bool and False:
        return NotImplemented
    return make_reduction(g, x, _dims(dim) or None, keepdim, "max")


@register(aten.amin.default)
def amin(g, x, dim=(), keepdim=False):
    return make_reduction(g, x, _dims(dim) or None, keepdim, "min")


@register(aten.max.default)
def max_all(g, x):
    return make_reduction(g, x, None, False, "max")


@register(aten.min.default)
def min_all(g, x):
    return make_reduction(g, x, None, False, "min")


@register(aten.argmax.default, aten.argmin.default)
def argmax(g, x, dim=None, keepdim=False):
    rtype = "argmax" if g.current_node.target is aten.argmax.default else "argmin"
    if dim is None:
        flat = view_of(g, x, [x.numel()], lambda idx: unflatten(idx[0], x.sizes))
        sizes, _, _ = out_meta(g)
        return make_reduction(g, flat, [0], keepdim and False, rtype, torch.int64) if not keepdim else NotImplemented
    return make_reduction(g, x, [dim], keepdim, rtype, torch.int64)


@register(aten.max.dim, aten.min.dim)
def max_dim(g, x, dim, keepdim=False):
    is_max = g.current_node.target is aten.max.dim
    fake = fake_of(g.current_node)
    values = make_reduction_with_fake(g, x, [dim], keepdim, "max" if is_max else "min", fake[0])
    indices = make_reduction_with_fake(g, x, [dim], keepdim, "argmax" if is_max else "argmin", fake[1])
    return (values, indices)


def make_reduction_with_fake(g, x, dims, keepdim, rtype, fake):
    node = g.current_node

    class _Shim:   # out_meta reads the current node's metadata; point it at one output
        pass
    saved = node.meta.get("val")
    node.meta["val"] = fake
    try:
        return make_reduction(g, x, dims, keepdim, rtype, fake.dtype)
    finally:
        node.meta["val"] = saved


@register(aten.any.default, aten.any.dim, aten.any.dims)
def any_(g, x, dim=None, keepdim=False):
    return make_reduction(g, x, _dims(dim), keepdim, "any", acc_dtype=torch.bool)


@register(aten.all.default, aten.all.dim, aten.all.dims)
def all_(g, x, dim=None, keepdim=False):
    return make_reduction(g, x, _dims(dim), keepdim, "all", acc_dtype=torch.bool)


# -- more views and data movement --------------------------------------------------------
@register(aten.split_with_sizes.default, aten.split.Tensor, aten.unsafe_split.Tensor,
          aten.unsafe_split_with_sizes.default)
def split(g, a, sizes_or_size, dim=0):
    dim = dim % len(a.sizes)
    n = a.sizes[dim]
    if isinstance(sizes_or_size, int):
        if not n.is_Integer:
            return NotImplemented
        step = sizes_or_size
        parts = [min(step, int(n) - s) for s in range(0, int(n), step)] or [0]
    else:
        parts = list(sizes_or_size)
    outs, start = [], 0
    for size in parts:
        def fn(idx, start=start):
            idx = list(idx)
            idx[dim] = idx[dim] + start
            return idx
        shape = list(a.sizes)
        shape[dim] = sympy.sympify(size)
        outs.append(view_of(g, a, shape, fn))
        start += size
    return outs


@register(aten.unbind.int)
def unbind(g, a, dim=0):
    dim = dim % len(a.sizes)
    if not a.sizes[dim].is_Integer:
        return NotImplemented
    shape = list(a.sizes[:dim]) + list(a.sizes[dim + 1:])
    return [view_of(g, a, shape, lambda idx, k=k: idx[:dim] + [sympy.Integer(k)] + idx[dim:])
            for k in range(int(a.sizes[dim]))]


@register(aten.flip.default)
def flip(g, a, dims):
    nd = len(a.sizes)
    dims = {d % nd for d in dims}

    def fn(idx):
        return [a.sizes[d] - 1 - idx[d] if d in dims else idx[d] for d in range(nd)]
    return view_of(g, a, a.sizes, fn)


@register(aten.repeat.default)
def repeat(g, a, repeats):
    sizes, _, _ = out_meta(g)
    lead = len(sizes) - len(a.sizes)

    def fn(idx):
        return [mod(idx[lead + d], a.sizes[d]) if repeats[lead + d] != 1 else idx[lead + d]
                for d in range(len(a.sizes))]
    return view_of(g, a, sizes, fn)


@register(aten.slice_scatter.default)
def slice_scatter(g, base, src, dim=0, start=None, end=None, step=1):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    dim = dim % len(sizes)
    n = sizes[dim]
    start = 0 if start is None else start
    end = n if end is None else end
    if not (isinstance(start, int) and n.is_Integer):
        return NotImplemented
    # Python's slice bounds, as aten reads them: negative ones count from the end, and both
    # are clamped into [0, n] (Gemma2's `mask[..., -4096:]` of 16 columns starts at 0, not -4080)
    start = min(max(start + int(n) if start < 0 else start, 0), int(n))
    if not isinstance(end, sympy.Expr) or end.is_Integer:
        end = int(end)
        end = min(max(end + int(n) if end < 0 else end, start), int(n))

    def fn(idx):
        i = idx[dim]
        rel = i - start
        conds = [V.op("ge", V.index_value(i), V.index_value(sympy.Integer(start)), dtype=torch.bool),
                 V.op("lt", V.index_value(i), V.index_value(sympy.sympify(end)), dtype=torch.bool)]
        if step != 1:
            conds.append(V.op("eq", V.index_value(IModp(rel, step)), V.index_value(sympy.Integer(0)), dtype=torch.bool))
        mask = conds[0]
        for c in conds[1:]:
            mask = V.op("logical_and", mask, c, dtype=torch.bool)
        sub = list(idx)
        sub[dim] = FloorDivp(rel, step) if step != 1 else rel
        body = V.cast(_load_within(src, sub, [dim]) if step == 1 else src.loader(sub), cdt)
        return V.op("where", mask, V.masked(mask, body, 0), V.cast(base.loader(list(idx)), cdt), dtype=cdt)
    if step != 1:
        return NotImplemented
    return pointwise(sizes, dtype, device, fn)


def IModp(a, b):
    return mod(a, b)


def FloorDivp(a, b):
    return floordiv(a, b)


@register(aten.select_scatter.default)
def select_scatter(g, base, src, dim, index):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    dim = dim % len(sizes)
    if index < 0:
        index = index + sizes[dim]

    def fn(idx):
        mask = V.op("eq", V.index_value(idx[dim]), V.index_value(sympy.sympify(index)), dtype=torch.bool)
        body = V.cast(src.loader(idx[:dim] + idx[dim + 1:]), cdt)
        return V.op("where", mask, body, V.cast(base.loader(list(idx)), cdt), dtype=cdt)
    return pointwise(sizes, dtype, device, fn)


# -- indirect indexing -------------------------------------------------------------------
def _in_memory(g, x: TensorValue) -> TensorValue:
    """x as a view of a buffer, for data-dependent reads: realized when the lowering runs,
    never inside a loader (each evaluation would add a buffer, and the kernel that read it
    would name one nobody writes)."""
    return x if g.as_strided(x) is not None else g.realize(x)


def _indirect(g, x: TensorValue, positions: dict, idx, cdt):
    """x (a buffer view: _in_memory) read where dims in `positions` take data-dependent
    values (Value, wrapped for negative indices); other dims from idx (a list over x's dims,
    None at indexed dims)."""
    buf, layout = g.as_strided(x)
    bindings, full = [], []
    for d in range(len(x.sizes)):
        if d in positions:
            v = V.cast(positions[d], torch.int64)
            size = V.index_value(x.sizes[d])
            wrapped = V.op("where", V.op("lt", v, V.const(0, torch.int64), dtype=torch.bool),
                           V.op("add", v, size, dtype=torch.int64), v, dtype=torch.int64)
            s = sympy.Symbol(f"ind{len(bindings)}", integer=True)
            bindings.append((s, wrapped))
            full.append(s)
        else:
            full.append(idx[d])
    return V.cast(V.iload(buf, layout.index(full), tuple(bindings), V.compute_dtype(x.dtype)), cdt)


@register(aten.embedding.default)
def embedding(g, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    k = len(indices.sizes)
    weight = _in_memory(g, weight)

    def fn(idx):
        return _indirect(g, weight, {0: indices.loader(idx[:k])}, [None] + list(idx[k:]), cdt)
    return pointwise(sizes, dtype, device, fn)


@register(aten.index_select.default)
def index_select(g, x, dim, index):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    dim = dim % max(1, len(x.sizes))
    if len(x.sizes) == 0:
        return NotImplemented
    x = _in_memory(g, x)

    def fn(idx):
        pos = index.loader([idx[dim]] if len(index.sizes) == 1 else [])
        return _indirect(g, x, {dim: pos}, list(idx[:dim]) + [None] + list(idx[dim + 1:]), cdt)
    return pointwise(sizes, dtype, device, fn)


def _computed_at(x: TensorValue, dim: int, idx, pos: V.Value, cdt):
    """x (not in memory: a pointwise value) computed where dim takes the data-dependent
    value pos, its loads made indirect; None when x's loader cannot be read that way. A
    loss's `log_softmax(logits).gather(1, target)` then reads one logit a row, where
    realizing the log-softmax would write and read the whole [tokens, vocabulary] matrix."""
    s = index_var(f"at{dim}", x.sizes[dim])
    v = x.loader(list(idx[:dim]) + [s] + list(idx[dim + 1:]))
    size = V.index_value(x.sizes[dim])
    pos = V.cast(pos, torch.int64)
    wrapped = V.op("where", V.op("lt", pos, V.const(0, torch.int64), dtype=torch.bool),
                   V.op("add", pos, size, dtype=torch.int64), pos, dtype=torch.int64)
    out = V.through_index(v, s, wrapped)
    return None if out is None else V.cast(out, cdt)


@register(aten.gather.default)
def gather(g, x, dim, index, sparse_grad=False):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    if len(x.sizes) == 0:
        return NotImplemented
    dim = dim % len(x.sizes)
    probe = [index_var(f"probe{d}", s) for d, s in enumerate(sizes)]
    if g.as_strided(x) is None and _computed_at(x, dim, probe, V.const(0, torch.int64), cdt) is not None:
        def fn(idx):
            return _computed_at(x, dim, idx, index.loader(list(idx)), cdt)
        return pointwise(sizes, dtype, device, fn)
    x = _in_memory(g, x)

    def fn(idx):
        return _indirect(g, x, {dim: index.loader(list(idx))}, list(idx[:dim]) + [None] + list(idx[dim + 1:]), cdt)
    return pointwise(sizes, dtype, device, fn)


@register(aten.scatter.value, aten.scatter.src)
def scatter(g, x, dim, index, src):
    """One element a row along dim (index's size there is 1, elsewhere x's): a pointwise
    select, `where(i == index, src, x)`; the one-hot of a loss's backward then fuses into
    the kernel that reads it instead of being written whole."""
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    dim = dim % max(1, len(sizes))
    if (len(sizes) == 0 or len(index.sizes) != len(sizes) or index.sizes[dim] != 1
            or any(index.sizes[d] != sizes[d] for d in range(len(sizes)) if d != dim)
            or isinstance(src, TensorValue) and tuple(src.sizes) != tuple(index.sizes)):
        return NotImplemented

    def fn(idx):
        at = list(idx[:dim]) + [sympy.Integer(0)] + list(idx[dim + 1:])
        hit = V.op("eq", V.index_value(idx[dim]), V.cast(index.loader(at), torch.int64), dtype=torch.bool)
        new = V.cast(src.loader(at), cdt) if isinstance(src, TensorValue) else V.const(src, cdt)
        return V.op("where", hit, new, V.cast(x.loader(list(idx)), cdt), dtype=cdt)
    return pointwise(sizes, dtype, device, fn)


@register(aten.index.Tensor)
def index(g, x, indices):
    sizes, dtype, device = out_meta(g)
    cdt = V.compute_dtype(dtype)
    present = [d for d, t in enumerate(indices) if t is not None]
    if not present or present != list(range(present[0], present[-1] + 1)):
        return NotImplemented
    if any(t.dtype == torch.bool for t in indices if t is not None):
        return NotImplemented    # boolean masks: data-dependent output shape
    p = present[0]
    bshape = list(sizes[p:len(sizes) - (len(x.sizes) - len(indices)) - (len(indices) - present[-1] - 1)])
    x = _in_memory(g, x)

    def fn(idx):
        bidx = idx[p:p + len(bshape)]
        positions = {d: broadcast_loader(indices[d], bshape)(list(bidx)) for d in present}
        rest = list(idx[p + len(bshape):])
        full = list(idx[:p]) + [None] * len(present) + rest
        return _indirect(g, x, positions, full, cdt)
    return pointwise(sizes, dtype, device, fn)
