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

from engine import config

from . import compile_worker
from .cuda_launch import CudaKernel, KernelBinary
from .cuda_launch import Unsupported as CudaUnsupported
from .heuristics import Config, Shape, candidates, cdiv, heuristic, looped_candidates, worth_timing

_modules: dict = {}
_executor = []


def _threads():
    if not _executor:
        from concurrent.futures import ThreadPoolExecutor
        _executor.append(ThreadPoolExecutor(max(1, min(8, config.usable_cpus)), thread_name_prefix="triton-compile"))
    return _executor[0]


def _warmup_job(fn, args, grid, kw):
    """Compile (no launch) with Triton's JIT on a thread: loading the binary into the CUDA
    context stays on the launching thread (a worker loading modules beside running
    kernels is a race we do not take)."""
    fn.warmup(*args, grid=grid, **kw)


def compile_workers():
    """The worker processes that compile this GPU's kernels (started on the first call:
    compile_fx starts them when a CUDA graph comes in, so they load Triton while it
    lowers), or None when config.triton_compile_workers is 0 or there is no GPU."""
    if config.triton_compile_workers <= 0:
        return None
    try:
        from triton.runtime.driver import driver
        arch = driver.active.get_current_target().arch
    except Exception:
        return None
    return compile_worker.pool(config.triton_compile_workers, arch)


def _device_of(args):
    return next((a.device for a in args if hasattr(a, "device")), None)


_sms: dict = {}


def _sm_count(device) -> int:
    import torch
    if device is None or device.type != "cuda":      # precompile's meta stand-ins: the current GPU
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _sms:
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sms[device]


def precompile_graph(fn, args, early: bool = False) -> None:
    """Run a wrapper's _precompile; it is only an optimization, so a failure is logged and
    the kernels compile at their first launch instead."""
    try:
        with observe.stage("triton_precompile"):
            fn(args, early=early)
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


