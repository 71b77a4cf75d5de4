"""Delta debugging over a list of items (a graph's units, or its inputs): the smallest set
for which `fails(kept)` still holds. Graph order helps: a bad op is usually found by
cutting off the tail and then the head with two binary searches (about 2 log2 n trials),
and classic ddmin then removes what is left in between."""

from __future__ import annotations

from typing import Callable, Sequence

Test = Callable[[tuple[int, ...]], bool]


class Search:
    """`fails(kept)` must be true for every item; kept sets are tuples of indices in order.
    Results are memoized, so a set is never tried twice."""

    def __init__(self, n: int, fails: Test) -> None:
        self.n = n
        self._fails = fails
        self.tried: dict[tuple[int, ...], bool] = {}

    def fails(self, kept: Sequence[int]) -> bool:
        key = tuple(kept)
        if not key:
            return False
        if key not in self.tried:
            self.tried[key] = self._fails(key)
        return self.tried[key]

    def run(self) -> tuple[int, ...]:
        end = self.shortest_prefix()
        start = self.latest_start(end)
        return self.ddmin(tuple(range(start, end)))

    def shortest_prefix(self) -> int:
        """The smallest `end` such that items [0, end) still fail."""
        lo, hi = 0, self.n           # [0, lo) passes (or is empty), [0, hi) fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(range(mid)):
                hi = mid
            else:
                lo = mid
        return hi

    def latest_start(self, end: int) -> int:
        """The largest `start` such that items [start, end) still fail."""
        lo, hi = 0, end              # [lo, end) fails, [hi, end) passes (or is empty)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(range(mid, end)):
                lo = mid
            else:
                hi = mid
        return lo

    def ddmin(self, kept: tuple[int, ...]) -> tuple[int, ...]:
        """Zeller's ddmin: try each of n chunks alone, then each complement; on a hit keep
        it and go on, else split finer, until single items are tried."""
        n = 2
        while len(kept) >= 2:
            chunks = [kept[i * len(kept) // n:(i + 1) * len(kept) // n] for i in range(n)]
            chunks = [c for c in chunks if c]
            for chunk in chunks:
                if self.fails(chunk):
                    kept, n = chunk, 2
                    break
            else:
                for chunk in chunks:
                    rest = tuple(i for i in kept if i not in chunk)
                    if self.fails(rest):
                        kept, n = rest, max(n - 1, 2)
                        break
                else:
                    if n >= len(kept):
                        break
                    n = min(len(kept), 2 * n)
        return kept
