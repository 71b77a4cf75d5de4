"""Seeded generator of small random PyTorch programs (tests/fuzz).

`generate(seed)` returns a Program (program.py): Python source of a function `fn` (with
the module-level globals, helpers and nn.Module it uses) and a list of calls to it: call 0,
then variants of it (new values, another size, dtype, layout, requires_grad, aliased
arguments, changed globals and Python scalars, module mode and parameters, no_grad).

The body is grown one statement at a time. After each candidate statement the program so
far is run eagerly on call 0's inputs (returning `locals()`), so the next statement
picks its operands from what the variables really are (shape, dtype, requires_grad, whether
they may be written); a candidate that raises is dropped. Finally every call is run in
order, eagerly and twice: calls that raise are dropped, and a program whose call 0
raises, or whose two runs differ, is discarded for the next attempt."""

from __future__ import annotations

import contextlib
import re
import linecache
import random
import warnings

import torch

from . import harness
from .program import Arg, CallSpec, GSpec, ModuleSpec, Program, TSpec, replace

# ----------------------------------------------------------------------------------------
# module-level helpers a program may use (only those it names are kept)

HELPERS = {
    "combine": '''def combine(*ts, scale=1.0, **opts):
    out = ts[0] * scale
    for t in ts[1:]:
        out = out + t
    if opts.get("relu", False):
        out = out.relu()
    return out''',
    "call_with": '''def call_with(f, *args, **kwargs):
    return f(*args, **kwargs)''',
    "bump_": '''def bump_(t, by=1.0, **unused):
    t.add_(by)
    return t''',
    "make_scaler": '''def make_scaler(k):
    def scale(t):
        return t * k
    return scale''',
    "stats": '''def stats(t, **kw):
    return {"mean": t.float().mean(**kw), "max": t.amax(**kw)}''',
    "apply_all": '''def apply_all(fs, t):
    for f in fs:
        t = f(t)
    return t''',
    # cached helpers: a registry the program fills (the cache hands back the same dict on
    # every call) and a parse whose answer is a constant tuple
    "count": '''def count(key):
    c = _counts()
    c[key] = c.get(key, 0) + 1
    return c[key]


_counts = functools.lru_cache(None)(lambda: {})''',
    "order": '''def order(pattern):
    return _order(pattern)


@functools.lru_cache(16)
def _order(pattern):
    left, right = pattern.split("->")
    return tuple(left.split().index(a) for a in right.split())''',
}

UNARY_F = ["torch.sin({a})", "torch.tanh({a})", "{a}.relu()", "{a}.sigmoid()", "torch.exp({a}.clamp(max=3))",
           "{a}.abs().sqrt()", "torch.log1p({a}.abs())", "F.gelu({a})", "{a}.neg()", "{a} * 2.5", "{a} - 1",
           "{a}.clamp(-0.5, 0.5)", "{a}.pow(2)", "F.silu({a})", "torch.floor({a} * 3)", "{a}.square()",
           "torch.rsqrt({a}.abs() + 1)", "F.leaky_relu({a}, 0.1)", "F.hardtanh({a})", "{a}.cos() + {a}",
           "torch.erf({a})", "{a}.round()", "{a}.sign() * {a}"]
UNARY_I = ["{a} * 2", "{a} + 1", "{a}.abs()", "{a} // 2", "{a} % 3", "{a}.clamp(min=0)", "-{a}", "{a}.relu()",
           "({a} > 0).long()", "torch.where({a} > 0, {a}, 0)", "{a}.float()", "{a} * {a}", "{a}.sign()"]
BINARY = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "torch.maximum({a}, {b})", "torch.where({a} > {b}, {a}, {b})",
          "torch.add({a}, {b}, alpha=2)", "{a} * {b} + {a}", "torch.minimum({a}, {b})", "({a} > {b}) * {a}"]
BINARY_F = ["{a} / ({b}.abs() + 1)", "torch.atan2({a}, {b})", "torch.hypot({a}, {b})"]
REDUCE = ["{a}.sum({d})", "{a}.sum()", "{a}.amax({d})", "{a}.amin({d})", "{a}.max({d}).values",
          "{a}.argmax({d})", "{a}.sum({d}, keepdim=True)", "{a}.cumsum({d})", "{a}.prod({d})"]
REDUCE_F = ["{a}.mean({d})", "{a}.mean({d}, keepdim=True)", "{a}.norm()", "torch.logsumexp({a}, {d})",
            "{a}.var({d})", "{a}.mean()", "{a}.std()"]
SOFTMAX = ["torch.softmax({a}, {d})", "F.log_softmax({a}, dim={d})", "{a}.softmax(-1)", "F.softmax({a} * 2, dim={d})"]
VIEWS = ["{a}[1:]", "{a}[0]", "{a}[::2]", "{a}.unsqueeze(0)", "{a}.view(-1)", "{a}.narrow(0, 0, 1)",
         "{a}.detach()", "{a}.squeeze()", "{a}.chunk(2)[0]", "{a}.unbind(0)[-1]", "{a}.to({a}.dtype)",
         "{a}.contiguous()", "{a}.expand(2, *{a}.shape)", "{a}[None]", "{a}[-1:]"]
VIEWS_2D = ["{a}[:, 0]", "{a}.t()", "{a}.transpose(0, 1)", "{a}[..., ::2]", "{a}.diagonal()", "{a}[:, 1:]",
            "{a}.select(1, -1)", "{a}.movedim(0, -1)", "{a}[1:, :-1]"]
INLINE_RESHAPE = ["{a}.reshape(-1) * 2", "{a}.flatten().cumsum(0)", "{a}.reshape({a}.shape[0], -1).sum(-1)",
                  "{a}.contiguous().view(-1) + 1", "{a}.reshape(-1)[::2].sum()", "{a}.flatten(0) @ {a}.flatten(0)"]
FACTORY = ["torch.zeros_like({a})", "torch.ones({a}.shape[0], 2)", "torch.full_like({a}, 0.5)",
           "torch.arange({a}.shape[0])", "torch.eye({a}.shape[-1])", "{a}.new_ones({a}.shape)",
           "torch.tensor([1.0, -2.0, 3.0])", "torch.ones_like({a}) * {a}.shape[-1]",
           "torch.arange({a}.numel()).view({a}.shape)", "torch.linspace(0, 1, {a}.shape[-1])"]
INDEX_READ = ["{a}[{a} > 0]", "{a}[torch.arange(0, {a}.shape[0], 2)]", "{a}.index_select(0, torch.tensor([0]))",
              "{a}.masked_fill({a} < 0, 0)", "{a}[[0, -1]]", "{a}.flip(0)", "{a}.roll(1, 0)"]
