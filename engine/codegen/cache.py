"""The on-disk kernel cache: a graph's C++ translation unit compiled once into a shared
library, keyed by a hash of the source, the compiler flags, the compiler version and the
CPU. A small index per graph remembers the last key's parts, so a miss says what changed.

The directory is `engine.config.cache_dir` (ENGINE_CACHE_DIR or TORCHINDUCTOR_CACHE_DIR);
unset, each process uses its own temporary directory, removed at exit, so separate runs
(CI jobs) never share compiled code by accident."""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time

import observe

from engine import config

from . import cache_explain

CXX = os.environ.get("CXX", "g++")
# no -fno-trapping-math: g++ 12 then miscompiles masked loads inside `omp simd` reductions
# (tests/test_codegen_fuzz.py seed 201).
# -ffp-contract=off: eager rounds after every op; a product fused into the next subtraction
# (an FMA) made `std` of two equal values 1.5e-18 instead of 0, and std's gradient, which
# is 0 where std is 0, -0.41 (fuzz 423863).
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
         "-ffp-contract=off", "-w"]


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


if _has_avx512():
    # g++ prefers 256-bit vectors by default; 512-bit ones double libmvec's exp/tanh/erf
    # throughput (measured: tanh 1.46 -> 0.70 ms on 4M floats, eager 0.73 ms)
    FLAGS.append("-mprefer-vector-width=512")

_loaded: dict[str, ctypes.CDLL] = {}
_compile_seconds: dict[str, float] = {}   # key -> the seconds g++ took for it (from its manifest)


@functools.lru_cache(None)
def has_vector_math() -> bool:
    """glibc's libmvec (vectorized exp/log/tanh/erf/...) is there to link against."""
    import ctypes.util
    return ctypes.util.find_library("mvec") is not None
_process_dir: str | None = None


class CompileError(RuntimeError):
    pass


def cache_dir() -> str:
    global _process_dir
    if config.cache_dir:
        os.makedirs(config.cache_dir, exist_ok=True)
        return config.cache_dir
    if _process_dir is None:
        _process_dir = tempfile.mkdtemp(prefix=f"engine-codegen-{os.getpid()}-")
        atexit.register(shutil.rmtree, _process_dir, True)
    return _process_dir


@functools.lru_cache(None)
def compiler_version() -> str:
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unavailable"


@functools.lru_cache(None)
def cpu_id() -> str:
    model, flags = platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == platform.machine():
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    return f"{model} (flags {flags})"


def flags() -> list[str]:
    return FLAGS + list(config.cpp_extra_flags)


def key_parts(source: str) -> dict:
    return {
        "source": hashlib.sha256(source.encode()).hexdigest()[:16],
        "flags": " ".join(flags()),
        "compiler": compiler_version(),
        "cpu": cpu_id(),
    }


def load_cpp(source: str, graph_key: str = "adhoc") -> ctypes.CDLL:
    """The shared library for this source: from memory, from the disk cache, or compiled now."""
    parts = key_parts(source)
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    if key in _loaded:
        observe.log("inductor", logging.DEBUG, "kernel cache: in-memory hit %s for graph %s", key, graph_key)
        cache_explain.report("hit", graph_key, key, cache_explain.kernel_names(source),
                             ["loaded earlier in this process"], saved_s=_compile_seconds.get(key))
        return _loaded[key]
    root = cache_dir()
    so_path = os.path.join(root, "kernels", key[:2], f"{key}.so")
    index_path = os.path.join(root, "index", f"{graph_key}.json")
    now = cache_explain.manifest_for(key, graph_key, parts, source)
    if os.path.exists(so_path):
        observe.log("inductor", logging.INFO, "kernel cache hit: %s (graph %s) from %s", key, graph_key, so_path)
        t0 = time.perf_counter()
        lib = ctypes.CDLL(so_path)
        load_s = time.perf_counter() - t0
        previous = cache_explain.read_manifest(root, key)
        compile_s = previous.compile_s if previous is not None else None
        if previous is None:   # a library from before manifests were written: describe it now
            cache_explain.write_manifest(root, now)
        else:
            _compile_seconds[key] = compile_s
        cache_explain.report("hit", graph_key, key, now.kernels, [], compile_s=compile_s,
                             saved_s=max(compile_s - load_s, 0.0) if compile_s else None)
    else:
        observe.log("inductor", logging.INFO, "kernel cache miss: %s (graph %s): %s", key, graph_key,
                    _miss_reason(index_path, parts))
        if config.cache_dir:
            status, (reasons, closest) = "miss", cache_explain.explain_miss(root, now)
        else:
            status, reasons, closest = "bypass", [
                "no cache directory is set (ENGINE_CACHE_DIR or TORCHINDUCTOR_CACHE_DIR): compiled into this "
                "process's temporary directory, removed at exit"], None
        t0 = time.perf_counter()
        with observe.stage("cpp_compile"):
            _compile(source, so_path)
        now.compile_s = _compile_seconds[key] = time.perf_counter() - t0
        cache_explain.write_manifest(root, now)
        cache_explain.report(status, graph_key, key, now.kernels, reasons, compile_s=now.compile_s, closest=closest)
        lib = ctypes.CDLL(so_path)
    _write_index(index_path, parts, key)
    _loaded[key] = lib
    return lib


def _miss_reason(index_path: str, parts: dict) -> str:
    try:
        with open(index_path) as f:
            previous = json.load(f)["parts"]
    except (OSError, ValueError, KeyError):
        return "no previous compile of this graph in the cache"
    changed = [k for k in parts if previous.get(k) != parts[k]]
    if not changed:
        return "same key as before, but the library is missing from the cache"
    return "changed since the last compile of this graph: " + ", ".join(
        f"{k} ({previous.get(k)!r} -> {parts[k]!r})" for k in changed)


def _write_index(index_path: str, parts: dict, key: str) -> None:
    os.makedirs(os.path.dirname(index_path), exist_ok=True)
    tmp = f"{index_path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"key": key, "parts": parts}, f)
    os.replace(tmp, index_path)


def _compile(source: str, so_path: str) -> None:
    os.makedirs(os.path.dirname(so_path), exist_ok=True)
    workdir = tempfile.mkdtemp(dir=os.path.dirname(so_path))
    try:
        cpp = os.path.join(workdir, "kernels.cpp")
        with open(cpp, "w") as f:
            f.write(source)
        out = os.path.join(workdir, "kernels.so")
        libs = ["-lmvec"] if "__attribute__((simd" in source else []
        proc = subprocess.run([CXX, *flags(), cpp, "-o", out, *libs], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"{CXX} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        os.replace(out, so_path)   # atomic: concurrent processes see a whole library or none
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
