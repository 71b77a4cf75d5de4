"""Why the kernel cache missed: each compiled library in the cache directory has a
manifest beside it (what went into it: the graph's code, its inputs' dtypes, shapes and
strides, the codegen config knobs, the versions of torch, Triton, the engine, the C++
compiler and its flags, the CPU). On a miss, the manifest of the graph being compiled is
compared with every manifest in the cache and the closest one names the difference, in
the manner of JAX's explain_cache_misses:

    kernel cache miss for graph 5f0c... (kernels cpp_fused_mul_relu_0): closest entry differs in
      input 0: dtype torch.float32 -> torch.float64

The result of each load (hit, miss or bypass) goes to the trace as the artifacts
`kernel_cache_hit` / `kernel_cache_miss` / `kernel_cache_bypass` (JSON) and to
TORCH_LOGS=cache as one line.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import logging
import os
import platform
import re
from typing import Optional

import observe

from engine import config

# The knobs that change what the code generator emits or how it is compiled.
CODEGEN_KNOBS = ("cpp_extra_flags", "max_autotune", "triton_interpret", "inject_relu_bug_TESTING_ONLY")
MAX_MANIFESTS = 2000     # the newest ones compared on a miss: bounds the cost in a big shared cache


@dataclasses.dataclass
class Manifest:
    key: str                        # the library's cache key
    graph_key: str
    graph_code: str                 # the FX graph's code; on disk in <key>.code beside the manifest
    inputs: list                    # [dtype, shape, stride] (or a type name) per graph input
    config: dict                    # CODEGEN_KNOBS -> value
    versions: dict                  # torch, triton, engine, python
    compiler: str
    flags: str
    cpu: str
    source: str                     # hash of the generated C++
    kernels: list
    compile_s: float = 0.0
    graph_hash: str = ""            # of graph_code: what a miss compares (the code is read only for the closest)

    def __post_init__(self):
        if not self.graph_hash and self.graph_code:
            self.graph_hash = hashlib.sha256(self.graph_code.encode()).hexdigest()[:16]


@dataclasses.dataclass
class GraphDescription:
    graph_code: str
    inputs: list


_graphs: dict[str, GraphDescription] = {}
_GRAPHS_KEPT = 64


def describe_graph(graph_key: str, gm, example_inputs) -> None:
    """Called by compile_fx before the wrapper loads its library: what the graph is."""
    import torch

    inputs = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            inputs.append([str(x.dtype), [str(s) for s in x.shape], [str(s) for s in x.stride()]])
        else:
            inputs.append(type(x).__name__)
    _graphs.pop(graph_key, None)
    _graphs[graph_key] = GraphDescription(gm.code, inputs)
    while len(_graphs) > _GRAPHS_KEPT:   # only the graphs whose libraries are being loaded now matter
        del _graphs[next(iter(_graphs))]


@functools.lru_cache(None)
def versions() -> dict:
    import sys

    import torch
    try:   # the installed distribution's version: importing triton would cost ~0.1 s on a CPU-only run
        from importlib import metadata
        triton_version = metadata.version("triton")
    except Exception:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version, "engine": engine_version(),
            "python": platform.python_version() + (" (debug)" if hasattr(sys, "gettotalrefcount") else "")}


@functools.lru_cache(None)
def engine_version() -> str:
    """The code generator's own code: a change to it is a new engine as far as the cache goes."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        with open(path, "rb") as f:
            h.update(f.read())
    return "codegen " + h.hexdigest()[:12]


def knobs() -> dict:
    return {k: getattr(config, k, None) for k in CODEGEN_KNOBS}


def manifest_for(key: str, graph_key: str, parts: dict, source: str) -> Manifest:
    graph = _graphs.get(graph_key)
    return Manifest(key=key, graph_key=graph_key, graph_code=graph.graph_code if graph else "",
                    inputs=graph.inputs if graph else [], config=knobs(), versions=versions(),
                    compiler=parts["compiler"], flags=parts["flags"], cpu=parts["cpu"], source=parts["source"],
                    kernels=kernel_names(source))


def kernel_names(source: str) -> list[str]:
    return re.findall(r'extern "C" void (\w+)\(', source)


# ---------------------------------------------------------------------- the manifests on disk


def _manifest_path(root: str, key: str) -> str:
    return os.path.join(root, "manifests", f"{key}.json")


def write_manifest(root: str, m: Manifest) -> None:
    """<key>.json (small: read for every entry on a miss) and <key>.code (the graph's code)."""
    path = _manifest_path(root, m.key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for target, text in ((path[:-len(".json")] + ".code", m.graph_code),
                         (path, json.dumps({**dataclasses.asdict(m), "graph_code": ""}))):
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, target)


