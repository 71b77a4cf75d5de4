"""Tensor guards checked in C++: one call checks every TENSOR_MATCH of a cache entry.

A tensor guard in generated Python reads six properties (type, dtype, device,
requires_grad, sizes, strides), each through an attribute or method call that builds a
Python object: about 0.4 us a tensor on the CPU machines, and a ResNet-50 or BERT-base
forward guards 200-300 of them on every call, before its first kernel starts. Here the
expected properties are unpacked once into C++ structs, and each call reads them off the
TensorImpl: tens of nanoseconds a tensor.

The extension is built once per machine, Python and torch (the system C++ compiler against
torch's headers, about 10-25 s) on a background thread, into `engine.config.native_dir`.
Until it is ready (or where it cannot be built) the guards stay Python, with the same
meaning; guards compiled before it was ready switch to it when it is."""

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
from typing import Optional

import torch

import observe

_SOURCE = r"""
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/pybind11.h>
#include <vector>

namespace py = pybind11;

struct Spec {
  PyTypeObject* type;
  c10::ScalarType dtype;
  c10::DeviceType device_type;
  int device_index;               // -1: any index
  bool requires_grad;
  std::vector<int64_t> sizes;     // -1: not checked (a symbolic size, related by other guards)
  std::vector<int64_t> strides;
};

static std::vector<int64_t> dims(py::list xs) {
  std::vector<int64_t> out;
  for (auto x : xs) out.push_back(x.is_none() ? -1 : x.cast<int64_t>());
  return out;
}

class TensorSpecs {
 public:
  // specs: (type, a tensor of the dtype, device type string, device index, requires_grad, sizes, strides)
  explicit TensorSpecs(py::list specs) {
    for (auto item : specs) {
      py::tuple s = item.cast<py::tuple>();
      Spec spec;
      spec.type = reinterpret_cast<PyTypeObject*>(s[0].ptr());
      types_.push_back(py::reinterpret_borrow<py::object>(s[0]));
      spec.dtype = THPVariable_Unpack(s[1].ptr()).scalar_type();
      spec.device_type = c10::Device(s[2].cast<std::string>()).type();
      spec.device_index = s[3].cast<int>();
      spec.requires_grad = s[4].cast<bool>();
      spec.sizes = dims(s[5].cast<py::list>());
      spec.strides = dims(s[6].cast<py::list>());
      specs_.push_back(std::move(spec));
    }
  }

  bool check(py::tuple tensors) const {
    if (tensors.size() != specs_.size()) return false;
    for (size_t i = 0; i < specs_.size(); i++) {
      PyObject* o = PyTuple_GET_ITEM(tensors.ptr(), i);
      const Spec& s = specs_[i];
      if (Py_TYPE(o) != s.type) return false;     // the exact type, as `type(t) is T`
      const at::Tensor& t = THPVariable_Unpack(o);
      if (t.scalar_type() != s.dtype || t.requires_grad() != s.requires_grad) return false;
      const c10::Device d = t.device();
      if (d.type() != s.device_type || (s.device_index >= 0 && d.index() != s.device_index)) return false;
      if (t.layout() != c10::kStrided) return false;
      const auto sizes = t.sizes();
      if (sizes.size() != s.sizes.size()) return false;
      const auto strides = t.strides();
      for (size_t k = 0; k < s.sizes.size(); k++) {
        if ((s.sizes[k] >= 0 && sizes[k] != s.sizes[k]) || (s.strides[k] >= 0 && strides[k] != s.strides[k]))
          return false;
      }
    }
    return true;
  }

 private:
  std::vector<Spec> specs_;
  std::vector<py::object> types_;   // keeps the type objects alive
};

PYBIND11_MODULE(engine_tensor_guards, m) {
  py::class_<TensorSpecs>(m, "TensorSpecs")
      .def(py::init<py::list>())
      .def("__call__", &TensorSpecs::check);
}
"""

_state: dict = {"module": None, "thread": None, "failed": None}
_lock = threading.Lock()
_waiting = weakref.WeakSet()      # CompiledGuards compiled in Python that switch when it is ready
_ready = threading.Event()


def _tag() -> str:
    key = _SOURCE + sys.version + torch.__version__ + str(torch._C._GLIBCXX_USE_CXX11_ABI)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _build(directory: str):
    from torch.utils.cpp_extension import include_paths, library_paths
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = _tag()
    path = os.path.join(directory, f"engine_tensor_guards_{tag}{suffix}")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        mine = f"{os.getpid()}.{threading.get_ident()}"     # processes may build side by side
        src = os.path.join(directory, f"engine_tensor_guards_{tag}.{mine}.cpp")
        with open(src, "w") as f:
            f.write(_SOURCE)
        tmp = f"{path}.{mine}.tmp"
        cxx = os.environ.get("CXX", "c++")
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               f"-I{sysconfig.get_paths()['include']}", *(f"-I{p}" for p in include_paths()), src, "-o", tmp,
               *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:] or f"{cxx} exited with {proc.returncode}")
            os.replace(tmp, path)
        finally:
            os.remove(src)
    loader = importlib.machinery.ExtensionFileLoader("engine_tensor_guards", path)
    spec = importlib.util.spec_from_file_location("engine_tensor_guards", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _build_in_background(directory: str) -> None:
    try:
        mod = _build(directory)
    except Exception as exc:     # no compiler, no headers: the guards stay Python
        _state["failed"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        observe.log("dynamo", logging.INFO, "tensor guards stay Python: the C++ checker did not build: %s",
                    _state["failed"])
        _ready.set()
        return
    with _lock:
        _state["module"] = mod
        waiting = list(_waiting)
        _waiting.clear()
    for compiled in waiting:
        compiled.use_native()
    _ready.set()


def _start() -> bool:
    """Start the build if it has not started; whether the checker can be had at all."""
    from engine import config
    if not config.native_guards or _state["failed"] is not None:
        return False
    if _state["module"] is None and _state["thread"] is None:
        with _lock:
            if _state["thread"] is None:
                t = threading.Thread(target=_build_in_background, args=(config.native_dir,),
                                     name="engine-native-guards", daemon=True)
                _state["thread"] = t
                t.start()
    return True


def checker(specs: list):
    """A C++ function of a tuple of tensors that says whether each matches its spec, or
    None while the extension is not built (or is turned off)."""
    from engine import config
    mod = _state["module"]
    return mod.TensorSpecs(specs) if mod is not None and config.native_guards else None


def when_ready(compiled) -> None:
    """Switch `compiled` (a CompiledGuards) to the C++ checker now if it is built, else
    when it is (starting the build)."""
    if not _start():
        return
    with _lock:
        if _state["module"] is None:
            _waiting.add(compiled)
            return
    compiled.use_native()


def wait(timeout: Optional[float] = None) -> bool:
    """Block until the build has finished (or failed); True when the checker is available."""
    if _start():
        _ready.wait(timeout)
    return _state["module"] is not None


def build_error() -> Optional[str]:
    """Why the checker did not build (its first line), or None."""
    return _state["failed"]


def spec_of(m) -> tuple:
    """A TensorMeta as the C++ constructor takes it."""
    dev = torch.device(m.device)
    return (m.type, torch.empty(0, dtype=m.dtype, device="meta"), dev.type, -1 if dev.index is None else dev.index,
            bool(m.requires_grad), list(m.sizes), list(m.strides))
