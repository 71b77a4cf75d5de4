"""Combo kernels: a run of independent pointwise kernels launched as one.

An optimizer step is one small pointwise kernel per parameter (GPT-2: 148); each launch
costs the host ~10 us, more than most of those kernels run. A combo kernel gives each
member a range of program ids and calls the member's body (the member's own source, with
its program id passed in) for its range:

    @triton.jit
    def combo0_add_mul_x3(p_buf0, p_arg1, p_buf1, p_arg2, xnumel, XBLOCK: tl.constexpr):
        pid = tl.program_id(0)
        if pid < 12:
            kernel4_add_mul_part(pid, p_buf0, p_arg1, 12288, XBLOCK)
        elif pid < 13:
            kernel5_add_mul_part(pid - 12, p_buf1, p_arg2, 768, XBLOCK)
        ...

Members are consecutive steps of the schedule, so nothing runs between them; no member
reads or writes memory another member writes (blocks of one launch run in any order),
memory reuse between buffers included."""

from __future__ import annotations

import dataclasses
import re

import sympy

from .heuristics import cdiv, next_pow2

MAX_MEMBERS = 16      # torch.compile's combo kernels for a 148-parameter AdamW: ~15 each
MAX_ARGS = 160        # pointers a launch passes: CUDA allows 4 KiB of parameters


@dataclasses.dataclass
class Combo:
    name: str
    steps: list           # step indices of the members, consecutive
    members: list         # their KernelSources
    buffers: list         # storage names: the combo's pointer parameters, in order
    xblock: int
    num_warps: int
    blocks: list          # programs of each member

    @property
    def total_blocks(self) -> int:
        return sum(self.blocks)


def _eligible(ks) -> bool:
    return (ks.kind == "pointwise" and not ks.split_slots and not ks.symbols
            and isinstance(ks.xnumel, sympy.Integer) and int(ks.xnumel) > 0
            and ks.source.count("@triton.jit") == 1 and ks.source.count("tl.program_id(") == 1)


def _root(b: str, reuse: dict) -> str:
    """The allocation whose memory buffer b lives in (reuse: new buffer -> freed buffer)."""
    seen = set()
    while b in reuse and b not in seen:
        seen.add(b)
        b = reuse[b]
    return b


def plan(steps: list, kernels: dict, reuse: dict) -> list[list[int]]:
    """Groups of two or more consecutive step indices whose kernels may launch as one."""
    groups, cur, reads, writes, args = [], [], set(), set(), set()

    def close():
        if len(cur) >= 2:
            groups.append(list(cur))
        cur.clear()
        reads.clear()
        writes.clear()
        args.clear()

    for i, step in enumerate(steps):
        ks = kernels.get(getattr(step, "name", None))
        if ks is None or not _eligible(ks):
            close()
            continue
        r = {_root(b, reuse) for b in ks.read}
        w = {_root(b, reuse) for b in ks.written}
        independent = not (r & writes or w & reads or w & writes)
        if not independent or len(cur) >= MAX_MEMBERS or len(args | set(ks.buffers)) > MAX_ARGS:
            close()
        cur.append(i)
        reads |= r
        writes |= w
        args |= set(ks.buffers)
    close()
    return groups


def build(index: int, steps: list[int], members: list, interpret: bool) -> Combo:
    largest = max(int(ks.xnumel) for ks in members)
    if interpret:     # the CPU interpreter pays per program: few large blocks
        xblock, warps = min(max(next_pow2(largest), 16), 4096), 1
    else:
        xblock, warps = min(max(next_pow2(largest), 128), 1024), 4
    buffers: list = []
    for ks in members:
        buffers += [b for b in ks.buffers if b not in buffers]
    ops = re.sub(r"^kernel\d+_?", "", members[0].name) or "pointwise"
    name = f"combo{index}_{ops}_x{len(members)}"
    return Combo(name, steps, members, buffers, xblock, warps, [cdiv(int(ks.xnumel), xblock) for ks in members])


def part_source(ks) -> str:
    """The member's kernel as a function of its program id, for the combo to call."""
    src = ks.source.replace(f"def {ks.name}(", f"def {ks.name}_part(pid, ", 1)
    return src.replace("tl.program_id(0)", "pid", 1)


def source(c: Combo) -> str:
    params = [f"p_{b}" for b in c.buffers] + ["xnumel", "XBLOCK: tl.constexpr"]
    lines = ["@triton.jit", f"def {c.name}({', '.join(params)}):", "    pid = tl.program_id(0)"]
    start = 0
    for k, (ks, blocks) in enumerate(zip(c.members, c.blocks)):
        end = start + blocks
        pid = "pid" if start == 0 else f"pid - {start}"
        args = ", ".join([pid] + [f"p_{b}" for b in ks.buffers] + [str(int(ks.xnumel)), "XBLOCK"])
        if k == len(c.members) - 1:        # a combo has two members or more
            lines.append("    else:")
        else:
            lines.append(f"    {'if' if k == 0 else 'elif'} pid < {end}:")
        lines.append(f"        {ks.name}_part({args})")
        start = end
    return "\n".join(part_source(ks) for ks in c.members) + "\n\n" + "\n".join(lines) + "\n"
