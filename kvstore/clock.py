"""The clocks every deadline is kept on, the master core's and the client's flows'.

Code that keeps deadlines takes a `Clock` and never reads `time` itself, so a test
drives time by hand (`ManualClock`) and production uses the monotonic clock, which
never jumps when the wall clock is set.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class MonotonicClock:
    """This host's time.monotonic(), looked up at each call (so a test that patches
    time.monotonic moves it too)."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


MONOTONIC = MonotonicClock()


class ManualClock:
    """A clock that moves only when a test says so; `advance` doubles as a driver's sleep."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go backwards")
        self._now += seconds
