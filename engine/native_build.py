"""Building a C++ extension against torch's headers (the system C++ compiler, about 10-25 s)
into a directory once per machine, Python and torch, and importing it. Shared by the C++
guard checker (engine/guards/native.py) and the kernel launcher (engine/codegen/triton/
native_launch.py); each builds on a background thread and stays Python until it is ready."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig
import threading
import weakref

import torch

import observe


def build(name: str, source: str, directory: str, libraries: tuple = ("c10", "torch", "torch_cpu", "torch_python")):
    """Compile `source` (defining the Python module `name`) unless a build of this exact
    source for this Python and torch is in `directory`, then import it. Raises on failure."""
    from torch.utils.cpp_extension import include_paths, library_paths
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = source + sys.version + torch.__version__ + str(torch._C._GLIBCXX_USE_CXX11_ABI)
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = os.path.join(directory, f"{name}_{tag}{suffix}")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        mine = f"{os.getpid()}.{threading.get_ident()}"     # processes may build side by side
        src = os.path.join(directory, f"{name}_{tag}.{mine}.cpp")
        with open(src, "w") as f:
            f.write(source)
        tmp = f"{path}.{mine}.tmp"
        cxx = os.environ.get("CXX", "c++")
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               f"-I{sysconfig.get_paths()['include']}", *(f"-I{p}" for p in include_paths()), src, "-o", tmp,
               *(f"-L{p}" for p in library_paths()), *(f"-l{lib}" for lib in libraries), "-ldl"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:] or f"{cxx} exited with {proc.returncode}")
            os.replace(tmp, path)
        finally:
            os.remove(src)
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class BackgroundBuild:
    """One extension built (or, where built before, loaded) on a background thread, once a
    process, and the objects that wait to switch to it. `knob`: the engine.config switch
    that turns it off; `switch(obj)` moves an object made before the build finished onto
    it; a failed build is logged once (`log_name`, `fallback`: what stays Python)."""

    def __init__(self, name: str, source: str, knob: str, switch, log_name: str, fallback: str):
        self.name, self.source = name, source
        self.knob, self.switch = knob, switch
        self.log_name, self.fallback = log_name, fallback
        self.module = None
        self.failed: str | None = None      # the first line of why it did not build
        self.waiting = weakref.WeakSet()
        self._thread = None
        self._lock = threading.Lock()
        self._ready = threading.Event()

    def _run(self, directory: str) -> None:
        try:
            mod = build(self.name, self.source, directory)
        except Exception as exc:     # no compiler, no headers
            self.failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            observe.log(self.log_name, logging.INFO, "%s: the C++ extension %s did not build: %s", self.fallback,
                        self.name, self.failed)
            self._ready.set()
            return
        with self._lock:
            self.module = mod
            waiting = list(self.waiting)
            self.waiting.clear()
        for obj in waiting:
            self.switch(obj)
        self._ready.set()

    def enabled(self) -> bool:
        from engine import config
        return getattr(config, self.knob)

    def start(self) -> bool:
        """Start the build if it has not started; whether the extension can be had at all."""
        from engine import config
        if not self.enabled() or self.failed is not None:
            return False
        if self.module is None and self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, args=(config.native_dir,),
                                                    name=self.name, daemon=True)
                    self._thread.start()
        return True

    def when_ready(self, obj) -> None:
        """switch(obj) now if the extension is built, else when it is (starting the build)."""
        if not self.start():
            return
        with self._lock:
            if self.module is None:
                self.waiting.add(obj)
                return
        self.switch(obj)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build has finished (or failed); whether the extension is available."""
        if self.start():
            self._ready.wait(timeout)
        return self.module is not None
