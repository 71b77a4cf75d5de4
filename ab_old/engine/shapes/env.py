"""The shape environment of one capture and the making of FakeTensors whose sizes are
symbols tied to their sources.

`EngineShapeEnv` is torch's ShapeEnv with three changes: symbols are numbered s0, s1, ...
in creation order; every symbol and guard remembers the *user* line being traced when it
was made (our interpreter's current instruction, not a Python traceback); and each new
symbol is reported on the bus (`create_symbol` event, `dynamic` log)."""

from __future__ import annotations

import dataclasses
import linecache
import logging
import os
import re
import weakref
from typing import Any, Optional

import sympy
import torch
from torch._guards import SLoc
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext, constrain_range

import observe

from . import policy
from .sources import NamedSource, source_name


@dataclasses.dataclass(frozen=True)
class UserSLoc(SLoc):
    """An SLoc that also carries our (filename, lineno, name, line) user frame."""

    user_frame: Optional[tuple] = None


def format_user_frame(frame: Optional[tuple]) -> str:
    if not frame:
        return "(unknown user line)"
    filename, lineno, name, _line = frame
    return f"{os.path.basename(filename)}:{lineno} in {name}"


_QUIET = logging.getLogger("engine.shapes.torch_shape_env")
_QUIET.disabled = True


class EngineShapeEnv(ShapeEnv):
    def __init__(self, owner=None, **kwargs: Any) -> None:
        # `owner` (the OutputGraph) gives the user line being traced and the graph to which
        # symbols are added as inputs; set before super().__init__, which may create nodes.
        self.owner = owner
        self.symbol_frames: dict = {}        # symbol -> user frame at its creation
        self.symbol_placeholders: dict = {}  # symbol -> fx proxy of its graph input
        self._entry_frame: Optional[tuple] = None
        super().__init__(**kwargs)
        self.log = _QUIET  # what torch's ShapeEnv would log, we report on the bus ourselves

    # The compiled graph's fake tensors keep this env alive for as long as the graph lives;
    # a strong reference would keep the capture, and with it the real tensors of the call
    # that compiled (a training step's gradients: 3 GiB of a 1B model), alive as long.
    @property
    def owner(self):
        return self._owner() if self._owner is not None else None

    @owner.setter
    def owner(self, value) -> None:
        self._owner = weakref.ref(value) if value is not None else None

    # -- locations: our interpreter knows the user line; a Python traceback would show ours
    def current_user_frame(self) -> Optional[tuple]:
        owner = self.owner
        try:
            frame = getattr(owner, "user_frame", None) if owner is not None else None
            frame = frame() if callable(frame) else frame
        except Exception:
            frame = None
        if frame is None and owner is not None and getattr(owner, "f_code", None) is not None:
            frame = self.entry_frame()  # inputs are wrapped before tracing starts
        return frame

    def entry_frame(self) -> tuple:
        """The first line of the function body: where its inputs come in. (Guards made
        there are later pointed at the first line using each input; see shapes.guards.)"""
        if self._entry_frame is None:
            code = self.owner.f_code
            line = next((ln for _s, _e, ln in code.co_lines() if ln is not None and ln > code.co_firstlineno),
                        code.co_firstlineno)
            text = linecache.getline(code.co_filename, line).strip()
            self._entry_frame = (code.co_filename, line, code.co_name, text)
        return self._entry_frame

    def _get_stack_summary(self, is_debug: bool = False, framework_loc: Optional[str] = None):
        frame = self.current_user_frame()
        return UserSLoc(framework_loc or "", format_user_frame(frame) if frame else None, frame), ""

    def _generate_unique_id(self, source_name: str) -> int:
        i = len(self.unique_ids)
        while i in self.unique_ids:
            i += 1
        self.unique_ids.add(i)
        return i

    def _log_guard(self, prefix: str, g, forcing_spec: bool) -> None:
        # torch's version walks the Python stack and writes torch's own trace; ours names the
        # user line from the interpreter and reports on the bus
        frame = self.current_user_frame()
        observe.log("dynamic", logging.INFO, "%s %s [guard added] at %s", prefix, g, format_user_frame(frame))
        if observe.enabled("guard_added_fast"):
            observe.emit("guard_added_fast", {"expr": str(g), "user_stack": _user_stack(frame), "stack": []})

    def create_symbol(self, val, source, *args, **kwargs):
        known = set(self.var_to_sources)
        expr = super().create_symbol(val, source, *args, **kwargs)
        if isinstance(expr, sympy.Symbol) and expr not in known:
            frame = self.current_user_frame()
            self.symbol_frames[expr] = frame
            _report_symbol(self, expr, val, source_name(source), frame)
        elif isinstance(expr, sympy.Symbol):
            observe.log("dynamic", logging.DEBUG, "create_symbol %s duck sized %s", expr, source_name(source))
        return expr


