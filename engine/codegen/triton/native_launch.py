"""The per-call work of a compiled CUDA graph's wrapper in C++: repeating a kernel launch
and allocating a buffer, each one C call from the generated Python.

A repeated launch in Python reads each tensor's address through `data_ptr()`, checks its
alignment and writes it into a ctypes slot: about 2 us a launch beside the driver's own
launch on the H200 machine, and a Llama training step launches ~490 kernels.
`torch.empty_strided(sizes, strides, dtype=, device=)` parses its arguments on every call
(~530 allocations a step). Here `Launch(stream, *args)` reads the addresses off the
TensorImpls, checks what the kernel was specialized on and calls cuLaunchKernel; `Alloc()`
calls at::empty_strided with sizes, strides and options unpacked once.

Built like the C++ guard checker (engine/native_build.py: once per machine, on a
background thread, started by the first CUDA graph compiled); until it is ready, or where
it cannot be built, the same work runs as Python, and wrappers loaded before it was ready
switch to it (`when_ready`)."""

from __future__ import annotations

import functools
from typing import Optional

from ...native_build import BackgroundBuild

_SOURCE = r"""
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <memory>
#include <vector>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*error_string_t)(int, const char **);
static launch_t cu_launch = nullptr;
static error_string_t cu_error_string = nullptr;

struct Arg {
  bool tensor;
  bool aligned;         // a tensor: its address was 16-byte aligned when the kernel was specialized
  int slot;             // its parameter slot, -1: none (an integer specialized as a constant)
  long long expected;   // an integer: the value it was launched with
};

struct Plan {
  void *function;
  unsigned gx, gy, block, shared;
  std::vector<Arg> args;
  std::vector<uint64_t> values;     // one 8-byte slot a parameter (narrower integers read its low bytes)
  std::vector<void *> params;       // the slots' addresses, as cuLaunchKernel takes them
};

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Plan *plan;
  PyObject *counter;      // a bytearray of 8: launches made, shared by a kernel's repeats
} Launch;

static PyObject *launch_call(PyObject *self_, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
  Launch *self = (Launch *)self_;
  Plan &plan = *self->plan;
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n != (Py_ssize_t)plan.args.size() + 1) {
    PyErr_SetString(PyExc_TypeError, "Launch(stream, *args): another number of arguments than it was made for");
    return nullptr;
  }
  if (argv[0] == Py_None) Py_RETURN_FALSE;      // another device, or a launch hook: Triton's path
  void *stream = PyLong_AsVoidPtr(argv[0]);
  if (stream == nullptr && PyErr_Occurred()) return nullptr;
  uint64_t *values = plan.values.data();
  for (size_t i = 0; i < plan.args.size(); i++) {
    const Arg &a = plan.args[i];
    PyObject *o = argv[i + 1];
    if (a.tensor) {
      if (!THPVariable_Check(o)) Py_RETURN_FALSE;
      uint64_t p;
      try {
        p = (uint64_t)THPVariable_Unpack(o).const_data_ptr();
      } catch (...) {
        Py_RETURN_FALSE;
      }
      if (a.aligned && (p & 15)) Py_RETURN_FALSE;
      if (a.slot >= 0) values[a.slot] = p;
    } else {
      if (!PyLong_CheckExact(o)) Py_RETURN_FALSE;
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow || v != a.expected) Py_RETURN_FALSE;
    }
  }
  int code = cu_launch(plan.function, plan.gx, plan.gy, 1, plan.block, 1, 1, plan.shared, stream,
                       plan.params.data(), nullptr);
  if (code != 0) {
    const char *msg = nullptr;
    if (cu_error_string != nullptr) cu_error_string(code, &msg);
    PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel: CUDA error %d: %s", code, msg ? msg : "unknown error");
    return nullptr;
  }
  ++*(long long *)PyByteArray_AS_STRING(self->counter);
  Py_RETURN_TRUE;
}

// Launch(function, gx, gy, block, shared, args, values, counter): args one (tensor, aligned, slot,
// expected) an argument of the call after the stream; values the initial slot values (the constant
// integers); counter a bytearray of 8 that each launch adds one to
static PyObject *launch_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
  unsigned long long function;
  unsigned gx, gy, block, shared;
  PyObject *args, *values, *counter;
  if (!PyArg_ParseTuple(a, "KIIIIO!O!O!", &function, &gx, &gy, &block, &shared, &PyList_Type, &args, &PyList_Type,
                        &values, &PyByteArray_Type, &counter))
    return nullptr;
  if (PyByteArray_GET_SIZE(counter) != 8) {
    PyErr_SetString(PyExc_ValueError, "the counter is a bytearray of 8");
    return nullptr;
  }
  if (cu_launch == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "libcuda.so.1 has no cuLaunchKernel here");
    return nullptr;
  }
  auto plan = std::make_unique<Plan>();
  plan->function = (void *)function;
  plan->gx = gx; plan->gy = gy; plan->block = block; plan->shared = shared;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args); i++) {
    Arg arg;
    int tensor, aligned;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(args, i), "ppiL", &tensor, &aligned, &arg.slot, &arg.expected))
      return nullptr;
    arg.tensor = tensor; arg.aligned = aligned;
    plan->args.push_back(arg);
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++)
    plan->values.push_back((uint64_t)PyLong_AsUnsignedLongLongMask(PyList_GET_ITEM(values, i)));
  plan->values.push_back(0);     // the two scratch pointers Triton's kernels take last: null
  plan->values.push_back(0);
  for (auto &v : plan->values) plan->params.push_back(&v);
  if (PyErr_Occurred()) return nullptr;
  Launch *self = (Launch *)type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  self->vectorcall = launch_call;
  self->plan = plan.release();
  Py_INCREF(counter);
  self->counter = counter;
  return (PyObject *)self;
}

static void launch_dealloc(PyObject *self) {
  delete ((Launch *)self)->plan;
  Py_XDECREF(((Launch *)self)->counter);
  Py_TYPE(self)->tp_free(self);
}

struct Layout {
  std::vector<int64_t> sizes, strides;
  at::TensorOptions options;
};

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Layout *layout;
} Alloc;

static PyObject *alloc_call(PyObject *self_, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
  Layout &l = *((Alloc *)self_)->layout;
  try {
    return THPVariable_Wrap(at::empty_strided(l.sizes, l.strides, l.options));
  } catch (const c10::Error &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  }
}

static bool int_list(PyObject *seq, std::vector<int64_t> &out) {
  PyObject *fast = PySequence_Fast(seq, "sizes and strides are sequences of integers");
  if (fast == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++)
    out.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i)));
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

// Alloc(sizes, strides, dtype, device)() -> torch.empty_strided(sizes, strides, dtype=dtype, device=device)
static PyObject *alloc_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
  PyObject *sizes, *strides, *dtype, *device;
  if (!PyArg_ParseTuple(a, "OOO!O!", &sizes, &strides, &THPDtypeType, &dtype, &THPDeviceType, &device))
    return nullptr;
  auto layout = std::make_unique<Layout>();
  if (!int_list(sizes, layout->sizes) || !int_list(strides, layout->strides)) return nullptr;
  layout->options = at::TensorOptions().dtype(((THPDtype *)dtype)->scalar_type).device(((THPDevice *)device)->device);
  Alloc *self = (Alloc *)type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  self->vectorcall = alloc_call;
  self->layout = layout.release();
  return (PyObject *)self;
}

static void alloc_dealloc(PyObject *self) {
  delete ((Alloc *)self)->layout;
  Py_TYPE(self)->tp_free(self);
}

static PyTypeObject LaunchType = {PyVarObject_HEAD_INIT(nullptr, 0)};
static PyTypeObject AllocType = {PyVarObject_HEAD_INIT(nullptr, 0)};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "engine_native_launch", nullptr, -1, nullptr};

// a type whose instances are called through the vectorcall slot at `call_offset`
static bool callable_type(PyTypeObject &t, const char *name, Py_ssize_t size, Py_ssize_t call_offset, newfunc make,
                          destructor dealloc) {
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_vectorcall_offset = call_offset;
  t.tp_call = PyVectorcall_Call;
  t.tp_new = make;
  t.tp_dealloc = dealloc;
  return PyType_Ready(&t) == 0;
}

PyMODINIT_FUNC PyInit_engine_native_launch(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib != nullptr) {
    cu_launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    cu_error_string = (error_string_t)dlsym(lib, "cuGetErrorString");
  }
  if (!callable_type(LaunchType, "engine_native_launch.Launch", sizeof(Launch), offsetof(Launch, vectorcall),
                     launch_new, launch_dealloc) ||
      !callable_type(AllocType, "engine_native_launch.Alloc", sizeof(Alloc), offsetof(Alloc, vectorcall), alloc_new,
                     alloc_dealloc))
    return nullptr;
  PyObject *m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&LaunchType);
  PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType);
  Py_INCREF(&AllocType);
  PyModule_AddObject(m, "Alloc", (PyObject *)&AllocType);
  PyModule_AddObject(m, "has_libcuda", PyBool_FromLong(cu_launch != nullptr));
  return m;
}
"""

