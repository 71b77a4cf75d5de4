"""The scheduler: dependency analysis over buffer reads and writes, fusion of IR nodes
into kernels, and buffer planning (which buffers are stored, freed, reused, updated in
place). Its output (`Schedule`) is device-neutral: a list of FusedKernel and
ExternKernel steps that an emitter (C++ now, Triton later) renders.

A kernel is an outer loop nest (`outer`, shared by all its members) holding a sequence of
phases; a phase is an inner loop nest (`inner`, possibly empty) over which pointwise
members compute one element and reduction members accumulate. Pointwise producers fuse
with consumers that read them at the same element (vertical), siblings sharing inputs
fuse when their loops match (horizontal), pointwise prologues join a reduction's loop
and epilogues (per row or per element of the row) follow it in later phases."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import sympy
import torch

import observe

from . import values as V
from .index import VAR_RANGES, flatten, index_var, numel, unflatten
from .ir import UNDECLARED_VIEWS, ComputedBuffer, ExternKernel, Reduction


@dataclasses.dataclass
class Member:
    buf: ComputedBuffer
    inner: tuple                 # inner loop ranges of its phase
    idx: list                    # output index (kernel vars) the body is evaluated at
    ridx: Optional[list]         # reduction index (inner vars), reductions only
    value: V.Value
    store_index: sympy.Expr

    @property
    def name(self) -> str:
        return self.buf.name

    @property
    def out_inner(self) -> tuple:
        """Where its result lives: a reduction's is one value per outer iteration."""
        return () if self.buf.is_reduction else self.inner


@dataclasses.dataclass
class Phase:
    inner: tuple
    inner_vars: list
    members: list
    reduction: bool


@dataclasses.dataclass
class FusedKernel:
    name: str
    outer: tuple
    outer_vars: list
    members: list
    phases: list = dataclasses.field(default_factory=list)
    stored: set = dataclasses.field(default_factory=set)    # buffers written to memory
    storage: dict = dataclasses.field(default_factory=dict)  # buffer -> buffer whose memory it uses

    def reads(self) -> set:
        mine = {m.name for m in self.members}
        return {ld.name for m in self.members for ld in V.loads(m.value)} - mine

    def writes(self) -> set:
        return {m.name for m in self.members}


@dataclasses.dataclass
class Schedule:
    steps: list                  # FusedKernel | ExternKernel
    allocations: dict            # step index -> [buffer names allocated just before]
    frees: dict                  # step index -> [buffer names dead after it]
    reuse: dict                  # new buffer -> freed buffer whose memory it takes
    log: list                    # schedule decisions, for the `schedule` log


def squeeze(sizes) -> tuple:
    return tuple(s for s in sizes if s != 1)


