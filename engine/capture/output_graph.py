"""The state one capture attempt builds: the FX graph over FakeTensors, its inputs (with
sources), the guards, the side effects to replay, and the traced global state."""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import Any, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._python_dispatch import TorchDispatchMode
from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

from ..guards import Guard, TensorMeta, global_state
from .. import config
from ..user_frames import format_stack
from . import autocast as autocastmod
from . import checkpoint
from . import fake as fakemod
from . import scalars
from .builder import Builder
from .graph_breaks import GraphBreak
from .source import AttrSource, Source
from .variables import TensorVariable, VariableTracker

try:
    from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                               UnsupportedOperatorException)
    _DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
    _UNSUPPORTED_OP = (UnsupportedOperatorException,)
except ImportError:  # pragma: no cover
    _DATA_DEPENDENT = ()
    _UNSUPPORTED_OP = ()

# Graph nodes kept even when their result is unused: they mutate or change global state.
_SIDE_EFFECT_FUNCTIONS = {operator.setitem, torch._C._set_grad_enabled, autocastmod.autocast_enter,
                          autocastmod.autocast_exit, operator.iadd, operator.isub, operator.imul,
                          operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow, operator.iand,
                          operator.ior, operator.ixor, operator.ilshift, operator.irshift, operator.imatmul}


# Aten ops that write to an argument their schema does not mark `Tensor(a!)`: the running
# statistics of a training-mode batch norm (the argument indices written, and the condition).
_UNDECLARED_WRITES = {
    "aten::native_batch_norm": ((3, 4), lambda args: len(args) > 5 and bool(args[5])),
    "aten::cudnn_batch_norm": ((3, 4), lambda args: len(args) > 5 and bool(args[5])),
    "aten::miopen_batch_norm": ((3, 4), lambda args: len(args) > 5 and bool(args[5])),
}


def _assumptions(env) -> int:
    """How many runtime asserts the shape environment holds (each an assumption about a
    data-dependent size that tracing made): counted before and after every traced op."""
    if env is None or not env.deferred_runtime_asserts:
        return 0
    return sum(map(len, env.deferred_runtime_asserts.values()))


class _WriteRecorder(TorchDispatchMode):
    """Sees the aten ops a call dispatches, and records the storages of the arguments they
    write (by their schemas' `Tensor(a!)` annotations, and the few ops above whose schemas
    leave a write out)."""

    def __init__(self):
        super().__init__()
        self.written: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, name in _declared_writes(func):
            v = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(v, torch.Tensor):
                self.written.append(v)
        undeclared = _UNDECLARED_WRITES.get(func._schema.name)
        if undeclared is not None and undeclared[1](args):
            for i in undeclared[0]:
                if i < len(args) and isinstance(args[i], torch.Tensor):
                    self.written.append(args[i])
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _declared_writes(func) -> tuple:
    """(position, name) of each `Tensor(a!)` argument of an aten op. Version counters do
    not show every such write: `_native_batch_norm_legit`, which batch_norm becomes under the
    Python dispatcher (symbolic sizes), writes the running stats without bumping them."""
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except Exception:
        return None


_NO_CONTEXT = contextlib.nullcontext()


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter: the op name decides
        return None


def _is_mutating(node: torch.fx.Node) -> bool:
    if node.meta.get("mutates"):
        return True
    if node.op == "call_method":
        name = node.target
        return (name.endswith("_") and not name.endswith("__")) or name in ("__setitem__",)
    if node.op == "call_function":
        if node.target in _SIDE_EFFECT_FUNCTIONS:
            return True
        name = getattr(node.target, "__name__", "")
        if "out" in node.kwargs:
            return True
        return name.endswith("_") and not name.endswith("__")
    return False


