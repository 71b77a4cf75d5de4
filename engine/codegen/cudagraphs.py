"""mode="reduce-overhead": a compiled graph of CUDA tensors replays as one CUDA graph, so
the host launches one graph per call instead of each kernel and extern call.

Per compiled graph (each is compiled for static shapes; the AOT stage compiles another
graph, with its own capture, for new shapes): the first call runs normally (warm-up: cuBLAS
and friends set up their workspaces outside the capture); the second captures.
Inputs whose address was the same on both calls (parameters, buffers, the optimizer's
state) are read in place; the others are copied into static buffers before each replay.
An input that is another captured graph's output (a backward's saved tensors, in the
forward graph's memory) is read in place from the first capture. An in-place input whose
address later changes makes a new capture (a few at most, then the graph stops using CUDA
graphs).

Memory. A forward graph and its backward graphs capture into one memory pool, so the
backward's scratch and gradients reuse what the forward freed. The call that captures
returns the capture's own tensors, which the allocator frees when the caller drops them (a
saved activation once the backward has read it); later replays hand out tensors over the
same memory without the allocator (as torch.compile's CUDA graph trees do), so the pool
holds nothing between steps that the allocator counts. Two rules keep that memory right:

- A result the caller keeps is never overwritten. Before a graph replays, it asks each
  output of the last call (its use count, or a weak reference to the capture's own
  tensor) whether anything still holds it. If so, the graph captures again into fresh
  memory, and from then on copies that buffer out of each replay.
- A replay writes only memory its capture saw free. Before a graph replays, every output
  of the pool's other captures that is alive now must have been alive at its capture; one
  that was not (a gradient kept in `.grad` across a second forward) may lie in this graph's
  scratch: the graph captures again around it, and its owner copies that output out from
  then on. A pool takes a capture only while none of the tensors it handed out without the
  allocator is alive (the allocator would give their memory away); else the graphs move to
  a new pool, each capturing again there at its next call.

A loop that drops its outputs (inference) pays for no copy; a training loop that keeps its
last loss (`loss = step(batch)`) copies the loss. torch.compile hands out the graph's
buffers too, but overwrites them, and raises when an overwritten one is read.

Graphs that cannot be captured run as they are, with the reason logged once on
`TORCH_LOGS=cudagraphs`: CPU tensors among the inputs, symbolic sizes, no tensor input."""

from __future__ import annotations

import itertools
import logging
import operator
import weakref
from collections import Counter
from typing import Any, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

import observe

MAX_CAPTURES = 8          # per graph: captures again after in-place inputs moved
SETTLE_REPLAYS = 8        # replays in which a copied input that settled is taken in place
SETTLE_STREAK = 2         # replays in a row at one address that make an input settled


def _log(level: int, msg: str, *args) -> None:
    observe.emit("artifact", {"name": "cudagraphs", "encoding": "string"},
                 lambda: msg % args if args else msg, log="cudagraphs", level=level)


def why_not(example_inputs) -> Optional[str]:
    """Why a graph with these inputs cannot replay as a CUDA graph; None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if not tensors:
        return "no tensor inputs"
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cuda":
                return f"input {i} is a {x.device.type} tensor"
            if any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
                return f"input {i} has symbolic sizes"
        elif isinstance(x, torch.SymInt):
            return f"input {i} is a symbolic size"
    return None


_SEQUENCE = itertools.count()            # captures in the order they were made


class _Pool:
    """A CUDA graph memory pool and the captures made into it, oldest first. A capture
    released by its graph stays listed (and alive: its CUDA graph keeps the pool's memory
    from going back to the device) while anything holds an output it handed out."""

    def __init__(self):
        self.handle = torch.cuda.graph_pool_handle()
        self.captures: list = []

    def prune(self, everything: bool = False) -> None:
        """Drop the released captures (every one, once their graphs are gone) that nothing
        holds an output of."""
        self.captures = [c for c in self.captures if not (c.released or everything) or c.live_outputs()]

    def takes_captures(self) -> bool:
        """Whether a new capture may allocate here: no tensor a replay handed out (over
        memory the allocator counts as free) is alive."""
        return not any(map(_any_held, self.captures))


_ORPHANS: list = []      # pools of graphs that are gone, kept while a tensor they handed out is alive


def _prune_orphans() -> None:
    for p in _ORPHANS:
        p.prune(everything=True)
    _ORPHANS[:] = [p for p in _ORPHANS if p.captures]


def _orphaned(pools: list) -> None:
    """When a group's graphs are gone (engine.reset, the compiled function dropped): its
    pools stay while a tensor they handed out is alive (it reads their memory)."""
    _ORPHANS.extend(pools)
    _prune_orphans()


class _Group:
    """The graphs that share one pool: a forward and its backward graphs (one, for an
    inference graph). The pool is replaced when it stops taking captures; a replaced pool
    is kept while any of its captures' outputs is alive."""

    def __init__(self):
        self.pools = [_Pool()]         # the last one takes the group's captures
        weakref.finalize(self, _orphaned, self.pools).atexit = False

    @property
    def pool(self) -> _Pool:
        return self.pools[-1]

    def pool_for_capture(self) -> _Pool:
        _prune_orphans()
        for p in self.pools:
            p.prune()
        self.pools[:-1] = [p for p in self.pools[:-1] if p.captures]
        if not self.pool.takes_captures():
            self.pools.append(_Pool())
        return self.pool


