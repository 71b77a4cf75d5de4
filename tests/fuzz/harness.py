# ---- fuzz harness (tests/fuzz/harness.py): run one call, snapshot it, compare two snapshots ----
# Self-contained (torch only): the runner imports it, and every repro script carries a copy.
import contextlib
import math
import time

import torch

FLOAT_TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-7}


def snapshot(v):
    """A copy of everything observable about `v` (tensor values, dtype, shape, requires_grad;
    containers; numbers), unaffected by later mutation."""
    if isinstance(v, torch.Tensor):
        return ("tensor", v.detach().clone(), v.requires_grad)
    if isinstance(v, torch.nn.Module):
        attrs = {k: x for k, x in vars(v).items() if not k.startswith("_") and isinstance(x, (bool, int, float, str))}
        state = {k: snapshot(x) for k, x in v.state_dict(keep_vars=True).items()}
        return ("module", snapshot(attrs), snapshot(state))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [snapshot(x) for x in v])
    if isinstance(v, dict):
        return ("dict", [(k, snapshot(x)) for k, x in v.items()])
    if isinstance(v, torch.Size):
        return ("value", tuple(v))
    if v is None or isinstance(v, (bool, int, float, str, torch.dtype)):
        return ("value", v)
    return ("object", type(v).__name__)


def flat_tensors(v, path="out"):
    if isinstance(v, torch.Tensor):
        yield path, v
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from flat_tensors(x, f"{path}[{i}]")
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from flat_tensors(x, f"{path}[{k!r}]")


def alias_map(out, watch):
    """For each output tensor, the watched inputs it shares memory with."""
    ptrs = {}
    for name, t in flat_tensors(watch, "in"):
        if t.numel():
            ptrs.setdefault(t.untyped_storage().data_ptr(), set()).add(name)
    return {p: sorted(ptrs.get(t.untyped_storage().data_ptr(), ())) if t.numel() else [] for p, t in flat_tensors(out)}


class _RandomInFloat64(torch.overrides.TorchFunctionMode):
    """Inputs drawn as the float32 run draws them (the same generator stream), then widened."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.randn and out.is_floating_point():
            out = out.to(torch.float64)
        return out


class _DefaultDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = torch.get_default_dtype()
        if self.dtype is not None:
            torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


def run_call(ns, fn, make_call, global_names, float64=False):
    """Build the call's inputs in namespace `ns`, call `fn`, then backward through the sum of
    its floating outputs that require grad. Returns a dict of snapshots, or one with
    'error': (phase, exception). With float64, every floating input, global and module
    parameter is widened to float64 (same values) and the program runs in float64: the
    reference that tells rounding noise from a wrong result."""
    if float64:
        with _RandomInFloat64():
            c = make_call(ns)
        if ns.get("MOD") is not None:
            ns["MOD"].double()
    else:
        c = make_call(ns)
    mod = ns.get("MOD")
    if mod is not None:
        for p in mod.parameters():
            p.grad = None
    try:
        with torch.set_grad_enabled(c.get("grad", True)), _DefaultDtype(torch.float64 if float64 else None):
            out = fn(*c["args"])
    except Exception as e:  # noqa: BLE001
        return {"error": ("call", e)}
    res = {"out": snapshot(out), "alias": alias_map(out, c["watch"]), "inputs": snapshot(c["watch"]),
           "globals": snapshot({**{k: ns[k] for k in global_names if k in ns}, "<print calls>": _printed(ns)}),
           "module": snapshot(mod) if mod is not None else None}
    roots = [t for _, t in flat_tensors(out) if t.requires_grad and t.is_floating_point()]
    if roots:
        try:
            with _DefaultDtype(torch.float64 if float64 else None):
                sum(t.sum() for t in roots).backward()
        except Exception as e:  # noqa: BLE001
            res["error"] = ("backward", e)
            return res
    grads = {k: t.grad for k, t in c["leaves"].items()}
    if mod is not None:
        grads.update({"MOD." + k: p.grad for k, p in mod.named_parameters()})
    res["grads"] = snapshot(grads)
    return res


def _printed(ns):
    """How many print calls went to the program's DEVNULL stream (so far, over all calls)."""
    return getattr(ns.get("DEVNULL"), "prints", 0)


