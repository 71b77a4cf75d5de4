"""Interactive debugging tools: the only part of the engine that prints to the terminal."""

from .compile_profiler import CompileProfiler

__all__ = ["CompileProfiler", "replay"]


def replay(fn, *args, **kwargs):
    """`engine.debug.replay(fn)(*args)`: compile fn recording each traced instruction, then
    step forwards and backwards through the record (engine/debug/replay_stepper.py)."""
    from .replay_stepper import replay as _replay
    return _replay(fn, *args, **kwargs)
