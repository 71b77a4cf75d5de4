"""Host microseconds a call of a cuDNN convolution (ResNet-50's 3x3 layer3 conv, bf16,
channels-last input) by the two ways a compiled wrapper can call it, the OpOverload
`aten.convolution.default` and the binding `torch.convolution`, with an NCHW weight (aten
copies it to channels-last on every call) and a channels-last one; a 1x1 conv; and an
allocation and a view for scale. GPU only: `python tests/bench/conv_host_gpu.py`."""
import time

import torch

aten = torch.ops.aten


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    dev = "cuda"
    x = torch.randn(32, 256, 14, 14, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.randn(256, 256, 3, 3, device=dev, dtype=torch.bfloat16)
    w_cl = w.to(memory_format=torch.channels_last)
    w1 = torch.randn(1024, 256, 1, 1, device=dev, dtype=torch.bfloat16)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    args1 = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    with torch.no_grad():
        rows = {
            "aten.convolution.default, NCHW weight": lambda: aten.convolution.default(x, w, None, *args),
            "torch.convolution, NCHW weight": lambda: torch.convolution(x, w, None, *args),
            "aten.convolution.default, channels-last weight": lambda: aten.convolution.default(x, w_cl, None, *args),
            "torch.convolution, channels-last weight": lambda: torch.convolution(x, w_cl, None, *args),
            "aten.convolution.default, 1x1": lambda: aten.convolution.default(x, w1, None, *args1),
            "torch.convolution, 1x1": lambda: torch.convolution(x, w1, None, *args1),
            "torch.empty_strided": lambda: torch.empty_strided((32, 256, 14, 14), (50176, 1, 3584, 256),
                                                              dtype=torch.bfloat16, device=dev),
            "torch.as_strided": lambda: torch.as_strided(w, (256, 2304), (2304, 1), 0),
        }
        for name, fn in rows.items():
            print(f"{host_us(fn):8.1f} us  {name}", flush=True)


if __name__ == "__main__":
    main()
