"""`engine.debug.replay(fn)(*args)`: compile `fn` while recording every traced
instruction (replay_record.py), run it, and open a `(replay)` prompt that steps forwards
and backwards through the record:

    result = engine.debug.replay(step)(x, y)          # the prompt opens after the run
    result = engine.debug.replay(step, commands="gb\\ngraph\\nq")(x, y)   # scripted

Commands come from `commands` first, then from the terminal or stdin, read the way the
bytecode step debugger reads them (command_input.py). `result.value` is what the call
returned, `result.recording` the record, `result.stepper(...)` opens the prompt again.
The record also goes to TORCH_TRACE as the `replay_record` artifact (tlparse shows it as
a timeline with the graph growing beside it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Optional, TextIO

import observe

from . import command_input
from .replay_record import Recorder, Recording, Step

PROMPT = "(replay) "

HELP = """\
Commands (the record of the compiler's trace of your function; nothing runs again):
  s [n]        step: the next traced instruction, into inlined calls
  n [n]        next: the next instruction of this function, over inlined calls
  b [n]        back: the previous traced instruction (undo s)
  bn [n]       back over: the previous instruction of this function (undo n)
  out          run until this inlined call returns to its caller
  line N       run to the next instruction of line N (FILE:N for another file); `line -N` runs back
  gb           run to the next graph break
  j N          jump to step N
  graph        the graph of this capture attempt as it is after this instruction
  stack        the symbolic value stack before this instruction, bottom first
  locals       the function's variables by your names, before this instruction
  where        the inline stack: the calls this instruction runs inside, outermost first
  info         the record: steps, compiles, graph breaks
  q            leave the prompt
  help         this text"""


@dataclasses.dataclass
class ReplayResult:
    value: Any
    recording: Recording

    def stepper(self, commands=None, out: Optional[TextIO] = None) -> "Stepper":
        s = Stepper(self.recording, commands, out)
        s.loop()
        return s


def replay(fn, *args_now, backend="eager", commands=None, out: Optional[TextIO] = None,
           interactive: bool = True, fullgraph: bool = False, dynamic: Optional[bool] = None, **kwargs_now):
    """`replay(fn)(*args)` -> ReplayResult. Forgets earlier compiles first (like explain),
    so the trace of this call is the one recorded."""
    from ..api import OptimizedModule, compile as engine_compile, reset
    from ..capture import interpreter

    def run(*args, **kwargs):
        recorder = Recorder()
        reset()
        target = fn._orig_mod if isinstance(fn, OptimizedModule) else getattr(fn, "_engine_orig", fn)

        def on_break(event):
            # a break raised before an instruction's handler ran (an unsupported opcode)
            # is not seen by the recorder: put it on the last step of its capture attempt
            rows = recorder.rows_of(str(event.compile_id or "?"))
            if rows and not any(recorder.event_of(i).startswith("graph break") for i in rows):
                recorder.note_event(rows[-1], f"graph break: {event.metadata.get('reason', '')}")

        observe.subscribe(on_break, events=["graph_break"])
        if interpreter.recorder is not None:
            raise RuntimeError("engine.debug.replay: another replay is recording already")
        interpreter.recorder = recorder
        try:
            value = engine_compile(target, backend=backend, fullgraph=fullgraph, dynamic=dynamic)(*args, **kwargs)
        finally:
            interpreter.recorder = None
            observe.unsubscribe(on_break)
        recording = recorder.recording
        observe.emit("artifact", {"name": "replay_record", "encoding": "json"},
                     lambda: json.dumps(recording.to_json()))
        result = ReplayResult(value, recording)
        if interactive:
            result.stepper(commands, out)
        return result

    if args_now or kwargs_now:
        return run(*args_now, **kwargs_now)
    return run


class Stepper:
    def __init__(self, recording: Recording, commands=None, out: Optional[TextIO] = None):
        if isinstance(commands, str):
            commands = commands.splitlines()
        self.rec = recording
        self.script = list(commands or [])
        self._out = out
        self.pos = 0

    @property
    def out(self) -> TextIO:
        return self._out if self._out is not None else sys.stdout

    def write(self, text: str = "") -> None:
        self.out.write(text + "\n")

    @property
    def steps(self) -> list[Step]:
        return self.rec.steps

    # ------------------------------------------------------------------ the loop
    def loop(self) -> None:
        if not self.steps:
            self.write("[replay] nothing was traced (the function was not compiled: see TORCH_LOGS=dynamo)")
            return
        breaks = sum(s.is_break for s in self.steps)
        compiles = len(dict.fromkeys(s.compile_id for s in self.steps))
        self.write(f"[replay] {len(self.steps)} traced instructions in {compiles} capture attempts, "
                   f"{breaks} graph break{'s' if breaks != 1 else ''}; `help` lists the commands")
        self.show()
        while True:
            line = self.next_command()
            if line is None:
                return
            line = line.strip()
            if not line:
                continue
            cmd, _, arg = line.partition(" ")
            handler = getattr(self, "cmd_" + _ALIASES.get(cmd, cmd), None)
            if handler is None:
                self.write(f"*** unknown command {cmd!r} (help lists them)")
                continue
            try:
                if handler(arg.strip()):
                    return
            except Exception as exc:  # a bad command never ends the session
                self.write(f"*** {type(exc).__name__}: {exc}")

    def next_command(self) -> Optional[str]:
        return command_input.next_command(self.script, PROMPT, self.out, self.write,
                                          "[replay] {reason}: leaving the replay")

    # ------------------------------------------------------------------ display
    def show(self) -> None:
        s = self.steps[self.pos]
        where = f"{os.path.basename(s.filename)}:{s.lineno}" if s.lineno else os.path.basename(s.filename)
        indent = "  " * s.depth
        self.write(f"[{s.index}/{len(self.steps) - 1}] [{s.compile_id}] {indent}{s.function} {where}: {s.source}")
        self.write(f"    {indent}{s.offset:>4} {s.opname} {s.argrepr}".rstrip())
        for n in s.nodes:
            self.write(f"    {indent}+ node  {n}")
        for g in s.guards:
            self.write(f"    {indent}+ guard {g}")
        if s.event:
            self.write(f"    {indent}! {s.event}")

    def _move(self, to: Optional[int], what: str) -> None:
        if to is None:
            self.write(f"[replay] {what}: not in the record (staying at step {self.pos})")
            return
        self.pos = to
        self.show()

    def _count(self, arg: str) -> int:
        n = int(arg) if arg else 1
        if n < 1:
            raise ValueError("the count must be positive")
        return n

    def _scan(self, start: int, stop: int, step: int, pred) -> Optional[int]:
        for i in range(start, stop, step):
            if pred(self.steps[i]):
                return i
        return None

    def _over(self, forward: bool) -> Optional[int]:
        """The next (previous) instruction of the current function invocation, or of its callers."""
        cur = self.steps[self.pos]
        if forward:
            return self._scan(self.pos + 1, len(self.steps), 1,
                              lambda s: s.compile_id != cur.compile_id or s.depth <= cur.depth)
        return self._scan(self.pos - 1, -1, -1, lambda s: s.compile_id != cur.compile_id or s.depth <= cur.depth)

    # ------------------------------------------------------------------ commands
    def cmd_help(self, arg):
        self.write(HELP)

    def cmd_step(self, arg):
        to = min(self.pos + self._count(arg), len(self.steps) - 1)
        self._move(to if to != self.pos else None, "the end of the record")

    def cmd_back(self, arg):
        to = max(self.pos - self._count(arg), 0)
        self._move(to if to != self.pos else None, "the start of the record")

    def cmd_next(self, arg):
        for _ in range(self._count(arg)):
            to = self._over(True)
            if to is None:
                self._move(None, "no later instruction in this function")
                return
            self.pos = to
        self.show()

    def cmd_bn(self, arg):
        for _ in range(self._count(arg)):
            to = self._over(False)
            if to is None:
                self._move(None, "no earlier instruction in this function")
                return
            self.pos = to
        self.show()

    def cmd_out(self, arg):
        cur = self.steps[self.pos]
        if cur.depth == 0:
            self.write("[replay] out: this is the compiled frame, not an inlined call")
            return
        self._move(self._scan(self.pos + 1, len(self.steps), 1,
                              lambda s: s.compile_id != cur.compile_id or s.depth < cur.depth),
                   "the caller's next instruction")

    def cmd_line(self, arg):
        if not arg:
            raise ValueError("line needs a line number (or FILE:N)")
        backwards = arg.startswith("-")
        arg = arg.lstrip("-")
        file_part, _, num = arg.rpartition(":")
        n = int(num)
        cur = self.steps[self.pos]

        def at(s: Step) -> bool:
            if s.lineno != n:
                return False
            if file_part:
                return s.filename.endswith(file_part)
            return s.filename == cur.filename

        if backwards:
            to = self._scan(self.pos - 1, -1, -1, at)
        else:
            to = self._scan(self.pos + 1, len(self.steps), 1, at)
        self._move(to, f"line {arg}")

    def cmd_gb(self, arg):
        self._move(self._scan(self.pos + 1, len(self.steps), 1, lambda s: s.is_break),
                   "no graph break after this step")

    def cmd_jump(self, arg):
        n = int(arg)
        if not 0 <= n < len(self.steps):
            raise ValueError(f"steps are 0..{len(self.steps) - 1}")
        self._move(n, "")

    def cmd_graph(self, arg):
        cur = self.steps[self.pos]
        nodes = self.rec.graph_until(self.pos)
        self.write(f"graph of capture attempt [{cur.compile_id}] after step {self.pos} ({len(nodes)} nodes):")
        for n in nodes:
            self.write(f"  {n}")

    def cmd_stack(self, arg):
        s = self.steps[self.pos]
        if not s.stack:
            self.write("(empty stack)")
        for i, v in enumerate(s.stack):
            self.write(f"  [{i}] {v}")

    def cmd_locals(self, arg):
        s = self.steps[self.pos]
        if not s.locals:
            self.write("(no locals)")
        for name, v in s.locals.items():
            self.write(f"  {name} = {v}")

    def cmd_where(self, arg):
        for s in self.rec.inline_stack(self.pos):
            self.write(f"  {'  ' * s.depth}{s.function} {os.path.basename(s.filename)}:{s.lineno} "
                       f"(step {s.index}, {s.opname}): {s.source}")

    def cmd_info(self, arg):
        by_compile: dict[str, list[Step]] = {}
        for s in self.steps:
            by_compile.setdefault(s.compile_id, []).append(s)
        for cid, steps in by_compile.items():
            nodes = sum(len(s.nodes) for s in steps)
            self.write(f"  [{cid}] {steps[0].function}: steps {steps[0].index}..{steps[-1].index}, "
                       f"{nodes} node{'' if nodes == 1 else 's'} added")
            for s in steps:
                if s.event:
                    self.write(f"      step {s.index} ({os.path.basename(s.filename)}:{s.lineno}): {s.event}")

    def cmd_quit(self, arg):
        return True


_ALIASES = {"s": "step", "n": "next", "b": "back", "back": "back", "j": "jump", "q": "quit", "exit": "quit",
            "h": "help", "?": "help", "w": "where", "bt": "where", "u": "out", "up": "out", "l": "line",
            "break": "gb", "g": "graph"}