class KernelBuilder:
    """Places IR nodes in a kernel's loop structure and checks that fusion is legal."""

    def __init__(self, name: str, outer: tuple):
        self.name = name
        self.outer = tuple(outer)
        self.outer_vars = [index_var(f"x{i}", s) for i, s in enumerate(self.outer)]
        self.members: list[Member] = []

    @staticmethod
    def inner_vars(inner: tuple) -> list:
        # r0, r1, ... in every phase; registering the range on each use keeps index
        # simplification right when phases of one kernel loop over different ranges
        return [index_var(f"r{i}", s) for i, s in enumerate(inner)]

    def _full_index(self, sizes, inner: tuple, contiguous: bool):
        """Index over `sizes` from (outer vars, inner vars), or None if they do not line up."""
        loop_vars = self.outer_vars + self.inner_vars(inner)
        loop_sizes = self.outer + tuple(inner)
        sq = squeeze(sizes)
        if sq == loop_sizes:
            it = iter(loop_vars)
            return [sympy.Integer(0) if s == 1 else next(it) for s in sizes]
        if contiguous and sympy.simplify(numel(sizes) - numel(loop_sizes)) == 0:
            return unflatten(flatten(loop_vars, loop_sizes), sizes)
        return None

    def place(self, buf: ComputedBuffer, inner: tuple) -> Optional[Member]:
        # loop variables are named x0, x1, ... in every kernel: make their ranges this
        # kernel's again before index expressions are simplified against them
        for v, s in zip(self.outer_vars, self.outer):
            VAR_RANGES[v] = s
        d = buf.data
        contiguous = buf.layout.is_contiguous()
        if isinstance(d, Reduction):
            if squeeze(d.reduction_ranges) != tuple(inner):
                return None
            idx = self._full_index(d.ranges, (), contiguous)
            if idx is None:
                return None
            rvars = self.inner_vars(inner)
            it = iter(rvars)
            ridx = [sympy.Integer(0) if s == 1 else next(it) for s in d.reduction_ranges]
            value = d.fn(idx, ridx)
            return Member(buf, tuple(inner), idx, ridx, value, buf.store_index(idx))
        idx = self._full_index(d.ranges, inner, contiguous)
        if idx is None:
            return None
        return Member(buf, tuple(inner), idx, None, d.fn(idx), buf.store_index(idx))

    def inners(self) -> list:
        seen = []
        for m in self.members:
            if m.inner not in seen:
                seen.append(m.inner)
        return seen

    def try_add(self, buf: ComputedBuffer) -> tuple[Optional[Member], str]:
        if buf.is_reduction:
            candidates = [squeeze(buf.data.reduction_ranges)]
        else:
            candidates = [()] + [i for i in self.inners() if i != ()] + self._rows_of(buf)
        for inner in candidates:
            m = self.place(buf, inner)
            if m is None:
                continue
            ok, why = self.check(self.members + [m])
            if ok:
                why = self.order_conflict(self.members + [m])
                if why is None:
                    return m, "fused"
            return None, why
        return None, (f"loop ranges differ: node {buf.name} ranges "
                      f"{list(buf.data.ranges)}{' x ' + str(list(buf.data.reduction_ranges)) if buf.is_reduction else ''}"
                      f" vs kernel outer {list(self.outer)} inner {self.inners()}")

    def check(self, members) -> tuple[bool, str]:
        by_name = {m.name: m for m in members}
        for m in members:
            for ld in V.loads(m.value):
                producer = by_name.get(ld.name)
                if producer is None or producer is m:
                    continue
                if producer.out_inner not in ((), m.inner):
                    return False, f"{m.name} reads {ld.name} across different inner loops"
                if ld.kind == "iload":
                    return False, f"{m.name} reads {ld.name} at a data-dependent index"
                if sympy.expand(ld.extra - producer.store_index) != 0:
                    return False, (f"{m.name} reads {ld.name} at {ld.extra}, not at the element "
                                   f"being computed ({producer.store_index})")
        return True, ""

    def order_conflict(self, members) -> Optional[str]:
        """A sum over rows (loads contiguous along the one outer dim, strided along the
        reduction) is emitted with the outputs innermost (cpp.py's column reduction); a
        pointwise member in its loop that stores along the reduction var contiguously would
        then be written with a large stride (a layer norm backward's input gradient fused
        with its weight gradient): such a member gets its own kernel instead. So does a sum
        over rows beside a sum over columns."""
        if len(self.outer) != 1:
            return None
        x0 = self.outer_vars[0]
        inners = {m.inner for m in members if m.buf.is_reduction and m.inner}

        def walks(inner, x_step, r_step) -> bool:
            rl = self.inner_vars(inner)[-1]
            return any(x_step(e.coeff(x0)) and r_step(e.coeff(rl))
                       for m in members if m.buf.is_reduction and m.inner == inner
                       for e in (sympy.expand(ld.extra) for ld in V.loads(m.value) if ld.kind == "load"))

        columns = {i for i in inners if walks(i, lambda c: c == 1, lambda c: c not in (0, 1))}
        if columns and any(walks(i, lambda c: c not in (0, 1), lambda c: c == 1) for i in inners - columns):
            # a layer's weight gradient (sums over rows) beside its input gradient (sums over
            # columns) when #rows == #cols: one tile shape serves one order and starves the
            # other (a Llama RMSNorm backward's pair took 75 us on an H200, two kernels 36)
            return "sums over rows and sums over columns read memory in opposite orders"
        for inner in columns:
            for m in members:
                if not m.buf.is_reduction and m.inner == inner:
                    # the next output along x0 must be the next element (or the same one): a
                    # member placed by its flat index over the kernel's loops (GPT-2's layer
                    # norm input gradient beside its weight gradient, 768 columns x 4096 rows)
                    # is stored along the rows through divisions, and its strided loads made the
                    # whole kernel walk one column a program (74 us a launch on an H200)
                    e = sympy.expand(m.store_index)
                    if sympy.simplify(e.subs(x0, x0 + 1) - e) not in (0, 1):
                        return (f"loop order: the reduction walks {x0} contiguously but {m.name} is not "
                                f"stored contiguously along it")
        return None

    def _rows_of(self, buf: ComputedBuffer) -> list:
        """For a pointwise node over this reduction kernel's rows and trailing dims of its
        own (a loss's logit gradient over the vocabulary padded to a multiple of 8, after
        the row sums over the unpadded vocabulary): those dims as a phase of their own.
        Computed row by row beside the sums it reads, its loads and stores walk each row
        contiguously; as a flat pointwise kernel every address took a division by the
        row length (a GPT-2 step's 0.86 ms kernel where torch.compile's took 0.43)."""
        sizes = squeeze(buf.data.ranges)
        n = len(self.outer)
        inners = [i for i in self.inners() if i != ()]
        if not inners or len(sizes) <= n or tuple(sizes[:n]) != self.outer or tuple(sizes[n:]) in inners:
            return []
        if _serializes(sizes, self.outer):
            # a kernel of no rows (a loss's mean over the tokens) is one program: the whole
            # node would be its sequential phase (a Llama step's embedding gather, 4M
            # elements beside the loss, made a 1.4 ms kernel of one program)
            return []
        return [tuple(sizes[n:])]

    def resplit(self, outer: tuple) -> Optional["KernelBuilder"]:
        """The same members under a shorter outer loop (the rest becomes an inner loop), so
        that a reduction over the trailing dims can join a pointwise kernel."""
        n = len(outer)
        if (tuple(self.outer[:n]) != tuple(outer) or len(outer) == len(self.outer)
                or any(m.buf.is_reduction or m.inner != () for m in self.members)):
            return None
        new = KernelBuilder(self.name, outer)
        inner = tuple(self.outer[n:])
        for m in self.members:
            placed = new.place(m.buf, inner)
            if placed is None:
                return None
            new.members.append(placed)
        ok, _ = new.check(new.members)
        return new if ok else None


