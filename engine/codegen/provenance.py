"""What each kernel of a compiled graph computes, in the user's terms: the aten nodes it
fuses, the captured FX nodes those came from (engine.aot.provenance), and the user's lines.

One record per step of the schedule (fused kernels and extern calls alike) feeds three
places: a comment above each step in the output code, the `kernel_provenance` trace
artifact, and through it the report's kernel <-> line pages."""

from __future__ import annotations

import dataclasses

from engine.user_frames import frames_of, user_frames

from .ir import ExternKernel


STACK_FRAMES = 4    # the calls kept above each line (a real model's whole stack, per line, is most of the record)


@dataclasses.dataclass
class KernelOrigin:
    kernel: str                 # the kernel's name, or the extern call's result buffer
    kind: str                   # "fused" | "extern"
    op: str                     # an extern's aten op ("" for fused kernels)
    aten: list                  # aten node names, in graph order
    fx: list                    # captured FX node names
    lines: list                 # UserFrame: the innermost user frame of each, deduplicated
    stacks: list                # per line, the nearest calls that led to it (outermost first)

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "kind": self.kind, "op": self.op, "aten": self.aten, "fx": self.fx,
                "lines": [dataclasses.asdict(f) for f in self.lines],
                "stacks": [[dataclasses.asdict(f) for f in s] for s in self.stacks]}

    def comment(self) -> str:
        """One line for the output code: what the kernel fuses and the user's lines."""
        what = ", ".join(self.fx) or ", ".join(self.aten) or "?"
        where = ", ".join(f"{_short(f.file)}:{f.line}" for f in self.lines[:4])
        more = f" (+{len(self.lines) - 4})" if len(self.lines) > 4 else ""
        return f"# {self.kernel}: {what}" + (f" <- {where}{more}" if where else "")


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _aten_names(step) -> list:
    sources = [step.origins] if isinstance(step, ExternKernel) else [m.buf.origins for m in step.members]
    return [n for n in dict.fromkeys(n for origins in sources for n in origins) if n != "output"]


def kernel_origins(gm, steps) -> list[KernelOrigin]:
    """A KernelOrigin for each step of the schedule, in schedule order."""
    nodes = {n.name: n for n in gm.graph.nodes}
    out = []
    for step in steps:
        aten = _aten_names(step)
        fx: dict = {}          # dicts as ordered sets: an optimizer's kernels fuse thousands of nodes
        lines: dict = {}       # the innermost user frame -> the calls that led to it
        for name in aten:
            node = nodes.get(name)
            if node is None:
                continue
            fx.update(dict.fromkeys(node.meta.get("fx_origins", ())))
            # a node stands for the repeated calls merged into it too (aot/cse.py)
            for frames in [user_frames(node)] + [frames_of(t) for t in node.meta.get("merged_stack_traces", ())]:
                if frames and frames[-1] not in lines:
                    lines[frames[-1]] = list(frames[-1 - STACK_FRAMES:-1])
        extern = isinstance(step, ExternKernel)
        op = f"{step.op.namespace}.{step.op._opname}.{step.op._overloadname}" if extern else ""
        out.append(KernelOrigin(step.name, "extern" if extern else "fused", op, aten, list(fx), list(lines),
                                list(lines.values())))
    return out