INDEX_READ_2D = ["torch.gather({a}, 1, {a}.argmin(1, keepdim=True))", "{a}[:, torch.tensor([0, -1])]",
                 "{a}[{a}[:, 0] > 0]", "{a}.tril()", "{a}[torch.arange({a}.shape[0]), 0]"]

COND_TENSOR_META = ["{a}.dtype == torch.float32", "{a}.requires_grad", "{a}.is_contiguous()",
                    "{a}.stride(-1) == 1", "{a}.is_floating_point()", "{a}.dim() == 2"]
COND_DATA = ["{a}.sum() > 0", "{a}.max().item() > 0.5", "bool(({a} > 0).any())", "{a}.mean().item() < 0",
             "{a}.float().norm() > 3"]


def _bshape(a, b):
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


class TV:
    """What a probe saw of one tensor-valued expression."""

    def __init__(self, expr, t, weight=1, name=None):
        self.expr, self.weight, self.name = expr, weight, name
        self.shape, self.dtype, self.ndim = tuple(t.shape), t.dtype, t.dim()
        self.float = t.is_floating_point()
        self.rg = t.requires_grad
        base = t._base if t._base is not None else t
        self.grad_leaf = t.requires_grad and (t.is_leaf or (base.is_leaf and base.requires_grad))
        self.overlapping = any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))
        self.writable = not self.grad_leaf and not self.overlapping
        self.storage = t.untyped_storage().data_ptr() if t.numel() else None
        self.view_key = (t.data_ptr(), self.shape, t.stride())

    def may_read_into(self, target, whole=True):
        """Whether this tensor may be read by an in-place op writing `target` (or a view of
        it when not `whole`): not when they share memory without being the same view, where
        eager's result would depend on the order the op visits elements."""
        if self.storage is None or self.storage != target.storage:
            return True
        return whole and self.view_key == target.view_key


class ProbeError(Exception):
    pass


