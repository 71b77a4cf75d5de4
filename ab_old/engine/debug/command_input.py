"""Where the interactive tools (comptime.breakpoint's pdb, the bytecode step debugger) read
their commands: a terminal, or a script on stdin.

On a terminal, `input()` (line editing, history). Otherwise each command is read from
stdin and echoed after the prompt, so a scripted session's output reads like a
transcript. End of input, an unreadable stdin (pytest's capture) or no command within
`ENGINE_DEBUGGER_STDIN_TIMEOUT` seconds (default 10) when stdin is not a terminal ends
the session with a note instead of hanging; the end is sticky, so later prompts in the
same process do not wait again.
"""

from __future__ import annotations

import os
import select
import sys
from typing import Optional, TextIO

_eof = False
_buffer = b""


def timeout_s() -> float:
    try:
        return float(os.environ.get("ENGINE_DEBUGGER_STDIN_TIMEOUT", "10"))
    except ValueError:
        return 10.0


def at_eof() -> bool:
    return _eof


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError, AttributeError):
        return False


def reset() -> None:
    """Forget an earlier end of input (tests that swap sys.stdin)."""
    global _eof, _buffer
    _eof = False
    _buffer = b""


class InputEnded(Exception):
    """No more commands: `reason` says why, for the note the tool prints."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _fd_of(stream) -> Optional[int]:
    # read the real file descriptor only for the process's own stdin: a replaced
    # sys.stdin (io.StringIO, a test's fake) is read through its own readline()
    if stream is not sys.__stdin__:
        return None
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None


def _read_fd_line(fd: int) -> str:
    global _buffer
    limit = timeout_s()
    while b"\n" not in _buffer:
        ready, _, _ = select.select([fd], [], [], limit)
        if not ready:
            raise InputEnded(f"no command on stdin within {limit:g} s (stdin is not a terminal; "
                             "set ENGINE_DEBUGGER_STDIN_TIMEOUT to wait longer)")
        chunk = os.read(fd, 4096)
        if not chunk:
            if _buffer:
                break
            raise InputEnded("end of input on stdin")
        _buffer += chunk
    line, sep, rest = _buffer.partition(b"\n")
    _buffer = rest
    return line.decode(errors="replace")


def read_command(prompt: str, out: TextIO) -> str:
    """One command line (without its newline); raises InputEnded when there is none."""
    global _eof
    if _eof:
        raise InputEnded("end of input on stdin")
    stream = sys.stdin
    if stream is None:
        _eof = True
        raise InputEnded("no stdin")
    if stdin_is_terminal():
        out.flush()
        try:
            return input(prompt)
        except EOFError:
            _eof = True
            raise InputEnded("end of input (Ctrl-D)") from None
    out.write(prompt)
    out.flush()
    try:
        fd = _fd_of(stream)
        if fd is not None:
            line = _read_fd_line(fd)
        else:
            line = stream.readline()
            if not line:
                raise InputEnded("end of input on stdin")
            line = line.rstrip("\n")
    except InputEnded:
        _eof = True
        out.write("\n")
        raise
    except (OSError, ValueError) as exc:  # e.g. pytest: "reading from stdin while output is captured"
        _eof = True
        out.write("\n")
        raise InputEnded(f"stdin cannot be read ({type(exc).__name__}: {exc})") from None
    out.write(line + "\n")  # echo: a scripted session reads like a transcript
    return line


def next_command(script: list, prompt: str, out: TextIO, write, when_ended: str) -> Optional[str]:
    """A debugger's next command: the first of `script` (tests and docs drive a session so,
    echoed after the prompt as if typed), else a typed one; None when input has ended, after
    writing `when_ended` (with {reason})."""
    if script:
        line = script.pop(0)
        out.write(prompt + line + "\n")
        return line
    try:
        return read_command(prompt, out)
    except InputEnded as exc:
        write(when_ended.format(reason=exc.reason))
        return None