class _Capture:
    """One captured CUDA graph: its static inputs and the outputs it writes."""

    def __init__(self, inplace: set, pool: _Pool, leader_seq: Optional[int], copied: set):
        self.seq = next(_SEQUENCE)
        self.pool = pool
        self.copied = copied               # its graph's: the output buffers copied out from its next capture on
        self.leader_seq = leader_seq       # a backward's: its forward's capture when it captured
        self.released = False
        self.live_at_capture: frozenset = frozenset()   # (seq, index) of the pool's outputs alive then
        self.inplace = inplace             # input positions read where they are
        self.graph = torch.cuda.CUDAGraph()
        self.ptrs: dict = {}               # in-place position -> address at capture
        self.inplace_order: list = []      # the same, as two lists (checked on every replay)
        self.inplace_ptrs: list = []
        self.buffers: dict = {}            # copied position -> static buffer
        self.outs: list = []               # non-tensor outputs as they are; tensors as _Out
        self.storages: list = []           # the graph's output memory, as flat uint8 tensors over storage the
                                           # allocator does not own
        self.watched: list = []            # (index, storage, its own use count, its StorageImpl's address,
                                           # its memory's address) of those handed out as they are (not
                                           # copied): checked before a replay
        self.watched_impls: list = []      # the StorageImpl addresses and own use counts of those, as two
        self.watched_counts: list = []     # lists (counted in one C-level pass)
        self.owned: dict = {}              # index -> weak reference to the capture's own tensor's storage
                                           # (what the capturing call returned), while it lives
        self.templates: list = []          # per output: a tensor over the graph's memory a replay hands out
                                           # detached (one C++ call), or None (made by its _Out)
        self.spec = None
        self.flat_type = None              # list or tuple when the graph returns a flat one (no unflatten)
        self.streak: dict = {}             # copied position -> replays in a row it came at one address
        self.last: dict = {}               # copied position -> its address at the last replay
        self.settling = SETTLE_REPLAYS     # replays left in which a copied input may still settle

    def live_owned(self) -> set:
        """The indices of output buffers whose tensor from the capturing call is alive."""
        if self.owned:
            self.owned = {k: r for k, r in self.owned.items() if not r.expired()}
        return set(self.owned)

    def live_outputs(self) -> set:
        """The indices of output buffers something outside the engine holds now."""
        return {w[0] for w, n in zip(self.watched, map(_USE_COUNT, self.watched_impls)) if n > w[2]} \
            | self.live_owned()


class _Out:
    """How a replay hands out one tensor output: a view of one of the call's inputs (an
    output that aliases an input stays an alias of the caller's tensor; all of it: the
    input itself, as the wrapper returns an input it wrote in place), or of a fresh copy of
    the graph's output memory (outputs sharing memory still share it)."""

    def __init__(self, t: torch.Tensor, input_index: Optional[int], storage_index: Optional[int], offset: int,
                 whole: bool = False):
        self.size, self.stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self.input_index, self.storage_index, self.offset = input_index, storage_index, offset
        self.whole = whole

    def make(self, args, storages) -> torch.Tensor:
        if self.input_index is not None:
            a = args[self.input_index]
            if self.whole:      # an optimizer step's updated parameters and states: no view, no copy back
                return a
            return a.as_strided(self.size, self.stride, a.storage_offset() + self.offset)
        st = storages[self.storage_index]
        return torch.empty((0,), dtype=self.dtype, device=st.device).set_(
            st.untyped_storage(), self.offset, self.size, self.stride)


