"""GraphLowering: walks an aten FX graph and builds the loop-level IR, one lowering per
node (lowerings.py); ops without a lowering become extern kernels that call aten."""

from __future__ import annotations

import operator
from typing import Any, Optional

import sympy
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from ..backward_ops import TANGENT_MARK
from ..exact_values import compared_with_its_extreme
from . import values as V
from .index import contiguous_strides, index_var, numel
from .ir import (UNDECLARED_VIEWS, ComputedBuffer, ExternKernel, ExternOutput, InputBuffer, Layout,
                 Pointwise, TensorValue, strided_value)


class Unsupported(Exception):
    """The graph cannot be compiled by codegen; the caller runs it as it is (eager aten)."""


def to_sympy(x):
    if isinstance(x, torch.SymInt):
        return x.node.expr
    if isinstance(x, (int, sympy.Expr)):
        return sympy.sympify(x)
    raise Unsupported(f"size {x!r} of type {type(x).__name__}")


def _gapped(layout, fake) -> bool:
    """The view is eager's layout with gaps: the same dim order, every stride at least eager's
    (a padded matmul's rows)."""
    dims = [d for d in range(fake.dim()) if fake.shape[d] > 1]
    if len(layout.sizes) != fake.dim() or not all(isinstance(layout.strides[d], sympy.Integer) for d in dims):
        return False
    order = sorted(dims, key=lambda d: (fake.stride()[d], d))
    mine = sorted(dims, key=lambda d: (int(layout.strides[d]), d))
    return order == mine and all(int(layout.strides[d]) >= fake.stride()[d] for d in dims)


def _same_strides(layout, fake) -> bool:
    """The view's strides are eager's (dims of size 1 aside); unknown (symbolic) counts as same."""
    if len(layout.sizes) != fake.dim():
        return True
    for size, stride, want in zip(layout.sizes, layout.strides, fake.stride()):
        if not (isinstance(size, sympy.Integer) and isinstance(stride, sympy.Integer) and isinstance(want, int)):
            return True
        if int(size) > 1 and int(stride) != want:
            return False
    return True


def _aliases_an_input(node) -> bool:
    """Whether eager's value of `node` is a graph input's memory: the input itself, or ops
    whose schema says they return an alias of their first argument (`Tensor(a)`: views,
    in-place ops) all the way down to it. (`view(cat([x]))` is new memory: cat's.)"""
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            return True
        if node.target is operator.getitem and getattr(node.args[0], "target", None) in UNDECLARED_VIEWS:
            node = node.args[0].args[0]
            continue
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.returns or \
                schema.returns[0].alias_info is None or not node.args:
            return False
        node = node.args[0]
    return True  # not a node: a constant or an unknown, left as it is


def _is_view(node) -> bool:
    """An aten view op (reshape, transpose, slice, ...): its result reads its input's memory."""
    return isinstance(node, torch.fx.Node) and getattr(node.target, "is_view", False)


def _storage_of(fake):
    """The identity of a fake value's storage (two views of one tensor share it), or None."""
    if not isinstance(fake, torch.Tensor):
        return None
    try:
        return StorageWeakRef(fake.untyped_storage())
    except Exception:   # no storage (a sparse or nested fake)
        return None