def _initial(name: str, buf: ComputedBuffer) -> KernelBuilder:
    d = buf.data
    kb = KernelBuilder(name, squeeze(d.ranges))
    inner = squeeze(d.reduction_ranges) if buf.is_reduction else ()
    m = kb.place(buf, inner)
    assert m is not None
    kb.members.append(m)
    return kb


def schedule(nodes: list, output_buffers: set, graph_inputs: set, write_back: Optional[dict] = None,
             user_ops: Optional[dict] = None, barrier: Optional[int] = None) -> Schedule:
    """write_back: buffer -> the graph input whose new value it is (stored in that input's
    memory where no later read needs the old value). user_ops: aten node name -> the user's
    ops it came from (the captured graph's node names), which kernels are named after.
    barrier: the position in `nodes` where a graph's own backward starts (its loss's
    tangent): no node from there on joins a kernel before it. A recomputation the
    partitioner put in the backward (a weight's bf16 cast) would otherwise join its twin in
    the forward as a sibling and keep its result alive from the forward on."""
    with observe.stage("scheduling"):
        return _schedule(nodes, output_buffers, graph_inputs, write_back or {}, user_ops or {}, barrier)


def _schedule(nodes, output_buffers, graph_inputs, write_back, user_ops, barrier=None) -> Schedule:
    steps: list = []           # KernelBuilder | ExternKernel
    producer_step: dict = {}   # buffer -> step index
    decisions: list[str] = []
    counter = 0

    read_names: dict = {}      # id(value) -> (value, the buffers it loads): walked once each

    def names_read(value):
        hit = read_names.get(id(value))
        if hit is None or hit[0] is not value:
            hit = read_names[id(value)] = (value, frozenset(ld.name for ld in V.loads(value)))
        return hit[1]

    def step_reads(s):
        if isinstance(s, ExternKernel):
            return s.reads()
        return set().union(*(names_read(m.value) for m in s.members))

    def step_writes(s):
        if isinstance(s, ExternKernel):
            return {o.name for o in s.outputs} | s.mutates
        return {m.name for m in s.members}

    floor = 0                  # the first step a node may join (past the barrier: the backward's first)
    for k, node in enumerate(nodes):
        if k == barrier:
            floor = len(steps)
        if isinstance(node, ExternKernel):
            steps.append(node)
            for name in step_writes(node):
                producer_step.setdefault(name, len(steps) - 1)
            for name in node.mutates:
                producer_step[name] = len(steps) - 1
            decisions.append(f"{node.name}: extern kernel {node.op}")
            continue
        reads = node.reads()
        dep_steps = [producer_step[r] for r in reads if r in producer_step]
        earliest = max(max(dep_steps, default=-1), floor)
        placed = False
        later_writes: set = set()    # what steps i+1.. write
        for i in range(len(steps) - 1, max(earliest, 0) - 1, -1):
            if i + 1 < len(steps):
                later_writes |= step_writes(steps[i + 1])
            s = steps[i]
            if isinstance(s, ExternKernel):
                continue
            shared = reads & (step_writes(s) | step_reads(s))
            if not shared:
                continue
            relation = "consumer of" if reads & step_writes(s) else "sibling of"
            # moving the node up to step i must not cross a write of something it reads
            if reads & later_writes:
                _fusion_log(node.name, s.name, relation, False, "a later step writes one of its inputs")
                continue
            m, why = s.try_add(node)
            if m is None and node.is_reduction and not any(x.buf.is_reduction for x in s.members) \
                    and not _serializes(s.outer, squeeze(node.data.ranges)):
                alt = s.resplit(squeeze(node.data.ranges))
                if alt is not None:
                    m, why = alt.try_add(node)
                    if m is not None:
                        s.outer, s.outer_vars, s.members = alt.outer, alt.outer_vars, alt.members
            # (never to no outer loop at all: a 0-d value, an optimizer's step count, would turn
            # its sibling's whole loop into one sequential program)
            if m is None and not node.is_reduction and squeeze(node.data.ranges) not in (s.outer, ()):
                alt = s.resplit(squeeze(node.data.ranges)) if len(squeeze(node.data.ranges)) < len(s.outer) else None
                if alt is not None:
                    m2, why2 = alt.try_add(node)
                    if m2 is not None:
                        s.outer, s.outer_vars, s.members = alt.outer, alt.outer_vars, alt.members
                        m, why = m2, why2
            if m is None:
                _fusion_log(node.name, s.name, relation, False, why)
                continue
            s.members.append(m)
            _fusion_log(node.name, s.name, relation, True, f"shares {sorted(shared)}")
            producer_step[node.name] = i
            placed = True
            break
        if not placed and not node.is_reduction and squeeze(node.data.ranges) == ():
            placed = _join_scalars(steps, node, earliest, step_writes, producer_step)
        if not placed:
            kb = _initial(f"kernel{counter}", node)
            counter += 1
            steps.append(kb)
            producer_step[node.name] = len(steps) - 1

    return _plan(steps, output_buffers, graph_inputs, decisions, write_back, user_ops)