def _upgrade(wrapper_module) -> None:
    """Rebind a wrapper module's allocators to C++ ones and drop its Python repeats (the
    next launch of each kernel makes a C++ one)."""
    from .launcher import Launcher
    if module() is None:
        return
    ns = vars(wrapper_module)
    for name, value in list(ns.items()):
        if isinstance(value, functools.partial) and name.startswith("_alloc_"):
            ns[name] = allocator(*value.args, **value.keywords)
        elif isinstance(value, Launcher):
            value.forget_plans()


_BUILD = BackgroundBuild("engine_native_launch", _SOURCE, knob="native_launch", switch=_upgrade, log_name="inductor",
                         fallback="kernel launches and allocations stay Python")


def start() -> bool:
    """Start the build (or the load, where built) if it has not started; whether the
    launcher can be had at all."""
    return _BUILD.start()


def module():
    """The built extension, or None (not built yet, failed, turned off, or no libcuda)."""
    mod = _BUILD.module
    return mod if mod is not None and mod.has_libcuda and _BUILD.enabled() else None


def wait(timeout: Optional[float] = None) -> bool:
    """Block until the build has finished (or failed); True when the launcher is available."""
    _BUILD.wait(timeout)
    return module() is not None


def build_error() -> Optional[str]:
    return _BUILD.failed


def when_ready(wrapper_module) -> None:
    """Switch a wrapper module's allocators and launches to the C++ ones once they are built
    (now, if they are)."""
    _BUILD.when_ready(wrapper_module)


def allocator(sizes: tuple, strides: tuple, dtype, device):
    """f() -> a new tensor of this layout: the C++ Alloc where built, else torch.empty_strided."""
    import torch
    device = torch.device(device)
    mod = module()
    if mod is not None:
        return mod.Alloc(sizes, strides, dtype, device)
    return functools.partial(torch.empty_strided, sizes, strides, dtype=dtype, device=device)
