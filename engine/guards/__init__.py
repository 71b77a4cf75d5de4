"""Guards: what a compiled frame assumed about its inputs, as data, compiled into one
fast check per cache entry, with a slow path that says which guard failed and why."""

from .guard import Guard, TensorMeta, global_state
from .chains import SharedPrefixes
from .check import CompiledGuards, GuardFailure, compile_guards
from .render import render_guards, render_guard

__all__ = ["Guard", "TensorMeta", "global_state", "CompiledGuards", "GuardFailure", "compile_guards", "SharedPrefixes",
           "render_guards",
           "render_guard"]