def _serializes(outer: tuple, new_outer: tuple) -> bool:
    """Whether moving a kernel's loop under a new outer loop of `new_outer` would leave one
    program (one thread) walking a large tensor: a full reduction (a loss's count of
    labels) joining a sibling over millions of elements (GPT-2's embeddings) made one
    sequential 1.8 ms kernel of a 10 us one."""
    if new_outer != ():
        return False
    n = numel(outer)
    return not (isinstance(n, sympy.Integer) and int(n) <= 4096)


def _join_scalars(steps, node, earliest: int, step_writes, producer_step) -> bool:
    """A 0-d value that shares no input with any kernel (an optimizer's step count + 1, one per
    parameter) joins the latest kernel of 0-d values it may move up to: one launch for all
    of them instead of one each."""
    reads = node.reads()
    later_writes: set = set()
    for i in range(len(steps) - 1, max(earliest, 0) - 1, -1):
        if i + 1 < len(steps):
            later_writes |= step_writes(steps[i + 1])
        s = steps[i]
        if reads & later_writes:
            return False
        if isinstance(s, ExternKernel) or s.outer != () or any(m.buf.is_reduction or m.inner != () for m in s.members):
            continue
        m, why = s.try_add(node)
        if m is None:
            continue
        s.members.append(m)
        _fusion_log(node.name, s.name, "scalar beside", True, "both are 0-d")
        producer_step[node.name] = i
        return True
    return False


