"""Launching a kernel Triton compiled, through the CUDA driver API (ctypes), without the C
launcher Triton builds for each kernel signature with the system C compiler (0.15-0.3 s
on the first call of every new signature, most of a small graph's cold compile).

The kernel's parameters are its non-constexpr arguments in order (an integer specialized
as ==1 is a constexpr), then two scratch pointers, null when the kernel needs no scratch.
A kernel that needs more (scratch memory, clusters, cooperative launch, tensor
descriptors, float scalars) raises Unsupported and goes through Triton's launcher."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from .compile_worker import METADATA

_INT_TYPES = {"i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
              "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}
_libcuda: list = []
_lock = threading.Lock()


class Unsupported(Exception):
    pass


def _cuda():
    """libcuda's launch entry point, called with the GIL held (PyDLL): a launch fills
    the kernel's shared parameter slots and calls in one step no other thread splits."""
    if not _libcuda:
        with _lock:
            if not _libcuda:
                lib = ctypes.PyDLL("libcuda.so.1")
                launch = lib.cuLaunchKernel
                launch.restype = ctypes.c_int
                launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p,
                                                                             ctypes.c_void_p]
                err = lib.cuGetErrorString
                err.restype = ctypes.c_int
                err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
                _libcuda.append((launch, err))
    return _libcuda[0]


def _error(code: int) -> str:
    msg = ctypes.c_char_p()
    _cuda()[1](code, ctypes.byref(msg))
    return (msg.value or b"unknown error").decode()


@dataclass
class KernelBinary:
    """A compiled kernel as a launch needs it: from Triton's JIT (`of`), or from a compile
    worker's reply (compile_worker.compile_job)."""
    name: str
    binary: bytes
    signature: dict          # argument name -> Triton type: "*bf16", "i32", "constexpr", ...
    arg_names: list
    metadata: dict           # compile_worker.METADATA

    @classmethod
    def of(cls, compiled) -> "KernelBinary":
        return cls(compiled.name, compiled.kernel, compiled.src.signature, compiled.src.fn.arg_names,
                   {k: getattr(compiled.metadata, k, None) for k in METADATA})


class CudaKernel:
    """One compiled kernel, loaded on one device: kernel(grid, stream, values) launches it.
    `values` are the kernel's runtime arguments as Triton's launch takes them, tensors
    given as their addresses."""

    def __init__(self, kb: KernelBinary, n_args: int, device: int, load_binary):
        md = kb.metadata
        if (md["global_scratch_size"] or md["profile_scratch_size"] or (md["num_ctas"] or 1) != 1
                or md["launch_cooperative_grid"] or md["launch_pdl"] or md["tensordesc_meta"]):
            raise Unsupported("kernel needs scratch memory, clusters or a special launch")
        self.positions, self.slots = [], []
        for i, name in enumerate(kb.arg_names[:n_args]):
            ty = kb.signature[name]
            if ty == "constexpr":
                continue
            if ty.startswith("*"):
                slot = ctypes.c_uint64()
            elif ty in _INT_TYPES:
                slot = _INT_TYPES[ty]()
            else:
                raise Unsupported(f"argument {name} of type {ty}")
            self.positions.append(i)
            self.slots.append(slot)
        self._scratch = (ctypes.c_uint64(0), ctypes.c_uint64(0))
        addrs = [ctypes.addressof(s) for s in (*self.slots, *self._scratch)]
        self.params = (ctypes.c_void_p * len(addrs))(*addrs)
        self.block = 32 * md["num_warps"]
        self.shared = md["shared"]
        self.name = kb.name
        _module, self.function, *_ = load_binary(kb.name, kb.binary, self.shared, device)
        self._plan = list(zip(self.positions, self.slots))

    def repeater(self, grid, args, spec, counter):
        """A function f(stream, *args[:-1]) -> bool that launches this kernel again on `stream`
        as the launch with `args` did (its last argument, the size xnumel, taken as it was),
        without looking anything up. False (nothing launched) when the stream is None (the
        wrapper's `launch_stream`: another device current, or a launch hook on) or an
        argument specializes otherwise (an address not 16-byte aligned where it was, another
        integer). The C++ Launch (native_launch) where it is built, else generated Python:
        one line per argument (a tensor's address into its slot), then the launch. The
        wrapper calls it first where a kernel's sizes are static."""
        gx, gy = grid[0], grid[1] if len(grid) > 1 else 1
        if gx * gy == 0:
            return None
        slots = dict(self._plan)
        last = len(args) - 1
        from .native_launch import module
        native = module()
        if native is not None:
            slot_of = {pos: k for k, pos in enumerate(self.positions)}
            plan = [(False, False, slot_of.get(i, -1), a) if isinstance(a, int) else (True, bool(spec[i]), slot_of[i], 0)
                    for i, a in enumerate(args[:last])]
            values = [args[i] if isinstance(args[i], int) else 0 for i, _ in self._plan]
            return native.Launch(self.function, gx, gy, self.block, self.shared, plan, values, counter.native_launched)
        from .c_launch import launcher
        c_launch = launcher()
        ns = {"counter": counter, "launch": c_launch or _cuda()[0], "error": self._raise, "FN": self.function,
              "PARAMS": ctypes.addressof(self.params) if c_launch else self.params}
        lines = [f"def repeat(s, {', '.join(f'a{i}' for i in range(last))}):", "    if s is None: return False"]
        for i, a in enumerate(args):
            if i in slots:
                ns[f"S{i}"] = slots[i]
            if isinstance(a, int):
                if i != last:
                    lines.append(f"    if a{i} != {a}: return False")
                if i in slots:
                    lines.append(f"    S{i}.value = {a}")
            else:
                lines.append(f"    p = a{i}.data_ptr()")
                if spec[i]:
                    lines.append("    if p & 15: return False")
                lines.append(f"    S{i}.value = p")
        lines += [(f"    code = launch(FN, {gx}, {gy}, {self.block}, {self.shared}, s, PARAMS)" if c_launch else
                   f"    code = launch(FN, {gx}, {gy}, 1, {self.block}, 1, 1, {self.shared}, s, PARAMS, None)"),
                  "    if code: error(code)",
                  "    counter.launched += 1",
                  "    return True"]
        exec(compile("\n".join(lines), f"<launch {self.name}>", "exec"), ns)
        return ns["repeat"]

    def _raise(self, code: int):
        raise RuntimeError(f"launching Triton kernel {self.name}: CUDA error {code}: {_error(code)}")

    def fill(self, values) -> None:
        """Write the launch's argument values into the parameter slots."""
        for i, slot in self._plan:
            slot.value = values[i]

    def __call__(self, grid, stream, values) -> None:
        self.fill(values)
        gx, gy = grid[0], grid[1] if len(grid) > 1 else 1
        if gx * gy == 0:
            return
        code = _cuda()[0](self.function, gx, gy, 1, self.block, 1, 1, self.shared, stream, self.params, None)
        if code:
            self._raise(code)
