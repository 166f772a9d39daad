"""Group commit for the SSD tier: which unflushed writes a flush covers, one flush at a
time shared by every waiter, and the verdict after a failed one.

No I/O: `SsdTier.sync` (ssd.py) runs the flush itself, syncfs(2) through `ssd_libc`,
between `begin` and `succeeded`/`failed`. The state shares the tier's one lock (the
condition passed in) because a failed flush must take its objects out of the index, and
put must check the verdict and number its write, in the same critical sections as the
index changes they go with.

The rules (the durability argument is in the docstring of ssd.py):
- A put with `sync=False` is numbered as it lands (`wrote`). A `sync()` targets the newest
  number at its call and returns once a flush that started after that number has ended.
- One flush runs at a time. A caller whose writes the running flush already covers
  returns when it ends; the others wait and one of them runs the next flush. N batches in
  flight cost about one flush each, not one per object.
- After a failed flush the tier cannot tell which pages reached the device: every
  unflushed object is given up (`failed` returns their keys for the tier to delete) and
  the tier refuses writes until it is reopened (`broken`).
"""

from __future__ import annotations

import threading

from kvstore.errors import Internal


class GroupCommit:
    """Numbers unflushed writes and runs one flush at a time. Methods named `*_locked`
    expect the caller to hold the condition's lock; `begin` and `abandon` take it."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._unsynced: dict[bytes, int] = {}  # key -> number of its unflushed write
        self._write_seq = 0
        self._synced_seq = 0
        self._syncing = False
        self.broken: str | None = None  # why writes are refused (a flush failed)
        self.syncs = 0
        self.seconds = 0.0

    def pending_locked(self) -> int:
        """Objects written with sync=False and not flushed yet."""
        return len(self._unsynced)

    def wrote_locked(self, key: bytes) -> None:
        """`key` was just written without a flush: the next flush must cover it."""
        self._write_seq += 1
        self._unsynced[key] = self._write_seq

    def forget_locked(self, key: bytes) -> None:
        """`key` left the index (removed, evicted, dropped as corrupt): no flush owes it."""
        self._unsynced.pop(key, None)

    def begin(self) -> int | None:
        """Wait for the right to flush. None: a flush that ended meanwhile covered every
        write before this call, nothing to do. Otherwise the newest write number the
        caller's flush will cover; it must then call `succeeded_locked`,
        `failed_locked` or `abandon`. Raises Internal once a flush has failed."""
        with self._cond:
            target = self._write_seq
            while True:
                if self._synced_seq >= target:
                    return None
                if self.broken is not None:
                    raise Internal(self.broken)
                if not self._syncing:
                    break
                self._cond.wait()
            self._syncing = True
            return self._write_seq

    def abandon(self) -> None:
        """The flush did not run to a verdict (closed, interrupted): nothing advanced, and
        the next waiter flushes."""
        with self._cond:
            self._syncing = False
            self._cond.notify_all()

    def succeeded_locked(self, upto: int, seconds: float) -> None:
        self._syncing = False
        self.syncs += 1
        self.seconds += seconds
        self._synced_seq = max(self._synced_seq, upto)
        for key in [k for k, seq in self._unsynced.items() if seq <= upto]:
            del self._unsynced[key]
        self._cond.notify_all()

    def failed_locked(self, reason: str, seconds: float) -> list[bytes]:
        """Record the failed flush; every unflushed key, for the caller to take out of
        the index and delete. Waiting and later callers get Internal(reason)."""
        self._syncing = False
        self.syncs += 1
        self.seconds += seconds
        self.broken = reason
        keys = list(self._unsynced)
        self._unsynced.clear()
        self._cond.notify_all()
        return keys