def load(prog: Program, src=None, tag="fuzz"):
    """Exec a program's source and its calls into a fresh module namespace."""
    src = src if src is not None else prog.source()
    filename = f"<{tag}-{prog.seed}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = {"__name__": f"fuzz_prog_{prog.seed}"}
    exec(compile(src, filename, "exec"), ns)
    calls_ns = {"torch": torch}
    exec(prog.calls_source(), calls_ns)
    return ns, calls_ns["CALLS"], calls_ns["GLOBALS"]


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class Gen:
    def __init__(self, seed, attempt=0):
        self.seed = seed
        self.r = random.Random(seed * 1009 + attempt)
        self.counts = {}
        self.hidden = {"i", "j", "t", "p", "key", "val"}

    def fresh(self, prefix):
        n = self.counts.get(prefix, 0)
        self.counts[prefix] = n + 1
        return f"{prefix}{n}"

    # ------------------------------------------------------------------ setup
    def build(self) -> Program:
        r = self.r
        n = r.choice([2, 3, 4, 5, 6])
        m = r.choice([x for x in (3, 4, 5, 6, 7) if x != n])
        k = r.choice([x for x in (2, 3, 4, 5, 6, 7) if x not in (n, m)])
        self.sizes = {"N": n, "M": m, "K": k}
        args = []
        shapes = [("N", "M")] * 4 + [("M",)] * 2 + [("M", "M"), ("N", "M", "K"), ("N",), ("N", 1), (), ("N", "M", "K", "K")]
        for i in range(r.choice([1, 2, 2, 3, 3, 4])):
            dims = r.choice(shapes) if i else r.choice([("N", "M"), ("N", "M"), ("N", "M", "K"), ("M",)])
            dt = r.choices(["float32", "float64", "int64"], [8, 1.5, 1.5])[0]
            lay = r.choices(["contig", "transposed", "sliced", "sliced_last", "expanded", "channels_last"],
                            [10, 2, 1.5, 1, 1, 1 if len(dims) == 4 else 0])[0] if dims else "contig"
            rg = r.choices([None, "leaf", "nonleaf"], [6, 2, 1])[0] if dt != "int64" else None
            args.append(Arg("xyzw"[i], "tensor", tensor=TSpec(dims, dt, lay, rg)))
        if r.random() < 0.25:
            args.append(Arg("xs", "list", items=[TSpec(("N", "M")), TSpec(r.choice([("M",), ("N", "M")]))]))
        if r.random() < 0.2:
            args.append(Arg("d", "dict", items=[("a", TSpec(("N", "M"))), ("b", TSpec(("M",)))]))
        if r.random() < 0.5:
            args.append(Arg("n", "int", value=r.choice([0, 1, 2, 3])))
        if r.random() < 0.3:
            args.append(Arg("s", "float", value=r.choice([0.5, -1.5, 2.0])))
        if r.random() < 0.3:
            args.append(Arg("flag", "bool", value=r.random() < 0.5))
        self.module_ref = None
        module = None
        if r.random() < 0.35:
            module = self.make_module()
            self.module_ref = "m" if r.random() < 0.5 else "MOD"
            if self.module_ref == "m":
                args.append(Arg("m", "module"))
        gl = []
        if r.random() < 0.6:
            for name in r.sample(["G_W", "COUNT", "SCALE", "G_CFG", "G_HIST"], r.choice([1, 1, 2, 3])):
                if name == "G_W":
                    gl.append(GSpec("G_W", "tensor", tensor=TSpec(r.choice([("M",), ("N", "M"), (1,)]))))
                elif name == "COUNT":
                    gl.append(GSpec("COUNT", "int", value=r.choice([0, 1, 2])))
                elif name == "SCALE":
                    gl.append(GSpec("SCALE", "float", value=r.choice([0.5, 2.0, -1.0])))
                elif name == "G_CFG":
                    gl.append(GSpec("G_CFG", "cfg", value={"scale": r.choice([0.5, 3.0]), "on": r.random() < 0.5}))
                else:
                    gl.append(GSpec("G_HIST", "hist"))
        prog = Program(seed=self.seed, sizes=self.sizes, args=args, globals=gl, helpers=list(HELPERS.values()),
                       module=module, body=[], ret=[], ret_form="single", global_decls=[])
        prog.calls = [CallSpec("call 0", dict(self.sizes), seed=self.seed * 7919 % 100003 + 1, args=args,
                               globals=gl, module="new" if module else None)]
        return prog

    def make_module(self):
        r = self.r
        init = ["self.lin = torch.nn.Linear(m, m)", "self.scale = torch.nn.Parameter(torch.linspace(-1, 1, m))",
                "self.register_buffer(\"running\", torch.zeros(m))",
                "self.register_buffer(\"steps\", torch.zeros((), dtype=torch.int64))", "self.calls = 0"]
        fwd = ["h = self.lin(t)" if r.random() < 0.8 else "h = t * 1.0"]
        opts = ["h = h * self.scale",
                "self.running.mul_(0.9).add_(h.detach().mean(0) * 0.1)",
                "self.steps += 1",
                "self.calls += 1",
                "if self.training:\n    h = h.relu()\nelse:\n    h = h.sigmoid()",
                "if self.calls % 2 == 0:\n    h = h * 2",
                "h = self.bn(h)",
                "h = h + self.running",
                "h = F.layer_norm(h, h.shape[-1:])",
                "if int(self.steps) > 2:\n    h = h - 1"]
        chosen = r.sample(opts, r.randint(2, 5))
        if "h = self.bn(h)" in chosen:
            init.append("self.bn = torch.nn.BatchNorm1d(m)")
        fwd += chosen
        return ModuleSpec(init=init, forward=fwd)

    # ------------------------------------------------------------------ probing
    def probe(self, prog: Program, body):
        p = prog.copy()
        p.body = body
        p.calls = prog.calls[:1]
        with quiet():
            try:
                ns, calls, _ = load(p, src=p.source(ret="locals()"), tag="probe")
                c = calls[0](ns)
                with torch.set_grad_enabled(c["grad"]):
                    loc = ns["fn"](*c["args"])
                roots = [t for t in _tensors(loc) if t.requires_grad and t.is_floating_point()]
                if roots:
                    sum(t.sum() for t in roots).backward()
            except Exception as e:  # noqa: BLE001
                raise ProbeError(harness.error_line(e)) from None
        return ns, loc

    def observe(self, prog, ns, loc):
        """Rebuild the operand pools from a probe's locals and the module namespace."""
        self.tvs, self.ints, self.floats, self.names = [], [], [], []
        argnames = {a.name for a in prog.args}
        for name, v in loc.items():
            if name in self.hidden or name.startswith("_"):
                continue
            w = 2 if name in argnames else 3
            if isinstance(v, torch.Tensor):
                self.tvs.append(TV(name, v, w, name=name))
            elif isinstance(v, list):
                for i, x in enumerate(v[:3]):
                    if isinstance(x, torch.Tensor):
                        self.tvs.append(TV(f"{name}[{i}]", x, 1))
            elif isinstance(v, dict):
                for key, x in list(v.items())[:3]:
                    if isinstance(x, torch.Tensor) and isinstance(key, str):
                        self.tvs.append(TV(f"{name}[{key!r}]", x, 1))
            elif isinstance(v, bool):
                pass
            elif isinstance(v, int):
                self.ints.append(name)
            elif isinstance(v, float):
                self.floats.append(name)
        for g in prog.globals:
            v = ns.get(g.name)
            if isinstance(v, torch.Tensor):
                self.tvs.append(TV(g.name, v, 2))
            elif g.kind == "int":
                self.ints.append(g.name)
            elif g.kind == "float":
                self.floats.append(g.name)
            elif g.kind == "cfg":
                self.floats.append("G_CFG['scale']")
        if self.module_ref:
            mod = ns["MOD"]
            self.tvs.append(TV(f"{self.module_ref}.running", mod.running, 1))
            self.tvs.append(TV(f"{self.module_ref}.scale", mod.scale, 1))
        for tv in self.tvs:
            if tv.name and tv.ndim >= 1:
                self.ints.append(f"{tv.name}.shape[0]")
        self.loc = loc

    def pick(self, pred=lambda v: True, names_only=False):
        c = [v for v in self.tvs if pred(v) and (v.name or not names_only)]
        if not c:
            return None
        return self.r.choices(c, [v.weight for v in c])[0]

    def scalar(self, kind="any"):
        r = self.r
        pool = (self.ints + self.floats) if kind == "any" else self.ints
        if pool and r.random() < 0.5:
            return r.choice(pool)
        return repr(r.choice([2, 3, -1, 0.5, 1.5, -2.0] if kind == "any" else [1, 2, 3]))

    # ------------------------------------------------------------------ statements
    def stmt(self, prog):
        r = self.r
        kinds = {"unary": 10, "binary": 10, "scalar_binary": 5, "reduce": 6, "softmax": 3, "matmul": 5,
                 "view": 7, "inline_reshape": 2, "factory": 3, "index_read": 3, "cat": 3, "cast": 2,
                 "inplace": 9, "index_assign": 7, "relu_inplace": 2, "out_arg": 3, "inplace_meta": 1,
                 "if": 6, "for": 4, "while": 1, "data_dep": 4, "print": 3, "grad_block": 2,
                 "closure": 3, "helper": 4, "global_mut": 4 if prog.globals else 0, "global_read": 2 if prog.globals else 0,
                 "container": 4, "input_container": 2 if any(a.kind in ("list", "dict") for a in prog.args) else 0,
                 "module": 7 if self.module_ref else 0}
        kind = r.choices(list(kinds), list(kinds.values()))[0]
        return kind, getattr(self, "s_" + kind)(prog)

    def new(self, expr):
        return f"{self.fresh('t')} = {expr}"

    def s_unary(self, prog):
        a = self.pick()
        if a is None:
            return None
        return self.new(self.r.choice(UNARY_F if a.float else UNARY_I).format(a=a.expr))

    def s_binary(self, prog):
        a = self.pick()
        if a is None:
            return None
        b = self.pick(lambda v: v is not a and _bshape(a.shape, v.shape) is not None) or a
        ops = BINARY + (BINARY_F if a.float and b.float else [])
        return self.new(self.r.choice(ops).format(a=a.expr, b=b.expr))

    def s_scalar_binary(self, prog):
        a = self.pick()
        if a is None:
            return None
        s = self.scalar()
        return self.new(self.r.choice(["{a} * {s}", "{a} + {s}", "{a} - {s} * 0.5", "{s} - {a}", "{a} * ({s} + 1)"])
                        .format(a=a.expr, s=s))

    def _dim(self, a):
        return self.r.choice([0, -1, a.ndim - 1]) if a.ndim else 0

    def s_reduce(self, prog):
        a = self.pick(lambda v: v.ndim >= 1) or self.pick()
        if a is None:
            return None
        ops = REDUCE + (REDUCE_F if a.float else [])
        return self.new(self.r.choice(ops).format(a=a.expr, d=self._dim(a)))

    def s_softmax(self, prog):
        a = self.pick(lambda v: v.float and v.ndim >= 1)
        if a is None:
            return None
        return self.new(self.r.choice(SOFTMAX).format(a=a.expr, d=self._dim(a)))

    def s_matmul(self, prog):
        r = self.r
        a = self.pick(lambda v: v.ndim >= 1)
        if a is None:
            return None
        if a.ndim == 2 and r.random() < 0.3:
            return self.new(r.choice(["{a} @ {a}.t()", "{a}.t() @ {a}", "torch.mm({a}, {a}.t())"]).format(a=a.expr))
        if a.ndim == 3 and r.random() < 0.3:
            return self.new(f"torch.bmm({a.expr}, {a.expr}.transpose(1, 2))")
        b = self.pick(lambda v: 1 <= v.ndim <= 2 and v.shape[0] == a.shape[-1] and v is not a)
        if b is not None:
            if b.ndim == 2 and a.ndim == 2 and r.random() < 0.3:
                return self.new(f"torch.einsum('ij,jk->ik', {a.expr}, {b.expr})")
            return self.new(r.choice(["{a} @ {b}", "torch.matmul({a}, {b})"]).format(a=a.expr, b=b.expr))
        b = self.pick(lambda v: v.ndim == 2 and v.shape[1] == a.shape[-1])
        if b is not None:
            return self.new(f"F.linear({a.expr}, {b.expr})")
        return None

    def s_view(self, prog):
        a = self.pick(lambda v: v.ndim >= 1)
        if a is None:
            return None
        ops = VIEWS + (VIEWS_2D if a.ndim >= 2 else [])
        return self.new(self.r.choice(ops).format(a=a.expr))

    def s_inline_reshape(self, prog):
        a = self.pick(lambda v: v.ndim >= 1)
        if a is None:
            return None
        return self.new(self.r.choice(INLINE_RESHAPE).format(a=a.expr))

    def s_factory(self, prog):
        a = self.pick(lambda v: v.ndim >= 1)
        if a is None:
            return None
        ops = FACTORY + ([f"torch.arange({self.scalar('int')}) * 1.5", ] if self.ints else [])
        return self.new(self.r.choice(ops).format(a=a.expr))

    def s_index_read(self, prog):
        a = self.pick(lambda v: v.ndim >= 1)
        if a is None:
            return None
        ops = INDEX_READ + (INDEX_READ_2D if a.ndim >= 2 else [])
        return self.new(self.r.choice(ops).format(a=a.expr))

    def s_cat(self, prog):
        a = self.pick(lambda v: v.ndim >= 1)
        if a is None:
            return None
        b = self.pick(lambda v: v.shape == a.shape and v is not a)
        if b is None:
            return self.new(self.r.choice(["torch.cat([{a}, {a}[:1]])", "torch.cat([{a}, {a} * 2], -1)",
                                           "torch.stack([{a}, {a}.relu()])"]).format(a=a.expr))
        return self.new(self.r.choice(["torch.stack([{a}, {b}])", "torch.cat([{a}, {b}])", "torch.cat([{a}, {b}], -1)",
                                       "torch.stack([{a}, {b}], -1).sum(-1)"]).format(a=a.expr, b=b.expr))

    def s_cast(self, prog):
        a = self.pick()
        if a is None:
            return None
        b = self.pick(lambda v: v is not a)
        ops = ["{a}.to(torch.float64)", "{a}.long()", "{a}.float()", "{a}.double() * 2", "{a}.to(torch.int64) + 1"]
        if b is not None:
            ops.append("{a}.type_as({b})")
        return self.new(self.r.choice(ops).format(a=a.expr, b=b.expr if b else ""))

    # -- in-place --
    def target(self, pred=lambda v: True, allow_view=True, grad_ok=False):
        """An expression to write through: a writable tensor, or a view of one."""
        a = self.pick(lambda v: (v.writable or (grad_ok and not v.overlapping)) and pred(v))
        if a is None:
            return None, None, None
        if allow_view and a.ndim >= 1 and self.r.random() < 0.35:
            views = ["{a}[1:]", "{a}[0]", "{a}[::2]", "{a}.detach()", "{a}[-1:]"]
            if a.ndim >= 2:
                views += ["{a}[:, 0]", "{a}.t()", "{a}.diagonal()", "{a}[:, 1:]"]
            v = self.r.choice(views).format(a=a.expr)
            return v, _view_shape(v, a), a
        return a.expr, a.shape, a

    def s_inplace(self, prog):
        r = self.r
        tgt, shape, a = self.target()
        if tgt is None or shape is None:
            return None
        b = self.pick(lambda v: _bshape(shape, v.shape) == shape and v.may_read_into(a, tgt == a.expr))
        ops = [".mul_({s})", ".sub_(1)", ".clamp_(min=-0.5)", ".zero_()", ".fill_(2)", ".relu_()", ".neg_()",
               ".masked_fill_({t} > 1, 1)", ".abs_()", ".mul_(2).add_(1)", ".add_({s})"]
        if a.float:
            ops += [".sigmoid_()", ".div_(2)", ".exp_()", ".tanh_()"]
        if b is not None:
            ops += [".add_({b})", ".copy_({b})", ".add_({b}, alpha=2)", ".mul_({b})", ".sub_({b})"]
            if a.float and b.float:
                ops += [".addcmul_({b}, {b}, value=0.5)", ".lerp_({b}, 0.5)"]
        op = r.choice(ops).format(s=self.scalar(), b=b.expr if b else "", t=tgt)
        if r.random() < 0.2:
            return f"{self.fresh('t')} = {tgt}{op}"
        return tgt + op

    def s_index_assign(self, prog):
        r = self.r
        a = self.pick(lambda v: v.writable and v.ndim >= 1)
        if a is None:
            return None
        e = a.expr
        val = self.scalar()
        sub = _view_shape(f"{e}[1:]", a)
        b = self.pick(lambda v: sub is not None and _bshape(sub, v.shape) == sub and v.may_read_into(a, False))
        ops = [f"{e}[0] = {val}", f"{e}[{e} < 0] = 0", f"{e}[torch.arange(0, {e}.shape[0], 2)] = {val}",
               f"{e}[1:] += 1", f"{e}[:2] *= 2", f"{e}[-1] = {e}[0]", f"{e}[...] = {val}"]
        if b is not None:
            ops += [f"{e}[1:] = {b.expr}"]
        c = self.pick(lambda v: _bshape(a.shape, v.shape) == a.shape and v.may_read_into(a, False))
        if c is not None:
            ops += [f"{e}[...] = {c.expr}", f"{e}[{c.expr} > 0] = 1"]
        if a.ndim >= 2:
            ops += [f"{e}[:, 0] = {val}", f"{e}[..., -1] = {e}[..., 0]", f"{e}[0, 0] = {e}[0, 0] * 2",
                    f"{e}[1:, :1] = -{val}"]
        return r.choice(ops)

    def s_relu_inplace(self, prog):
        tgt, _, _ = self.target()
        if tgt is None:
            return None
        st = self.r.choice([f"F.relu({tgt}, inplace=True)", f"torch.relu_({tgt})", f"F.hardtanh({tgt}, inplace=True)",
                            f"F.leaky_relu({tgt}, 0.2, inplace=True)"])
        return st if self.r.random() < 0.5 else f"{self.fresh('t')} = {st}"

    def s_out_arg(self, prog):
        r = self.r
        a = self.pick()
        if a is None:
            return None
        b = self.pick(lambda v: _bshape(a.shape, v.shape) is not None)
        if b is None:
            return None
        shape = _bshape(a.shape, b.shape)
        rd = torch.promote_types(a.dtype, b.dtype)
        c = self.pick(lambda v: v.writable and v.shape == shape and v.dtype == rd and v.name is not None
                      and a.may_read_into(v) and b.may_read_into(v))
        if c is None:
            return None
        ops = ["torch.add({a}, {b}, out={c})", "torch.mul({a}, {b}, out={c})", "torch.sub({a}, {b}, alpha=2, out={c})",
               "torch.maximum({a}, {b}, out={c})"]
        if rd.is_floating_point:
            ops += ["torch.sin({a}, out={c})" if a.shape == shape and a.dtype == rd else "torch.add({a}, {b}, out={c})"]
        return r.choice(ops).format(a=a.expr, b=b.expr, c=c.expr)

    def s_inplace_meta(self, prog):
        a = self.pick(lambda v: v.writable and v.ndim >= 1, names_only=True)
        if a is None:
            return None
        ops = [f"{a.expr}.unsqueeze_(0)", f"{a.expr}.squeeze_()"]
        if a.ndim == 2:
            ops += [f"{a.expr}.t_()", f"{a.expr}.transpose_(0, 1)"]
        return self.r.choice(ops)

    # -- control flow --
    def cond(self, prog):
        r = self.r
        a = self.pick(lambda v: v.ndim >= 1) or self.pick()
        opts = []
        if a is not None and a.ndim >= 1:
            s0 = a.shape[0]
            opts += [f"{a.expr}.shape[0] > {max(s0 - r.choice([0, 1]), 0)}", f"{a.expr}.numel() > {a.shape[0] + 2}",
                     f"{a.expr}.shape[-1] == {a.shape[-1]}"]
        if a is not None:
            opts += [r.choice(COND_TENSOR_META).format(a=a.expr), r.choice(COND_DATA).format(a=a.expr)]
        opts.append("torch.is_grad_enabled()")
        names = {x.name for x in prog.args}
        if "n" in names:
            opts += [f"n > {r.choice([0, 1, 2])}", "n % 2 == 0"]
        if "flag" in names:
            opts += ["flag", "not flag"]
        if "s" in names:
            opts.append("s > 0")
        if "xs" in names:
            opts.append("len(xs) > 2")
        gnames = {g.name for g in prog.globals}
        if "COUNT" in gnames:
            opts.append("COUNT % 2 == 1")
        if "G_CFG" in gnames:
            opts += ["G_CFG['on']", "G_CFG.get('calls', 0) > 1"]
        if "SCALE" in gnames:
            opts.append("SCALE > 0")
        if self.module_ref:
            opts += [f"{self.module_ref}.training", f"{self.module_ref}.calls > 1"]
        return r.choice(opts)

    def s_if(self, prog):
        r = self.r
        c = self.cond(prog)
        a = self.pick(names_only=True)
        if a is None:
            return None
        one = (UNARY_F if a.float else UNARY_I)
        e1, e2 = (r.choice(one).format(a=a.expr) for _ in range(2))
        form = r.randrange(4)
        if form == 0:
            return f"if {c}:\n    {a.expr} = {e1}\nelse:\n    {a.expr} = {e2}"
        if form == 1:
            tgt, _, _ = self.target()
            if tgt is None:
                return None
            return f"if {c}:\n    {tgt}.mul_({self.scalar()})"
        if form == 2:
            t = self.fresh("t")
            return f"if {c}:\n    {t} = {e1}\nelse:\n    {t} = {e2}"
        t = self.fresh("t")
        return f"{t} = {e1}\nif {c}:\n    {t} = {t} + {a.expr}"

    def s_for(self, prog):
        r = self.r
        a = self.pick(names_only=True)
        if a is None:
            return None
        n = self.scalar("int") if r.random() < 0.7 else str(r.choice([2, 3]))
        acc = self.fresh("acc")
        names = {x.name for x in prog.args}
        form = r.randrange(6)
        if form == 0:
            return f"{acc} = torch.zeros_like({a.expr})\nfor i in range({n}):\n    {acc} = {acc} + {a.expr} * (i + 1)"
        if form == 1 and a.writable and a.ndim >= 1:
            return f"for i in range({a.expr}.shape[0]):\n    {a.expr}[i] = {a.expr}[i] * 2 + i"
        if form == 2 and "xs" in names:
            return f"{acc} = {a.expr}.sum() * 0\nfor t in xs:\n    {acc} = {acc} + t.sum()"
        if form == 3 and "d" in names:
            return f"{acc} = 0\nfor key, val in d.items():\n    {acc} = {acc} + val.mean()"
        if form == 4:
            return (f"{acc} = {a.expr}\nfor i in range(5):\n    if i >= {n}:\n        break\n"
                    f"    {acc} = {acc} * 0.5 + i")
        t = self.fresh("t")
        b = self.pick(lambda v: v.shape == a.shape and v is not a) or a
        return f"{t} = []\nfor j, p in enumerate([{a.expr}, {b.expr}]):\n    {t}.append(p * j)\n{t} = torch.stack({t})"

    def s_while(self, prog):
        a = self.pick(names_only=True)
        if a is None:
            return None
        k = self.fresh("k")
        n = self.scalar("int")
        if self.r.random() < 0.5:
            return f"{k} = 0\nwhile {k} < {n}:\n    {a.expr} = {a.expr} * 2 - 1\n    {k} += 1"
        return f"{k} = 0\nwhile {a.expr}.sum() > 0 and {k} < 3:\n    {a.expr} = {a.expr} - 1\n    {k} += 1"

    def s_data_dep(self, prog):
        r = self.r
        a = self.pick()
        if a is None:
            return None
        b = self.pick() or a
        v, k = self.fresh("v"), self.fresh("k")
        ops = [f"{v} = {a.expr}.sum().item()\n{self.fresh('t')} = {b.expr} * {v}",
               f"{k} = int({a.expr}.argmax())",
               f"{self.fresh('t')} = {b.expr} * {a.expr}.max().item()",
               f"{v} = float({a.expr}.float().mean())",
               f"{v} = {a.expr}.flatten().tolist()[0]"]
        if b.ndim >= 1:
            ops.append(f"{k} = int(({a.expr} > 0).sum())\n{self.fresh('t')} = {b.expr}[:{k} + 1]")
        return r.choice(ops)

    def s_print(self, prog):
        a = self.pick()
        if a is None:
            return None
        n = self.scalar()
        return self.r.choice([f"print('dbg', {a.expr}.shape, file=DEVNULL)",
                              f"print({a.expr}.sum().item(), {n}, file=DEVNULL)",
                              f"print({a.expr}, file=DEVNULL)",
                              f"LOG.debug('value %s', {a.expr})",
                              f"LOG.info('shape %s', tuple({a.expr}.shape))"])

    def s_grad_block(self, prog):
        r = self.r
        form = r.randrange(4)
        if form == 0:
            tgt, _, _ = self.target(grad_ok=True)
            if tgt is None:
                return None
            return f"with torch.no_grad():\n    {tgt}.mul_({self.scalar()})"
        a = self.pick()
        if a is None:
            return None
        if form == 1:
            return f"with torch.no_grad():\n    {self.new(a.expr + ' * 2')}"
        if form == 2:
            return f"with torch.enable_grad():\n    {self.new('torch.sin(' + a.expr + ')')}"
        return self.new(f"{a.expr}.detach()" if r.random() < 0.5 else f"{a.expr}.detach().clone()")

    def s_closure(self, prog):
        r = self.r
        a = self.pick()
        if a is None:
            return None
        form = r.randrange(5)
        f = self.fresh("f")
        if form == 0:
            c = self.pick(lambda v: _bshape(a.shape, v.shape) is not None, names_only=True) or a
            return (f"def {f}(t):\n    return t * {self.scalar()} + {c.expr}\n"
                    f"{self.new(f + '(' + a.expr + ')')}")
        if form == 1:
            cnt = self.fresh("calls")
            return (f"{cnt} = 0\ndef {f}(t):\n    nonlocal {cnt}\n    {cnt} += 1\n    return t * {cnt}\n"
                    f"{self.new(f'{f}({f}({a.expr}))')}")
        if form == 2:
            return f"{f} = lambda t, k={self.scalar()}: t.relu() * k\n{self.new(f + '(' + a.expr + ')')}"
        if form == 3:
            c = self.pick(lambda v: v.writable and _bshape(v.shape, a.shape) == v.shape and a.may_read_into(v),
                          names_only=True)
            if c is None:
                return None
            return f"def {f}(t):\n    {c.expr}.add_(t)\n{f}({a.expr})"
        return f"{f} = make_scaler({self.scalar()})\n{self.new(f + '(' + a.expr + ')')}"

    def s_helper(self, prog):
        r = self.r
        a = self.pick()
        if a is None:
            return None
        b = self.pick(lambda v: _bshape(a.shape, v.shape) is not None) or a
        form = r.randrange(7)
        if form == 0:
            return self.new(f"combine({a.expr}, {b.expr}, scale={self.scalar()}, relu={r.random() < 0.5})")
        if form == 1:
            return self.new(f"combine(*[{a.expr}, {b.expr}, {a.expr}])")
        if form == 2:
            return self.new(r.choice([f"call_with(torch.add, {a.expr}, {b.expr}, alpha=2)",
                                      f"call_with(torch.clamp, {a.expr}, min=-0.5, max=0.5)",
                                      f"call_with(torch.sum, {a.expr}, dim=0)" if a.ndim else f"call_with(torch.neg, {a.expr})"]))
        if form == 3:
            tgt, _, _ = self.target()
            if tgt is None:
                return None
            return self.new(f"bump_({tgt}, by={self.scalar()})")
        if form == 4 and a.ndim >= 1:
            return f"{self.fresh('st')} = stats({a.expr}, dim=0)"
        if form == 5:
            return self.new(f"apply_all([torch.sin, torch.relu, lambda t: t * 2], {a.expr})" if a.float else
                            f"apply_all([torch.abs, lambda t: t + 1], {a.expr})")
        return self.new(f"call_with(lambda *ts, **kw: sum(ts) * kw['k'], {a.expr}, {b.expr}, k={self.scalar()})")

    def s_cached(self, r):
        """One time in six, a cached helper's answer scales a tensor in place: `count` (a
        registry that grows with every call) or `order` (a parsed pattern)."""
        if r.random() >= 1 / 6:
            return None
        c = [v for v in self.tvs if v.name and v.float and v.writable]
        if not c:
            return None
        tgt = r.choice(c)
        if r.random() < 0.5:
            return f"{tgt.expr}.mul_(count({r.choice(['a', 'b'])!r}))"
        return f"{tgt.expr}.add_(order({r.choice(['a b c -> c a b', 'a b -> b a', 'x y z -> y x z'])!r})[0])"

    def s_global_mut(self, prog):
        r = self.r
        g = r.choice(prog.globals)
        a = self.pick()
        if g.kind == "tensor":
            w = self.pick(lambda v: v.expr == "G_W")
            b = self.pick(lambda v: w is not None and _bshape(w.shape, v.shape) == w.shape and v.may_read_into(w))
            ops = ["G_W.mul_(0.5)", "G_W.add_(1)"] + ([f"G_W.add_({b.expr})"] if b else [])
            if a is not None:
                ops.append(f"G_W = G_W * 0.9 + {a.expr}.float().mean()")
            st = r.choice(ops)
        elif g.kind == "int":
            st = r.choice(["COUNT += 1", f"COUNT = COUNT + {self.scalar('int')}"])
        elif g.kind == "float":
            st = r.choice(["SCALE = SCALE * 2", "SCALE = -SCALE"])
        elif g.kind == "cfg":
            st = r.choice(["G_CFG['calls'] = G_CFG.get('calls', 0) + 1", "G_CFG['scale'] = G_CFG['scale'] * 2",
                           "G_CFG['on'] = not G_CFG['on']"])
        else:
            st = r.choice([f"G_HIST.append({a.expr}.sum())" if a else "G_HIST.append(1)", "G_HIST.append(len(G_HIST))"])
        if st.startswith(g.name + " ") and g.name not in prog.global_decls:
            prog.global_decls.append(g.name)
        return st

    def s_global_read(self, prog):
        a = self.pick()
        if a is None:
            return None
        g = self.r.choice(prog.globals)
        use = {"tensor": f"{a.expr} * G_W", "int": f"{a.expr} + COUNT", "float": f"{a.expr} * SCALE",
               "cfg": f"{a.expr} * G_CFG['scale']", "hist": f"{a.expr} * len(G_HIST)"}[g.kind]
        return self.new(use)

    def s_container(self, prog):
        r = self.r
        lists = [n for n, v in self.loc.items() if isinstance(v, list) and n not in self.hidden and n not in ("xs",)]
        dicts = [n for n, v in self.loc.items() if isinstance(v, dict) and n not in ("d",) and not n.startswith("_")]
        a = self.pick()
        if a is None:
            return None
        b = self.pick(lambda v: v.shape == a.shape) or a
        ops = [f"{self.fresh('parts')} = [{a.expr}, {b.expr}]", f"{self.fresh('box')} = {{'a': {a.expr}, 'b': {b.expr}}}"]
        for n in lists:
            ops += [f"{n}.append({a.expr})", self.new(f"sum({n})"), self.new(f"torch.cat([p.flatten() for p in {n}])"),
                    f"{n}.pop()"]
        for n in dicts:
            ops += [f"{n}['c'] = {a.expr}", self.new(f"sum(v.sum() for v in {n}.values())"), f"{n}.pop('a', None)",
                    self.new(f"{n}['a'] * 2") if "a" in self.loc[n] else f"{n}['a'] = {a.expr}"]
        return r.choice(ops)

    def s_input_container(self, prog):
        names = {x.name for x in prog.args}
        a = self.pick()
        if a is None:
            return None
        ops = []
        if "xs" in names:
            ops += [f"xs.append({a.expr})", f"xs[0] = {a.expr}", "xs.pop()", self.new("torch.stack(xs[:1] * 2)")]
        if "d" in names:
            ops += [f"d['new'] = {a.expr}", "d['a'] = d['a'] * 2", "del d['b']", self.new("d['a'] + d.get('b', 0)")]
        return self.r.choice(ops)

    def s_module(self, prog):
        r = self.r
        m = self.module_ref
        a = self.pick(lambda v: v.ndim >= 1 and v.shape[-1] == self.sizes["M"] and v.dtype == torch.float32)
        ops = [f"{m}.calls = {m}.calls + 1", f"{m}.running.add_(1)"]
        if a is not None:
            ops += [self.new(f"{m}({a.expr})")] * 4 + [self.new(f"{m}.lin({a.expr})"),
                                                       self.new(f"{a.expr} @ {m}.lin.weight.t()")]
        return r.choice(ops)

    # ------------------------------------------------------------------ return
    def choose_return(self, prog):
        r = self.r
        tensors = [v for v in self.tvs if v.name]
        made = [v for v in tensors if v.name not in {a.name for a in prog.args}]
        ret = []
        if made:
            ret.append(made[-1].expr)
        # values computed and not used afterwards (up to two more): what the body computed is checked
        unused = [v.expr for v in made[:-1] if _unused_after_def(v.expr, prog.body)]
        for e in r.sample(unused, min(len(unused), r.choice([0, 1, 2]))):
            ret.append(e)
        for _ in range(r.choice([0, 1, 1, 2])):
            x = r.random()
            if x < 0.4 and tensors:
                e = r.choice(tensors).expr
            elif x < 0.55:
                ins = [v for v in tensors if v.name in {a.name for a in prog.args}]
                if not ins:
                    continue
                v = r.choice(ins)
                e = v.expr if r.random() < 0.5 or v.ndim == 0 else r.choice(
                    ["{a}[1:]", "{a}[0]", "{a}.detach()"] + (["{a}.t()"] if v.ndim == 2 else [])).format(a=v.expr)
            elif x < 0.7 and (self.ints or self.floats):
                e = r.choice(self.ints + self.floats)
                e = e if r.random() < 0.5 else f"{e} * 2"
            elif x < 0.8:
                conts = [n for n, v in self.loc.items() if isinstance(v, (list, dict)) and n not in self.hidden]
                if not conts:
                    continue
                e = r.choice(conts)
            else:
                if not tensors:
                    continue
                e = f"[{r.choice(tensors).expr}, {r.choice(tensors).expr}]"
            if e not in ret:
                ret.append(e)
        if not ret:
            ret = [tensors[-1].expr if tensors else "None"]
        prog.ret = ret
        prog.ret_form = r.choice(["tuple", "list", "dict"]) if len(ret) > 1 else r.choice(["single", "single", "tuple"])

    # ------------------------------------------------------------------ calls
    def variants(self, prog):
        r = self.r
        c0 = prog.calls[0]
        makers = [self.v_values, self.v_shape, self.v_shape, self.v_dtype, self.v_layout, self.v_layout, self.v_rg,
                  self.v_globals, self.v_scalars, self.v_alias, self.v_module, self.v_grad, self.v_list, self.v_global_inplace]
        r.shuffle(makers)
        out = []
        for mk in makers:
            c = mk(c0, prog)
            if c is not None:
                c.seed = r.randrange(1, 100000)
                out.append(c)
            if len(out) >= r.choice([4, 5, 6]):
                break
        if r.random() < 0.5:
            out.append(replace(c0, variant="call 0 again (globals and module as the calls left them)", globals=None,
                               module=None))
        return out

    def _tensor_args(self, c, pred=lambda a: True):
        return [a for a in c.args if a.kind == "tensor" and pred(a)]

    def v_values(self, c0, prog):
        return replace(c0, variant="new values", globals=None, module=None)

    def v_shape(self, c0, prog):
        r = self.r
        dim = r.choice(["N", "N", "M", "K"])
        old = c0.sizes[dim]
        new = r.choice([v for v in {1, old + 1, old + 2, max(old - 1, 1)} if v != old] or [old + 1])
        sizes = dict(c0.sizes, **{dim: new})
        used_globally = dim == "M" or any(dim in (g.tensor.dims if g.tensor else ()) for g in prog.globals)
        return replace(c0, variant=f"size {dim}: {old} -> {new}", sizes=sizes,
                       globals=c0.globals if used_globally else None,
                       module="new" if dim == "M" and prog.module else None)

    def v_dtype(self, c0, prog):
        r = self.r
        c = replace(c0, globals=None, module=None)
        fl = self._tensor_args(c, lambda a: a.tensor.dtype != "int64")
        if not fl:
            return None
        chosen = fl if r.random() < 0.4 else [r.choice(fl)]
        for a in chosen:
            a.tensor.dtype = "float64" if a.tensor.dtype == "float32" else "float32"
        c.variant = "dtype of " + ", ".join(f"{a.name} -> {a.tensor.dtype}" for a in chosen)
        return c

    def v_layout(self, c0, prog):
        r = self.r
        c = replace(c0, globals=None, module=None)
        ts = self._tensor_args(c, lambda a: len(a.tensor.dims) >= 1)
        if not ts:
            return None
        a = r.choice(ts)
        opts = ["sliced", "sliced_last", "expanded", "contig"] + (["transposed"] * 2 if len(a.tensor.dims) >= 2 else []) + \
               (["channels_last"] * 2 if len(a.tensor.dims) == 4 else [])
        opts = [o for o in opts if o != a.tensor.layout]
        a.tensor.layout = r.choice(opts)
        c.variant = f"layout of {a.name} -> {a.tensor.layout}"
        return c

    def v_rg(self, c0, prog):
        r = self.r
        c = replace(c0, globals=None, module=None)
        fl = self._tensor_args(c, lambda a: a.tensor.dtype != "int64")
        if not fl:
            return None
        a = r.choice(fl)
        a.tensor.rg = None if a.tensor.rg else r.choice(["leaf", "nonleaf"])
        c.variant = f"requires_grad of {a.name} -> {a.tensor.rg}"
        return c

    def v_globals(self, c0, prog):
        r = self.r
        if not prog.globals:
            return None
        gl = replace(c0).globals
        for g in gl:
            if g.kind == "int":
                g.value = g.value + r.choice([1, 2, 3])
            elif g.kind == "float":
                g.value = -g.value * 2
            elif g.kind == "cfg":
                g.value = {"scale": g.value["scale"] * 2, "on": not g.value["on"]}
        return replace(c0, variant="new global values", globals=gl, module=None)

    def v_global_inplace(self, c0, prog):
        if not any(g.kind == "tensor" for g in prog.globals):
            return None
        return replace(c0, variant="global tensor G_W changed in place", globals=None, module=None, global_inplace="G_W")

    def v_scalars(self, c0, prog):
        c = replace(c0, globals=None, module=None)
        ch = []
        for a in c.args:
            if a.kind == "int":
                a.value = a.value + self.r.choice([1, 2, 3])
            elif a.kind == "float":
                a.value = -a.value * 2
            elif a.kind == "bool":
                a.value = not a.value
            else:
                continue
            ch.append(f"{a.name}={a.value!r}")
        if not ch:
            return None
        c.variant = "Python scalars " + ", ".join(ch)
        return c

    def v_alias(self, c0, prog):
        ts = self._tensor_args(c0)
        for i, a in enumerate(ts):
            for b in ts[i + 1:]:
                if a.tensor.dims == b.tensor.dims:
                    c = replace(c0, globals=None, module=None, variant=f"{b.name} is {a.name}", alias=(a.name, b.name))
                    for x in c.args:
                        if x.name == b.name:
                            x.tensor = replace(a.tensor)
                    return c
        return None

    def v_module(self, c0, prog):
        if not prog.module:
            return None
        act = self.r.choice(["eval", "tweak", "new"])
        return replace(c0, variant={"eval": "module.eval()", "tweak": "module parameters changed in place",
                                    "new": "a new module instance"}[act], globals=None, module=act)

    def v_grad(self, c0, prog):
        return replace(c0, variant="under torch.no_grad()", globals=None, module=None, grad=False)

    def v_list(self, c0, prog):
        c = replace(c0, globals=None, module=None)
        ls = [a for a in c.args if a.kind == "list"]
        if not ls:
            return None
        a = ls[0]
        if len(a.items) > 1 and self.r.random() < 0.5:
            a.items = a.items[:-1]
        else:
            a.items = a.items + [TSpec(("N", "M"))]
        c.variant = f"len(xs) -> {len(a.items)}"
        return c


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