# views and reshapes: a kernel reads through them, but they are not what it computes
_LAYOUT_OPS = frozenset({"view", "reshape", "transpose", "permute", "split", "chunk", "contiguous", "expand",
                         "unsqueeze", "squeeze", "flatten", "unflatten", "size", "t", "view_as", "narrow", "select",
                         "slice", "detach", "clone", "alias", "tensor", "to", "type_as", "float"})


def kernel_name(base: str, members: list, user_ops: Optional[dict] = None) -> str:
    """kernel3_batch_norm_relu: the kernel's number, then the ops it fuses in order, as
    profiler traces and output code show it: the user's ops where the aten graph says which
    they were (`batch_norm`, not the `unsqueeze_mul_add` it decomposes into), else the aten
    nodes' names, each without its numbering suffix."""
    ops: list = []
    for m in members:
        for origin in m.buf.origins if user_ops else m.buf.origins[-8:]:
            for name in (user_ops or {}).get(origin) or (origin,):
                op = re.sub(r"_\d+$", "", name)
                op = re.sub(r"(_default|_tensor|_scalar|_self|_dim|_int)$", "", op)
                op = re.sub(r"\W", "_", op)
                if op and op not in ops and op not in ("output", "getitem"):
                    ops.append(op)
    computed = [op for op in ops if op not in _LAYOUT_OPS]    # the ops that compute, where any do
    ops = computed or ops
    if not ops:
        return base
    suffix = "_".join(ops[:4]) + ("_etc" if len(ops) > 4 else "")
    return f"{base}_{suffix}"


def _fusion_log(node, kernel, relation, made, why):
    observe.emit("artifact", {"name": "fusion", "encoding": "string"},
                 lambda: f"{'fused' if made else 'refused'}: {node} into {kernel} ({relation} it): {why}",
                 log="fusion")


def _phases(kb: KernelBuilder) -> list[Phase]:
    phases: list[Phase] = []
    for m in kb.members:
        reads = {ld.name for ld in V.loads(m.value)}
        cur = phases[-1] if phases else None
        if (cur is None or cur.inner != m.inner
                or any(x.buf.is_reduction and x.name in reads for x in cur.members)
                or (cur.inner == () and cur.reduction)):
            cur = Phase(m.inner, KernelBuilder.inner_vars(m.inner), [], False)
            phases.append(cur)
        cur.members.append(m)
        cur.reduction = cur.reduction or m.buf.is_reduction
    return phases


REUSE_WINDOW = 8     # steps a dead buffer waits for a new buffer of its layout to take its memory


