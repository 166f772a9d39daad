"""Where the core gets its time from: always an injected clock, never `time` directly.

Every deadline the core keeps (lease expiry, PENDING timeout, the post-failover eviction
hold) is a number on this clock (the shared kvstore.clock, which the client's flows use
too).
"""

from __future__ import annotations

from kvstore.clock import Clock, ManualClock, MonotonicClock

__all__ = ["Clock", "ManualClock", "MonotonicClock"]