def fake_of(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val


def is_dense(sizes, strides) -> bool:
    """Non-overlapping and dense: strides are a permutation of contiguous strides."""
    try:
        dims = sorted([d for d in range(len(sizes)) if sizes[d] != 1], key=lambda d: (int(strides[d]), d))
        expected = 1
        for d in dims:
            if int(strides[d]) != expected:
                return False
            expected *= int(sizes[d])
        return True
    except TypeError:
        return all(st == cs for sz, st, cs in zip(sizes, strides, contiguous_strides(sizes)) if sz != 1)


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs):
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.nodes: list = []                 # ComputedBuffer | ExternKernel, program order
        self.backward_starts: Optional[int] = None   # in self.nodes: loss.backward() in the graph
        self.inputs: list[InputBuffer] = []
        self.input_nodes: dict = {}           # input buffer name -> its placeholder
        self.alias_buffers: set = set()       # outputs of extern view ops (they share their argument's memory)
        self.extern_results: set = set()      # every buffer an extern kernel returns
        self.constants: dict[str, torch.Tensor] = {}
        self.env: dict[torch.fx.Node, Any] = {}
        self.outputs: list = []               # TensorValue | python value, per graph output
        self.sym_bindings: dict = {}          # sympy.Symbol -> (kind, arg index, dim)
        self.fallback_ops: list[str] = []     # unlowered ops run as extern kernels
        self.extern_ops: list[str] = []       # every extern kernel's op
        self.buffer_layouts: dict[str, Layout] = {}
        self.mutated_inputs: set[str] = set()
        self.current_node: torch.fx.Node | None = None
        self._counter = 0
        self.chains: dict = {}   # fx node -> the fx node names a buffer realized there computes
        self.kernel_origins: dict = {}   # step name -> provenance.KernelOrigin, set after scheduling
        self.write_back: dict = {}       # computed buffer -> the input whose new value it is
        self._aligned: dict = {}         # matmul operand (buffer, layout) -> its row-padded copy
        self._new_values: set = set()    # fx nodes whose values a mutated input takes (set by run)

    # -- names -----------------------------------------------------------------------
    def new_name(self, prefix="buf") -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    # -- the walk --------------------------------------------------------------------
    def run(self) -> "GraphLowering":
        from .lowerings import LOWERINGS
        V.reset()
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        leaves = pytree.tree_leaves(out.args[0])
        # new values of mutated inputs: stored anyway (maybe in the input's memory), so their
        # other users read them instead of recomputing them from the input's old value
        self._new_values = {leaves[k] for k in self.gm.meta.get("mutated_inputs", {}) if k < len(leaves)}
        placeholder_i = 0
        for node in self.gm.graph.nodes:
            self.current_node = node
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, placeholder_i)
                placeholder_i += 1
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op == "call_function":
                if node.meta.get("custom") == TANGENT_MARK:   # the graph's own backward starts here
                    self.backward_starts = len(self.nodes)
                self._note_chain(node)
                self.env[node] = self._call(node, LOWERINGS)
            elif node.op == "output":
                outs = pytree.tree_leaves(node.args[0])
                self._realize_shared_bases(outs, LOWERINGS)
                claimed: dict = {}
                self.outputs = []
                user = self.gm.meta.get("user_outputs", len(outs))    # the rest: saved for backward
                for k, o in enumerate(outs):
                    if isinstance(o, torch.fx.Node):   # an output realized here computes o's chain
                        self.chains[node] = self.chains.get(o, [o.name])
                    value = self.env[o] if isinstance(o, torch.fx.Node) else o
                    if k < user and isinstance(value, TensorValue):
                        value = self._dense_as_eager(value, o)
                    self.outputs.append(self._output(value, o, claimed, user=k < user))
                self._find_write_backs()
            else:
                raise Unsupported(f"fx node kind {node.op}")
        return self

    def _note_chain(self, node) -> None:
        """The fx nodes a buffer realized at `node` computes: node itself, after those of its
        inputs that are still unrealized values (inlined into it). Kernels are named after them
        and report them as their provenance (capped: a chain is rarely longer than a norm's)."""
        chain: list = []
        for a in node.all_input_nodes:
            v = self.env.get(a)
            # a view of a buffer is read through its indexing here: it is part of this kernel too
            if isinstance(v, TensorValue) and (not v.realized or _is_view(a)):
                chain += [n for n in self.chains.get(a, ()) if n not in chain]
        self.chains[node] = (chain + [node.name])[-64:]

    def _origins(self, value=None) -> list:
        """The chain of the fx node being lowered; or, when `value` is one of its inputs
        (realized to be passed to an extern call), that input's chain."""
        node = self.current_node
        if node is None:
            return []
        for a in node.all_input_nodes if value is not None else ():
            if self.env.get(a) is value:
                return list(self.chains.get(a, [a.name]))
        return list(self.chains.get(node, [node.name]))

    @staticmethod
    def _views_into(node) -> list:
        """The view nodes (reshape, transpose, ...) between an extern call and its buffers:
        the call reads through them, so they are part of it."""
        names: list = []
        work = list(node.all_input_nodes)
        while work:
            a = work.pop()
            if _is_view(a) and a.name not in names:
                names.insert(0, a.name)
                work.extend(a.all_input_nodes)
        return names

    def _placeholder(self, node, i):
        ex = self.example_inputs[i] if i < len(self.example_inputs) else fake_of(node)
        if isinstance(ex, torch.Tensor):
            sizes = tuple(to_sympy(s) for s in ex.shape)
            strides = tuple(to_sympy(s) for s in ex.stride())
            for d, s in enumerate(sizes):
                if isinstance(s, sympy.Symbol) and s not in self.sym_bindings:
                    self.sym_bindings[s] = ("size", i, d)
            for d, s in enumerate(strides):
                if isinstance(s, sympy.Symbol) and s not in self.sym_bindings:
                    self.sym_bindings[s] = ("stride", i, d)
            if any(not isinstance(s, sympy.Integer) and s.free_symbols - set(self.sym_bindings) for s in sizes + strides):
                raise Unsupported("input size expression not bound to a plain symbol")
            name = f"arg{i}"
            self.input_nodes[name] = node
            layout = Layout(sizes, strides, ex.dtype, ex.device, 0)
            self.inputs.append(InputBuffer(name, layout, i))
            self.buffer_layouts[name] = layout
            return strided_value(name, layout)
        if not node.users:
            # An unused scalar input: a size the captured graph takes (automatic dynamic
            # shapes) that this graph, traced for concrete sizes, has baked in.
            return None
        if isinstance(ex, torch.SymInt):
            expr = ex.node.expr
            if isinstance(expr, sympy.Symbol):
                self.sym_bindings.setdefault(expr, ("scalar", i, None))
                return expr
            return expr
        if isinstance(ex, (int, float, bool)) or ex is None:
            self.inputs.append(None)  # keeps positions; python scalars are passed to externs
            raise Unsupported("python scalar graph input")
        raise Unsupported(f"graph input of type {type(ex).__name__}")

    def _constant(self, node):
        value = getattr(self.gm, node.target)
        if not isinstance(value, torch.Tensor):
            return value
        name = f"const_{len(self.constants)}"
        self.constants[name] = value
        layout = Layout(tuple(sympy.Integer(s) for s in value.shape), tuple(sympy.Integer(s) for s in value.stride()),
                        value.dtype, value.device, 0)
        self.inputs.append(InputBuffer(name, layout, -1, const_name=name))
        self.buffer_layouts[name] = layout
        return strided_value(name, layout)

    def _call(self, node, table):
        target = node.target
        args, kwargs = pytree.tree_map(lambda a: self.env[a] if isinstance(a, torch.fx.Node) else a,
                                       (node.args, node.kwargs))
        if target is operator.getitem:
            return self._shared(node, args[0][args[1]])
        if not isinstance(target, torch._ops.OpOverload):
            if target in _SYM_OPS and all(isinstance(a, (int, sympy.Expr)) for a in args):
                return _SYM_OPS[target](*[sympy.sympify(a) for a in args])
            raise Unsupported(f"call of {getattr(target, '__name__', target)}")
        fake = fake_of(node)
        if target is torch.ops.aten.sym_size.int:
            return to_sympy(fake) if fake is not None else args[0].sizes[args[1]]
        lowering = table.get(target) or table.get(target.overloadpacket)
        if target._schema.is_mutable or lowering is None or not _lowerable(fake):
            return self.extern(target, args, kwargs, fake, fallback=lowering is None and target not in _BY_DESIGN
                               and target.overloadpacket not in _BY_DESIGN)
        result = lowering(self, *args, **kwargs)
        if result is NotImplemented:
            return self.extern(target, args, kwargs, fake, fallback=True)
        return self._shared(node, result)

    def _shared(self, node, result):
        """A lowering's value (or one output of it: a getitem), realized into a buffer where
        several users would each recompute it, or an extern kernel needs it in memory."""
        if isinstance(result, TensorValue) and not result.realized and len(node.users) > 1 \
                and (node in self._new_values or not self._cheap_to_recompute(result) or self._feeds_extern(node)
                     or compared_with_its_extreme(node)):
            result = self.realize(result, self._row_major_if_better(node, result))
        elif isinstance(result, TensorValue) and any(u.op == "output" for u in node.users) \
                and self.as_strided(result) is None and self._reads_an_extern_result(result):
            # an output computed right after the matmul it reads, not when the outputs are
            # gathered at the end, which kept every matmul result alive until then: a
            # backward's fp32 weight gradients were all cast at the end (1.1 GiB more at the
            # peak of a 1B Llama's step); a KV cache's values, copied out of each layer's
            # projection and read by its attention too (32 MiB more at a 1B Llama's peak)
            result = self.realize(result)
        return result

    def _row_major_if_better(self, node, tv: TensorValue):
        """The layout an intermediate that eager lays out permuted is stored in: eager's, or
        row-major where that makes more of its same-size loads coalesced. Whisper's residual
        stream starts as a permuted convolution output, and eager keeps that order through all
        twelve layers: every residual add then read its matmul's row-major output across the
        rows (121 us a kernel on an H200; stored row-major, the add fuses into the next layer
        norm, 15-23 us). torch.compile's inductor also lays intermediates out row-major. Graph
        outputs keep eager's strides. Returns a fake tensor for `realize`: eager's, or one with
        row-major strides."""
        fake = fake_of(node)
        if not isinstance(fake, torch.Tensor) or fake.dim() < 2 or fake.is_contiguous() \
                or any(u.op == "output" for u in node.users) \
                or not all(isinstance(x, int) for x in (*fake.shape, *fake.stride())) \
                or not is_dense(fake.shape, fake.stride()):
            return fake
        inner = [d for d in range(fake.dim()) if fake.shape[d] > 1]
        if not inner:
            return fake
        eager_inner = min(inner, key=lambda d: fake.stride()[d])
        if eager_inner == inner[-1]:
            return fake
        syms = [index_var(f"v{i}", s) for i, s in enumerate(tv.sizes)]
        loads = [ld for ld in V.loads(tv.loader(syms)) if ld.kind == "load"]
        size = numel(tv.sizes)
        layouts = self.buffer_layouts
        # loads of buffers at least tv's size: a bias read along the rows says nothing, a
        # pool's larger input does (ResNet's stem pool, while only equal sizes counted, was
        # stored row-major from a channels-last input: 0.33 ms on an H200, torch.compile's 0.02)
        whole = [sympy.expand(ld.extra) for ld in loads if ld.name in layouts
                 and sympy.expand(numel(layouts[ld.name].sizes) - size).is_nonnegative]

        def coalesced(d):     # loads whose next element along dim d is the next in memory
            return sum(1 for e in whole if sympy.expand(e.subs(syms[d], syms[d] + 1) - e) == 1)
        if coalesced(eager_inner) > coalesced(inner[-1]):
            return fake
        return torch.empty_strided(fake.shape, [int(s) for s in contiguous_strides(fake.shape)], dtype=fake.dtype,
                                   device="meta")

    def _reads_an_extern_result(self, tv: TensorValue) -> bool:
        syms = [index_var(f"v{i}", sz) for i, sz in enumerate(tv.sizes)]
        return any(ld.name in self.extern_results for ld in V.loads(tv.loader(syms)))

    def _feeds_extern(self, node) -> bool:
        """An extern kernel (matmul, ...) among the users, directly or through views: it
        needs the value in memory anyway, so the other users read that buffer instead of
        recomputing it (a cat feeding a weight-gradient mm and its transpose was computed
        three times, once per user, with masked strided loads)."""
        seen, todo = set(), list(node.users)
        while todo:
            u = todo.pop()
            if u in seen or u.op != "call_function":
                continue
            seen.add(u)
            t = u.target
            if isinstance(t, torch._ops.OpOverload):
                if t.overloadpacket in _VIEW_OPS:
                    todo.extend(u.users)
                elif t in _BY_DESIGN or t.overloadpacket in _BY_DESIGN or _runs_as_extern(t):
                    return True
        return False

    def _cheap_to_recompute(self, tv: TensorValue, per_element: int = 1) -> bool:
        """A small pointwise expression used several times is recomputed by each user (and
        fused into each) instead of being written to memory and read back. `per_element`:
        how many times each of one user's elements reads it (a 3x3 pool: nine taps), where
        only a load and a few cheap ops are worth recomputing (not a batch norm's square
        root and division, nine times an element; torch.compile stores that too)."""
        if self.as_strided(tv) is not None:
            return True
        syms = [index_var(f"v{i}", s) for i, s in enumerate(tv.sizes)]
        nodes = V.walk(tv.loader(syms))
        ops = [n for n in nodes if n.kind in ("op", "masked", "iload")]
        if per_element > 1:
            return len(ops) <= 4 and not any(n.name in _TRANSCENDENTAL or n.name in _DIVISIONS for n in ops)
        costly = [n for n in ops if n.name in _TRANSCENDENTAL]
        loads = [n for n in nodes if n.kind in ("load", "iload")]
        if len(costly) <= 1 and len(loads) <= 6 and len(ops) <= 40 and self._reads_only_small(tv, loads):
            # a function of its indices and of tensors a fraction of its size (the one-hot
            # gradient of a cross entropy, built from the labels): recomputing it is arithmetic,
            # storing it a write and a read of every element (GPT-2's 4096x50257 fp32, 0.4 ms
            # and 823 MB at the peak of a training step on an H200)
            return True
        return len(ops) <= 12 and len(costly) <= 1 and len(loads) <= 4 and self._whole_tensors_read(tv, loads) <= 2

    def _reads_only_small(self, tv: TensorValue, loads: list) -> bool:
        """Every buffer tv's loads read is known to be at most a sixteenth of tv's size."""
        size, layouts = numel(tv.sizes), self.buffer_layouts
        for ld in loads:
            layout = layouts.get(ld.name)
            if layout is None or sympy.expand(size - 16 * numel(layout.sizes)).is_nonnegative is not True:
                return False
        return True

    def _whole_tensors_read(self, tv: TensorValue, loads: list) -> int:
        """How many buffers of tv's own size its loads read. Each user that recomputes tv
        keeps them all alive until it runs: a residual stream recomputed as `x + a1 + m1 + a2`
        by each layer norm held every layer's attention and MLP outputs (a 12-layer encoder
        at 3.4x eager's activation memory), where storing the sum frees them."""
        size = numel(tv.sizes)
        layouts = self.buffer_layouts
        return len({ld.name for ld in loads if ld.name in layouts
                    and sympy.expand(numel(layouts[ld.name].sizes) - size) == 0})

    def _realize_shared_bases(self, outs, lowerings) -> None:
        """Results that are views of one intermediate in eager (`t[1:]` and `t[1:][::2]`) must
        be views of one buffer here: that intermediate is realized and the views lowered
        again over it."""
        output_node, chains = self.current_node, {}
        for o in outs:
            chain = [o] if isinstance(o, torch.fx.Node) else []
            while chain and _is_view(chain[-1]) and isinstance(chain[-1].args[0], torch.fx.Node):
                chain.append(chain[-1].args[0])
            if chain:    # the intermediate itself, returned beside its views (CLIP's logits and their .t())
                chains.setdefault(chain[-1], []).append(chain)
        for base, views in chains.items():
            value = self.env.get(base)
            if (len(views) < 2 or all(len(c) == 1 for c in views) or not isinstance(value, TensorValue)
                    or self.as_strided(value) is not None):
                continue
            self.current_node = base
            self.env[base] = self.realize(value, fake_of(base))
            for chain in views:
                for node in reversed(chain[:-1]):
                    self.current_node = node
                    self.env[node] = self._call(node, lowerings)
        self.current_node = output_node

    def _dense_as_eager(self, value: TensorValue, node) -> TensorValue:
        """A result the user gets keeps eager's dim order where eager's is dense (a conv net
        computed channels-last returns NCHW logits). A padded matmul's product keeps its
        gaps between rows, as under torch.compile: a dense copy of GPT-2's logits cost 0.47
        ms and 393 MB a call on an H200, while `logits.view(-1, vocab)` works on either;
        only flattening the vocabulary dim into others needs `.reshape`."""
        view, fake = self.as_strided(value), fake_of(node)
        if view is None or not isinstance(fake, torch.Tensor) or \
                not all(isinstance(x, int) for x in (*fake.shape, *fake.stride())) or \
                not is_dense(fake.shape, fake.stride()):
            return value
        if (is_dense(view[1].sizes, view[1].strides) and _same_strides(view[1], fake)) or _gapped(view[1], fake):
            return value
        return self.realize(value, fake, copy=True)

    def _find_write_backs(self) -> None:
        """Outputs that are the new values of mutated inputs (the AOT stage marks them in
        gm.meta["mutated_inputs"]), each a whole buffer computed here and returned once, with
        its input's layout: the scheduler may store them in the input's memory."""
        computed = {n.name for n in self.nodes if isinstance(n, ComputedBuffer)}
        views = [self.as_strided(o) if isinstance(o, TensorValue) else None for o in self.outputs]
        returned = [v[0] for v in views if v is not None]
        for k, i in self.gm.meta.get("mutated_inputs", {}).items():
            view = views[k] if k < len(views) else None
            target = f"arg{i}"
            if view is None or target not in self.input_nodes or view[0] not in computed:
                continue
            buf, layout = view
            mine, theirs = self.buffer_layouts[buf], self.buffer_layouts[target]
            if returned.count(buf) == 1 and layout.same(mine) and mine.same(theirs) \
                    and is_dense(mine.sizes, mine.strides):     # each element stored once
                self.write_back[buf] = target

    def _output(self, value, node, claimed: dict, user: bool = True):
        """`claimed`: buffer -> (the eager storage, the node) of the output that returns it
        (outputs that are views of one intermediate in eager, `t[1:]` and `t[1:][::2]`, share
        it here too: writing through one must change the other). `user`: an output the caller
        sees; the rest are saved for the backward graph, which only reads them, so two of them
        may be two buffers where eager had views of one (GPT-2's q, k and v, split from one
        projection)."""
        if isinstance(value, TensorValue):
            fake = fake_of(node) if isinstance(node, torch.fx.Node) else None
            storage = _storage_of(fake)
            view = self.as_strided(value)
            if view is None:
                value = self.realize(value, fake)
            elif not _aliases_an_input(node) and (view[0] in self.input_nodes or view[0] in self.alias_buffers
                                                  or view[0] in self.constants
                                                  or (view[0] in claimed and (storage is None
                                                                              or claimed[view[0]][0] != storage))):
                # the op made new memory in eager (clone, diag, repeat, ...) though its values are
                # read in place from memory someone else sees (an input, a view of one, another
                # output, a constant of the graph: `torch.tensor([...])` is one per call in eager,
                # fuzz 405199): the output is a copy, never the caller's tensor
                value = self.realize(value, fake, copy=True)
            mine = self.as_strided(value)[0]
            if user and storage is not None and any(st == storage and buf != mine and other is not node
                                                    for buf, (st, other) in claimed.items()):
                # in eager this output and an earlier one are views of one tensor (writing
                # through one changes the other); here they would be two buffers
                raise Unsupported(f"outputs {node} and an earlier one are views of one tensor that is not "
                                  "an output itself")
            claimed.setdefault(mine, (storage, node))
            return value
        return value

    # -- realization -----------------------------------------------------------------
    def dense_layout(self, sizes, dtype, device, fake=None) -> Layout:
        sizes = tuple(sympy.sympify(s) for s in sizes)
        if fake is not None and isinstance(fake, torch.Tensor) and tuple(to_sympy(s) for s in fake.shape) == sizes:
            strides = tuple(to_sympy(s) for s in fake.stride())
            if is_dense(sizes, strides):
                return Layout(sizes, strides, dtype, device, 0)
        return Layout(sizes, tuple(contiguous_strides(sizes)), dtype, device, 0)

    def realize(self, tv: TensorValue, fake=None, copy: bool = False) -> TensorValue:
        """tv in a buffer of its own, dense, with fake's strides where they are dense. The
        kernel walks the buffer in memory order, not in tv's dim order, so its stores are
        coalesced and so are the loads of inputs laid out alike: a channels-last activation
        (N, C, H, W with C innermost) is computed as N, H, W, C; an operand eager passes
        transposed, `h.t()` into a matmul, is written row by row and handed over as the
        transposed view."""
        if self.as_strided(tv) is not None and not copy:
            return tv
        fake = fake if fake is not None else fake_of(self.current_node)
        layout = self.dense_layout(tv.sizes, tv.dtype, tv.device, fake)
        name = self.new_name()
        cdt = V.compute_dtype(tv.dtype)
        loader = tv.loader
        order = sorted(range(len(layout.sizes)), key=lambda d: -int(layout.strides[d])) \
            if all(isinstance(s, sympy.Integer) for s in layout.strides) else None
        if order is None or order == sorted(order):
            data, stored = Pointwise(list(tv.sizes), lambda idx: V.cast(loader(idx), cdt)), layout
        else:
            def in_dim_order(idx):
                out = [None] * len(idx)
                for k, d in enumerate(order):
                    out[d] = idx[k]
                return out
            sizes = tuple(layout.sizes[d] for d in order)
            stored = Layout(sizes, tuple(contiguous_strides(sizes)), layout.dtype, layout.device, 0)
            data = Pointwise(list(sizes), lambda idx: V.cast(loader(in_dim_order(idx)), cdt))
        self.nodes.append(ComputedBuffer(name, stored, data, origins=self._origins(tv)))
        self.buffer_layouts[name] = stored
        return strided_value(name, layout)

    def add_buffer(self, buf: ComputedBuffer) -> TensorValue:
        if self.current_node is not None:
            buf.origins = self._origins()
        self.nodes.append(buf)
        self.buffer_layouts[buf.name] = buf.layout
        return strided_value(buf.name, buf.layout)

    def as_strided(self, tv: TensorValue):
        """(buffer, layout relative to the buffer's data pointer) when tv is a strided view
        of a buffer, else None."""
        if tv.layout is not None and tv.buffer is not None:
            return tv.buffer, tv.layout
        syms = [index_var(f"v{i}", s) for i, s in enumerate(tv.sizes)]
        v = tv.loader(syms)
        if v.kind != "load" or self.buffer_layouts.get(v.name) is None:
            return None
        if self.buffer_layouts[v.name].dtype != tv.dtype:
            return None
        expr = sympy.expand(v.extra)
        try:
            poly = sympy.Poly(expr, *syms) if syms else None
        except sympy.PolynomialError:
            return None
        if poly is not None and poly.total_degree() > 1:
            return None
        strides = []
        for s in syms:
            c = expr.coeff(s)
            if c.free_symbols & set(syms):
                return None
            strides.append(c)
        if any(s.is_Integer and s < 0 for s in strides):
            return None    # torch tensors cannot have negative strides (flip): realize instead
        offset = expr.subs({s: 0 for s in syms})
        if any(isinstance(a, sympy.Function) for a in sympy.preorder_traversal(offset)):
            return None
        base = self.buffer_layouts[v.name]
        layout = Layout(tuple(tv.sizes), tuple(sympy.sympify(s) for s in strides), base.dtype, base.device, offset)
        tv.buffer, tv.layout = v.name, layout
        return v.name, layout

    def _aligned_operand(self, view) -> TensorValue:
        """A matmul operand whose rows (or columns) are not 16-byte aligned (the logits'
        gradient, 50257 wide) copied once into a buffer with padded rows; both of the
        backward's matmuls read that copy (one transposed), which fuses into the kernel that
        computes the operand."""
        buf, layout = view
        rows, cols, transposed = _unaligned_operand(layout)
        src = Layout((rows, cols), (layout.strides[1], 1) if transposed else (layout.strides[0], 1),
                     layout.dtype, layout.device, layout.offset)
        key = (buf, src.sizes, src.strides, src.offset)
        name = self._aligned.get(key)
        padded = (cols + 7) // 8 * 8
        if name is None:
            name = self.new_name()
            dense = Layout(src.sizes, (sympy.Integer(padded), sympy.Integer(1)), src.dtype, src.device, 0)
            loader, cdt = strided_value(buf, src).loader, V.compute_dtype(src.dtype)
            self.nodes.append(ComputedBuffer(name, dense, Pointwise([rows, cols], lambda idx: V.cast(loader(idx), cdt)),
                                             origins=self._origins()))
            self.buffer_layouts[name] = dense
            self._aligned[key] = name
        if transposed:
            return strided_value(name, Layout((cols, rows), (sympy.Integer(1), sympy.Integer(padded)),
                                              src.dtype, src.device, 0))
        return strided_value(name, self.buffer_layouts[name])

    # -- extern kernels --------------------------------------------------------------
    def extern(self, op, args, kwargs, fake, fallback: bool):
        reads: set = set()
        mutates: set = set()
        # the strides eager hands the op: an argument that is a view here but a new tensor in
        # eager (`clone(memory_format=contiguous)` before a kernel that needs contiguity) is copied
        node = self.current_node
        fakes = [fake_of(a) for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)
                 and isinstance(fake_of(a), torch.Tensor)] if node is not None else []
        values = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorValue)]
        expected = dict(zip(map(id, values), fakes)) if len(fakes) == len(values) else {}

        def prep(a):
            if isinstance(a, TensorValue):
                view = self.as_strided(a)
                fake = expected.get(id(a))
                if view is not None and fake is not None and not _same_strides(view[1], fake):
                    a = self.realize(a, fake, copy=True)
                    view = self.as_strided(a)
                if view is None:
                    a = self.realize(a, fake)
                    view = self.as_strided(a)
                if op in _MATMULS and _unaligned_operand(view[1]) is not None:
                    a = self._aligned_operand(view)
                    view = self.as_strided(a)
                reads.add(view[0])
                return a
            return a

        args, kwargs = pytree.tree_map(prep, (args, kwargs))
        if op._schema.is_mutable:
            for i, arg in enumerate(op._schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    value = args[i] if i < len(args) else kwargs.get(arg.name)
                    for leaf in pytree.tree_leaves(value):
                        if isinstance(leaf, TensorValue):
                            mutates.add(leaf.buffer)
                            if any(b.name == leaf.buffer for b in self.inputs if b is not None):
                                self.mutated_inputs.add(leaf.buffer)
        name = self.new_name("extern")
        origins = self._views_into(self.current_node) + [self.current_node.name] if self.current_node is not None else []
        if fallback:
            self.fallback_ops.append(str(op))
        self.extern_ops.append(str(op))
        outputs: list = []

        def make_out(f, path):
            if isinstance(f, torch.Tensor):
                sizes = tuple(to_sympy(s) for s in f.shape)
                strides = tuple(to_sympy(s) for s in f.stride())
                layout = Layout(sizes, strides, f.dtype, f.device, 0)
                oname = name if path == () else f"{name}_{'_'.join(map(str, path))}"
                out = ExternOutput(oname, layout, kernel=name, path=path)
                outputs.append(out)
                self.buffer_layouts[oname] = layout
                self.extern_results.add(oname)
                if any(r.alias_info is not None for r in op._schema.returns):
                    self.alias_buffers.add(oname)
                return strided_value(oname, layout)
            if isinstance(f, (tuple, list)):
                return type(f)(make_out(x, path + (i,)) for i, x in enumerate(f))
            if f is None or isinstance(f, (int, float, bool)):
                return f
            raise Unsupported(f"extern {op} returns {type(f).__name__}")

        if fake is None and op._schema.returns:   # (an op that returns nothing: a check, `_assert_async`)
            raise Unsupported(f"no metadata (node.meta['val']) for {op}")
        result = make_out(fake, ())
        self.nodes.append(ExternKernel(name, op, args, kwargs, outputs, reads, mutates, origins))
        return result


_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.mm.dtype, torch.ops.aten.addmm.default}


