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
switch to it (`when_ready`).

`Gemm(bias, out_dtype)(stream, a, b[, bias])` is a matmul of 16-bit matrices through
cuBLASLt directly: the descriptors and the algorithm are chosen at its first call, as
cuBLAS's heuristic picks them for torch.mm, and kept. torch.mm costs 15-18 us of host time
a call on the H200 machines (argument parsing, dispatch, the cuBLAS handle and workspace
look-ups, cuBLAS's own heuristic), and a GPT-2 training step makes 147. It returns None
wherever torch.mm's path must run instead (another layout, dtype or alignment than its
first call's, cuBLAS settings off their defaults, no cuBLASLt in the process): the wrapper
then calls torch.mm. Under CUDA graph capture it is captured as torch.mm's cuBLASLt call
would be, with torch's workspace of the capturing stream."""

from __future__ import annotations

import functools
from typing import Optional

from ...native_build import BackgroundBuild

_SOURCE = r"""
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <algorithm>
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

// ---- Gemm: a matmul through cuBLASLt, planned at its first call -------------------------
// cuBLASLt is not linked: torch has loaded it, and its entry points are looked up by name, as are
// torch's own cuBLASLt handle and workspace (the ones torch.mm uses on the current stream).
typedef int (*lt_desc_create_t)(void **, int, int);
typedef int (*lt_set_t)(void *, int, const void *, size_t);
typedef int (*lt_layout_create_t)(void **, int, uint64_t, uint64_t, int64_t);
typedef int (*lt_create_t)(void **);
typedef int (*lt_destroy_t)(void *);
struct LtHeuristic { uint64_t algo[8]; size_t workspace; int state; float waves; int reserved[4]; };
typedef int (*lt_heuristic_t)(void *, void *, void *, void *, void *, void *, void *, int, LtHeuristic *, int *);
typedef int (*lt_matmul_t)(void *, void *, const void *, const void *, void *, const void *, void *, const void *,
                           const void *, void *, void *, void *, const void *, void *, size_t, void *);

// cublasLt.h's values (stable since CUDA 11)
enum { LT_COMPUTE_32F = 68, LT_R_32F = 0, LT_R_16F = 2, LT_R_16BF = 14, LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4,
       LT_DESC_EPILOGUE = 7, LT_DESC_BIAS_POINTER = 8, LT_EPILOGUE_BIAS = 4, LT_PREF_MAX_WORKSPACE = 1,
       LT_PREF_ALIGN_A = 5, LT_PREF_ALIGN_B = 6, LT_PREF_ALIGN_C = 7, LT_PREF_ALIGN_D = 8 };

static struct {
  bool tried = false, ok = false;
  lt_desc_create_t desc_create;
  lt_set_t desc_set, pref_set;
  lt_layout_create_t layout_create;
  lt_create_t pref_create;
  lt_destroy_t desc_destroy, layout_destroy, pref_destroy;
  lt_heuristic_t heuristic;
  lt_matmul_t matmul;
  void *(*handle)();
  void *(*workspace)();
  size_t (*workspace_size)();
} lt;

static void *loaded(const char *const *names) {
  for (const char *const *n = names; *n != nullptr; n++) {
    void *lib = dlopen(*n, RTLD_NOW | RTLD_NOLOAD);
    if (lib != nullptr) return lib;
  }
  return nullptr;
}

static bool lt_load() {
  if (lt.tried) return lt.ok;
  lt.tried = true;
  static const char *const cublaslt[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11",
                                         "libcublasLt.so", nullptr};
  static const char *const torch_cuda[] = {"libtorch_cuda.so", nullptr};
  void *l = loaded(cublaslt), *t = loaded(torch_cuda);
  if (l == nullptr || t == nullptr) return false;
  lt.desc_create = (lt_desc_create_t)dlsym(l, "cublasLtMatmulDescCreate");
  lt.desc_set = (lt_set_t)dlsym(l, "cublasLtMatmulDescSetAttribute");
  lt.pref_set = (lt_set_t)dlsym(l, "cublasLtMatmulPreferenceSetAttribute");
  lt.layout_create = (lt_layout_create_t)dlsym(l, "cublasLtMatrixLayoutCreate");
  lt.pref_create = (lt_create_t)dlsym(l, "cublasLtMatmulPreferenceCreate");
  lt.desc_destroy = (lt_destroy_t)dlsym(l, "cublasLtMatmulDescDestroy");
  lt.layout_destroy = (lt_destroy_t)dlsym(l, "cublasLtMatrixLayoutDestroy");
  lt.pref_destroy = (lt_destroy_t)dlsym(l, "cublasLtMatmulPreferenceDestroy");
  lt.heuristic = (lt_heuristic_t)dlsym(l, "cublasLtMatmulAlgoGetHeuristic");
  lt.matmul = (lt_matmul_t)dlsym(l, "cublasLtMatmul");
  // at::cuda::getCurrentCUDABlasLtHandle(), getCUDABlasLtWorkspace(), getCUDABlasLtWorkspaceSize()
  lt.handle = (void *(*)())dlsym(t, "_ZN2at4cuda26getCurrentCUDABlasLtHandleEv");
  lt.workspace = (void *(*)())dlsym(t, "_ZN2at4cuda22getCUDABlasLtWorkspaceEv");
  lt.workspace_size = (size_t(*)())dlsym(t, "_ZN2at4cuda26getCUDABlasLtWorkspaceSizeEv");
  lt.ok = lt.desc_create && lt.desc_set && lt.pref_set && lt.layout_create && lt.pref_create && lt.desc_destroy &&
          lt.layout_destroy && lt.pref_destroy && lt.heuristic && lt.matmul && lt.handle && lt.workspace &&
          lt.workspace_size;
  return lt.ok;
}

struct GemmPlan {
  int state = 0;                // 0: first call to come, 1: planned, -1: torch.mm's path always
  bool bias;
  at::ScalarType out_dtype;     // as asked: Undefined for the inputs' dtype
  at::ScalarType dtype, out;    // the inputs' and the result's
  at::Device device = at::Device(at::kCPU);
  int64_t m, n, k, sa0, sa1, sb0, sb1;
  uint64_t align_a, align_b, align_bias;
  void *desc = nullptr, *la = nullptr, *lb = nullptr, *ld = nullptr;
  LtHeuristic chosen;
  at::TensorOptions options;
  ~GemmPlan() {
    if (desc) lt.desc_destroy(desc);
    for (void *l : {la, lb, ld})
      if (l) lt.layout_destroy(l);
  }
};

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  GemmPlan *plan;
} Gemm;

static uint64_t alignment(const void *p) {
  uint64_t a = 256;
  while (a > 2 && ((uint64_t)p % a)) a >>= 1;
  return a;
}

static int lt_type(at::ScalarType t) {
  return t == at::kBFloat16 ? LT_R_16BF : t == at::kHalf ? LT_R_16F : t == at::kFloat ? LT_R_32F : -1;
}

// One row-major operand as cuBLAS's column-major one: (rows, cols, ld, transposed), false if
// neither of its dims is dense.
static bool as_column_major(int64_t r, int64_t c, int64_t s0, int64_t s1, int64_t *rows, int64_t *cols,
                            int64_t *ld, int *trans) {
  if (s1 == 1 && s0 >= std::max<int64_t>(1, c)) {
    *rows = c; *cols = r; *ld = s0; *trans = 0;
    return true;
  }
  if (s0 == 1 && s1 >= std::max<int64_t>(1, r)) {
    *rows = r; *cols = c; *ld = s1; *trans = 1;
    return true;
  }
  return false;
}

// a (m x k) @ b (k x n) [+ bias (n)] as cuBLAS computes it column-major: D^T (n x m) = b^T a^T
static bool gemm_plan(GemmPlan &p, const at::Tensor &a, const at::Tensor &b, const at::Tensor *bias) {
  if (!lt_load() || a.dim() != 2 || b.dim() != 2 || !a.is_cuda() || b.device() != a.device()) return false;
  p.dtype = a.scalar_type();
  if ((p.dtype != at::kBFloat16 && p.dtype != at::kHalf) || b.scalar_type() != p.dtype || a.is_neg() || b.is_neg())
    return false;
  at::ScalarType out = p.out = p.out_dtype == at::ScalarType::Undefined ? p.dtype : p.out_dtype;
  p.device = a.device();
  p.m = a.size(0); p.k = a.size(1); p.n = b.size(1);
  if (b.size(0) != p.k || p.m == 0 || p.n == 0 || p.k == 0) return false;
  p.sa0 = a.stride(0); p.sa1 = a.stride(1); p.sb0 = b.stride(0); p.sb1 = b.stride(1);
  if (bias != nullptr && (bias->dim() != 1 || bias->size(0) != p.n || bias->stride(0) != 1 ||
                          bias->scalar_type() != out || bias->device() != a.device()))
    return false;
  int64_t ar, ac, ald, br, bc, bld;
  int ta, tb;
  if (!as_column_major(p.m, p.k, p.sa0, p.sa1, &ar, &ac, &ald, &ta) ||
      !as_column_major(p.k, p.n, p.sb0, p.sb1, &br, &bc, &bld, &tb))
    return false;
  p.align_a = alignment(a.const_data_ptr());
  p.align_b = alignment(b.const_data_ptr());
  p.align_bias = bias != nullptr ? alignment(bias->const_data_ptr()) : 1;
  uint32_t align_d = 256;       // a fresh tensor from the caching allocator (checked on each call)
  if (lt.desc_create(&p.desc, LT_COMPUTE_32F, LT_R_32F) != 0) return false;
  int32_t op_b = tb, op_a = ta;     // cuBLAS's A is b, its B is a
  lt.desc_set(p.desc, LT_DESC_TRANSA, &op_b, sizeof(op_b));
  lt.desc_set(p.desc, LT_DESC_TRANSB, &op_a, sizeof(op_a));
  if (bias != nullptr) {
    int32_t epilogue = LT_EPILOGUE_BIAS;
    const void *ptr = bias->const_data_ptr();
    lt.desc_set(p.desc, LT_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    lt.desc_set(p.desc, LT_DESC_BIAS_POINTER, &ptr, sizeof(ptr));
  }
  if (lt.layout_create(&p.lb, lt_type(p.dtype), br, bc, bld) != 0 ||
      lt.layout_create(&p.la, lt_type(p.dtype), ar, ac, ald) != 0 ||
      lt.layout_create(&p.ld, lt_type(out), p.n, p.m, p.n) != 0)
    return false;
  void *pref = nullptr;
  if (lt.pref_create(&pref) != 0) return false;
  uint64_t workspace = lt.workspace_size();
  uint32_t aa = p.align_a, ab = p.align_b;
  lt.pref_set(pref, LT_PREF_MAX_WORKSPACE, &workspace, sizeof(workspace));
  lt.pref_set(pref, LT_PREF_ALIGN_A, &ab, sizeof(ab));
  lt.pref_set(pref, LT_PREF_ALIGN_B, &aa, sizeof(aa));
  lt.pref_set(pref, LT_PREF_ALIGN_C, &align_d, sizeof(align_d));
  lt.pref_set(pref, LT_PREF_ALIGN_D, &align_d, sizeof(align_d));
  int found = 0;
  int code = lt.heuristic(lt.handle(), p.desc, p.lb, p.la, p.ld, p.ld, pref, 1, &p.chosen, &found);
  lt.pref_destroy(pref);
  if (code != 0 || found < 1 || p.chosen.state != 0) return false;
  p.options = at::TensorOptions().dtype(out).device(p.device);
  return true;
}

static bool gemm_fits(const GemmPlan &p, const at::Tensor &a, const at::Tensor &b, const at::Tensor *bias) {
  if (a.scalar_type() != p.dtype || b.scalar_type() != p.dtype || a.device() != p.device || b.device() != p.device ||
      a.dim() != 2 || b.dim() != 2 || a.is_neg() || b.is_neg())
    return false;
  if (a.size(0) != p.m || a.size(1) != p.k || b.size(0) != p.k || b.size(1) != p.n || a.stride(0) != p.sa0 ||
      a.stride(1) != p.sa1 || b.stride(0) != p.sb0 || b.stride(1) != p.sb1)
    return false;
  if ((uint64_t)a.const_data_ptr() % p.align_a || (uint64_t)b.const_data_ptr() % p.align_b) return false;
  if (bias != nullptr && (bias->dim() != 1 || bias->size(0) != p.n || bias->stride(0) != 1 ||
                          bias->scalar_type() != p.out || bias->device() != p.device ||
                          (uint64_t)bias->const_data_ptr() % p.align_bias))
    return false;
  if (c10::GradMode::is_enabled() &&
      (a.requires_grad() || b.requires_grad() || (bias != nullptr && bias->requires_grad())))
    return false;
  return true;
}

static PyObject *gemm_call(PyObject *self_, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
  GemmPlan &p = *((Gemm *)self_)->plan;
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n != (p.bias ? 4 : 3)) {
    PyErr_SetString(PyExc_TypeError, "Gemm(stream, a, b[, bias]): another number of arguments than it was made for");
    return nullptr;
  }
  if (argv[0] == Py_None || p.state < 0) Py_RETURN_NONE;
  for (Py_ssize_t i = 1; i < n; i++)     // a subclass keeps its own dispatch: torch.mm's path
    if (!THPVariable_CheckExact(argv[i])) Py_RETURN_NONE;
  void *stream = PyLong_AsVoidPtr(argv[0]);
  if (stream == nullptr && PyErr_Occurred()) return nullptr;
  try {
    const at::Tensor &a = THPVariable_Unpack(argv[1]);
    const at::Tensor &b = THPVariable_Unpack(argv[2]);
    const at::Tensor *bias = p.bias ? &THPVariable_Unpack(argv[3]) : nullptr;
    if (p.state == 0) p.state = gemm_plan(p, a, b, bias) ? 1 : -1;
    if (p.state < 0 || !gemm_fits(p, a, b, bias)) Py_RETURN_NONE;
    // torch's workspace for this stream, as torch.mm's cuBLASLt calls take it (under CUDA graph
    // capture too: the capturing stream's own)
    void *workspace = lt.workspace();
    size_t workspace_size = lt.workspace_size();
    if (p.chosen.workspace > workspace_size) Py_RETURN_NONE;
    at::Tensor d = at::empty({p.m, p.n}, p.options);
    if (bias != nullptr) {
      const void *ptr = bias->const_data_ptr();
      lt.desc_set(p.desc, LT_DESC_BIAS_POINTER, &ptr, sizeof(ptr));
    }
    float alpha = 1.0f, beta = 0.0f;
    void *out = d.data_ptr();
    if ((uint64_t)out % 256) Py_RETURN_NONE;     // another allocator than the caching one's blocks
    int code = lt.matmul(lt.handle(), p.desc, &alpha, b.const_data_ptr(), p.lb, a.const_data_ptr(), p.la, &beta, out,
                         p.ld, out, p.ld, p.chosen.algo, workspace, workspace_size, stream);
    if (code != 0) {      // refused before launching anything: torch.mm's path, from now on
      p.state = -1;
      Py_RETURN_NONE;
    }
    return THPVariable_Wrap(std::move(d));
  } catch (const c10::Error &e) {
    Py_RETURN_NONE;
  }
}

// Gemm(bias, out_dtype or None)
static PyObject *gemm_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
  int bias;
  PyObject *out_dtype;
  if (!PyArg_ParseTuple(a, "pO", &bias, &out_dtype)) return nullptr;
  if (out_dtype != Py_None && !THPDtype_Check(out_dtype)) {
    PyErr_SetString(PyExc_TypeError, "out_dtype is a torch.dtype or None");
    return nullptr;
  }
  auto plan = std::make_unique<GemmPlan>();
  plan->bias = bias;
  plan->out_dtype = out_dtype == Py_None ? at::ScalarType::Undefined : ((THPDtype *)out_dtype)->scalar_type;
  Gemm *self = (Gemm *)type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  self->vectorcall = gemm_call;
  self->plan = plan.release();
  return (PyObject *)self;
}

static void gemm_dealloc(PyObject *self) {
  delete ((Gemm *)self)->plan;
  Py_TYPE(self)->tp_free(self);
}

static PyObject *gemm_state(PyObject *self, void *) { return PyLong_FromLong(((Gemm *)self)->plan->state); }
static PyGetSetDef gemm_getset[] = {{"state", gemm_state, nullptr, "0: not called yet, 1: planned, -1: torch.mm's path", nullptr},
                                    {nullptr}};

static PyTypeObject LaunchType = {PyVarObject_HEAD_INIT(nullptr, 0)};
static PyTypeObject GemmType = {PyVarObject_HEAD_INIT(nullptr, 0)};
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
  GemmType.tp_getset = gemm_getset;
  if (!callable_type(GemmType, "engine_native_launch.Gemm", sizeof(Gemm), offsetof(Gemm, vectorcall), gemm_new,
                     gemm_dealloc))
    return nullptr;
  PyObject *m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&LaunchType);
  PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType);
  Py_INCREF(&AllocType);
  PyModule_AddObject(m, "Alloc", (PyObject *)&AllocType);
  Py_INCREF(&GemmType);
  PyModule_AddObject(m, "Gemm", (PyObject *)&GemmType);
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
        elif isinstance(value, NoGemm):
            ns[name] = gemm(value.bias, value.out_dtype)
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


class NoGemm:
    """Gemm's stand-in until the extension is built (or where it is not): every call takes
    torch.mm's path."""

    def __init__(self, bias: bool, out_dtype=None):
        self.bias, self.out_dtype = bias, out_dtype

    def __call__(self, *args):
        return None


def gemm(bias: bool, out_dtype=None):
    """f(stream, a, b[, bias]) -> a @ b (+ bias) through cuBLASLt directly, or None where
    torch.mm / torch.addmm must run (see Gemm above): the C++ Gemm where built."""
    mod = module()
    return mod.Gemm(bias, out_dtype) if mod is not None else NoGemm(bias, out_dtype)