def _unused_after_def(name, body):
    defs = [i for i, s in enumerate(body) if re.search(rf"^\s*{name} = ", s, re.M)]
    return bool(defs) and not any(re.search(rf"\b{name}\b", s) for s in body[defs[-1] + 1:])


def _view_shape(expr, tv):
    """Shape of a view expression of `tv`, evaluated on a meta tensor."""
    try:
        t = torch.empty(tv.shape, dtype=tv.dtype, device="meta")
        return tuple(eval(expr.replace(tv.expr, "_v", 1), {"torch": torch, "_v": t}).shape)
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------------------

def run_sequence(prog, calls_idx=None):
    """Run the program's calls in order, eagerly, in a fresh namespace; a list of results."""
    ns, calls, gnames = load(prog)
    out = []
    with quiet():
        for i, mk in enumerate(calls):
            if calls_idx is not None and i not in calls_idx:
                continue
            out.append(harness.run_call(ns, ns["fn"], mk, gnames))
    return out


def finalize_calls(prog):
    """Drop the calls that raise eagerly (repeatedly: dropping one changes the state the
    next sees). False if call 0 raises or two runs differ."""
    for _ in range(len(prog.calls)):
        res = run_sequence(prog)
        bad = [i for i, x in enumerate(res) if "error" in x]
        if not bad:
            break
        if bad[0] == 0:
            return False
        prog.calls = [c for i, c in enumerate(prog.calls) if i != bad[0]]
    else:
        return False
    again = run_sequence(prog)
    if any("error" in x for x in again) or any(harness.compare(a, b) for a, b in zip(res, again)):
        return False
    return True


