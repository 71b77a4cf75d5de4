"""Building a C++ extension against torch's headers (the system C++ compiler, about 10-25 s)
into a directory once per machine, Python and torch, and importing it. Shared by the C++
guard checker (engine/guards/native.py) and the kernel launcher (engine/codegen/triton/
native_launch.py); each builds on a background thread and stays Python until it is ready."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import threading

import torch


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
