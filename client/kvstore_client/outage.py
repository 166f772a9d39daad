"""The engine adapters' rule for a store that stopped answering: after a failure, every
call is a miss (or a dropped write) at once for `retry_interval` seconds, then the store
is tried again. An engine thread then never waits a timeout per call while the store is
down: a dead store costs misses, never a stalled engine.

An outage opens with the first failure and closes when the store answers again, so an
adapter logs one warning per outage and one line when it is over, however many calls
failed in between.
"""

from __future__ import annotations

from kvstore.clock import MONOTONIC, Clock


class Outage:
    """Whether the store counts as down now, and why (see the module docstring)."""

    def __init__(self, retry_interval: float, clock: Clock = MONOTONIC) -> None:
        self.retry_interval = retry_interval
        self.clock = clock
        self.until = 0.0  # on `clock`: calls before this are misses without trying
        self.reason = ""  # the failure that opened the outage; "" when none is open

    @property
    def down(self) -> bool:
        return self.clock.now() < self.until

    def fail(self, reason: str) -> bool:
        """The store failed a call: down for `retry_interval` from now. True when this
        failure opens an outage (the caller's cue for its one warning)."""
        opens = not self.reason
        self.until = self.clock.now() + self.retry_interval
        self.reason = reason
        return opens

    def answered(self) -> bool:
        """The store answered: any open outage is over. True when one was open (the
        caller's cue for its line saying so)."""
        was_open = bool(self.reason)
        self.reason = ""
        return was_open
