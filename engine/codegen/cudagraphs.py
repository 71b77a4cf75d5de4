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
graphs). Outputs are views of the graph's own output memory (outputs that alias an input
stay views of the caller's tensor), and a result the caller keeps is never overwritten:
before each replay, each output buffer's use count says whether anything still holds a
tensor of it from the last call. If so, the graph is captured again into fresh memory, and
from then on each replay copies that buffer out (outputs that share memory still do); the
others stay the graph's own. A loop that drops its outputs (inference) pays for no copy; a
training loop that keeps its last loss (`loss = step(batch)`) copies the loss, not the
activations saved beside it. torch.compile hands out the graph's buffers too, but
overwrites them, and raises when an overwritten one is read.

Graphs that cannot be captured run as they are, with the reason logged once on
`TORCH_LOGS=cudagraphs`: CPU tensors among the inputs, symbolic sizes, no tensor input."""

from __future__ import annotations

import logging
import weakref
from typing import Any, Optional

import torch
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


class _Capture:
    """One captured CUDA graph: its static inputs and the outputs it writes."""

    def __init__(self, inplace: set):
        self.inplace = inplace             # input positions read where they are
        self.graph = torch.cuda.CUDAGraph()
        self.ptrs: dict = {}               # in-place position -> address at capture
        self.inplace_order: list = []      # the same, as two lists (checked on every replay)
        self.inplace_ptrs: list = []
        self.buffers: dict = {}            # copied position -> static buffer
        self.outs: list = []               # non-tensor outputs as they are; tensors as _Out
        self.storages: list = []           # the graph's output memory, as flat uint8 tensors
        self.watched: list = []            # (index, storage, its own use count) of those handed out as they
                                           # are (not copied): checked before a replay
        self.templates: list = []          # per output: a tensor over the graph's memory a replay hands out
                                           # detached (one C++ call), or None (made by its _Out)
        self.spec = None
        self.flat_type = None              # list or tuple when the graph returns a flat one (no unflatten)
        self.streak: dict = {}             # copied position -> replays in a row it came at one address
        self.last: dict = {}               # copied position -> its address at the last replay
        self.settling = SETTLE_REPLAYS     # replays left in which a copied input may still settle


class _Out:
    """How a replay hands out one tensor output: a view of one of the call's inputs (an
    output that aliases an input stays an alias of the caller's tensor), or of a fresh copy of
    the graph's output memory (outputs sharing memory still share it)."""

    def __init__(self, t: torch.Tensor, input_index: Optional[int], storage_index: Optional[int], offset: int):
        self.size, self.stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self.input_index, self.storage_index, self.offset = input_index, storage_index, offset

    def make(self, args, storages) -> torch.Tensor:
        if self.input_index is not None:
            a = args[self.input_index]
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


def _use_count(flat: torch.Tensor) -> int:
    return _USE_COUNT(flat.untyped_storage()._cdata)


def _held(watched: tuple) -> bool:
    """Whether anything but the graph's own tensors refers to a storage's memory: a tensor
    handed out by the last replay, or a view of one. `watched`: (index, flat, own use count)."""
    return _use_count(watched[1]) > watched[2]