def float64_source(src):
    """The program as its float64 reference runs it: its explicit casts down to float32
    (`t.float()`) widened too, so that the reference is the program's arithmetic in
    float64 throughout, not float32 rounding that eager and the reference share."""
    return src.replace(".float()", ".double()")


def float64_run(ns, fn, calls, upto, global_names, ties=None):
    """Calls 0..upto of the program in float64 (fn: the program's fn in the fresh namespace
    `ns`, or its compiled form): the result of call `upto`, or None where a call raises.
    ties: a RoundingTies that records the branches rounding decides."""
    with ties if ties is not None else contextlib.nullcontext():
        for mk in calls[:upto + 1]:
            r = run_call(ns, fn, mk, global_names, float64=True)
            if "error" in r:
                return None
    return r


# A one-element float compared with a value it equals to this (relative) precision in float64,
# or read as a number this close to 0, is 0 in exact arithmetic (the sum of a LayerNorm's
# output, the mean of a symmetric BatchNorm): a branch on it goes whichever way rounding takes
# it. Random programs do not come this close by chance: float64 carries 16 digits.
TIE = 1e-9
_COMPARISONS = {torch.Tensor.__gt__, torch.Tensor.__lt__, torch.Tensor.__ge__, torch.Tensor.__le__,
                torch.Tensor.gt, torch.Tensor.lt, torch.Tensor.ge, torch.Tensor.le, torch.gt, torch.lt, torch.ge, torch.le}
_TO_NUMBER = {torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.tolist}
# The maximum of 0.0 and -0.0 is not defined by eager either: its scalar loop returns the
# first, its vector loop the second (torch.maximum of 8 such pairs gives 0.0, of 16 -0.0).
# The sign shows where a later op reads it (atan2, a division): a tie eager may break either way.
_EXTREMES = {torch.maximum, torch.minimum, torch.Tensor.maximum, torch.Tensor.minimum,
             torch.max, torch.min, torch.Tensor.max, torch.Tensor.min}
# Elementwise, the same holds per element: `(t1 > z)` with t1 = sqrt(|z|)**2, a ReLU of a
# BatchNorm of equal rows. Each element a float64 comparison or ReLU finds within TIE is a tie
# (its ReLU gradient too); which of them the compiled code broke the other way is searched.
_RELUS = {torch.relu, torch.Tensor.relu, torch.nn.functional.relu}