class DirectLaunch:
    """Launches kernels past Triton's JIT dispatch (binding arguments, computing the
    specialization key, looking up the cache: ~20 us a launch, as much as a small kernel
    runs; a training step launches dozens) and past its C launcher (cuda_launch). Keyed
    by what Triton specializes on: each pointer's 16-byte alignment and each integer's
    ==1, %16 and width. A kernel it cannot launch, or a launch hook (a profiler), takes
    Triton's path."""

    def __init__(self, driver, knobs):
        self.driver = driver
        self.knobs = knobs
        self.kernels: dict = {}
        self.compiling: dict = {}    # key -> (Future of a worker's compile, its signature, arg names)
        self.launched = 0            # launches made here and by the Python repeats
        self.native_launched = bytearray(8)    # ... and by the C++ ones (native_launch.Launch)
        self.from_workers = 0        # kernels loaded from a worker process's binary

    @property
    def hits(self) -> int:
        """Launches made past Triton's dispatch, repeats included."""
        return self.launched + int.from_bytes(self.native_launched, "little")

    @classmethod
    def create(cls):
        try:
            from triton import knobs
            from triton.runtime.driver import driver
            return cls(driver.active, knobs)
        except Exception:        # another Triton: its own dispatch only
            return None

    @staticmethod
    def bind(args) -> tuple:
        """(specialization key, the values a launch passes: tensors as their addresses),
        or (None, None) for arguments only Triton's dispatch takes."""
        key, values = [], []
        for a in args:
            if type(a) is int:
                key.append((a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31))
                values.append(a)
            elif hasattr(a, "data_ptr"):
                ptr = a.data_ptr()
                key.append(ptr % 16 == 0)
                values.append(ptr)
            else:
                return None, None
        return tuple(key), values

    @staticmethod
    def specialization(args) -> tuple:
        return DirectLaunch.bind(args)[0]

    def _hooked(self) -> bool:
        return _hooked(self.knobs.runtime)

    def launch(self, fn, grid, args, kw, cfg):
        """Launch fn our way: the (kernel, specialization, device) it ran with, or None when
        Triton's dispatch must (and has not yet) run it."""
        spec, values = self.bind(args)
        if spec is None or self._hooked():
            return None
        device = self.driver.get_current_device()
        key = self._key(fn, cfg, device, spec)
        kernel = self.kernels.get(key)
        if kernel is None:
            if key in self.kernels:
                return None                  # known to need Triton's launcher
            kernel = self.kernels[key] = self._load(fn, grid, args, kw, device, key)
            if kernel is None:
                return None
        kernel(grid, self.driver.get_current_stream(device), values)
        self.launched += 1
        return kernel, spec, device

    def compile_in(self, workers, fn, args, kw, cfg):
        """Start compiling, in a worker process, the binary a launch of fn with these
        arguments will load; returns the Future, or None when the arguments or this Triton
        do not allow it (the launch then compiles with Triton's JIT)."""
        spec = self.bind(args)[0]
        device = self.driver.get_current_device()
        key = self._key(fn, cfg, device, spec)
        if key in self.compiling:
            return self.compiling[key][0]
        if spec is None or key in self.kernels:
            return None
        try:
            job = self._job(fn, args, kw, device)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:   # another Triton's internals
            observe.log("inductor", logging.DEBUG, "%s compiles in this process: %s", fn, exc)
            return None
        future = workers.submit(job)
        self.compiling[key] = (future, job["signature"], fn.arg_names)
        return future

    @staticmethod
    def _key(fn, cfg, device, spec) -> tuple:
        return id(fn), cfg, device, spec

    def loaded(self, fn, args, cfg) -> bool:
        """Whether the binary for this launch is loaded already."""
        return self._key(fn, cfg, self.driver.get_current_device(), self.bind(args)[0]) in self.kernels

    def _job(self, fn, args, kw, device) -> dict:
        """What Triton's JIT would compile for these arguments: its run() up to the compile."""
        kw = dict(kw, debug=kw.get("debug", fn.debug) or self.knobs.runtime.debug,
                  instrumentation_mode=self.knobs.compilation.instrumentation_mode)
        _cache, _keys, target, backend, binder = fn.device_caches[device]
        bound, specialization, options = binder(*args, **kw)
        options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, specialization, options)
        return {"path": sys.modules[fn.module].__file__, "fn": fn.__name__, "signature": signature,
                "constexprs": constexprs, "attrs": attrs, "options": options.__dict__,
                "target": (target.backend, target.arch, target.warp_size), "cache_dir": self.knobs.cache.dir}

    def _load(self, fn, grid, args, kw, device, key):
        """The binary for these arguments (a worker's, or compiled now by Triton's JIT, or
        found in its cache where a precompile thread put it), loaded on the device."""
        load = self.driver.utils.load_binary
        if key in self.compiling:
            future, signature, arg_names = self.compiling.pop(key)
            try:
                r = future.result()
                kernel = CudaKernel(KernelBinary(r["name"], r["binary"], signature, arg_names, r["metadata"]),
                                    len(args), device, load)
                self.from_workers += 1
                return kernel
            except CudaUnsupported as exc:
                observe.log("inductor", logging.DEBUG, "%s launches through Triton's launcher: %s", fn, exc)
                return None
            except Exception as exc:     # CompileFailed, or a binary that does not load: Triton's JIT
                observe.log("inductor", logging.DEBUG, "%s: the compile worker's binary is not used: %s", fn, exc)
        try:
            compiled = fn.warmup(*args, grid=grid, **kw)
            return CudaKernel(KernelBinary.of(compiled), len(args), device, load)
        except (CudaUnsupported, AttributeError, KeyError, TypeError) as exc:   # or another Triton's internals
            observe.log("inductor", logging.DEBUG, "%s launches through Triton's launcher: %s", fn, exc)
            return None


def _not_yet(*args) -> bool:
    return False


def _hooked(rt) -> bool:
    """A launch hook is installed in Triton's runtime knobs `rt` (Triton 3.6 keeps them in
    chains, empty when none)."""
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
    if type(enter) is type(exit_) and hasattr(enter, "calls"):
        return bool(enter.calls or exit_.calls)
    return any(h is not None and getattr(h, "calls", True) for h in (enter, exit_))


_stream_calls: list = []


def launch_stream(device):
    """The stream a wrapper's repeated launches go to this call: the current CUDA stream of
    `device` (the graph's GPU) when it is the current device and no launch hook (a profiler)
    is on, else None (each launch then takes Triton's path). Asked once a call, not once a
    launch (a Llama training step makes ~490)."""
    if device is None:
        return None
    if not _stream_calls:
        import torch
        try:
            from triton import knobs
            rt = knobs.runtime
        except (ImportError, AttributeError):     # another Triton: its own dispatch only
            rt = None
        _stream_calls.append((torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream, rt))
    get_device, get_stream, rt = _stream_calls[0]
    if rt is None or get_device() != device or _hooked(rt):
        return None
    return get_stream(device)


