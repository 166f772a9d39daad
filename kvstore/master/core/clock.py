"""Where the core gets its time from: always an injected clock, never `time` directly.

Every deadline the core keeps (lease expiry, PENDING timeout, the post-failover eviction
hold) is a number on this clock, so tests drive time by hand and production uses the
monotonic clock, which never jumps when the wall clock is set.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class MonotonicClock:
    """The production clock."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when a test says so."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go backwards")
        self._now += seconds
