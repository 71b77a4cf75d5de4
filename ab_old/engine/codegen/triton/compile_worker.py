"""Compiling Triton kernels in worker processes.

Triton's front end and its MLIR/LLVM passes hold the GIL, so kernels compiled on threads
run one after another. A worker here is a separate Python process that imports only
triton: the launching process computes a kernel's specialization (what Triton's JIT would
compile for these arguments), a worker compiles it and sends back the binary and the
metadata a launch needs, and the launching process loads that binary (cuda_launch) without
Triton's JIT compiling anything.

This file is both sides. The worker runs it by path (`python -c _BOOT this_file arch`), so
at the top it imports only the standard library: never `engine` (which imports torch)."""

from __future__ import annotations

import importlib.util
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future

# the metadata fields a launch needs (cuda_launch.KernelBinary)
METADATA = ("shared", "num_warps", "num_ctas", "global_scratch_size", "profile_scratch_size",
            "launch_cooperative_grid", "launch_pdl", "tensordesc_meta")
# (the working directory leaves sys.path: a folder named triton there must not shadow Triton)
_BOOT = ("import sys, importlib.util as u; sys.path = [p for p in sys.path if p not in ('', '.')]; "
         "s = u.spec_from_file_location('engine_triton_compile_worker', sys.argv[1]); "
         "m = u.module_from_spec(s); s.loader.exec_module(m); m.serve(sys.argv[2])")
_RESTARTS = 3           # a worker process that dies is started again this often, then its jobs fail


class CompileFailed(Exception):
    """A worker could not compile the kernel (the launch then compiles it with Triton's JIT,
    which raises the real error if there is one)."""


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _recv(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("compile worker closed its pipe")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("compile worker closed its pipe")
    return pickle.loads(data)


# -- the worker process -------------------------------------------------------------------
_kernel_modules: dict = {}


def _kernel_module(path: str):
    """A kernel module written by launcher.load_module (it imports only triton)."""
    mod = _kernel_modules.get(path)
    if mod is None:
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod           # triton resolves a kernel's globals through its module
        spec.loader.exec_module(mod)
        _kernel_modules[path] = mod
    return mod


def compile_job(job: dict) -> dict:
    """Compile one kernel as Triton's JIT would (the same ASTSource and options) for the
    target given; returns the binary and its launch metadata."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if job.get("cache_dir"):     # Triton's cache directory as the launching process has it now
        os.environ["TRITON_CACHE_DIR"] = job["cache_dir"]
    fn = getattr(_kernel_module(job["path"]), job["fn"])
    src = ASTSource(fn, job["signature"], job["constexprs"], job["attrs"])
    compiled = triton.compile(src, target=GPUTarget(*job["target"]), options=job["options"])
    md = compiled.metadata._asdict()
    return {"name": compiled.name, "binary": compiled.kernel, "metadata": {k: md.get(k) for k in METADATA}}


def _warm_up(arch: int) -> None:
    """Compile a tiny kernel, so the first real job does not pay for loading Triton's
    MLIR/LLVM and running ptxas for the first time (~0.3 s)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def _increment(x, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + i, tl.load(x + i, i < n) + 1, i < n)

    triton.compile(ASTSource(_increment, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {(2,): 128}),
                   target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})


def serve(arch: str) -> None:
    """The worker's loop: a job in on stdin, its result (or error text) out. Anything else
    written to stdout goes to stderr, so it cannot corrupt the replies. Ctrl-C is the
    launching process's to handle: a worker ends when its stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    try:
        _warm_up(int(arch))
    except Exception:          # only an optimization; a real job reports a real problem
        pass
    _send(replies, {"ready": True})
    while True:
        try:
            job = _recv(requests)
        except EOFError:       # the launching process is gone or closed the pool
            return
        try:
            reply = {"ok": True, "result": compile_job(job)}
        except Exception as exc:       # reported to the launching process; the worker goes on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        _send(replies, reply)


# -- the launching process ----------------------------------------------------------------
class WorkerPool:
    """`size` worker processes, each fed by a thread of this process that waits on its
    pipes (outside the GIL). submit(job) returns a Future of compile_job's result."""

    def __init__(self, size: int, arch: int):
        self.arch = arch
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.ready = threading.Event()          # set when the first worker has warmed up
        self.threads = [threading.Thread(target=self._feed, name=f"triton-compile-worker-{i}", daemon=True)
                        for i in range(size)]
        for t in self.threads:
            t.start()

    def submit(self, job: dict) -> Future:
        fut: Future = Future()
        self.jobs.put((fut, job))
        return fut

    def _start(self):
        """A worker process, once it is ready (None if it died starting)."""
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, os.path.abspath(__file__), str(self.arch)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        try:
            _recv(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            proc.kill()
            return None
        self.ready.set()
        return proc

    def _feed(self) -> None:
        proc, restarts = self._start(), 0
        while True:
            fut, job = self.jobs.get()
            if fut is None:                      # close()
                break
            if not fut.set_running_or_notify_cancel():
                continue
            if proc is None:
                fut.set_exception(CompileFailed("the compile worker died"))
                continue
            try:
                _send(proc.stdin, job)
                reply = _recv(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                fut.set_exception(CompileFailed(f"the compile worker died: {exc}"))
                proc.kill()
                restarts += 1
                proc = self._start() if restarts <= _RESTARTS else None
                continue
            if reply["ok"]:
                fut.set_result(reply["result"])
            else:
                fut.set_exception(CompileFailed(reply["error"]))
        if proc is not None:
            proc.stdin.close()
            proc.wait()

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put((None, None))
        for t in self.threads:
            t.join()


_pools: dict = {}
_lock = threading.Lock()


def pool(size: int, arch: int) -> WorkerPool | None:
    """The process's pool for this GPU architecture, started on first use; None when
    `size` is 0 (compile on threads instead)."""
    if size <= 0:
        return None
    with _lock:
        if arch not in _pools:
            _pools[arch] = WorkerPool(size, arch)
        return _pools[arch]
