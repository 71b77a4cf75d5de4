"""Variable trackers: what the symbolic interpreter knows about each value on its stack
and in its locals. Plain classes; the behaviour (calls, attribute reads, operators) lives
in the interpreter, which dispatches on these types."""

from __future__ import annotations

from typing import Any, Optional

import torch

from .source import Source


class VariableTracker:
    source: Optional[Source] = None

    def python_type(self) -> type:
        raise NotImplementedError(type(self).__name__)

    def is_constant(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NullVariable(VariableTracker):
    """The NULL CPython pushes below a callable (PUSH_NULL, LOAD_GLOBAL/LOAD_ATTR with the
    low bit set)."""


NULL = NullVariable()


_PLAIN_TYPE_OF_SYMBOLIC = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


class ConstantVariable(VariableTracker):
    """An immutable Python value known at trace time (int, float, str, None, dtype, device,
    torch.Size, range, slice, tuples of these, ...)."""

    def __init__(self, value: Any, source: Optional[Source] = None):
        self.value = value
        self.source = source

    def python_type(self):
        t = type(self.value)
        return _PLAIN_TYPE_OF_SYMBOLIC.get(t, t)  # a symbolic size is an int to the program (engine/shapes)

    def is_constant(self):
        return True

    def __repr__(self):
        return f"ConstantVariable({self.value!r})"


class TensorVariable(VariableTracker):
    def __init__(self, proxy, fake: torch.Tensor, source: Optional[Source] = None, ptype: type = torch.Tensor):
        self.proxy = proxy
        self.fake = fake
        self.source = source
        self.ptype = ptype

    def python_type(self):
        return self.ptype

    def __repr__(self):
        return f"TensorVariable({self.proxy.node.name})"


class ListVariable(VariableTracker):
    def __init__(self, items: list, source: Optional[Source] = None):
        self.items = list(items)
        self.source = source

    def python_type(self):
        return list

    def __repr__(self):
        return f"ListVariable({self.items!r})"


class TupleVariable(VariableTracker):
    def __init__(self, items, source: Optional[Source] = None, cls: type = tuple):
        self.items = list(items)
        self.source = source
        self.cls = cls  # tuple, a namedtuple class, or a torch.return_types structseq

    def python_type(self):
        return self.cls

    def is_namedtuple(self) -> bool:
        return self.cls is not tuple and hasattr(self.cls, "_fields")

    def field_index(self, name: str) -> Optional[int]:
        """The item a field name reads: a namedtuple's, or a torch.return_types structseq's
        (`x.max(-1).values`), None if `name` is no field."""
        fields = self.cls._fields if self.is_namedtuple() else _structseq_fields(self.cls)
        return fields.index(name) if name in fields else None

    def __repr__(self):
        return f"TupleVariable({self.items!r})"


_STRUCTSEQ_FIELDS: dict = {}


def _structseq_fields(cls: type) -> tuple:
    """Field names, in order, of a structseq type (torch.return_types.max, ...); () for others."""
    if cls is tuple or not hasattr(cls, "n_fields") or not issubclass(cls, tuple):
        return ()
    if cls not in _STRUCTSEQ_FIELDS:
        try:
            probe = cls(tuple(range(cls.n_fields)))
            names = [k for k, v in vars(cls).items() if type(v).__name__ == "member_descriptor"]
            _STRUCTSEQ_FIELDS[cls] = tuple(sorted((k for k in names if isinstance(getattr(probe, k), int)),
                                                  key=lambda k: getattr(probe, k)))
        except Exception:
            _STRUCTSEQ_FIELDS[cls] = ()
    return _STRUCTSEQ_FIELDS[cls]


class DictViewVariable(ListVariable):
    """d.keys() / d.values() / d.items(): iterable like a list, rebuilt as the real view."""

    def __init__(self, items: list, dict_vt, kind: str):
        super().__init__(items)
        self.dict_vt = dict_vt
        self.kind = kind

    def python_type(self):
        return type(getattr({}, self.kind)())


class DictVariable(VariableTracker):
    """Keys are Python constants (hashable values); values are variables."""

    def __init__(self, items: dict, source: Optional[Source] = None, cls: type = dict):
        self.items = dict(items)
        self.source = source
        self.cls = cls

    def python_type(self):
        return self.cls

    def has(self, key) -> bool:
        """`key in d`, reading no value."""
        return key in self.items

    def item(self, key):
        """`d[key]` (the key is there)."""
        return self.items[key]


class LazyDictVariable(DictVariable):
    """A dict from outside the frame whose values are wrapped, and guarded, as they are read:
    `d.get(k)`, `d[k]` and `k in d` read one key (its presence is pinned by the DICT_KEYS
    guard on the dict), anything else reads them all. An object's `__dict__` read for one
    attribute (transformers' config reads `__dict__.get("_heterogeneity_spec")` on every
    attribute access) no longer guards every attribute."""

    def __init__(self, value: dict, source: Source, cls: type, wrap_item):
        self._value, self._wrap_item, self._read, self._items = value, wrap_item, {}, None
        self.source = source
        self.cls = cls

    @property
    def items(self) -> dict:
        if self._items is None:
            self._items = {k: self.item(k) for k in self._value}
        return self._items

    @items.setter
    def items(self, items: dict) -> None:
        self._items = items

    def has(self, key) -> bool:
        return key in (self._value if self._items is None else self._items)

    def item(self, key):
        if self._items is not None:     # read whole (and maybe changed by the trace) already
            return self._items[key]
        if key not in self._read:
            self._read[key] = self._wrap_item(key)
        return self._read[key]


class SetVariable(VariableTracker):
    """A set of Python constants."""

    def __init__(self, items, source: Optional[Source] = None, cls: type = set):
        self.items = list(items)  # constant values, insertion order kept for determinism
        self.source = source
        self.cls = cls

    def python_type(self):
        return self.cls


class IteratorVariable(VariableTracker):
    """An iterator over a known, finite sequence of variables."""

    def __init__(self, items: list, pytype: type = type(iter([]))):
        self.items = list(items)
        self.index = 0
        self.pytype = pytype  # what the real iterator would be (generator, zip, map, ...)

    def python_type(self):
        return self.pytype

    def next(self):
        if self.index >= len(self.items):
            return None
        v = self.items[self.index]
        self.index += 1
        return v


class FunctionVariable(VariableTracker):
    """A real Python function object (inlined when called)."""

    def __init__(self, fn, source: Optional[Source] = None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def __repr__(self):
        return f"FunctionVariable({getattr(self.fn, '__qualname__', self.fn)})"


class ClassStatementVariable(VariableTracker):
    """`builtins.__build_class__`, as LOAD_BUILD_CLASS pushes it inside an inlined function."""


class UnbuiltClassVariable(VariableTracker):
    """A class a `class` statement in an inlined function would create, left unbuilt: a
    library that defines a class it does not use on this path (torch.masked's `Combine`,
    for MaskedTensor inputs only) traces on; any use of the class is a graph break."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"UnbuiltClassVariable({self.name})"


class NestedFunctionVariable(VariableTracker):
    """A function made by MAKE_FUNCTION during the trace (closure, lambda, comprehension)."""

    def __init__(self, code, f_globals: dict, globals_source, qualname: str, defaults, kwdefaults, closure,
                 module_name: Optional[str] = None):
        self.code = code
        self.f_globals = f_globals
        self.globals_source = globals_source
        self.qualname = qualname
        self.defaults = defaults      # TupleVariable or None
        self.kwdefaults = kwdefaults  # DictVariable or None
        self.closure = closure        # tuple of CellVariable or None
        self.module_name = module_name

    def python_type(self):
        return type(lambda: None)


class CellVariable(VariableTracker):
    _EMPTY = object()

    def __init__(self, value=None, source: Optional[Source] = None):
        self.value = value  # a VariableTracker or None when empty
        self.source = source


class ObjectVariable(VariableTracker):
    """Any other Python object known at trace time: modules, classes, builtins, torch
    functions, nn.Modules, user objects. `value` is the real object (None for objects
    created during the trace, which have `cls` and only `attrs`). Attribute stores made by
    the traced code are kept in `attrs` and replayed after the graph."""

    def __init__(self, value: Any, source: Optional[Source] = None, cls: Optional[type] = None, is_new: bool = False):
        self.value = value
        self.source = source
        self.cls = cls if cls is not None else type(value)
        self.is_new = is_new
        self.attrs: dict[str, VariableTracker] = {}
        self.deleted: set[str] = set()
        # a dict subclass built in the trace (transformers' ModelOutput): its items, apart from
        # its attributes; the class's Python methods are traced, dict's own work on these items
        self.dict_vt: Optional["DictVariable"] = None

    def python_type(self):
        return self.cls

    def __repr__(self):
        return f"ObjectVariable({self.cls.__name__}{'' if self.source is None else ' ' + self.source.name()})"


class BoundMethodVariable(VariableTracker):
    """`obj.method` where obj is a variable: a Python function bound to it, or a method
    looked up by name on a tensor / constant / container."""

    def __init__(self, obj: VariableTracker, name: str, fn: Any = None):
        self.obj = obj
        self.name = name
        self.fn = fn  # the underlying Python function for user methods, else None

    def python_type(self):
        return type(print)


class GradModeVariable(VariableTracker):
    """torch.no_grad() / enable_grad() / set_grad_enabled(mode) as a context manager."""

    def __init__(self, target: bool, prev: bool, applied_on_create: bool):
        self.target = target
        self.prev = prev
        self.applied_on_create = applied_on_create

    def python_type(self):
        return torch.set_grad_enabled


class ProfilerRangeVariable(VariableTracker):
    """torch.profiler.record_function(name) as a context manager: a profiler range, which
    changes no value; the graph has no node for it (as under torch.compile)."""

    def python_type(self):
        return torch.autograd.profiler.record_function


class AutocastVariable(VariableTracker):
    """torch.autocast(...) as a context manager: the block's setting (an AutocastState), and
    once entered the state from before it. `entered_in_graph`: entered by a node of this
    graph (a break re-enters it in the generated code) rather than before the graph (a
    resumed block, runtime state the graph starts in)."""

    def __init__(self, block, prev=None, entered_in_graph: bool = False):
        self.block = block
        self.prev = prev
        self.entered_in_graph = entered_in_graph

    def python_type(self):
        return torch.autocast


class PartialVariable(VariableTracker):
    """functools.partial(func, *args, **kwargs) made by the traced code."""

    def __init__(self, func: VariableTracker, args: list, kwargs: dict):
        self.func, self.args, self.kwargs = func, list(args), dict(kwargs)

    def python_type(self):
        import functools
        return functools.partial


class WithExitVariable(VariableTracker):
    """The __exit__ that BEFORE_WITH pushes."""

    def __init__(self, ctx: VariableTracker):
        self.ctx = ctx


class ExceptionVariable(VariableTracker):
    """An exception instance created by the traced code."""

    def __init__(self, cls: type, args: list):
        self.cls = cls
        self.args = args
        self.user_stack = None  # where the traced code raised it, for GB0015

    def python_type(self):
        return self.cls


class SuperVariable(VariableTracker):
    def __init__(self, cls: type, obj: VariableTracker):
        self.cls = cls
        self.obj = obj