def gemm_stream(stream):
    """The stream a wrapper's matmuls go to through cuBLASLt directly this call (native_launch's
    Gemm): the launch stream, where torch's cuBLAS settings are the defaults the direct call
    assumes (reduced-precision reductions allowed, fp32 accumulation), else None (torch.mm).
    Deterministic algorithms also leave the matmuls to torch.mm, which checks the cuBLAS
    workspace setting they need."""
    if stream is None:
        return None
    import torch
    m = torch.backends.cuda.matmul
    if not (m.allow_bf16_reduced_precision_reduction and m.allow_fp16_reduced_precision_reduction
            and getattr(m, "allow_bf16_reduced_precision_reduction_split_k", True)
            and getattr(m, "allow_fp16_reduced_precision_reduction_split_k", True)) \
            or getattr(m, "allow_fp16_accumulation", False) or torch.are_deterministic_algorithms_enabled():
        return None
    return stream


def _split_repeater(workspace, stream, partials, combine):
    """A split reduction's two launches repeated with the first call's workspace kept: the
    next call's partials overwrite it only after this call's combine has read it, on the
    same stream (on another stream the launch takes the slow path, with a new workspace)."""
    def repeat(s, *args):
        return s == stream and partials(s, workspace, *args) and combine(s, workspace, *args)
    return repeat


