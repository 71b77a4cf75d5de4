"""Which collectives a compile runs, read from its trace: ops of the graph
(`torch.ops._c10d_functional.all_reduce`, ...) and graph breaks at a collective call
(`dist.all_reduce` in user code). Ranks whose sequences differ wait on each other forever;
`--all-ranks-html` compares these sequences per compile."""

from __future__ import annotations

import re

# a collective's name after a namespace that only collectives live in
_IN_GRAPH = re.compile(r"(?:_c10d_functional|c10d_functional|_c10d|c10d|funcol|_functional_collectives|"
                       r"distributed\.nn\.functional)\.([a-z_]+)")
# a break's reason (`... torch.distributed.all_reduce ...`) or its source line (`dist.all_reduce(t)`)
_IN_BREAK = re.compile(r"\b(?:torch\.distributed|dist|funcol)\.(?:\w+\.)*?([a-z_]+)\b")
_COLLECTIVE = re.compile(r"^(all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|reduce|gather|scatter|"
                         r"barrier|monitored_barrier|send|recv|isend|irecv|batch_isend_irecv|permute_tensor)"
                         r"(_[a-z_]+)?$")
_NOT_OPS = ("wait_tensor", "default")


def _is_collective(name: str) -> bool:
    return bool(_COLLECTIVE.match(name)) and name not in _NOT_OPS


def in_graph(graph_text: str) -> list[str]:
    """Collective ops of a graph, in graph order (each call once: `x = ...all_reduce(...)`)."""
    out = []
    for line in graph_text.splitlines():
        for m in _IN_GRAPH.finditer(line):
            if _is_collective(m.group(1)):
                out.append(m.group(1))
                break
    return out


def in_break(reason: str, code: str = "") -> list[str]:
    """The collective a graph break's reason or source line names (empty when none)."""
    for m in _IN_BREAK.finditer(reason + "\n" + code):
        if _is_collective(m.group(1)):
            return [m.group(1)]
    return []
