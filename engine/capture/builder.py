"""Wrapping real values read from a source (frame locals, globals, attributes, items) into
variable trackers, installing the guards each wrapping relies on."""

from __future__ import annotations

import collections
import dataclasses
import enum
import types
from typing import Any

import torch

from ..shapes.env import wrap_int
from .graph_breaks import GraphBreak
from .runtime import GradModeExit, ProfilerRangeExit
from . import autocast as autocastmod
from . import numpy_ops
from . import optimizers
from .source import (AttrSource, DictValueSource, GetItemSource, ListIteratorSource, LocalSource, NumpyTensorSource,
                     Source, literal)
from .variables import (AutocastVariable, ConstantVariable, DictVariable, FunctionVariable, GradModeVariable,
                        LazyDictVariable,
                        IteratorVariable, ListVariable, ObjectVariable, ProfilerRangeVariable, SetVariable, TensorVariable, TupleVariable, VariableTracker, WithExitVariable)

CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), range, slice,
                  torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size, enum.Enum)


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_LIST_ITERATOR = type(iter([]))


def is_constant_value(v: Any) -> bool:
    if isinstance(v, CONSTANT_TYPES):
        return True
    if type(v) in (tuple, frozenset):
        return all(is_constant_value(x) for x in v)
    return False


def wrap_constant(value: Any) -> VariableTracker:
    """A value computed at trace time (no source, no guard)."""
    if isinstance(value, VariableTracker):
        return value
    if isinstance(value, CONSTANT_TYPES) or isinstance(value, _SYM_TYPES):  # symbolic sizes: engine/shapes
        return ConstantVariable(value)
    if type(value) is list:
        return ListVariable([wrap_constant(v) for v in value])
    if isinstance(value, tuple):
        cls = type(value)
        return TupleVariable([wrap_constant(v) for v in value], cls=cls)
    if type(value) in (dict, collections.OrderedDict):
        return DictVariable({k: wrap_constant(v) for k, v in value.items()}, cls=type(value))
    if isinstance(value, (set, frozenset)):
        return SetVariable(list(value), cls=type(value))
    if type(value) is types.MappingProxyType:  # read-only (a class __dict__, Signature.parameters): a copy reads the same
        return DictVariable({k: wrap_constant(v) for k, v in value.items()})
    if isinstance(value, types.FunctionType):
        return FunctionVariable(value)
    return ObjectVariable(value)