def generate(seed, max_attempts=20):
    """The program for `seed` (deterministic). Also returns how many attempts were discarded."""
    for attempt in range(max_attempts):
        g = Gen(seed, attempt)
        prog = g.build()
        try:
            ns, loc = g.probe(prog, [])
        except ProbeError:
            continue
        g.observe(prog, ns, loc)
        want = g.r.randint(4, 12)
        tries = 0
        while len(prog.body) < want and tries < 60:
            tries += 1
            decls = list(prog.global_decls)
            counts = dict(g.counts)
            kind, st = g.stmt(prog)
            if not st:
                continue
            body = prog.body + [st]
            try:
                ns, loc = g.probe(prog, body)
            except ProbeError:
                prog.global_decls, g.counts = decls, counts
                continue
            prog.body = body
            g.observe(prog, ns, loc)
        if g.module_ref and not any(re.search(rf"\b{g.module_ref}\(", s) for s in prog.body):
            a = g.pick(lambda v: v.ndim >= 1 and v.shape[-1] == g.sizes["M"] and v.dtype == torch.float32)
            if a is not None:
                st = g.new(f"{g.module_ref}({a.expr})")
                try:
                    ns, loc = g.probe(prog, prog.body + [st])
                    prog.body.append(st)
                    g.observe(prog, ns, loc)
                except ProbeError:
                    pass
        g.choose_return(prog)
        st = g.s_cached(random.Random(seed * 31337 + attempt))   # its own draws: the rest of the program is unchanged
        if st:
            try:
                ns, loc = g.probe(prog, prog.body + [st])
                prog.body.append(st)
            except ProbeError:
                pass
        prog.calls += g.variants(prog)
        prog.prune_helpers()
        try:
            if finalize_calls(prog):
                return prog, attempt
        except Exception:  # noqa: BLE001  (a program that breaks the harness itself)
            continue
    raise RuntimeError(f"no valid program for seed {seed} in {max_attempts} attempts")
