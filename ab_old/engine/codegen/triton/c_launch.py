"""cuLaunchKernel called from a small C extension module instead of through ctypes.

ctypes converts each of the driver call's 11 arguments against its argtypes on every
launch: 5.3 us a call on the H100 machine where eager's `torch.mul` takes 7.5 us. This
module's one function takes the 6 values that vary (function, grid, block, shared memory,
stream, the parameter array's address) by METH_FASTCALL. It is compiled once per Python
(the system C compiler and Python's headers; about 0.3 s) into the cache directory; where
that fails, or no libcuda is found, `launcher()` is None and launches go through ctypes."""

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

import observe

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
static launch_t cu_launch = NULL;

/* launch(function, gx, gy, block, shared, stream, params) -> CUresult */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 7) {
        PyErr_SetString(PyExc_TypeError, "launch takes 7 arguments");
        return NULL;
    }
    if (cu_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libcuda.so.1 has no cuLaunchKernel here");
        return NULL;
    }
    void *function = PyLong_AsVoidPtr(args[0]);
    unsigned gx = (unsigned)PyLong_AsUnsignedLong(args[1]);
    unsigned gy = (unsigned)PyLong_AsUnsignedLong(args[2]);
    unsigned block = (unsigned)PyLong_AsUnsignedLong(args[3]);
    unsigned shared = (unsigned)PyLong_AsUnsignedLong(args[4]);
    void *stream = PyLong_AsVoidPtr(args[5]);
    void **params = (void **)PyLong_AsVoidPtr(args[6]);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(cu_launch(function, gx, gy, 1, block, 1, 1, shared, stream, params, NULL));
}

static PyObject *available(PyObject *self, PyObject *unused) { return PyBool_FromLong(cu_launch != NULL); }

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel"},
    {"available", available, METH_NOARGS, "whether libcuda's cuLaunchKernel was found"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "engine_c_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_engine_c_launch(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib != NULL)
        cu_launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    return PyModule_Create(&module);
}
"""

_module: list = []
_lock = threading.Lock()


def build(directory: str):
    """Compile (or find) the extension in `directory` and import it; None on any failure."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256((_SOURCE + sys.version).encode()).hexdigest()[:16]
    path = os.path.join(directory, f"engine_c_launch_{tag}{suffix}")
    try:
        if not os.path.exists(path):
            os.makedirs(directory, exist_ok=True)
            src = os.path.join(directory, f"engine_c_launch_{tag}.c")
            with open(src, "w") as f:
                f.write(_SOURCE)
            tmp = f"{path}.{os.getpid()}.tmp"
            cc = os.environ.get("CC", "cc")
            cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", src, "-o", tmp, "-ldl"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:])
            os.replace(tmp, path)
        loader = importlib.machinery.ExtensionFileLoader("engine_c_launch", path)
        spec = importlib.util.spec_from_file_location("engine_c_launch", path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        return mod
    except Exception as exc:     # no compiler, no headers: ctypes launches instead
        observe.log("inductor", logging.INFO, "kernel launches go through ctypes: the C launcher did not build: %s",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None


def launcher():
    """The C launch function, or None (then ctypes): engine.config.c_launch off, no
    compiler or headers, or no libcuda."""
    from engine import config
    if not config.c_launch:
        return None
    if not _module:
        with _lock:
            if not _module:
                from ..cache import cache_dir
                mod = build(os.path.join(cache_dir(), "c_launch"))
                _module.append(mod.launch if mod is not None and mod.available() else None)
    return _module[0]