def read_manifest(root: str, key: str) -> Optional[Manifest]:
    try:
        with open(_manifest_path(root, key)) as f:
            return Manifest(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _read_code(root: str, key: str) -> str:
    try:
        with open(_manifest_path(root, key)[:-len(".json")] + ".code") as f:
            return f.read()
    except OSError:
        return ""


def _all_manifests(root: str) -> list[Manifest]:
    paths = glob.glob(os.path.join(root, "manifests", "*.json"))
    paths.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)
    out = []
    for p in paths[:MAX_MANIFESTS]:
        try:
            with open(p) as f:
                out.append(Manifest(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue   # written by another version, or half-written by a crashed process
    return out


# ---------------------------------------------------------------------- the difference


def differences(now: Manifest, then: Manifest) -> list[str]:
    """What differs, the causes first: versions and machine, config knobs, the graph's
    code, its inputs; the generated source or compiler flags only when nothing above
    explains them."""
    out = []
    for k in sorted(set(now.versions) | set(then.versions)):
        if now.versions.get(k) != then.versions.get(k):
            out.append(f"{k} version: {then.versions.get(k)} -> {now.versions.get(k)}")
    for k, label in (("compiler", "C++ compiler"), ("cpu", "CPU")):
        if getattr(now, k) != getattr(then, k):
            out.append(f"{label}: {getattr(then, k)} -> {getattr(now, k)}")
    for k in sorted(set(now.config) | set(then.config)):
        if now.config.get(k) != then.config.get(k):
            out.append(f"config {k}: {then.config.get(k)!r} -> {now.config.get(k)!r}")
    if now.graph_hash != then.graph_hash:
        out.append("the graph's code: " + (_first_changed_line(then.graph_code, now.graph_code)
                                           if then.graph_code and now.graph_code else "differs"))
    if len(now.inputs) != len(then.inputs):
        out.append(f"number of graph inputs: {len(then.inputs)} -> {len(now.inputs)}")
    else:
        for i, (a, b) in enumerate(zip(then.inputs, now.inputs)):
            if a == b:
                continue
            if isinstance(a, list) and isinstance(b, list):
                for j, what in enumerate(("dtype", "shape", "stride")):
                    if a[j] != b[j]:
                        fmt = (lambda v: v) if j == 0 else (lambda v: "(" + ", ".join(v) + ")")
                        out.append(f"input {i}: {what} {fmt(a[j])} -> {fmt(b[j])}")
            else:
                out.append(f"input {i}: {a} -> {b}")
    if not out and now.flags != then.flags:
        out.append(f"compiler flags: {then.flags} -> {now.flags}")
    if not out and now.source != then.source:
        out.append("the generated source (same graph, inputs, knobs and versions: the code generator "
                   "did not emit the same code twice)")
    return out


def _first_changed_line(a: str, b: str) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1}: {x.strip()!r} -> {y.strip()!r}"
    return f"{len(la)} -> {len(lb)} lines"


def explain_miss(root: str, now: Manifest) -> tuple[list[str], Optional[str]]:
    """(the differences against the closest manifest in the cache, its key); a one-line
    reason when there is nothing to compare with."""
    best, best_diff = None, None
    manifests = _all_manifests(root)
    for m in manifests:
        if m.key == now.key:
            continue
        diff = differences(now, m)
        # the same graph code first, then the fewest differences
        rank = (m.graph_hash != now.graph_hash, len(diff))
        if best is None or rank < best[0]:
            best, best_diff = (rank, m), diff
    if best is None:
        return ["the cache has no entry yet (a cold start)"], None
    if best[1].graph_hash != now.graph_hash:   # say which line: read the closest entry's code
        best[1].graph_code = _read_code(root, best[1].key)
        best_diff = differences(now, best[1])
        best_diff = [f"no entry for this graph's code among the {len(manifests)} in the cache; "
                     f"closest: graph {best[1].graph_key}"] + best_diff
    return best_diff or ["same key parts as an existing entry, but its library is missing"], best[1].key


# ---------------------------------------------------------------------- reporting


def report(status: str, graph_key: str, key: Optional[str], kernels: list, reasons: list[str],
           compile_s: Optional[float] = None, saved_s: Optional[float] = None, closest: Optional[str] = None) -> None:
    """One load's result: the trace artifact kernel_cache_<status> and a TORCH_LOGS=cache line."""
    payload = {"graph": graph_key, "key": key, "kernels": kernels, "reasons": reasons}
    if compile_s is not None:
        payload["compile_s"] = round(compile_s, 6)
    if saved_s is not None:
        payload["saved_s"] = round(saved_s, 6)
    if closest is not None:
        payload["closest"] = closest
    observe.emit("artifact", {"name": f"kernel_cache_{status}", "encoding": "json"}, lambda: json.dumps(payload))
    what = f"kernel cache {status} for graph {graph_key}"
    if kernels:
        what += f" ({len(kernels)} kernel{'s' if len(kernels) != 1 else ''}: {', '.join(kernels[:6])}" \
                f"{', ...' if len(kernels) > 6 else ''})"
    if saved_s is not None:
        what += f", saved {saved_s:.3f} s of compiling"
    if reasons:
        if status == "miss" and closest is not None:
            what += ": the closest entry in the cache differs in\n" + "\n".join("  " + r for r in reasons)
        else:
            what += ": " + "; ".join(reasons)
    observe.log("cache", logging.INFO, "%s", what)