class OutputGraph:
    def __init__(self, f_code, user_globals: dict):
        self.graph = torch.fx.Graph()
        self.tracer = torch.fx.proxy.GraphAppendingTracer(self.graph)
        self.fake_mode = fakemod.new_fake_mode(self)
        if config.capture_scalar_outputs:
            scalars.enable(self.fake_mode)
        self.sym_outputs: dict = {}  # id(ConstantVariable of a captured scalar) -> its output fx node
        self.unbacked_sizes: dict = {}  # data-dependent size symbol -> (proxy, output index, dim, SymInt)
        self.builder = Builder(self)
        self.guards: dict[Any, Guard] = {}
        self.frame_values: Optional[tuple] = None   # (L, G) of a top frame: guard sources read there
        self.memo: dict[int, VariableTracker] = {}
        self._keepalive: list = []
        self.inputs: list[tuple[Source, torch.Tensor, TensorVariable]] = []
        self.constant_tensors: dict[str, torch.Tensor] = {}
        self.tensor_sources: dict[int, Source] = {}
        self.module_sources: dict[int, Source] = {}
        self.mutated: list[VariableTracker] = []        # existing lists/dicts/objects mutated, in order
        self.global_stores: dict = {}             # (id(globals), name) -> (source, value)
        self.deferred_calls: list = []           # reorderable logging calls, replayed after the graph
        # loss.backward() in the graph (capture/backward.py): the .grad each tensor input has now
        # (id(input) -> (input, value)), the autograd nodes the backwards consumed, and where they
        # were called; the (code, offset) of backwards to leave to autograd in this capture
        self.grads: dict = {}
        self.backward_nodes: set = set()
        self.backward_sites: set = set()
        self.eager_backward: set = set()
        self.output_index: dict = {}
        self.grad_enabled = torch.is_grad_enabled()
        self.initial_grad_enabled = self.grad_enabled
        self.autocast: dict[str, autocastmod.AutocastState] = {}  # device -> traced state, where a block changed it
        self.autocast_open: list = []  # (block, prev) of the blocks this graph entered and has not left
        self.autocast_left: list = []  # (block, prev) of the blocks this graph started inside and left
        self.checkpoint_region: Optional[int] = None  # inside torch.utils.checkpoint: its region (capture/checkpoint)
        self.checkpoint_regions = 0
        self.initial_state = global_state()
        self.current_frame = None  # the interpreter Frame whose instruction is traced now
        self._last_placeholder: Optional[torch.fx.Node] = None
        self.f_code = f_code
        self.user_globals = user_globals
        self.add_guard("GLOBAL_STATE", None, self.initial_state)

    @property
    def user_frame(self) -> Optional[tuple]:
        """(filename, lineno, name, line) of the instruction traced now."""
        f = self.current_frame
        return f.user_frame() if f is not None else None

    @property
    def user_stack(self) -> list:
        f = self.current_frame
        return f.user_stack() if f is not None else []

    # ------------------------------------------------------------------ guards & identity

    def add_guard(self, kind: str, source, expected) -> None:
        src = "" if source is None else (source if isinstance(source, str) else source.name())
        if kind == "TENSOR_MATCH":
            expected = TensorMeta.of(expected)
        g = Guard(kind, src, expected, self.user_frame)
        key = g.key()
        if key not in self.guards:
            self.guards[key] = g

    def guard_list(self) -> list[Guard]:
        return list(self.guards.values()) + self.aliasing_guards()

    def aliasing_guards(self) -> list[Guard]:
        """The graph's tensor inputs were distinct objects when traced (one object read through
        two sources is one input, with a DUPLICATE_INPUT guard): a call that passes one tensor
        twice must not reuse the graph, whose trace read each input's metadata separately
        (`y.t_()` then `x.shape`, with y the same tensor as x). Parameters are left out, as
        under torch.compile: they are rarely passed twice, and models have hundreds."""
        srcs = tuple(s.name() for s, value, _ in self.inputs if not isinstance(value, torch.nn.Parameter))
        return [Guard("NO_TENSOR_ALIASING", "", srcs)] if len(srcs) > 1 else []

    def release(self) -> None:
        """Drop the capture's hold on the call's real values (its locals and globals, the
        tensors it wrapped, every object it modelled) once the attempt is over. The capture's
        objects point at each other, so without this they, and a training step's gradients
        with them, live until the next garbage collection, which GPU memory does not trigger."""
        self.frame_values = None
        self.memo.clear()
        self._keepalive.clear()
        self.inputs.clear()
        self.mutated.clear()
        self.global_stores.clear()
        self.deferred_calls.clear()
        self.grads.clear()
        self.backward_nodes.clear()
        self.current_frame = None

    def remember(self, value, vt) -> None:
        self.memo[id(value)] = vt
        self._keepalive.append(value)

    def register_module_tree(self, module: torch.nn.Module, source: Source) -> None:
        """Record a source for every submodule, parameter and buffer, so that one reached
        through a path without a source (a slice of a Sequential, an iteration) still gets
        the guarded source of its owner."""
        stack = [(module, source)]
        while stack:
            mod, src = stack.pop()
            if id(mod) in self.module_sources and mod is not module:
                continue
            self.module_sources.setdefault(id(mod), src)
            for name, p in mod._parameters.items():
                if p is not None:
                    self.tensor_sources.setdefault(id(p), AttrSource(src, name))
            for name, b in mod._buffers.items():
                if b is not None:
                    self.tensor_sources.setdefault(id(b), AttrSource(src, name))
            for name, child in mod._modules.items():
                if child is not None:
                    stack.append((child, AttrSource(src, name)))

    # ------------------------------------------------------------------ graph inputs

    def add_graph_input(self, value: torch.Tensor, source: Source) -> TensorVariable:
        name = source.graph_input_name()
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first) if first is not None else self.graph.inserting_after(None)
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        with ctx:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        fake = fakemod.make_fake(self.fake_mode, value, source)
        node.meta["example_value"] = fake
        node.meta["val"] = fake
        node.meta["source"] = source.name()
        proxy = torch.fx.Proxy(node, self.tracer)
        vt = TensorVariable(proxy, fake, source, type(value))
        self.inputs.append((source, value, vt))
        return vt

    def add_constant_tensor(self, value: torch.Tensor) -> TensorVariable:
        """A tensor with no source (e.g. created by library code at trace time): kept on the
        graph module as an attribute."""
        name = f"_tensor_constant{len(self.constant_tensors)}"
        self.constant_tensors[name] = value
        node = self.graph.get_attr(name)
        fake = fakemod.make_fake(self.fake_mode, value)
        node.meta["example_value"] = fake
        node.meta["val"] = fake
        vt = TensorVariable(torch.fx.Proxy(node, self.tracer), fake, None, type(value))
        self.remember(value, vt)
        return vt

    # ------------------------------------------------------------------ graph ops

    def _stack_trace(self) -> str:
        return format_stack(self.user_stack)

    def call_op(self, kind: str, target, args: tuple, kwargs: dict):
        """Run the op on FakeTensors, then record it. Returns (proxy, fake result)."""
        from .tensor_ops import to_fake, to_proxy

        fargs, fkwargs = to_fake(args), to_fake(kwargs)
        # Whether the op writes to a tensor it was given comes from the aten ops it ran: the
        # autograd layer bumps the version counter of every `Tensor(a!)` argument (and of the
        # views sharing it), whatever the Python spelling (`inplace=True`, `out=`, `relu_`).
        tensors = [t for t in pytree.tree_leaves((fargs, fkwargs)) if isinstance(t, torch.Tensor)]
        versions = [_version(t) for t in tensors]
        recorder = _WriteRecorder()
        env = self.fake_mode.shape_env
        assumed = _assumptions(env)
        # with symbolic sizes, ops that C++ implements by reading concrete sizes (F.pad's
        # constant_pad_nd) take their symbolic Python decompositions, as under torch.compile:
        # else `F.pad(labels, (0, 1))` in a causal LM's loss pinned the sequence length
        symbolic = enable_python_dispatcher() if env is not None and env.var_to_range else _NO_CONTEXT
        try:
            with self.fake_mode, symbolic, torch.set_grad_enabled(self.grad_enabled), recorder, \
                    autocastmod.applied(self.autocast) if self.autocast else _NO_CONTEXT:
                if kind == "call_method":
                    result = getattr(fargs[0], target)(*fargs[1:], **fkwargs)
                else:
                    result = target(*fargs, **fkwargs)
        except _DATA_DEPENDENT as exc:
            raise GraphBreak("GB0008", f"{_target_name(target)}: {type(exc).__name__}") from None
        except GraphBreak:
            raise
        except Exception as exc:
            raise GraphBreak("GB0009", f"{_target_name(target)} raised {type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        if _assumptions(env) != assumed:
            # The op only traces by assuming something of a data-dependent size (t[t > 0] + a
            # 3-vector: u0 == 3, since a 1 would broadcast); the graph would be wrong, or fail,
            # for the sizes the data gives. It runs eagerly instead, as under torch.compile,
            # which breaks at the op that made the size.
            made = [a for asserts in env.deferred_runtime_asserts.values() for a in asserts]
            new = ", ".join(str(a.expr) for a in made[assumed:])
            raise GraphBreak("GB0008", f"{_target_name(target)} would assume {new} of a data-dependent size")
        pargs, pkwargs = to_proxy(args), to_proxy(kwargs)
        proxy = self.tracer.create_proxy(kind, target, pargs, pkwargs)
        proxy.node.meta["example_value"] = result
        if any(_version(t) != v for t, v in zip(tensors, versions)) or _writes_an_argument(recorder, tensors):
            proxy.node.meta["mutates"] = True
        if isinstance(result, torch.Tensor):
            proxy.node.meta["val"] = result
        proxy.node.meta["stack_trace"] = self._stack_trace()
        if self.checkpoint_region is not None:
            checkpoint.tag(proxy.node, self.checkpoint_region)
        if env is not None and env.pending_fresh_unbacked_symbols:
            # where each data-dependent size (u0) comes from: the runtime asserts on it go there
            bindings = compute_unbacked_bindings(env, result)
            if bindings:
                proxy.node.meta["unbacked_bindings"] = bindings
        self._note_unbacked_sizes(proxy, result)
        return proxy, result

    def _note_unbacked_sizes(self, proxy, result) -> None:
        """A data-dependent size (nonzero, unique, `t[t > 0]`: an unbacked symbol u0) is read
        from the tensor that has it (`aten.sym_size`) where the graph or the generated code
        needs it as a number (shapes.symbolic._placeholder)."""
        env = self.fake_mode.shape_env
        if env is None:
            return
        items = [(None, result)] if isinstance(result, torch.Tensor) else \
            list(enumerate(result)) if isinstance(result, (tuple, list)) else []
        for index, t in items:
            if not isinstance(t, torch.Tensor):
                continue
            for d, size in enumerate(t.shape):
                if isinstance(size, torch.SymInt) and scalars.is_unbacked(size):
                    sym = size.node.expr
                    if getattr(sym, "is_Symbol", False) and sym not in env.symbol_placeholders:
                        self.unbacked_sizes.setdefault(sym, (proxy, index, d, size))

    def set_grad_enabled(self, mode: bool) -> None:
        if mode != self.grad_enabled:
            proxy = self.tracer.create_proxy("call_function", torch._C._set_grad_enabled, (mode,), {})
            proxy.node.meta["stack_trace"] = self._stack_trace()
        self.grad_enabled = mode

    def enter_autocast(self, block: autocastmod.AutocastState) -> autocastmod.AutocastState:
        """An autocast block starts: a graph node, and the traced state. Returns the state before."""
        prev = self.autocast.get(block.device) or autocastmod.AutocastState.current(block.device)
        self._state_node(autocastmod.autocast_enter, block)
        self.autocast[block.device] = block
        self.autocast_open.append((block, prev))
        return prev

    def exit_autocast(self, block: autocastmod.AutocastState, prev: autocastmod.AutocastState,
                      entered_in_graph: bool) -> None:
        self._state_node(autocastmod.autocast_exit, prev)
        self.autocast[prev.device] = prev
        if entered_in_graph:
            self.autocast_open.pop()
        else:  # a block the graph started inside (a resumed one)
            self.autocast_left.append((block, prev))

    def end_autocast(self) -> list:
        """A graph leaves the thread's autocast state as it found it: under AOT its nodes run
        only while tracing. So a graph that ends inside blocks it entered (a break) leaves them,
        and one that left blocks it started in enters them again, at its end. Returns what the
        generated code does after the graph instead: (autocast_exit, prev) for each block left,
        then (autocast_enter, block) for each block still open, outermost first."""
        for _block, prev in reversed(self.autocast_open):
            self._state_node(autocastmod.autocast_exit, prev)
        for block, _prev in reversed(self.autocast_left):
            self._state_node(autocastmod.autocast_enter, block)
        return [(autocastmod.autocast_exit, prev) for _block, prev in self.autocast_left] + \
            [(autocastmod.autocast_enter, block) for block, _prev in self.autocast_open]

    def _state_node(self, fn, s: autocastmod.AutocastState) -> None:
        proxy = self.tracer.create_proxy("call_function", fn, (s.device, s.enabled, s.dtype, s.cache_enabled), {})
        proxy.node.meta["stack_trace"] = self._stack_trace()

    # ------------------------------------------------------------------ finishing

    def op_nodes(self) -> list:
        return [n for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module")]

    def dead_code_elimination(self, keep: set) -> None:
        changed = True
        while changed:
            changed = False
            for node in reversed(list(self.graph.nodes)):
                if node.op in ("placeholder", "output") or node in keep:
                    continue
                if node.users or _is_mutating(node):
                    continue
                self.graph.erase_node(node)
                changed = True

    def note_mutation(self, vt: VariableTracker) -> None:
        if vt.source is None:
            return  # created during the trace: rebuilt as a whole
        if vt not in self.mutated:
            self.mutated.append(vt)


def _writes_an_argument(recorder: _WriteRecorder, tensors: list) -> bool:
    if not recorder.written:
        return False
    given = {_storage_key(t) for t in tensors}
    return any(_storage_key(t) in given for t in recorder.written)


def _target_name(target) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{mod}.{name}" if mod and not mod.startswith("builtins") else name
