"""Launch configurations: block sizes and warps per kernel shape (heuristics), and the
small set of candidates `mode="max-autotune"` benchmarks."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    XBLOCK: int
    RBLOCK: int = 1          # unused by pointwise kernels
    num_warps: int = 4
    num_stages: int = 1
    NSPLIT: int = 1          # split reductions: programs per row block (a power of two)
    RSPLIT: int = 0          # ... and elements of the row each reduces (a multiple of RBLOCK)

    def kwargs(self, reduction: bool, split: bool = False) -> dict:
        kw = {"XBLOCK": self.XBLOCK, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if reduction:
            kw["RBLOCK"] = self.RBLOCK
        if split:
            kw["NSPLIT"], kw["RSPLIT"] = self.NSPLIT, self.RSPLIT
        return kw

    def __str__(self) -> str:
        split = f" NSPLIT={self.NSPLIT} RSPLIT={self.RSPLIT}" if self.RSPLIT else ""
        return f"XBLOCK={self.XBLOCK} RBLOCK={self.RBLOCK} num_warps={self.num_warps} num_stages={self.num_stages}{split}"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _clamp(v, lo, hi):
    return max(lo, min(hi, v))


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the heuristics know about a kernel at launch: its kind and sizes."""
    kind: str               # pointwise | reduction
    persistent: bool
    xnumel: int
    rnumel: int
    x_contiguous: bool
    interpret: bool = False
    split: bool = False     # a split reduction (kernel.py): the config also says NSPLIT/RSPLIT
    sms: int = 132          # streaming multiprocessors of the device: split targets a few programs each


def split_config(s: Shape, xb: int, rb: int, warps: int, nsplit: int | None = None) -> Config:
    """Enough splits for ~4 programs per SM, each looping at least 4 steps of RBLOCK."""
    if nsplit is None:
        nsplit = next_pow2(max(1, 4 * s.sms // cdiv(s.xnumel, xb)))
    while nsplit > 1 and nsplit * rb * 4 > s.rnumel:
        nsplit //= 2
    nsplit = _clamp(nsplit, 1, 1024)
    return Config(xb, rb, warps, 1, nsplit, cdiv(cdiv(s.rnumel, nsplit), rb) * rb)


def heuristic(s: Shape) -> Config:
    if s.split:
        if s.x_contiguous:   # 64 contiguous columns (128 B of bf16) by 64 rows a step (tuned on H200)
            return split_config(s, _clamp(next_pow2(s.xnumel), 1, 64), 64, 4)
        rb = _clamp(next_pow2(s.rnumel), 16, 2048 if not s.interpret else 1 << 12)
        return split_config(s, 1, rb, _clamp(rb // 256, 2, 8))
    if s.kind == "pointwise":
        if s.interpret:     # the CPU interpreter pays per program: few large blocks
            return Config(_clamp(next_pow2(s.xnumel), 16, 4096), 1, 1)
        xb = _clamp(next_pow2(s.xnumel), 32, 1024)
        return Config(xb, 1, _clamp(xb // 256, 1, 4) if xb < 1024 else 4)
    if s.persistent:
        rb = next_pow2(s.rnumel)
        target = 4096 if not s.interpret else 1 << 14
        xb = _clamp(target // rb, 1, next_pow2(s.xnumel))
        if not s.x_contiguous:
            xb = min(xb, 64)
        # measured on H100 and H200 (bf16 rows of 4096/8192): 4 warps for 4096, 16 for 8192
        warps = _clamp(next_pow2(max(1, xb * rb // (1024 if rb < 8192 else 512))), 2, 16)
        return Config(xb, rb, warps)
    if s.x_contiguous:      # reducing over a leading dim: a few contiguous columns, many rows per step
        # measured on H100 (bf16 [16384, 1024|4096] summed over rows): 8 x 256, 8 warps
        # beats 64 x 64 by 3x (more programs, longer r steps)
        xb = _clamp(next_pow2(s.xnumel), 1, 8)
        return Config(xb, 256 if not s.interpret else 1024, 8)
    rb = _clamp(next_pow2(s.rnumel), 16, 2048 if not s.interpret else 1 << 14)
    return Config(1, rb, _clamp(rb // 256, 2, 8))


# a looped row reduction this large is timed on its first launch in every mode: the best
# elements a thread differ by kernel (H200, rows of 50257 bf16 logits x 4096: a cross
# entropy's forward 0.29 ms at RBLOCK 2048 and 8 warps, 0.42 at 1024; its backward, which
# also writes the row, 0.73 at 2048 and 0.44 at 1024)
LARGE_LOOPED = 1 << 24


def worth_timing(s: Shape) -> bool:
    """A looped (not persistent, not split) row reduction large enough that its few
    configurations are timed once (a few ms, at the first call) even outside max-autotune."""
    return (s.kind == "reduction" and not s.persistent and not s.split and not s.x_contiguous
            and not s.interpret and s.xnumel * s.rnumel >= LARGE_LOOPED)


def looped_candidates(s: Shape) -> list[Config]:
    """The configs `worth_timing` reductions time: the heuristic's and 4 or 16 elements a thread."""
    out = [heuristic(s)]
    for c in (Config(1, 1024, 8), Config(1, 4096, 8), Config(1, 512, 4)):
        if c not in out and c.RBLOCK <= max(512, next_pow2(s.rnumel)):
            out.append(c)
    return out


def candidates(s: Shape) -> list[Config]:
    """The configs max-autotune times (the heuristic's choice is always among them)."""
    out = [heuristic(s)]
    if s.split:
        base = out[0]
        for xb, rb in ((base.XBLOCK, base.RBLOCK), (32, 64), (64, 32), (1, 1024), (1, 2048)):
            if (xb == 1) == (not s.x_contiguous) or (xb, rb) == (base.XBLOCK, base.RBLOCK):
                for mult in (1, 2, 4):
                    for w in (4, 8):
                        out.append(split_config(s, min(xb, next_pow2(s.xnumel)), rb, w,
                                                max(1, base.NSPLIT * mult // 2)))
    elif s.kind == "pointwise":
        for xb in (256, 512, 1024, 2048, 4096):
            for w in (4, 8):
                if xb <= max(32, next_pow2(s.xnumel)) and xb // w >= 32:
                    out.append(Config(xb, 1, w))
    elif s.persistent:
        rb = next_pow2(s.rnumel)
        for xb in (1, 2, 4, 8, 16, 32):
            if xb * rb > 32768 or xb > next_pow2(s.xnumel):
                continue
            for w in (2, 4, 8, 16):
                # at most 64 elements a thread: beyond, registers spill (10-30x slower on H100)
                if 32 * w <= xb * rb and xb * rb <= 64 * 32 * w:
                    out.append(Config(xb, rb, w))
    else:
        for xb, rb in ((1, 1024), (1, 2048), (1, 4096), (2, 1024), (8, 256), (8, 512), (16, 256), (32, 128),
                       (64, 64)):
            if xb > next_pow2(s.xnumel):
                continue
            for w in (4, 8):
                out.append(Config(xb, rb, w))
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq
