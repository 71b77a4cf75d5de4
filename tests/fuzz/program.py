"""A fuzz program as data: its module-level parts, the body of `fn`, its return, and the
calls made to it (each call: how its inputs, globals and module are built), and how all of
that is rendered to Python source."""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Optional

DTYPES = {"float32": "torch.float32", "float64": "torch.float64", "int64": "torch.int64"}


@dataclass
class TSpec:
    """A tensor input: dims are names of the program's sizes ('N', 'M', 'K') or ints."""
    dims: tuple
    dtype: str = "float32"
    layout: str = "contig"        # contig, transposed, sliced, sliced_last, expanded, channels_last
    rg: Optional[str] = None      # None, 'leaf' (a leaf requiring grad), 'nonleaf' (a clone of one)

    def shape(self, sizes):
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)


@dataclass
class Arg:
    name: str
    kind: str                     # tensor, int, float, bool, list, dict, module
    tensor: Optional[TSpec] = None
    value: object = None
    items: list = field(default_factory=list)   # list: [TSpec]; dict: [(key, TSpec)]


@dataclass
class GSpec:
    name: str
    kind: str                     # tensor, int, float, cfg, hist
    tensor: Optional[TSpec] = None
    value: object = None


@dataclass
class CallSpec:
    variant: str
    sizes: dict
    seed: int
    args: list                    # [Arg], with this call's values
    globals: Optional[list] = None  # [GSpec] to set before the call; None: keep what is there
    module: Optional[str] = None  # None, 'new', 'eval', 'train', 'tweak'
    grad: bool = True
    alias: Optional[tuple] = None  # (a, b): argument b is the same tensor as argument a
    global_inplace: Optional[str] = None  # a global tensor changed in place before the call


@dataclass
class ModuleSpec:
    init: list                    # lines of __init__ after super().__init__()
    forward: list                 # statements of forward(self, t) before `return h`


# `--backward-inside`: each program's fn is wrapped by one that runs the backward itself
# (`loss.backward()` in the compiled call, engine.config.backward_in_graph) and returns its
# outputs detached; the harness then finds no output to backward through and reads the grads.
BACKWARD_INSIDE = False
_BACKWARD_INSIDE_SRC = """

def _tensors_of(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors_of(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors_of(x)]
    return []


def _detached(v):
    if isinstance(v, torch.Tensor):
        return v.detach()
    if isinstance(v, (list, tuple)):
        return type(v)(_detached(x) for x in v)
    if isinstance(v, dict):
        return {k: _detached(x) for k, x in v.items()}
    return v


_forward = fn


def fn(*args):  # --backward-inside: the backward runs inside the (compiled) call
    out = _forward(*args)
    roots = [t for t in _tensors_of(out) if t.requires_grad and t.is_floating_point()]
    if roots:
        sum(t.sum() for t in roots).backward()
    return _detached(out)
"""


@dataclass
class Program:
    seed: int
    sizes: dict
    args: list
    globals: list
    helpers: list                 # sources of module-level helper functions
    module: Optional[ModuleSpec]
    body: list                    # statements of fn (each may span lines; unindented)
    ret: list                     # expressions returned
    ret_form: str                 # single, tuple, list, dict
    global_decls: list
    calls: list = field(default_factory=list)

    def copy(self):
        return copy.deepcopy(self)

    # -- rendering --
    def ret_source(self):
        if self.ret_form == "single" and len(self.ret) == 1:
            return self.ret[0]
        if self.ret_form == "list":
            return "[" + ", ".join(self.ret) + "]"
        if self.ret_form == "dict":
            return "{" + ", ".join(f"{_key(i)!r}: {r}" for i, r in enumerate(self.ret)) + "}"
        return ", ".join(self.ret) + ("," if len(self.ret) == 1 else "")

    def source(self, ret=None):
        lines = ["import functools", "import logging", "import torch", "import torch.nn.functional as F", "", "",
                 "class Sink:  # print(..., file=DEVNULL) goes nowhere; the harness compares how many prints ran",
                 "    prints = 0", "", "    def write(self, s):", "        self.prints += s == \"\\n\"", "",
                 "    def flush(self):", "        pass", "", "",
                 "DEVNULL = Sink()",
                 "LOG = logging.getLogger(\"fuzz\")  # no handler: debug/info are no-ops"]
        if self.globals:
            lines.append("# module-level state, set by each call's setup: " + ", ".join(g.name for g in self.globals))
        for h in self.helpers:
            lines += ["", ""] + h.rstrip().split("\n")
        if self.module is not None:
            lines += ["", "", "class Net(torch.nn.Module):", "    def __init__(self, m):", "        super().__init__()"]
            lines += ["        " + x for x in self.module.init]
            lines += ["", "    def forward(self, t):"]
            for st in self.module.forward:
                lines += ["        " + x for x in st.split("\n")]
            lines.append("        return h")
        params = ", ".join(a.name for a in self.args)
        lines += ["", "", f"def fn({params}):"]
        body = "\n".join(self.body)
        decls = sorted(n for n in self.global_decls if re.search(rf"\b{n}\b", body))
        if decls:
            lines.append("    global " + ", ".join(decls))
        for st in self.body:
            lines += ["    " + x for x in st.split("\n")]
        lines.append("    return " + (ret if ret is not None else self.ret_source()))
        return "\n".join(lines) + "\n" + (_BACKWARD_INSIDE_SRC if BACKWARD_INSIDE else "")

    def calls_source(self):
        out = [f"GLOBALS = {[g.name for g in self.globals]!r}"]
        for i, c in enumerate(self.calls):
            out += ["", "", render_call(c, i, self)]
        out += ["", "", "CALLS = [" + ", ".join(f"call_{i}" for i in range(len(self.calls))) + "]"]
        return "\n".join(out) + "\n"

    def prune_helpers(self):
        """Drop module-level helpers the rest of the source does not name."""
        keep = []
        for h in self.helpers:
            name = re.match(r"def (\w+)", h).group(1)
            rest = self.source().replace(h.rstrip(), "")
            if re.search(r"\b" + name + r"\b", rest):
                keep.append(h)
        self.helpers = keep


def _key(i):
    return "abcdefgh"[i] if i < 8 else f"k{i}"


def replace(obj, **kw):
    return dataclasses.replace(copy.deepcopy(obj), **kw)


# -- inputs as source --

def _make(spec: TSpec, shape):
    dt = spec.dtype
    if dt == "int64":
        return f"torch.randint(-4, 5, {shape!r}, generator=g)"
    extra = "" if dt == "float32" else f", dtype={DTYPES[dt]}"
    return f"torch.randn({shape!r}, generator=g{extra})"


def tensor_lines(name, spec: TSpec, sizes):
    """Source lines building tensor input `name`, the names to watch after the call and the
    leaves whose .grad is compared."""
    shape = spec.shape(sizes)
    lay = spec.layout
    nd = len(shape)
    if nd == 0 or (lay == "transposed" and nd < 2) or (lay == "channels_last" and nd != 4):
        lay = "contig"
    if lay == "transposed":
        base_shape, view = shape[::-1], (".t()" if nd == 2 else f".permute({', '.join(str(i) for i in range(nd - 1, -1, -1))})")
    elif lay == "sliced":
        base_shape, view = (shape[0] * 2,) + shape[1:], "[::2]"
    elif lay == "sliced_last":
        base_shape, view = shape[:-1] + (shape[-1] + 2,), "[..., 1:-1]"
    elif lay == "expanded":
        base_shape, view = (1,) + shape[1:], f".expand({', '.join(str(s) for s in shape)})"
    else:
        base_shape, view = shape, ""
    make = _make(spec, base_shape)
    if lay == "channels_last":
        make += ".contiguous(memory_format=torch.channels_last)"
    base = f"{name}_base" if view else name
    lines, watch, leaves = [], [], []
    if spec.rg == "leaf":
        lines.append(f"{base} = {make}.requires_grad_()")
        leaves.append(base)
    elif spec.rg == "nonleaf":
        lines.append(f"{name}_leaf = {make}.requires_grad_()")
        lines.append(f"{base} = {name}_leaf.clone()")
        leaves.append(f"{name}_leaf")
        watch.append(f"{name}_leaf")
    else:
        lines.append(f"{base} = {make}")
    if view:
        lines.append(f"{name} = {base}{view}")
        watch.append(base)
    watch.append(name)
    return lines, watch, leaves


def global_lines(gs, sizes):
    out = []
    for gl in gs:
        if gl.kind == "tensor":
            out.append(f"ns[{gl.name!r}] = {_make(gl.tensor, gl.tensor.shape(sizes))}")
        elif gl.kind == "cfg":
            out.append(f"ns[{gl.name!r}] = {gl.value!r}")
        elif gl.kind == "hist":
            out.append(f"ns[{gl.name!r}] = []")
        else:
            out.append(f"ns[{gl.name!r}] = {gl.value!r}")
    return out


def render_call(c: CallSpec, index, prog: Program):
    L = [f"def call_{index}(ns):", f"    # {c.variant}; sizes {c.sizes}", f"    g = torch.Generator().manual_seed({c.seed})"]
    if c.globals is not None:
        L += ["    " + x for x in global_lines(c.globals, c.sizes)]
    if c.global_inplace:
        L += ["    with torch.no_grad():", f"        ns[{c.global_inplace!r}].mul_(-2).add_(1)"]
    if c.module == "new":
        L += ["    torch.manual_seed(0)", f"    ns['MOD'] = ns['Net']({c.sizes['M']})"]
    elif c.module in ("eval", "train"):
        L.append(f"    ns['MOD'].{c.module}()")
    elif c.module == "tweak":
        L += ["    with torch.no_grad():", "        for p in ns['MOD'].parameters():", "            p.mul_(-0.5)"]
    watch, leaves, vals = [], [], []
    for a in c.args:
        if a.kind == "tensor":
            if c.alias and a.name == c.alias[1]:
                L.append(f"    {a.name} = {c.alias[0]}   # the same tensor twice")
            else:
                lines, w, lv = tensor_lines(a.name, a.tensor, c.sizes)
                L += ["    " + x for x in lines]
                watch += w
                leaves += lv
            vals.append(a.name)
        elif a.kind == "list":
            items = ", ".join(_make(s, s.shape(c.sizes)) for s in a.items)
            L.append(f"    {a.name} = [{items}]")
            watch.append(a.name)
            vals.append(a.name)
        elif a.kind == "dict":
            items = ", ".join(f"{k!r}: {_make(s, s.shape(c.sizes))}" for k, s in a.items)
            L.append(f"    {a.name} = {{{items}}}")
            watch.append(a.name)
            vals.append(a.name)
        elif a.kind == "module":
            vals.append("ns['MOD']")
        else:
            vals.append(repr(a.value))
    w = ", ".join(f"{n}={n}" for n in watch)
    lv = ", ".join(f"{n}={n}" for n in leaves)
    L.append(f"    return dict(args=[{', '.join(vals)}], watch=dict({w}), leaves=dict({lv}), grad={c.grad})")
    return "\n".join(L)
