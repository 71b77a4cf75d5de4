"""Where a call's peak GPU memory goes: the tensors alive at its highest point, grouped by
the line that allocated them (a line of a generated wrapper, of the user's model, of torch).

Used by `zoo_gpu.py --memory`: one call recorded with torch's allocator history after the
warm-up, its trace replayed to find the peak, and the live blocks at that moment summed by
their allocating line."""

from __future__ import annotations

import linecache
import os

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)


def _site(frames) -> str:
    """The innermost frame outside torch itself: the code that asked for the memory."""
    for fr in frames or ():
        path = fr.get("filename", "")
        generated = path.startswith("<engine codegen")
        if not path or path.startswith(_TORCH_DIR) or (path.startswith("<") and not generated) \
                or "memory_peak" in path:
            continue
        line = linecache.getline(path, fr.get("line", 0)).strip()
        return f"{os.path.basename(path)}:{fr.get('line')} {line[:110]}"
    return "(torch internals)"


def peak_sites(call, top: int = 12) -> dict:
    """Run call() once under allocator history; the peak's bytes and its biggest sites."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        call()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][torch.cuda.current_device()]
    live, cur, peak, at_peak = {}, 0, 0, {}
    for ev in trace:
        action, addr, size = ev["action"], ev["addr"], ev["size"]
        if action == "alloc":
            live[addr] = (size, ev.get("frames"))
            cur += size
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif action == "free_completed":   # a block from before the call counts in `base`
            cur -= live.pop(addr)[0] if addr in live else size
    sites: dict = {}
    for size, frames in at_peak.values():
        s = _site(frames)
        n, b = sites.get(s, (0, 0))
        sites[s] = (n + 1, b + size)
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][1])[:top]
    return {"before_gib": base / 2**30, "call_peak_gib": (base + peak) / 2**30,
            "sites": [[s, n, round(b / 2**20, 1)] for s, (n, b) in ranked]}