def _plan(steps, output_buffers, graph_inputs, decisions, write_back, user_ops) -> Schedule:
    # who reads what, per step
    readers: dict = {}
    written_at: dict = {}
    for i, s in enumerate(steps):
        for n in ({m.name for m in s.members} if not isinstance(s, ExternKernel) else {o.name for o in s.outputs} | s.mutates):
            written_at.setdefault(n, i)
    for i, s in enumerate(steps):
        names = s.reads() if isinstance(s, ExternKernel) else {ld.name for m in s.members for ld in V.loads(m.value)}
        for n in names:
            readers.setdefault(n, set()).add(i)
            if written_at.get(n, -1) > i:  # a step before the one that writes what it reads: refuse the graph
                raise RuntimeError(f"scheduling: {s.name} reads {n} before {steps[written_at[n]].name} writes it")

    final: list = []
    for i, s in enumerate(steps):
        if isinstance(s, ExternKernel):
            final.append(s)
            continue
        fk = FusedKernel(kernel_name(s.name, s.members, user_ops), s.outer, s.outer_vars, s.members, _phases(s))
        phase_of = {m.name: p for p, ph in enumerate(fk.phases) for m in ph.members}
        mine = set(phase_of)
        for m in fk.members:
            outside = readers.get(m.name, set()) - {i}
            cross_phase = any(
                ld.name == m.name and phase_of[x.name] != phase_of[m.name] and m.out_inner != ()
                for x in fk.members for ld in V.loads(x.value))
            if m.name in output_buffers or outside or cross_phase:
                fk.stored.add(m.name)
        local = sorted(mine - fk.stored)
        decisions.append(
            f"{fk.name}: outer {list(fk.outer)}, phases "
            + "; ".join(f"[{', '.join(m.name for m in ph.members)}] inner {list(ph.inner)}" for ph in fk.phases)
            + f"; stores {sorted(fk.stored)}" + (f"; kept in registers {local}" if local else ""))
        final.append(fk)

    # lifetimes: allocate each stored buffer before its step, free after its last reader
    last_use: dict = {}
    for n, rs in readers.items():
        last_use[n] = max(rs)
    produced_at: dict = {}
    for i, s in enumerate(final):
        for n in (s.stored if isinstance(s, FusedKernel) else ()):
            produced_at[n] = i
    extern_read = set().union(*[s.reads() | s.mutates for s in final if isinstance(s, ExternKernel)]) if final else set()
    # read by an extern whose result may share the argument's memory: that memory lives on
    # in the result, so it never goes back to the pool (a matmul's operands do)
    extern_aliased = set().union(*[s.reads() | s.mutates for s in final if isinstance(s, ExternKernel)
                                   and _may_alias_its_arguments(s.op)]) if final else set()
    # what an extern call writes, or may return a view of: a write into its memory is not
    # ordered by `readers` alone (a matmul's operand, read before, is: its result is fresh)
    extern_held = extern_aliased | set().union(*[s.reads() | s.mutates for s in final
                                                 if isinstance(s, ExternKernel) and s.mutates])
    allocations: dict = {}
    frees: dict = {}
    reuse: dict = {}
    free_pool: list = []     # (buffer, layout key, the step after which it died)
    layouts = {m.name: m.buf.layout for s in final if isinstance(s, FusedKernel) for m in s.members}
    for i, s in enumerate(final):
        # fresh results of extern kernels (mm, conv, ...) can be overwritten by their epilogue
        if isinstance(s, ExternKernel) and not s.mutates and all(
                r.alias_info is None for r in s.op._schema.returns):
            for o in s.outputs:
                layouts[o.name] = o.layout
                produced_at[o.name] = i

    def key(layout):
        return (tuple(layout.sizes), tuple(layout.strides), layout.dtype)

    for i, s in enumerate(final):
        # a dead buffer waits for a reuse a few steps at most: held longer, it is memory the
        # allocator would have handed out meanwhile (every dead buffer of a 12-layer encoder
        # waited for a reuse, 3.4x eager's activations); a reuse saves the host an
        # allocation, ~50 a call for GPT-2 that a window of one step lost
        free_pool[:] = [f for f in free_pool if f[2] >= i - REUSE_WINDOW]
        if isinstance(s, FusedKernel):
            for n in sorted(s.stored):
                target = write_back.get(n)
                if target is not None and _write_back_ok(s, n, target, readers, i, extern_held):
                    s.storage[n] = target
                    reuse[n] = target
                    decisions.append(f"{s.name}: {n} is the new value of input {target}: written in its memory")
                    allocations.setdefault(i, []).append(n)
                    continue
                # in place: an input read only at the element being written, dead after this step
                target = _inplace_candidate(s, n, readers, last_use, i, output_buffers, graph_inputs,
                                            extern_read, layouts)
                if target is not None:
                    s.storage[n] = s.storage.get(target, target)
                    reuse[n] = target
                    decisions.append(f"{s.name}: {n} computed in place in {target}'s memory")
                    allocations.setdefault(i, []).append(n)
                    continue
                match = next((f for f in reversed(free_pool) if f[1] == key(layouts[n])), None)
                if match is not None and n not in output_buffers:
                    free_pool.remove(match)
                    reuse[n] = match[0]
                    decisions.append(f"{s.name}: {n} reuses the memory of {match[0]} (dead)")
                allocations.setdefault(i, []).append(n)
        # dead after its last reader, and never before it is written (a reader fused into an
        # earlier kernel than the writer's would otherwise free it first: it then reused itself)
        dead = [n for n, last in last_use.items() if n in produced_at and max(last, produced_at[n]) == i
                and n in layouts and n not in output_buffers]
        written = _scatter_in_place(s, dead, layouts, graph_inputs, decisions) if isinstance(s, ExternKernel) else None
        if dead:
            frees[i] = sorted(dead)
            for n in sorted(dead):
                if n not in extern_aliased and n not in graph_inputs and n not in set(reuse.values()) and n != written:
                    free_pool.append((n, key(layouts[n]), i))
    return Schedule(final, allocations, frees, reuse, decisions)


