"""Where the client's flows get their time from: the clock in the state, never `time`
(kvstore.clock, shared with the master core).

Every deadline a flow keeps (a read lease's, a put's BUSY budget, a transfer batch's,
how fresh a placement or a node's last answer is) is a number on this clock, so a test
drives time by hand (`ManualClock`) and a client uses the monotonic clock, which never
jumps when the wall clock is set. Sleeping is not the clock's business: a flow yields
`Wait`, and the drivers (client.py, aio.py) sleep.
"""

from __future__ import annotations

from kvstore.clock import MONOTONIC, Clock, ManualClock, MonotonicClock

__all__ = ["MONOTONIC", "Clock", "ManualClock", "MonotonicClock"]
