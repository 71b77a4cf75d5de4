"""Interactive debugging tools: the only part of the engine that prints to the terminal."""

from .compile_profiler import CompileProfiler

__all__ = ["CompileProfiler"]
