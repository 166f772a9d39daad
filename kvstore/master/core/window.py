"""Recent counts: a ring of per-second buckets over a few monotonic counters.

The master counts lookups, hits and evictions since it started. An operator asks a
different question: "what is the hit ratio *now*", meaning over the last minute. This
ring answers it without any I/O or background thread: the core feeds it its running
totals from `tick()` (every ~100 ms), each feed adds what changed since the previous
one to the bucket of the current second, and a query sums the buckets of the last
`span` seconds plus whatever happened since the last feed.

Why buckets and not a log of events: a lookup path that appends to a list would cost
memory per call; here the cost is `span` small rows, whatever the load. Buckets are
stamped with their second, so a bucket left over from a lap ago (the master was idle,
or paused) is recognised as stale rather than counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class RecentCounts:
    """Per-second counts of named cumulative counters over the last `span` seconds."""

    __slots__ = ("_counts", "_last", "_names", "_seconds", "_started", "span")

    def __init__(self, names: Sequence[str], span: int = 60, start: float = 0.0) -> None:
        if span < 1:
            raise ValueError(f"span must be >= 1 second, got {span}")
        self.span = span
        self._names = tuple(names)
        self._seconds = [-1] * span  # the second each bucket holds, -1: empty
        self._counts = [[0] * len(self._names) for _ in range(span)]
        self._last = [0] * len(self._names)  # totals at the previous observe()
        self._started = start

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def observe(self, now: float, totals: Sequence[int]) -> None:
        """Add what `totals` gained since the previous call to the current second."""
        deltas = self._deltas(totals)
        self._last = list(totals)
        if not any(deltas):
            return
        sec = math.floor(now)
        i = sec % self.span
        row = self._counts[i]
        if self._seconds[i] != sec:
            self._seconds[i] = sec
            row[:] = [0] * len(row)
        for j, d in enumerate(deltas):
            row[j] += d

    def recent(self, now: float, totals: Sequence[int] | None = None) -> dict[str, int]:
        """Counts over the last `span` seconds, up to `now`. With `totals` (the current
        running totals), what happened since the last observe() counts too."""
        sec = math.floor(now)
        out = [0] * len(self._names)
        for stamp, row in zip(self._seconds, self._counts, strict=True):
            if sec - self.span < stamp <= sec:
                for j, c in enumerate(row):
                    out[j] += c
        if totals is not None:
            for j, d in enumerate(self._deltas(totals)):
                out[j] += d
        return dict(zip(self._names, out, strict=True))

    def covered(self, now: float) -> float:
        """Seconds of history behind `recent()`: less than `span` soon after a start."""
        return max(0.0, min(float(self.span), now - self._started))

    def _deltas(self, totals: Sequence[int]) -> list[int]:
        if len(totals) != len(self._names):
            raise ValueError(f"expected {len(self._names)} totals, got {len(totals)}")
        # A counter never goes down; if one did (a reset), count from the new value.
        return [t - last if t >= last else t for t, last in zip(totals, self._last, strict=True)]


def ratio(part: int, whole: int) -> float | None:
    """part / whole, or None when there is nothing to divide (no lookups: no ratio)."""
    return part / whole if whole else None