def _runs_as_extern(op) -> bool:
    """An op no lowering computes: it is called as it is (attention, a random op, ...)."""
    from .lowerings import LOWERINGS
    return op._schema.is_mutable or (LOWERINGS.get(op) or LOWERINGS.get(op.overloadpacket)) is None


def _unaligned_operand(layout):
    """(rows, cols, transposed) of a 16-bit CUDA matrix whose leading dimension is not a
    multiple of 8 elements (cuBLAS then takes its slow unaligned kernels), as the row-major
    matrix it is (transposed: the operand is that matrix's transpose); else None."""
    if layout.device.type != "cuda" or layout.dtype not in (torch.float16, torch.bfloat16) or len(layout.sizes) != 2:
        return None
    (r, c), (s0, s1) = layout.sizes, layout.strides
    if not all(isinstance(x, sympy.Integer) for x in (r, c, s0, s1)):
        return None
    if s1 == 1 and int(s0) % 8 and int(s0) >= int(c) >= 256:
        return int(r), int(c), False
    if s0 == 1 and int(s1) % 8 and int(s1) >= int(r) >= 256:
        return int(c), int(r), True
    return None


def _lowerable(fake) -> bool:
    """Codegen covers CPU (C++) and CUDA (Triton) tensors of these dtypes; anything else is an extern call."""
    ok = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.float16,
          torch.int8, torch.uint8, torch.int16)
    for leaf in pytree.tree_leaves(fake):
        if isinstance(leaf, torch.Tensor):
            if leaf.dtype not in ok or leaf.device.type not in ("cpu", "cuda") or leaf.is_sparse:
                return False
    return True