class RoundingTies(torch.overrides.TorchFunctionMode):
    """Finds, and then flips, the branches that rounding decides, and the signed-zero ties of
    maximum and minimum. Recording (flip=None, the float64 run): `found` lists the
    comparisons and number reads of a one-element float within TIE and the extremes of 0.0
    and -0.0, each as (site, what, ways), a site being (line, how many such calls that line
    made before), ways the `up` values to try; `elements` lists the elementwise comparisons
    and ReLUs with tied elements, each as (site, what, their flat indices in the output).
    Flipping (flip=site, a float32 run): that one call answers the other way (a comparison
    negated; a number read negated, 0 read as -1e-30 or, with up=True, 1e-30: two ways; the
    tied zeros of an extreme given the other sign), or, given `elements`, those elements of
    an elementwise comparison or ReLU do (a ReLU passes its input, gradient and all, where it
    gave 0, and gives 0 where it passed)."""

    def __init__(self, flip=None, up=False, elements=()):
        super().__init__()
        self.found, self.elements, self.seen = [], [], {}
        self.flip, self.up, self.flip_elements = flip, up, list(elements)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _EXTREMES and len(args) == 2 and all(
                isinstance(t, torch.Tensor) and t.is_floating_point() for t in args):
            return self._extreme(func, args, kwargs or {})
        if func in _RELUS and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() \
                and args[0].numel() > 1 and not (kwargs or {}).get("inplace", args[1] if len(args) > 1 else False):
            return self._relu(func, args, kwargs or {})
        out = func(*args, **(kwargs or {}))
        a = args[0] if args else None
        if func in _COMPARISONS and len(args) == 2 and isinstance(out, torch.Tensor) and out.numel() > 1 \
                and all(isinstance(t, (int, float)) or (isinstance(t, torch.Tensor) and t.is_floating_point())
                        for t in args):
            return self._compare_elements(out, *args)
        if not (func in _COMPARISONS or func in _TO_NUMBER) or not (
                isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() == 1):
            return out
        site = self._site()
        if func in _COMPARISONS:
            b = args[1] if len(args) == 2 else None
            if not isinstance(b, (int, float, torch.Tensor)) or (isinstance(b, torch.Tensor) and b.numel() != 1):
                return out
            if site == self.flip:
                return out.logical_not()
            x, y = float(a), float(b)
            if abs(x - y) <= TIE * max(1.0, abs(x), abs(y)):
                self.found.append((site, f"a branch rounding decides: line {site[0]} compares {x:.3g} with {y:.3g} "
                                         "in float64", (False,)))
        elif site == self.flip:
            v = float(a)
            v = -v if v else (1e-30 if self.up else -1e-30)
            return (not out) if func is torch.Tensor.__bool__ else ([v] if isinstance(out, list) else v)
        elif abs(float(a)) <= TIE:
            self.found.append((site, f"a branch rounding decides: line {site[0]} reads {float(a):.3g} as a "
                                     "number in float64", (False, True) if float(a) == 0 else (False,)))
        return out

    def _extreme(self, func, args, kwargs):
        a, b = args
        ties = (a == 0) & (b == 0) & (torch.signbit(a) != torch.signbit(b))   # before out= writes b
        out = func(*args, **kwargs)
        site = self._site()
        if not bool(ties.any()):
            return out
        if site != self.flip:
            self.found.append((site, f"a tie eager breaks either way: line {site[0]} takes the "
                                     f"{func.__name__} of 0.0 and -0.0", (False,)))
            return out
        with torch.no_grad():
            flipped = torch.where(ties, -out.detach(), out.detach())
            if kwargs.get("out") is not None:
                return out.copy_(flipped)
        return flipped - (out.detach() - out)     # the other zero, with out's gradient

    def _relu(self, func, args, kwargs):
        x = args[0]
        out = func(*args, **kwargs)
        site = self._site()
        if site == self.flip:
            other = torch.where(x > 0, x * 0, x)
            return torch.where(self._mask(out), other, out)
        if self.flip is None:
            self._record(site, f"line {site[0]} takes the ReLU of", x.detach().abs() <= TIE, out)
        return out

    def _compare_elements(self, out, a, b):
        site = self._site()
        if site == self.flip:
            return out.logical_xor(self._mask(out))
        if self.flip is not None:
            return out
        x = a.detach() if isinstance(a, torch.Tensor) else torch.tensor(float(a), dtype=torch.float64)
        y = b.detach() if isinstance(b, torch.Tensor) else torch.tensor(float(b), dtype=torch.float64)
        bound = TIE * torch.maximum(torch.maximum(x.abs(), y.abs()), torch.ones((), dtype=x.dtype))
        self._record(site, f"line {site[0]} compares", (x - y).abs() <= bound, out)
        return out

    def _record(self, site, what, tied, out):
        idx = tied.expand(out.shape).flatten().nonzero().flatten().tolist()
        if idx:
            self.elements.append((site, f"{what} {len(idx)} elements that tie in float64", idx))

    def _mask(self, out):
        mask = torch.zeros(out.numel(), dtype=torch.bool, device=out.device)
        mask[self.flip_elements] = True
        return mask.view(out.shape)

    def _site(self):
        import sys
        f = sys._getframe(2)
        while f is not None and not f.f_code.co_filename.startswith("<"):
            f = f.f_back
        line = f.f_lineno if f is not None else 0
        n = self.seen[line] = self.seen.get(line, -1) + 1
        return line, n


def branch_noise(ns_fresh, calls, upto, global_names, eager, compiled, ties, budget=20.0):
    """Does eager's float32 run give the compiled result once one branch that rounding decides,
    or one signed-zero tie (found by `ties` in the float64 run), goes the other way, or some
    tied elements of one elementwise comparison or ReLU do? Its description, or None.
    ns_fresh(): a fresh namespace of the program, for each rerun. Which tied elements: all of
    them (flips that only together cancel: a ReLU's two zeros in one BatchNorm channel), or
    each in turn kept flipped where that brings eager's values closer to the compiled ones
    (`budget` seconds at most), the latest call's sites first; the set is then checked like
    a single flip."""
    def rerun(site, up=False, elements=()):
        ns = ns_fresh()
        with RoundingTies(flip=site, up=up, elements=elements):
            for mk in calls[:upto + 1]:
                r = run_call(ns, ns["fn"], mk, global_names)
                if "error" in r:
                    return None
        return r

    def gives_compiled(r):
        return r is not None and compare(r, compiled) is None and compare(r, eager) is not None

    for site, what, ways in ties.found[:4]:
        for up in ways:
            if gives_compiled(rerun(site, up)):
                return what
    deadline = time.time() + budget
    for site, what, tied in ties.elements[::-1][:4]:   # the failing call's last
        if gives_compiled(rerun(site, elements=tied)):
            return f"{what}: all {len(tied)}"
        kept, far = [], distance(eager, compiled)
        for i in tied:
            if time.time() > deadline or far == 0:
                break
            r = rerun(site, elements=kept + [i])
            d = distance(r, compiled) if r is not None else math.inf
            if d < far:
                kept, far = kept + [i], d
        if kept and gives_compiled(rerun(site, elements=kept)):
            return f"{what}: {len(kept)} of them"
    return None


def distance(a, b):
    """How far run result `a` lies from `b`: the sum of their values' relative differences
    (infinite where their structure differs)."""
    return sum(_snapshot_distance(a[sec], b[sec]) if a.get(sec) is not None and b.get(sec) is not None
               else (0.0 if a.get(sec) is None and b.get(sec) is None else math.inf)
               for sec in SECTIONS if sec != "alias")


def _snapshot_distance(a, b):
    if a[0] != b[0]:
        return math.inf
    if a[0] == "tensor":
        ta, tb = a[1], b[1]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            return math.inf
        if not ta.is_floating_point():
            return float((ta != tb).sum())
        x, y = ta.double(), tb.double()
        d = ((x - y).abs() / (y.abs() + 1e-3)).nan_to_num(nan=1.0, posinf=1e6)
        return float(d.masked_fill(x.isnan() & y.isnan(), 0).sum())
    if a[0] in ("list", "tuple", "dict"):
        if len(a[1]) != len(b[1]):
            return math.inf
        pairs = zip(a[1], b[1]) if a[0] != "dict" else ((x, y) for (_, x), (_, y) in zip(a[1], b[1]))
        return sum(_snapshot_distance(x, y) for x, y in pairs)
    if a[0] == "module":
        return _snapshot_distance(a[1], b[1]) + _snapshot_distance(a[2], b[2])
    x, y = a[1], b[1]
    if isinstance(x, float) and isinstance(y, float):
        return 0.0 if x == y or (math.isnan(x) and math.isnan(y)) else min(abs(x - y) / (abs(y) + 1e-3), 1e6)
    return 0.0 if x == y else 1.0


# A float mismatch is rounding noise, not a wrong result, when the compiled value is no
# further from the float64 reference than eager's own float32 value is (times this, plus
# a tenth of the tolerance): the rule PyTorch's benchmark harness applies to the same problem.
NOISE_MULTIPLIER = 3.0


def _rms(x, y):
    return (x.double() - y.double()).pow(2).mean().sqrt().item() if x.numel() else 0.0


def _within_noise(ta, tb, tr, tol):
    """tb (compiled) is as close to tr (float64 reference) as ta (eager) is, within noise."""
    if tr is None or tr.shape != ta.shape or not (ta.is_floating_point() and tr.is_floating_point()):
        return False
    if not all(torch.isfinite(t).all() for t in (ta, tb, tr)):
        return False
    return _rms(tb, tr) <= NOISE_MULTIPLIER * _rms(ta, tr) + tol / 10


def _ref_part(r, kind, i):
    """The reference snapshot's part parallel to a snapshot of `kind`, or None."""
    return r[i] if r is not None and r[0] == kind else None


def _diff(a, b, path, r=None):
    """First difference between snapshots a (eager) and b (compiled), as a message, or None.
    r: the float64 reference's snapshot, parallel to a, which excuses rounding noise."""
    if a[0] != b[0]:
        return f"{path}: eager gives {_what(a)}, compiled gives {_what(b)}"
    kind = a[0]
    if kind == "tensor":
        ta, tb = a[1], b[1]
        if a[2] != b[2]:
            return f"{path}: requires_grad eager={a[2]} compiled={b[2]}"
        if ta.dtype != tb.dtype or ta.shape != tb.shape:
            return f"{path}: eager {ta.dtype}{list(ta.shape)}, compiled {tb.dtype}{list(tb.shape)}"
        tol = FLOAT_TOL.get(ta.dtype, 0)
        try:
            torch.testing.assert_close(tb, ta, rtol=tol, atol=tol, equal_nan=True)
        except AssertionError as e:
            if _within_noise(ta, tb, _ref_part(r, "tensor", 1), tol):
                return None
            detail = " ".join(str(e).split("\n")[1:3]).strip()
            return f"{path}: values differ ({detail})\n  eager:    {_short(ta)}\n  compiled: {_short(tb)}"
        return None
    if kind in ("list", "tuple"):
        if len(a[1]) != len(b[1]):
            return f"{path}: eager has {len(a[1])} items, compiled {len(b[1])}"
        rs = _ref_part(r, kind, 1)
        rs = rs if rs is not None and len(rs) == len(a[1]) else [None] * len(a[1])
        for i, (x, y, z) in enumerate(zip(a[1], b[1], rs)):
            d = _diff(x, y, f"{path}[{i}]", z)
            if d:
                return d
        return None
    if kind == "dict":
        ka, kb = [k for k, _ in a[1]], [k for k, _ in b[1]]
        if ka != kb:
            return f"{path}: eager keys {ka}, compiled keys {kb}"
        rs = dict(_ref_part(r, kind, 1) or ())
        for (k, x), (_, y) in zip(a[1], b[1]):
            d = _diff(x, y, f"{path}[{k!r}]", rs.get(k))
            if d:
                return d
        return None
    if kind == "module":
        return (_diff(a[1], b[1], path + ".attrs", _ref_part(r, kind, 1))
                or _diff(a[2], b[2], path + ".state", _ref_part(r, kind, 2)))
    x, y = a[1], b[1]
    if type(x) is not type(y):
        return f"{path}: eager {x!r} ({type(x).__name__}), compiled {y!r} ({type(y).__name__})"
    if isinstance(x, float):
        if (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-4):
            return None
        z = _ref_part(r, "value", 1)
        if isinstance(z, float) and all(map(math.isfinite, (x, y, z))) and \
                abs(y - z) <= NOISE_MULTIPLIER * abs(x - z) + 1e-5:
            return None
    elif x == y:
        return None
    return f"{path}: eager {x!r}, compiled {y!r}"


def _what(snap):
    if snap[0] == "value":
        return repr(snap[1]) if snap[1] is None or isinstance(snap[1], (bool, int, float)) else type(snap[1]).__name__
    return {"tensor": "a tensor", "list": "a list", "tuple": "a tuple", "dict": "a dict"}.get(snap[0], snap[0])


def _short(t):
    return " ".join(str(t.flatten()[:8].tolist()).split()) + (" ..." if t.numel() > 8 else "")


SECTIONS = ("out", "alias", "inputs", "globals", "module", "grads")


def compare(eager, compiled, reference=None):
    """(section, message) of the first difference between two run_call results, or None.
    reference: the float64 run of the same call (float64_run), which excuses float
    differences that are rounding noise."""
    for sec in SECTIONS:
        if sec == "grads" and ("grads" not in eager or "grads" not in compiled):
            continue
        if sec == "alias":
            if eager["alias"] != compiled["alias"]:
                diffs = [f"{p}: eager aliases {eager['alias'][p]}, compiled {compiled['alias'].get(p)}"
                         for p in eager["alias"] if eager["alias"][p] != compiled["alias"].get(p)]
                return sec, "; ".join(diffs) or "output structure differs"
            continue
        if eager[sec] is None and compiled[sec] is None:
            continue
        d = _diff(eager[sec], compiled[sec], sec, reference.get(sec) if reference else None)
        if d:
            return sec, d
    return None


def error_line(e):
    """The first line of an exception, prefixed with its type."""
    lines = [x.strip() for x in str(e).split("\n") if x.strip()]
    msg = lines[0] if lines else ""
    if msg.endswith(":") and len(lines) > 1:   # "backend='aot_eager' raised:" and the error on the next line
        msg += " " + lines[1]
    return f"{type(e).__name__}: {msg}"[:300]
# ---- end of harness ----
