"""Run time of the Triton kernels: load a graph's kernel module (a .py file in the cache
directory, so Triton can read each kernel's source), and launch kernels with a config
picked per size (heuristics, or benchmarked once under max-autotune and cached on disk)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import sys

import observe

from .heuristics import Config, Shape, candidates, heuristic

_modules: dict = {}
_executor = []


def _pool():
    if not _executor:
        from concurrent.futures import ThreadPoolExecutor
        _executor.append(ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 2))), thread_name_prefix="triton-compile"))
    return _executor[0]


def _compile_job(fn, args, grid, kw, device):
    # Compilation only: loading the binary into the CUDA context stays on the launching
    # thread (a worker loading modules beside running kernels is a race we do not take).
    return fn.warmup(*args, grid=grid, **kw)


def precompile_graph(fn, args) -> None:
    """Run a wrapper's _precompile; it is only an optimization, so a failure is logged and
    the kernels compile at their first launch instead."""
    try:
        fn(args)
    except Exception as exc:
        observe.log("inductor", logging.DEBUG, "triton precompile skipped: %s: %s", type(exc).__name__, exc)


def wait_precompiled(futures) -> None:
    """Wait for precompile jobs; a failure only means the launch compiles it itself."""
    for f in futures:
        if f is None:
            continue
        try:
            f.result()
        except Exception as exc:
            observe.log("inductor", logging.DEBUG, "triton precompile failed (compiled at launch): %s", exc)


def triton_dir() -> str:
    from ..cache import cache_dir
    d = os.path.join(cache_dir(), "triton")
    os.makedirs(d, exist_ok=True)
    return d


@contextlib.contextmanager
def _interpret_env(interpret: bool):
    """TRITON_INTERPRET is read when @triton.jit decorates; set it only for our module."""
    if not interpret:
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def load_module(source: str, interpret: bool):
    key = hashlib.sha256((source + str(interpret)).encode()).hexdigest()[:24]
    if key in _modules:
        return _modules[key]
    path = os.path.join(triton_dir(), f"k{key}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
        observe.log("inductor", logging.DEBUG, "triton kernels written to %s", path)
    name = f"engine_triton_{key}{'_interp' if interpret else ''}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module       # triton resolves a kernel's globals through its module
    with _interpret_env(interpret):
        spec.loader.exec_module(module)
    _modules[key] = module
    return module


class Launcher:
    """kernel(*tensors_and_sizes, xnumel=..., rnumel=...): launches with the config for
    these sizes, chosen once per (xnumel, rnumel)."""

    def __init__(self, fn, name: str, kind: str, persistent: bool, x_contiguous: bool, autotune: bool,
                 interpret: bool, inplace_args: tuple, source_hash: str):
        self.fn = fn
        self.name = name
        self.kind = kind
        self.persistent = persistent
        self.x_contiguous = x_contiguous
        self.autotune = autotune and not interpret
        self.interpret = interpret
        self.inplace_args = inplace_args       # positions of tensors read and written
        self.source_hash = source_hash
        self.configs: dict = {}

    def shape(self, xnumel: int, rnumel: int) -> Shape:
        return Shape(self.kind, self.persistent, int(xnumel), int(rnumel), self.x_contiguous, self.interpret)

    def config_for(self, args, xnumel, rnumel) -> Config:
        k = (xnumel, rnumel)
        cfg = self.configs.get(k)
        if cfg is None:
            s = self.shape(xnumel, rnumel)
            cfg = self._tuned(s, args) if self.autotune else heuristic(s)
            self.configs[k] = cfg
            observe.log("inductor", logging.DEBUG, "%s: xnumel=%s rnumel=%s -> %s", self.name, xnumel, rnumel, cfg)
        return cfg

    def __call__(self, *args, xnumel, rnumel=1):
        if xnumel == 0 or rnumel == 0 and self.kind == "pointwise":
            return
        cfg = self.config_for(args, xnumel, rnumel)
        self._launch(cfg, args, xnumel)

    def precompile(self, *args, xnumel, rnumel=1):
        """Compile (no launch) the binary the first call will need, on a worker thread:
        Triton's JIT spends most of its time outside the GIL (LLVM, ptxas), so the kernels
        of a graph compile side by side instead of one after another."""
        if self.autotune or self.interpret or xnumel == 0:
            return None
        cfg = self.config_for(args, xnumel, rnumel)
        grid = ((xnumel + cfg.XBLOCK - 1) // cfg.XBLOCK,)
        kw = cfg.kwargs(self.kind == "reduction")
        device = next((a.device.index for a in args if hasattr(a, "device") and a.device.type == "cuda"), None)
        return _pool().submit(_compile_job, self.fn, (*args, xnumel), grid, kw, device)

    def _launch(self, cfg: Config, args, xnumel):
        grid = ((xnumel + cfg.XBLOCK - 1) // cfg.XBLOCK,)
        self.fn[grid](*args, xnumel, **cfg.kwargs(self.kind == "reduction"))

    # -- max-autotune ------------------------------------------------------------------
    def _cache_path(self, s: Shape) -> str:
        import torch
        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        key = hashlib.sha256(f"{self.source_hash}|{self.name}|{s}|{dev}".encode()).hexdigest()[:24]
        d = os.path.join(triton_dir(), "autotune")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, f"{key}.json")

    def _tuned(self, s: Shape, args) -> Config:
        path = self._cache_path(s)
        try:
            with open(path) as f:
                cfg = Config(**json.load(f)["config"])
            observe.log("inductor", logging.INFO, "autotune cache hit for %s: %s", self.name, cfg)
            return cfg
        except (OSError, ValueError, KeyError, TypeError):
            pass
        from triton.testing import do_bench
        bench_args = list(args)
        for i in self.inplace_args:      # the kernel updates these: time it on copies
            bench_args[i] = args[i].clone()
        timings = []
        for cfg in candidates(s):
            try:
                ms = do_bench(lambda c=cfg: self._launch(c, bench_args, s.xnumel), warmup=5, rep=20)
            except Exception as exc:     # a config can exceed shared memory/registers
                observe.log("inductor", logging.DEBUG, "autotune %s: %s failed: %s", self.name, cfg, exc)
                continue
            timings.append((ms, cfg))
        if not timings:
            return heuristic(s)
        timings.sort(key=lambda t: t[0])
        best = timings[0][1]
        observe.log("inductor", logging.INFO, "autotune %s (xnumel=%s rnumel=%s): %s", self.name, s.xnumel,
                    s.rnumel, "; ".join(f"{c}: {ms:.4f} ms" for ms, c in timings))
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"config": {"XBLOCK": best.XBLOCK, "RBLOCK": best.RBLOCK, "num_warps": best.num_warps,
                                  "num_stages": best.num_stages},
                       "timings_ms": [[ms, str(c)] for ms, c in timings]}, f)
        os.replace(tmp, path)
        return best