def _capturing() -> bool:
    """A CUDA graph is being captured on this stream: nothing can be timed now."""
    import torch
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class Launcher:
    """kernel(*tensors_and_sizes, xnumel=..., rnumel=...): launches with the config for
    these sizes, chosen once per (xnumel, rnumel)."""

    def __init__(self, fn, name: str, kind: str, persistent: bool, x_contiguous: bool, autotune: bool,
                 interpret: bool, inplace_args: tuple, source_hash: str, split_fn=None, split_slots: int = 0,
                 fixed: Config | None = None, device: int | None = None):
        self.fn = fn
        self.device = device                   # the graph's GPU: launches repeat only there
        self.fixed = fixed                     # a combo kernel's config: its source assumes this XBLOCK
        self.split_fn = split_fn               # a split reduction's first kernel (partials)
        self.split_slots = split_slots         # fp32 partials per row and split
        self.name = name
        self.kind = kind
        self.persistent = persistent
        self.x_contiguous = x_contiguous
        self.autotune = autotune and not interpret and fixed is None
        self.interpret = interpret
        self.inplace_args = inplace_args       # positions of tensors read and written
        self.source_hash = source_hash
        self.configs: dict = {}
        self.direct = None if interpret else DirectLaunch.create()
        self.plans: dict = {}                  # (xnumel, rnumel) -> the last direct launch's repeater
        # the wrapper's first try where the sizes are static: `k.fast(_s, a, b) or k(a, b, xnumel=n)`,
        # _s the call's launch_stream
        self.fast = _not_yet

    def forget_plans(self) -> None:
        """Drop the repeaters: the next launch makes new ones (the C++ ones, once built)."""
        self.plans, self.fast = {}, _not_yet

    def shape(self, xnumel: int, rnumel: int, args=()) -> Shape:
        split = bool(self.split_slots)
        sms = (2 if self.interpret else _sm_count(_device_of(args))) if split else 132
        return Shape(self.kind, self.persistent, int(xnumel), int(rnumel), self.x_contiguous, self.interpret,
                     split, sms)

    def config_for(self, args, xnumel, rnumel) -> Config:
        k = (xnumel, rnumel)
        cfg = self.configs.get(k) or self.fixed
        if cfg is None:
            s = self.shape(xnumel, rnumel, args)
            if self.autotune:
                cfg = self._tuned(s, args)
            elif worth_timing(s) and not _capturing():
                cfg = self._tuned(s, args, looped_candidates(s))
            else:
                cfg = heuristic(s)
            self.configs[k] = cfg
            observe.log("inductor", logging.DEBUG, "%s: xnumel=%s rnumel=%s -> %s", self.name, xnumel, rnumel, cfg)
        return cfg

    def __call__(self, *args, xnumel, rnumel=1):
        if xnumel == 0 or rnumel == 0 and self.kind == "pointwise":
            return
        repeat = self.plans.get((xnumel, rnumel))
        if repeat is not None and repeat(launch_stream(self.device), *args):
            return
        cfg = self.config_for(args, xnumel, rnumel)
        self._launch(cfg, args, xnumel, rnumel)

    def precompile(self, *args, xnumel, rnumel=1, early=False) -> list:
        """Start compiling (no launch) the binaries the first call will need; returns their
        Futures. In worker processes (compile_worker) when there are any: a graph's
        kernels then compile side by side. Else on threads with Triton's JIT, where only
        ptxas runs outside the GIL; but not `early` (at codegen, beside the compiler's own
        work on this thread)."""
        if self.autotune or self.interpret or xnumel == 0:
            return []     # max-autotune compiles its candidates as it times them
        workers = compile_workers() if self.direct is not None else None
        if workers is not None and not workers.ready.is_set():
            workers = None      # still starting (~0.5 s): this process compiles sooner
        s = self.shape(xnumel, rnumel, args)
        if worth_timing(s):
            # the configs the first launch will time, side by side in the workers (without
            # them Triton's JIT compiles each in turn as it is timed)
            if workers is None:
                return []
            configs = looped_candidates(s)
            chosen = self._chosen(s, configs)      # by an earlier run, on disk
            configs = [chosen] if chosen is not None else configs
            return [f for cfg in configs for f in self._compile_in(workers, cfg, args, xnumel, early=True)]
        return self._compile_in(workers, self.config_for(args, xnumel, rnumel), args, xnumel, early)

    def _compile_in(self, workers, cfg: Config, args, xnumel, early) -> list:
        """Start compiling one config's kernels (a split reduction has two): in the workers,
        else on threads unless `early`; their Futures (None: nothing to wait for)."""
        kw = cfg.kwargs(self.kind == "reduction", bool(self.split_slots))
        futures = []
        for fn, grid, a in self._kernels(cfg, args, xnumel):
            a = (*a, xnumel)
            future = self.direct.compile_in(workers, fn, a, kw, cfg) if workers is not None else None
            if future is None and not early and not (self.direct is not None and self.direct.loaded(fn, a, cfg)):
                future = _threads().submit(_warmup_job, fn, a, grid, kw)
            futures.append(future)
        return futures

    def _kernels(self, cfg: Config, args, xnumel):
        """(kernel, grid, args) of one launch: one kernel, or a split reduction's two
        (partials into a workspace, then the combine)."""
        blocks = cdiv(xnumel, cfg.XBLOCK)
        if not self.split_slots:
            return [(self.fn, (blocks,), args)]
        import torch
        ws = torch.empty(self.split_slots * cfg.NSPLIT * xnumel, dtype=torch.float32, device=_device_of(args))
        return [(self.split_fn, (blocks, cfg.NSPLIT), (ws, *args)), (self.fn, (blocks,), (ws, *args))]

    def _launch(self, cfg: Config, args, xnumel, rnumel=1):
        kw = cfg.kwargs(self.kind == "reduction", bool(self.split_slots))
        repeats = []
        for fn, grid, a in self._kernels(cfg, args, xnumel):
            a = (*a, xnumel)
            done = self.direct.launch(fn, grid, a, kw, cfg) if self.direct is not None else None
            if done is None:
                fn[grid](*a, **kw)
            elif not self.autotune:
                kernel, spec, device = done
                repeats.append(kernel.repeater(grid, a, spec, self.direct) if device == self.device else None)
        if not repeats or None in repeats:
            return
        if self.split_slots:
            if len(repeats) != 2:
                return
            repeat = _split_repeater(a[0], self.direct.driver.get_current_stream(device), *repeats)
        else:
            (repeat,) = repeats
        if repeat is not None:    # the next call with these sizes repeats this launch
            self.plans[(xnumel, rnumel)] = self.fast = repeat

    # -- max-autotune ------------------------------------------------------------------
    def _cache_path(self, s: Shape, configs: list | None = None) -> str:
        import torch
        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        among = "" if configs is None else "|" + ";".join(map(str, configs))
        key = hashlib.sha256(f"{self.source_hash}|{self.name}|{s}|{dev}{among}".encode()).hexdigest()[:24]
        d = os.path.join(triton_dir(), "autotune")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, f"{key}.json")

    def _chosen(self, s: Shape, configs: list | None) -> Config | None:
        """The config an earlier timing chose among `configs` (None: max-autotune's), from disk."""
        try:
            with open(self._cache_path(s, configs)) as f:
                return Config(**json.load(f)["config"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _tuned(self, s: Shape, args, configs: list | None = None) -> Config:
        cfg = self._chosen(s, configs)
        if cfg is not None:
            observe.log("inductor", logging.INFO, "autotune cache hit for %s: %s", self.name, cfg)
            return cfg
        path = self._cache_path(s, configs)
        from triton.testing import do_bench
        bench_args = list(args)
        for i in self.inplace_args:      # the kernel updates these: time it on copies
            bench_args[i] = args[i].clone()
        timings = []
        for cfg in candidates(s) if configs is None else configs:
            try:
                ms = do_bench(lambda c=cfg: self._launch(c, bench_args, s.xnumel), warmup=5, rep=20)
            except Exception as exc:     # a config can exceed shared memory/registers
                observe.log("inductor", logging.DEBUG, "autotune %s: %s failed: %s", self.name, cfg, exc)
                continue
            timings.append((ms, cfg))
        self.forget_plans()              # the timed launches' repeaters hold the copies and the last config
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
