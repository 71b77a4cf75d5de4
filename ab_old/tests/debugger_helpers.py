"""What the comptime and bytecode-debugger tests share: a fresh engine per test, and a
user program run in its own interpreter with commands on stdin."""

import os
import subprocess
import sys
import textwrap

import pytest

import engine
from engine.debug import command_input

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh():
    engine.reset()
    command_input.reset()
    yield
    command_input.reset()


def run_script(tmp_path, source: str, stdin: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run a user program in a fresh interpreter with `stdin` as its input (a file, so
    tracebacks and ctx.print_bt() show its lines)."""
    script = tmp_path / "user_program.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ENGINE_DEBUGGER_STDIN_TIMEOUT="20")
    return subprocess.run([sys.executable, str(script)], input=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)