def _report_symbol(env: EngineShapeEnv, sym, val, src: str, frame) -> None:
    vr = env.var_to_range.get(sym)
    rng = f"[{vr.lower}, {vr.upper}]" if vr is not None else ""
    where = format_user_frame(frame)
    observe.log("dynamic", logging.INFO, "create_symbol %s = %s for %s %s at %s", sym, val, src, rng, where)
    if observe.enabled("create_symbol"):
        observe.emit("create_symbol", {"symbol": str(sym), "val": repr(val), "vr": rng, "source": src,
                                       "user_stack": _user_stack(frame), "stack": []})


def _user_stack(frame) -> list:
    return [] if not frame else [{"line": frame[1], "name": frame[2], "filename": frame[0],
                                  "loc": (frame[3] or "").strip()}]


def new_fake_mode(owner=None) -> FakeTensorMode:
    """The FakeTensorMode of one capture, with its own shape environment."""
    env = EngineShapeEnv(owner=owner, allow_scalar_outputs=False)
    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=env)


def frame_options(owner) -> tuple:
    """(code, dynamic) for the frame `owner` captures: the `dynamic=` option is set by the
    frame conversion (policy.set_frame_options) for the code it converts."""
    code = getattr(owner, "f_code", None)
    cur_code, dynamic = policy.current_frame_options()
    return code, (dynamic if cur_code is code else None)


def _dense_layout(t: torch.Tensor) -> bool:
    """Are the strides those of a dense (possibly permuted) layout? Only such tensors get
    symbolic sizes: their strides follow from the sizes. Others stay static (always correct)."""
    if t.storage_offset() != 0:
        return False
    dims = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.size(d)))
    expected = 1
    for d in dims:
        if t.size(d) != 1 and t.stride(d) != expected:
            return False
        expected *= t.size(d)
    return True


def make_fake(mode: FakeTensorMode, tensor: torch.Tensor, source=None) -> torch.Tensor:
    """A FakeTensor for `tensor` read from `source` (an engine Source or None). Its sizes
    are symbols where the policy makes a dimension dynamic, constants elsewhere."""
    env = mode.shape_env
    if source is None or not isinstance(env, EngineShapeEnv) or tensor.dim() == 0:
        return mode.from_tensor(tensor, static_shapes=True)
    owner = env.owner
    code, dynamic = frame_options(owner)
    name = source.name()
    module_state = isinstance(tensor, torch.nn.Parameter) or (
        owner is not None and id(tensor) in getattr(owner, "tensor_sources", {}))
    dims = policy.dim_policy(tensor, name, code, dynamic, module_state)
    if all(d is DimDynamic.STATIC for d in dims) or not _dense_layout(tensor):
        return mode.from_tensor(tensor, static_shapes=True)
    ctx = StatelessSymbolicContext(dynamic_sizes=dims)
    fake = mode.from_tensor(tensor, source=NamedSource(name), symbolic_context=ctx)
    for d, (lo, hi) in (getattr(tensor, "_engine_dynamic_ranges", None) or {}).items():
        size = fake.size(d)
        if isinstance(size, torch.SymInt):  # mark_dynamic(t, d, min=, max=): narrow the symbol's range
            constrain_range(size, min=lo, max=hi)
    return fake


_FRAME_ARG = re.compile(r"^L\[('[^']*'|\"[^\"]*\")\]$")
_FRAME_ARG_ITEM = re.compile(r"^L\[('[^']*'|\"[^\"]*\")\](\[\d+\])+$")   # L['sizes'][0]


def wrap_int(owner, value, source):
    """A symbolic int for an int argument of the frame when the policy makes it dynamic,
    else None (the caller specializes it with an EQUALS_MATCH guard)."""
    if type(value) is not int or source is None:
        return None
    env = getattr(getattr(owner, "fake_mode", None), "shape_env", None)
    if not isinstance(env, EngineShapeEnv):
        return None
    name = source.name()
    # an int in a list or tuple argument (split sizes from .tolist(), passed on to a resume
    # function): symbolic once it changes, as torch's automatic dynamic does; never up front
    item = _FRAME_ARG.match(name) is None
    if item and _FRAME_ARG_ITEM.match(name) is None:
        return None
    code, dynamic = frame_options(owner)
    if item and dynamic is True:
        return None
    if not policy.int_is_dynamic(code, name, value, dynamic):
        return None
    src = NamedSource(name)
    expr = env.create_symbol(value, src, DimDynamic.DYNAMIC, positive=None, do_not_specialize_zero_one=True)
    return env.create_symintnode(expr, hint=value, source=src)