def _clear_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces (32 MiB each on Hopper) after a warm-up and around
    a capture. Kept, the warm-up's stayed allocated beside the one the capture makes on its
    own stream (GPT-2 with CUDA graphs peaked 32 MiB above torch.compile's). A workspace made
    during a capture lies in the graph's pool, which only this graph's captures allocate
    from: freed after the capture, it is still the graph's scratch memory at each replay."""
    torch._C._cuda_clearCublasWorkspaces()


_GRAPHED: "weakref.WeakSet[CudaGraphed]" = weakref.WeakSet()   # every graph that may hold a capture


def _captured_outputs(but: "CudaGraphed") -> set:
    """The addresses of the output memory of every live capture but `but`'s."""
    return {st.data_ptr() for g in list(_GRAPHED) if g is not but and g.capture is not None
            for st in g.capture.storages}


def _plan_outputs(cap: "_Capture", outs: list, static: list, copied: set) -> None:
    """Record, for each tensor output, where its memory comes from (capture time), and a
    template for each one a replay hands out from the graph's own memory (not `copied`)."""
    inputs = {}
    for i, a in enumerate(static):
        if isinstance(a, torch.Tensor):
            inputs.setdefault(a.untyped_storage().data_ptr(), i)
    own: dict = {}
    for o in outs:
        if not isinstance(o, torch.Tensor):
            cap.outs.append(o)
            continue
        ptr = o.untyped_storage().data_ptr()
        i = inputs.get(ptr)
        if i is not None and static[i].dtype == o.dtype:
            cap.outs.append(_Out(o, i, None, o.storage_offset() - static[i].storage_offset()))
            continue
        k = own.get(ptr)
        if k is None:
            st = o.untyped_storage()
            k = own[ptr] = len(cap.storages)
            cap.storages.append(torch.empty((0,), dtype=torch.uint8, device=o.device).set_(st, 0, (st.nbytes(),), (1,)))
        cap.outs.append(_Out(o, None, k, o.storage_offset()))
    cap.templates = [o.make(static, cap.storages) if isinstance(o, _Out) and o.storage_index is not None
                     and o.storage_index not in copied else None for o in cap.outs]


class CudaGraphed:
    """A compiled graph's callable, replayed as CUDA graphs (one per input shapes)."""

    def __init__(self, compiled, name: str, mutated: frozenset = frozenset()):
        self.compiled = compiled
        self.name = name
        self.mutated = mutated             # positions the graph writes: never copied
        self.first_ptrs: Optional[dict] = None   # input position -> address at the warm-up call
        self.capture: Optional[_Capture] = None
        self.n_captures = 0
        self.disabled: Optional[str] = None
        self.pool = torch.cuda.graph_pool_handle()
        self.copied: set = set()           # output buffers (their index) a caller kept across calls: copied out
        self.moving: set = set()           # positions read in place once that moved: copied for good
        _GRAPHED.add(self)

    def __getattr__(self, item):           # what AOT and the debug tools read off the compiled graph
        return getattr(self.__dict__["compiled"], item)

    def __call__(self, *args):
        if self.disabled is not None:
            return self.compiled(*args)
        # one capture per graph: the graph was compiled for static shapes (the AOT stage
        # compiles again, another graph, for others), so the inputs' shapes are not re-read
        cap = self.capture
        if cap is not None:
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
            out = self.compiled(*args)
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
            return self.compiled(*args)
        cap = _Capture(inplace)
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
        torch.cuda.synchronize()
        _clear_cublas_workspaces()
        try:
            with torch.cuda.graph(cap.graph, pool=self.pool):
                out = self.compiled(*static)
        except Exception as exc:           # an op that cannot be captured: run as compiled, say why
            self.disabled = f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            _log(logging.WARNING, "cudagraphs: %s runs without CUDA graphs: %s", self.name, self.disabled)
            torch.cuda.synchronize()
            return self.compiled(*args)
        finally:
            _clear_cublas_workspaces()
        flat, cap.spec = pytree.tree_flatten(out)
        if type(out) in (list, tuple) and len(flat) == len(out) and all(a is b for a, b in zip(flat, out)):
            cap.flat_type = type(out)
        _plan_outputs(cap, flat, static, self.copied)
        del out, flat      # the capture's own output tensors: only the templates hold the memory now
        cap.watched = [(k, st, _use_count(st)) for k, st in enumerate(cap.storages) if k not in self.copied]
        cap.inplace_order = sorted(cap.ptrs)
        cap.inplace_ptrs = [cap.ptrs[i] for i in cap.inplace_order]
        self.capture = cap
        self.n_captures += 1
        produced = _captured_outputs(self)
        _log(logging.INFO, "cudagraphs: %s captured for input shapes %s: %d inputs read in place (%d of them "
             "another graph's outputs), %d copied", self.name,
             [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)], len(cap.ptrs),
             sum(args[i].untyped_storage().data_ptr() in produced for i in cap.ptrs), len(cap.buffers))
        return self._replay(cap, args)

    def _release(self, cap: _Capture) -> set:
        """Drop a capture before the next is made: its static input buffers go back to the
        allocator before the new capture allocates. Returns the positions it read in place."""
        self.capture = None
        cap.buffers, cap.storages, cap.watched, cap.templates = {}, [], [], []
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

    def _replay(self, cap: _Capture, args) -> Any:
        if any(map(_held, cap.watched)):
            # the caller still holds an output of the last replay: this one would write over it
            held = [w[0] for w in cap.watched if _held(w)]
            self.copied.update(held)
            _log(logging.INFO, "cudagraphs: %s: output buffer(s) %s of the last replay still held; capturing again "
                 "into fresh memory, and copying those out of it from now on (%d of %d)", self.name, held,
                 len(self.copied), len(cap.storages))
            return self._capture(args, self._release(cap))
        if cap.buffers:
            srcs = [args[i] for i in cap.buffers]
            settled = self._settled(cap, srcs) if cap.settling else None
            if settled:       # read in place from now on (a new capture), not copied every replay
                _log(logging.INFO, "cudagraphs: %s: copied input(s) %s now come at one address each call; "
                     "capturing again to read them in place", self.name, sorted(settled))
                return self._capture(args, self._release(cap) | settled)
            torch._foreach_copy_(list(cap.buffers.values()), srcs)
        cap.graph.replay()
        storages = cap.storages
        if self.copied:
            storages = [st.clone() if k in self.copied else st for k, st in enumerate(storages)]
        outs = [_DETACH(t) if t is not None else o.make(args, storages) if isinstance(o, _Out) else o
                for t, o in zip(cap.templates, cap.outs)]
        return cap.flat_type(outs) if cap.flat_type is not None else pytree.tree_unflatten(outs, cap.spec)


def wrap(compiled, example_inputs, name: str, mutated=frozenset()):
    """`compiled` as CudaGraphed when its inputs allow, else itself (the reason logged)."""
    reason = why_not(example_inputs)
    if reason is not None:
        _log(logging.INFO, "cudagraphs: %s runs without CUDA graphs: %s", name, reason)
        return compiled
    return CudaGraphed(compiled, name, frozenset(mutated))