class Builder:
    """VariableBuilder: `wrap(value, source)` for values the frame reads from outside."""

    def __init__(self, out):
        self.out = out  # the OutputGraph

    def wrap(self, value: Any, source: Source | None) -> VariableTracker:
        out = self.out
        if source is None:
            return self.wrap_sourceless(value)
        known = out.memo.get(id(value))
        if known is not None and not isinstance(value, CONSTANT_TYPES) and type(value) not in (tuple,):
            if isinstance(known, TensorVariable) and known.source is not None and known.source != source:
                out.add_guard("DUPLICATE_INPUT", source, known.source.name())
            elif (isinstance(known, (ListVariable, DictVariable, ObjectVariable)) and known.source is not None
                  and known.source != source):
                out.add_guard("ID_MATCH", source, value)
            return known
        if isinstance(value, torch.Tensor):
            return self.wrap_tensor(value, source)
        if type(value) is _LIST_ITERATOR and isinstance(source, LocalSource) and source.local.startswith("__stack"):
            # only a resume function's own loop iterator (built by the generated code, seen by nobody
            # else): tracing it does not advance it, which would be wrong for an iterator a caller holds
            return self.wrap_list_iterator(value, source)
        if numpy_ops.input_supported(value):  # an ndarray: the tensor sharing its memory (engine/capture/numpy_ops)
            out.add_guard("TYPE_MATCH", source, type(value))
            tensor = torch.from_numpy(value)
            tsrc = NumpyTensorSource(source)
            out.add_guard("TENSOR_MATCH", tsrc, tensor)
            vt = numpy_ops.NumpyVariable(out.add_graph_input(tensor, tsrc), source)
            out.remember(value, vt)
            return vt
        if type(value) is GradModeExit:  # a split grad-mode with block, resumed (see runtime.GradModeExit)
            out.add_guard("TYPE_MATCH", source, GradModeExit)
            out.add_guard("EQUALS_MATCH", AttrSource(source, "prev"), value.prev)
            return WithExitVariable(GradModeVariable(value.prev, value.prev, True))
        if type(value) is ProfilerRangeExit:  # a split record_function block, resumed
            out.add_guard("TYPE_MATCH", source, ProfilerRangeExit)
            return WithExitVariable(ProfilerRangeVariable())
        if type(value) is autocastmod.AutocastExit:  # a split autocast block, resumed
            out.add_guard("TYPE_MATCH", source, autocastmod.AutocastExit)
            out.add_guard("EQUALS_MATCH", AttrSource(source, "block"), value.block)
            out.add_guard("EQUALS_MATCH", AttrSource(source, "prev"), value.prev)
            return WithExitVariable(AutocastVariable(value.block, value.prev))
        block = autocastmod.block_of(value)
        if block is not None:  # a torch.autocast object made outside (a decorator's, a module attribute)
            out.add_guard("TYPE_MATCH", source, type(value))
            for attr, v in zip(("device", "_enabled", "fast_dtype", "_cache_enabled"), block):
                out.add_guard("EQUALS_MATCH", AttrSource(source, attr), getattr(value, attr))
            return AutocastVariable(autocastmod.AutocastState(*block))
        if isinstance(value, CONSTANT_TYPES) and not isinstance(value, enum.Enum):
            sym = wrap_int(out, value, source)  # an int argument made dynamic (engine/shapes)
            if sym is not None:
                out.add_guard("TYPE_MATCH", source, int)
                return ConstantVariable(sym, source)
            out.add_guard("EQUALS_MATCH", source, value)
            return ConstantVariable(value, source)
        if isinstance(value, enum.Enum):
            out.add_guard("ID_MATCH", source, value)
            return ConstantVariable(value, source)
        t = type(value)
        if t is tuple or (isinstance(value, tuple) and hasattr(t, "_fields")):
            out.add_guard("TYPE_MATCH", source, t)
            out.add_guard("LENGTH_CHECK", source, len(value))
            return TupleVariable([self.wrap(v, GetItemSource(source, i)) for i, v in enumerate(value)], source, cls=t)
        if t is list:
            out.add_guard("TYPE_MATCH", source, t)
            out.add_guard("LENGTH_CHECK", source, len(value))
            vt = ListVariable([], source)
            out.remember(value, vt)
            vt.items = [self.wrap(v, GetItemSource(source, i)) for i, v in enumerate(value)]
            return vt
        if t is dict or t is collections.OrderedDict:
            keys = list(value.keys())
            # keys the trace handles as constants: strings, ints, classes and typing forms (a type ->
            # validator table)
            if not all(isinstance(k, (str, int, type)) and type(k) is not bool or type(k).__module__ == "typing"
                       for k in keys):
                raise GraphBreak("GB0011", "dict input with non-constant keys")
            out.add_guard("TYPE_MATCH", source, t)
            out.add_guard("DICT_KEYS", source, tuple(keys))
            positions = {k: i for i, k in enumerate(keys)}

            def wrap_item(k):
                return self.wrap(value[k], GetItemSource(source, k) if literal(k) is not None else
                                 DictValueSource(source, positions[k]))
            vt = LazyDictVariable(value, source, t, wrap_item)
            out.remember(value, vt)
            if "capturable" in value:    # an optimizer's param group: read whole, as the step does
                optimizers.traced_group_items(value, vt.items, ConstantVariable)
            return vt
        if t in (set, frozenset) and all(is_constant_value(v) for v in value):
            out.add_guard("EQUALS_MATCH", source, frozenset(value) if t is frozenset else set(value))
            return SetVariable(list(value), source, cls=t)
        if isinstance(value, types.FunctionType):
            out.add_guard("ID_MATCH", source, value)
            vt = FunctionVariable(value, source)
            out.remember(value, vt)
            return vt
        if isinstance(value, torch.nn.Module):
            # by type, as torch.compile guards modules: what the trace reads of it (attributes,
            # parameters as graph inputs, the submodules' names) is guarded as it is read, so one
            # entry serves every layer of a stack, and a module replaced by another of its type
            # reuses it
            out.add_guard("TYPE_MATCH", source, type(value))
            vt = ObjectVariable(value, source)
            out.remember(value, vt)
            out.register_module_tree(value, source)
            return vt
        if type(value) is types.MethodType:
            # a bound method is a new object on every attribute read (logger.warning_once): guard
            # what it binds, not its identity
            out.add_guard("ID_MATCH", AttrSource(source, "__func__"), value.__func__)
            out.add_guard("ID_MATCH", AttrSource(source, "__self__"), value.__self__)
            vt = ObjectVariable(value, source)
            out.remember(value, vt)
            return vt
        if isinstance(value, (types.MethodWrapperType, types.BuiltinMethodType)) and \
                not isinstance(value.__self__, (types.ModuleType, type, type(None))):
            # a builtin method bound to an object (`func.__get__`, `lst.append`) is new on every
            # attribute read too: guard the object it binds
            out.add_guard("ID_MATCH", AttrSource(source, "__self__"), value.__self__)
            vt = ObjectVariable(value, source)
            out.remember(value, vt)
            return vt
        if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType,
                              types.BuiltinMethodType, types.MethodWrapperType, types.WrapperDescriptorType,
                              types.MethodDescriptorType, types.ClassMethodDescriptorType)) or \
                (callable(value) and not hasattr(value, "__dict__")):
            out.add_guard("ID_MATCH", source, value)
            vt = ObjectVariable(value, source)
            out.remember(value, vt)
            return vt
        # A user object: its type is guarded; attributes are guarded as they are read.
        out.add_guard("TYPE_MATCH", source, t)
        vt = ObjectVariable(value, source)
        out.remember(value, vt)
        return vt

    def wrap_list_iterator(self, value, source: Source) -> VariableTracker:
        """A `for` loop's list iterator on a resume function's stack: the items it has left,
        read without advancing it. The tracker has no source: the generated code passes a
        new iterator over what is left, never the original, which the trace did not advance."""
        out = self.out
        left = value.__length_hint__()
        out.add_guard("TYPE_MATCH", source, _LIST_ITERATOR)
        out.add_guard("EQUALS_MATCH", ListIteratorSource(source, "length"), left)
        items = []
        if left:
            seq = value.__reduce__()[1][0]
            for k in range(left, 0, -1):
                items.append(self.wrap(seq[-k], ListIteratorSource(source, "item", k)))
        return IteratorVariable(items, _LIST_ITERATOR)

    def wrap_tensor(self, value: torch.Tensor, source: Source) -> TensorVariable:
        out = self.out
        if type(value) not in (torch.Tensor, torch.nn.Parameter, torch.nn.parameter.Buffer):
            raise GraphBreak("GB0011", f"tensor subclass {type(value).__name__}")
        if value.is_sparse or value.layout != torch.strided:
            raise GraphBreak("GB0011", "non-strided tensor")
        out.add_guard("TENSOR_MATCH", source, value)
        vt = out.add_graph_input(value, source)
        out.remember(value, vt)
        return vt

    def wrap_sourceless(self, value: Any) -> VariableTracker:
        out = self.out
        known = out.memo.get(id(value))
        if known is not None:
            return known
        if isinstance(value, torch.Tensor):
            src = out.tensor_sources.get(id(value))
            if src is not None:
                return self.wrap(value, src)
            return out.add_constant_tensor(value)
        if isinstance(value, torch.nn.Module):
            src = out.module_sources.get(id(value))
            if src is not None:
                return self.wrap(value, src)
            vt = ObjectVariable(value)
            out.remember(value, vt)
            return vt
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            vt = ObjectVariable(value)
            out.remember(value, vt)
            return vt
        block = autocastmod.block_of(value)
        if block is not None:  # reached through an unguarded path (a class's decorated method)
            return AutocastVariable(autocastmod.AutocastState(*block))
        return wrap_constant(value)
