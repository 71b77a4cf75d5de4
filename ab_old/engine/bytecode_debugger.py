"""`engine.bytecode_debugger.debug()`: a `(bdb)` prompt on the bytecode the engine generated
for each compiled frame, with the real value stack (engine/debug/bytecode_debugger.py;
docs/bytecode_debugger.md)."""

from .debug.bytecode_debugger import HELP, Session, debug

__all__ = ["debug", "Session", "HELP"]
