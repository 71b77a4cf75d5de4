"""What padding an unaligned 16-bit matmul buys (engine/codegen/pad_mm.py), on the GPU.

    python -m tests.bench.pad_mm_gpu

GPT-2's logits, [4096, 768] @ [768, 50257] in bf16, and its weight gradient's shape: the
product as is (cuBLAS's unaligned kernels), on operands padded to a multiple of 8 (the
weight's copy included), and padded then copied back to a dense result (what a caller who
must see eager's layout costs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _ms(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def main():
    dt = torch.bfloat16
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    for m, k, n in ((4096, 768, 50257), (4096, 768, 30522), (2048, 2048, 32001)):
        x = torch.randn(m, k, device="cuda", dtype=dt)
        w = torch.randn(n, k, device="cuda", dtype=dt)        # a Linear's weight: read transposed
        pn = (-n) % 8
        plain = _ms(lambda: x @ w.t())
        padded = _ms(lambda: (x @ F.pad(w, (0, 0, 0, pn)).t())[:, :n])
        dense = _ms(lambda: (x @ F.pad(w, (0, 0, 0, pn)).t())[:, :n].contiguous())
        print(f"[{m}, {k}] @ [{k}, {n}]: as is {plain:.3f} ms, padded {padded:.3f}, padded + dense copy {dense:.3f}")


if __name__ == "__main__":
    main()