_DATA_PTR = torch.Tensor.data_ptr


def _addresses(args, positions: list) -> list:
    """The addresses of args at positions (one pass in C: replays of a model's graph check
    hundreds of parameters)."""
    return list(map(_DATA_PTR, map(args.__getitem__, positions)))


_USE_COUNT = torch._C._storage_Use_Count
_DETACH = torch.Tensor.detach


def _watch(k: int, flat: torch.Tensor) -> tuple:
    """An output storage's entry in _Capture.watched: its use count now (the graph's own
    tensors over it) is the count at which nothing else refers to it. Counted off the
    StorageImpl's address, one C call (the flat tensor, kept in the entry, keeps it alive)."""
    impl = flat.untyped_storage()._cdata
    return k, flat, _USE_COUNT(impl), impl, flat.data_ptr()


def _any_held(cap: "_Capture") -> bool:
    """Whether anything but the graph's own tensors refers to one of its watched storages: a
    tensor handed out by the last replay, or a view of one."""
    return any(map(operator.gt, map(_USE_COUNT, cap.watched_impls), cap.watched_counts))


def _clear_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces (32 MiB each on Hopper) after a warm-up and around
    a capture. Kept, the warm-up's stayed allocated beside the one the capture makes on its
    own stream (GPT-2 with CUDA graphs peaked 32 MiB above torch.compile's). A workspace made
    during a capture lies in the graph's pool, where it stays the graph's scratch memory."""
    torch._C._cuda_clearCublasWorkspaces()


_GRAPHED: "weakref.WeakSet[CudaGraphed]" = weakref.WeakSet()   # every graph that may hold a capture


def _captured_outputs(but: "CudaGraphed") -> set:
    """The addresses of the output memory of every live capture but `but`'s."""
    return {st.data_ptr() for g in list(_GRAPHED) if g is not but and g.capture is not None
            for st in g.capture.storages}


def _input_storages(static: list) -> dict:
    """storage address -> (position, dtype, storage offset, weak reference to the storage,
    sizes and strides) of each tensor input. An input the capture consumed may have its
    memory taken by an output: only one still alive after the capture can be what an output
    aliases."""
    inputs: dict = {}
    for i, a in enumerate(static):
        if isinstance(a, torch.Tensor):
            st = a.untyped_storage()
            inputs.setdefault(st.data_ptr(), (i, a.dtype, a.storage_offset(), StorageWeakRef(st),
                                              (tuple(a.shape), a.stride())))
    return inputs


def _plan_outputs(cap: "_Capture", outs: list, inputs: dict, copied: set) -> None:
    """Record, for each tensor output, where its memory comes from (capture time): an input
    (`inputs`, from _input_storages), or the graph's own memory, kept as a flat view over
    storage the allocator does not own (so the memory is free once the caller drops what
    the capturing call returned), with a template over it for each output a replay hands
    out as it is (not `copied`)."""
    own: dict = {}
    for o in outs:
        if not isinstance(o, torch.Tensor):
            cap.outs.append(o)
            continue
        ptr = o.untyped_storage().data_ptr()
        i, dtype, offset, ref, layout = inputs.get(ptr, (None, None, 0, None, None))
        if i is not None and dtype == o.dtype and not ref.expired():
            whole = o.storage_offset() == offset and (tuple(o.shape), o.stride()) == layout
            cap.outs.append(_Out(o, i, None, o.storage_offset() - offset, whole))
            continue
        k = own.get(ptr)
        if k is None:
            st = o.untyped_storage()
            k = own[ptr] = len(cap.storages)
            unowned = torch._C._construct_storage_from_data_pointer(st.data_ptr(), o.device, st.nbytes())
            cap.storages.append(torch.empty((0,), dtype=torch.uint8, device=o.device).set_(
                unowned, 0, (st.nbytes(),), (1,)))
        cap.outs.append(_Out(o, None, k, o.storage_offset()))
    cap.templates = [o.make(None, cap.storages) if isinstance(o, _Out) and o.storage_index is not None
                     and o.storage_index not in copied else None for o in cap.outs]


def _call(compiled, args: list):
    """compiled on args, handing it the list to consume where it can (a compiled graph's
    call_boxed frees each input after its last use)."""
    boxed = getattr(type(compiled), "call_boxed", None)
    return boxed(compiled, args) if boxed is not None else compiled(*args)


def _unowned_like(t: torch.Tensor):
    """A function making a tensor over t's memory that does not own it: how a capture that
    consumed a tensor in the pool (freed into it, its data intact: an aborted capture ran
    nothing) gets it back to run without CUDA graphs."""
    st = t.untyped_storage()
    ptr, nbytes, device = st.data_ptr(), st.nbytes(), t.device
    meta = (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)

    def remake():
        offset, size, stride, dtype = meta
        unowned = torch._C._construct_storage_from_data_pointer(ptr, device, nbytes)
        return torch.empty((0,), dtype=dtype, device=device).set_(unowned, offset, size, stride)
    return remake


class CudaGraphed:
    """A compiled graph's callable, replayed as CUDA graphs (one per input shapes)."""

    def __init__(self, compiled, name: str, mutated: frozenset = frozenset(), leader: "Optional[CudaGraphed]" = None):
        self.compiled = compiled
        self.name = name
        self.mutated = mutated             # positions the graph writes: never copied
        self.first_ptrs: Optional[dict] = None   # input position -> address at the warm-up call
        self.capture: Optional[_Capture] = None
        self.n_captures = 0
        self.disabled: Optional[str] = None
        self.leader = leader               # a backward's forward graph: they share one pool
        self.group = leader.group if leader is not None else _Group()
        self.copied: set = set()           # output buffers (their index) a caller kept across calls: copied out
        self.moving: set = set()           # positions read in place once that moved: copied for good
        _GRAPHED.add(self)

    def __getattr__(self, item):           # what AOT and the debug tools read off the compiled graph
        return getattr(self.__dict__["compiled"], item)

    def _leader_seq(self) -> Optional[int]:
        cap = self.leader.capture if self.leader is not None else None
        return cap.seq if cap is not None else None

    def _stale(self, cap: _Capture) -> Optional[str]:
        """Why this capture must not replay before capturing again (its pool's memory moved
        under it), or None."""
        if cap.pool is not self.group.pool:
            return "its graphs moved to a new memory pool"
        if self.leader is not None and cap.leader_seq != self._leader_seq():
            return f"{self.leader.name} captured again (they share one memory pool)"
        return None

    def __call__(self, *args):
        return self.call_boxed(list(args))

    def call_boxed(self, args: list):
        """As __call__, consuming the caller's list: a backward's saved activations that live
        in its forward's memory are freed as its capture goes (their memory taken again by
        its later steps), as the compiled graph frees them without CUDA graphs."""
        if self.disabled is not None:
            return _call(self.compiled, args)
        # one capture per graph: the graph was compiled for static shapes (the AOT stage
        # compiles again, another graph, for others), so the inputs' shapes are not re-read
        cap = self.capture
        if cap is not None:
            stale = self._stale(cap)
            if stale is not None:
                _log(logging.INFO, "cudagraphs: %s: %s; capturing again", self.name, stale)
                return self._capture(args, self._release(cap))
            if _addresses(args, cap.inplace_order) == cap.inplace_ptrs:
                return self._replay(cap, args)
            moved = [i for i, p in cap.ptrs.items() if args[i].data_ptr() != p]
            # another graph's outputs that moved (it captured again) are still read in place
            produced = _captured_outputs(self)
            movable = [i for i in moved
                       if i not in self.mutated and args[i].untyped_storage().data_ptr() not in produced]
            self.moving.update(movable)
            _log(logging.INFO, "cudagraphs: %s: input(s) %s read in place moved; capturing again%s", self.name,
                 moved, " (they are copied from now on)" if movable else "")
            return self._capture(args, self._release(cap) - set(movable))
        ptrs = {i: a.data_ptr() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        if self.first_ptrs is None:        # warm-up: libraries set up their workspaces outside the capture
            self.first_ptrs = ptrs
            out = _call(self.compiled, args)
            _clear_cublas_workspaces()
            return out
        produced = _captured_outputs(self)
        inplace = {i for i, p in ptrs.items() if self.first_ptrs.get(i) == p
                   or args[i].untyped_storage().data_ptr() in produced} | set(self.mutated)
        return self._capture(args, inplace)

    def _capture(self, args, inplace: set):
        if self.n_captures >= MAX_CAPTURES:
            self.disabled = f"captured {MAX_CAPTURES} times (inputs read in place kept moving)"
            _log(logging.WARNING, "cudagraphs: %s runs without CUDA graphs from now on: %s", self.name, self.disabled)
            return _call(self.compiled, args)
        last = self.group.pool
        pool = self.group.pool_for_capture()
        if pool is not last:
            _log(logging.INFO, "cudagraphs: %s captures into a new memory pool: tensors its last pool's graphs "
                 "handed out are still alive there", self.name)
        cap = _Capture(inplace, pool, self._leader_seq(), self.copied)
        static = list(args)
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if i in inplace:
                cap.ptrs[i] = a.data_ptr()
            else:
                buf = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                buf.copy_(a)
                cap.buffers[i] = static[i] = buf
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        produced = _captured_outputs(self)
        from_graphs = sum(args[i].untyped_storage().data_ptr() in produced for i in cap.ptrs)
        inputs = _input_storages(static)
        callers = {i: args[i] for i in cap.buffers}
        # The caller's list is consumed: an input in the leader's output memory (a saved
        # activation) is freed once the capture is past its last use. If the capture fails,
        # those come back from their memory in the pool, which nothing ran on; other inputs
        # are kept for that.
        leader_memory = ({st.data_ptr() for st in self.leader.capture.storages}
                         if self.leader is not None and self.leader.capture is not None
                         and self.leader.capture.pool is pool else set())
        fallback = [(_unowned_like(a), None) if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr()
                    in leader_memory else (None, a) for a in args]
        args.clear()
        torch.cuda.synchronize()
        _clear_cublas_workspaces()
        try:
            with torch.cuda.graph(cap.graph, pool=pool.handle):
                out = _call(self.compiled, static)
        except Exception as exc:           # an op that cannot be captured: run as compiled, say why
            self.disabled = f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            _log(logging.WARNING, "cudagraphs: %s runs without CUDA graphs: %s", self.name, self.disabled)
            torch.cuda.synchronize()
            del static
            return _call(self.compiled, [remake() if remake is not None else a for remake, a in fallback])
        finally:
            _clear_cublas_workspaces()
        del static, fallback
        # what of the pool was alive throughout the capture (inputs it consumed are not)
        cap.live_at_capture = frozenset((c.seq, k) for c in pool.captures for k in c.live_outputs())
        flat, cap.spec = pytree.tree_flatten(out)
        if type(out) in (list, tuple) and len(flat) == len(out) and all(a is b for a, b in zip(flat, out)):
            cap.flat_type = type(out)
        _plan_outputs(cap, flat, inputs, self.copied)
        cap.watched = [_watch(k, st) for k, st in enumerate(cap.storages) if k not in self.copied]
        cap.watched_impls, cap.watched_counts = [w[3] for w in cap.watched], [w[2] for w in cap.watched]
        cap.inplace_order = sorted(cap.ptrs)
        cap.inplace_ptrs = [cap.ptrs[i] for i in cap.inplace_order]
        pool.captures.append(cap)
        self.capture = cap
        self.n_captures += 1
        _log(logging.INFO, "cudagraphs: %s captured for input shapes %s: %d inputs read in place (%d of them "
             "another graph's outputs), %d copied%s", self.name, shapes, len(cap.ptrs), from_graphs,
             len(cap.buffers), f"; in {self.leader.name}'s memory pool" if leader_memory else "")
        # this call returns the capture's own tensors (the allocator frees each when the caller
        # drops it); the copied ones and views of copied inputs are made as a replay makes them
        cap.graph.replay()
        storages = self._copies(cap)
        owned = []
        for t, o in zip(flat, cap.outs):
            if not isinstance(o, _Out):
                owned.append(o)
            elif o.input_index in callers or o.storage_index in self.copied:
                owned.append(o.make(callers, storages))
            else:        # the graph's own memory, or a view of an input read in place (the caller's)
                if o.storage_index is not None:
                    cap.owned.setdefault(o.storage_index, StorageWeakRef(t.untyped_storage()))
                owned.append(t)
        del out, flat
        return self._unflatten(cap, owned)

    def _release(self, cap: _Capture) -> set:
        """Drop a capture before the next is made: its static input buffers go back to the
        allocator before the new capture allocates. It stays in its pool while anything
        holds an output it handed out. Returns the positions it read in place."""
        self.capture = None
        cap.released = True
        cap.buffers = {}
        return set(cap.inplace)

    def _settled(self, cap: _Capture, srcs: list) -> set:
        """The copied inputs that came at one address SETTLE_STREAK replays in a row: a
        backward's saved tensors, which live in the forward graph's memory once the forward
        is captured (ordinary memory at this graph's capture), at one address each step."""
        cap.settling -= 1
        for i, p in zip(cap.buffers, map(_DATA_PTR, srcs)):
            cap.streak[i] = cap.streak.get(i, 0) + 1 if cap.last.get(i) == p else 0
            cap.last[i] = p
        return {i for i in cap.buffers if cap.streak[i] >= SETTLE_STREAK and i not in self.moving}

    def _strays(self, cap: _Capture, args: list) -> list:
        """The outputs of the pool's other captures that are alive now but were not
        throughout this capture: this graph's scratch may lie in their memory. Held only by
        this call's own inputs (a saved activation its capture freed after its last use)
        does not count. Their owners copy them out from their next capture on.
        [(owner's capture, output index)]"""
        if any(c.released for c in cap.pool.captures):
            cap.pool.prune()
        strays, arg_refs = [], None
        for c in cap.pool.captures:
            if c is cap:
                continue
            owned = c.live_owned()
            # every output of the graph's own memory not copied out
            for w, n in zip(c.watched, map(_USE_COUNT, c.watched_impls)):
                k, extra = w[0], n - w[2]
                if extra <= 0 and k not in owned or (c.seq, k) in cap.live_at_capture:
                    continue
                if k not in owned:
                    if arg_refs is None:
                        arg_refs = Counter(a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor))
                    if extra <= arg_refs.get(w[4], 0):
                        continue
                strays.append((c, k))
        return strays

    def _replay(self, cap: _Capture, args) -> Any:
        strays = self._strays(cap, args) if len(cap.pool.captures) > 1 else None
        if strays:
            for c, k in strays:
                c.copied.add(k)
            _log(logging.INFO, "cudagraphs: %s: outputs of other graphs in its memory pool, alive now but not at "
                 "its capture, may lie in its scratch: %s; capturing again around them", self.name,
                 sorted({f"capture {c.seq} buffer {k}" for c, k in strays}))
            return self._capture(args, self._release(cap))
        held = cap.live_outputs() if cap.owned or _any_held(cap) else None
        if held:
            # the caller still holds an output of the last call: this replay would write over it
            self.copied.update(held)
            _log(logging.INFO, "cudagraphs: %s: output buffer(s) %s of the last replay still held; capturing again "
                 "into fresh memory, and copying those out of it from now on (%d of %d)", self.name, sorted(held),
                 len(self.copied), len(cap.storages))
            return self._capture(args, self._release(cap))
        if cap.buffers:
            srcs = [args[i] for i in cap.buffers]
            settled = self._settled(cap, srcs) if cap.settling else None
            if settled and not cap.pool.takes_captures():
                # a new capture would have to move to a new pool (and its group with it): copying
                # a few small inputs costs less
                settled = cap.settling = None
            if settled:       # read in place from now on (a new capture), not copied every replay
                _log(logging.INFO, "cudagraphs: %s: copied input(s) %s now come at one address each call; "
                     "capturing again to read them in place", self.name, sorted(settled))
                return self._capture(args, self._release(cap) | settled)
            torch._foreach_copy_(list(cap.buffers.values()), srcs)
        cap.graph.replay()
        storages = self._copies(cap)
        outs = [_DETACH(t) if t is not None else o.make(args, storages) if isinstance(o, _Out) else o
                for t, o in zip(cap.templates, cap.outs)]
        return self._unflatten(cap, outs)

    def _copies(self, cap: _Capture) -> list:
        """The output storages a replay hands out: copies of those a caller kept before."""
        if not self.copied:
            return cap.storages
        return [st.clone() if k in self.copied else st for k, st in enumerate(cap.storages)]

    @staticmethod
    def _unflatten(cap: _Capture, outs: list):
        return cap.flat_type(outs) if cap.flat_type is not None else pytree.tree_unflatten(outs, cap.spec)


def wrap(compiled, example_inputs, name: str, mutated=frozenset(), leader=None):
    """`compiled` as CudaGraphed when its inputs allow, else itself (the reason logged).
    leader: the forward graph (a CudaGraphed) whose memory pool a backward captures into."""
    reason = why_not(example_inputs)
    if reason is not None:
        _log(logging.INFO, "cudagraphs: %s runs without CUDA graphs: %s", name, reason)
        return compiled
    return CudaGraphed(compiled, name, frozenset(mutated), leader if isinstance(leader, CudaGraphed) else None)