# ops whose recomputation costs more than a load (GELU's backward has two of them)
_TRANSCENDENTAL = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "erf", "erfc", "ndtr", "tanh", "sigmoid",
                   "sin", "cos", "tan", "pow", "atan", "atan2", "asin", "acos", "sinh", "cosh", "lgamma"}

_DIVISIONS = {"sqrt", "rsqrt", "reciprocal", "truediv", "floordiv", "remainder"}

_BY_DESIGN = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.convolution, torch.ops.aten.addmm,
              torch.ops.aten.baddbmm, torch.ops.aten.convolution_backward} | {
    getattr(torch.ops.aten, f"_scaled_dot_product_{kind}{part}") for kind in (
        "flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention")
    for part in ("", "_backward") if hasattr(torch.ops.aten, f"_scaled_dot_product_{kind}{part}")}

# ops that only re-index their input (looked through by _feeds_extern)
_VIEW_OPS = {torch.ops.aten.view, torch.ops.aten._unsafe_view, torch.ops.aten.reshape, torch.ops.aten.permute,
             torch.ops.aten.t, torch.ops.aten.transpose, torch.ops.aten.expand, torch.ops.aten.unsqueeze,
             torch.ops.aten.squeeze, torch.ops.aten.alias}

_SYM_OPS = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
            operator.floordiv: lambda a, b: sympy.floor(a / b), operator.neg: operator.neg}