IN_PLACE_FORMS = {
    torch.ops.aten.index_put.default: torch.ops.aten.index_put_.default,
    torch.ops.aten.index_add.default: torch.ops.aten.index_add_.default,
    torch.ops.aten.scatter_add.default: torch.ops.aten.scatter_add_.default,
}


def _scatter_in_place(ext: ExternKernel, dead: list, layouts: dict, graph_inputs, decisions) -> Optional[str]:
    """An out-of-place scatter into a buffer of ours that dies at this call writes it in place
    (`index_put_`): the functional graph's `index_put(zeros, ...)` of an embedding's gradient
    otherwise holds two [vocabulary, dim] float32 tensors at once (500 MB on a 1B Llama).
    Returns that buffer, which stays out of the free pool: the result lives in its memory."""
    if ext.op not in IN_PLACE_FORMS or not ext.args or len(ext.outputs) != 1:
        return None
    base = ext.args[0]
    name, layout = getattr(base, "buffer", None), getattr(base, "layout", None)
    out = ext.outputs[0].layout
    if name is None or name not in dead or name in graph_inputs or name not in layouts or layout is None:
        return None
    mine = layouts[name]
    if not (layout.same(mine) and mine.same(out)):
        return None
    ext.in_place_of = name
    decisions.append(f"{ext.name}: {ext.op} writes {name} in place (dead after it)")
    return name


def _may_alias_its_arguments(op) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is None or op in UNDECLARED_VIEWS or any(r.alias_info is not None for r in schema.returns)


def _write_back_ok(fk: FusedKernel, name, target, readers, step, extern_held) -> bool:
    """Whether `name` may be stored in graph input `target`'s memory: no later step reads the
    input, no extern call writes it or may return a view of it (`extern_held`; one that only
    read it before, a matmul of the forward or backward reading a weight its optimizer then
    updates, may), and in this kernel it is read only at the element being written, by
    members computed no later than `name`."""
    if target in extern_held or max(readers.get(target, {step})) > step:
        return False
    order = {m.name: k for k, m in enumerate(fk.members)}
    me = next(m for m in fk.members if m.name == name)
    if sympy.simplify(numel(me.buf.data.ranges) - numel(tuple(fk.outer) + tuple(me.out_inner))) != 0:
        return False     # a value stored more than once per kernel (never so today): each store must be its element's only one
    return not any(ld.name == target and (ld.kind == "iload" or sympy.expand(ld.extra - me.store_index) != 0
                                          or order[m.name] > order[name] or m.inner != me.inner)
                   for m in fk.members for ld in V.loads(m.value))


def _inplace_candidate(fk: FusedKernel, name, readers, last_use, step, outputs, graph_inputs, extern_read, layouts):
    me = next(m for m in fk.members if m.name == name)
    order = {m.name: k for k, m in enumerate(fk.members)}
    for ld in V.loads(me.value):
        cand = ld.name
        if (cand in outputs or cand in graph_inputs or cand in extern_read or cand not in layouts
                or last_use.get(cand) != step or cand in {m.name for m in fk.members}):
            continue
        a, b = layouts[cand], layouts[name]
        if (tuple(a.sizes), tuple(a.strides), a.dtype) != (tuple(b.sizes), tuple(b.strides), b.dtype):
            continue
        if any(ld2.name == cand and (ld2.kind == "iload" or sympy.expand(ld2.extra - me.store_index) != 0 or order[m.name] > order[name]
                                     or m.inner != me.inner)
               for m in fk.members for ld2 in V.loads(m.value)):
            continue
        return cand
    return None
