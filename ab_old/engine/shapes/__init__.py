"""Dynamic shapes: which dimensions are symbolic (automatic dynamic, dynamic=True/False,
mark_dynamic / mark_static), symbols with ranges in torch's ShapeEnv tied to their sources
(`L['x'].size()[0]`), and the guards on them rendered in user terms."""

from .policy import reset, set_frame_options
from .env import EngineShapeEnv, make_fake, new_fake_mode
from .guards import finalize_guards, relax_tensor_match, shape_guards
from .runtime_asserts import insert_runtime_asserts
from .symbolic import has_symbolic, python_expr, to_proxy

__all__ = ["reset", "set_frame_options", "EngineShapeEnv", "make_fake", "new_fake_mode", "finalize_guards",
           "shape_guards", "has_symbolic", "python_expr", "to_proxy", "insert_runtime_asserts", "relax_tensor_match"]
