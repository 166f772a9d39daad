"""Which lease holds the promise for each page `batch_exists` reported.

SGLang asks `batch_exists` on its prefetch thread and reads the pages later with
`batch_get_v1` on another, once host memory is allocated; nothing in between may
evict them. Each `batch_exists` takes a lease on what it reports; the table below
remembers, per object key, the leases that promised it and were not yet read through.
A read takes, for every key, the oldest live promise of it: two requests with the same
prefix each hold their own lease and each read consumes its own, so one read never
releases pins another request still counts on. A lease whose keys were all read is
released; one never read through (SGLang reduced the hit count across ranks, or ended
the prefetch) expires by its TTL on the master and is dropped here at its deadline.

Pure: no I/O, an injectable clock.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Promise:
    lease: Any  # kvstore_client.Lease (anything with .id, .keys and .expires_at)
    unread: set[bytes] = field(default_factory=set)


@dataclass
class Taken:
    """The outcome of `PinTable.take` for one read."""

    groups: dict[int, tuple[Any, list[int]]]  # lease id -> (lease, indexes of keys it pins)
    unpinned: list[int]  # indexes of keys no live lease promised
    done: list[Any]  # leases read through: release them after the read


class PinTable:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._promises: dict[int, Promise] = {}
        self._by_key: dict[bytes, deque[int]] = {}

    def __len__(self) -> int:
        return len(self._promises)

    def pinned_keys(self) -> int:
        return sum(len(p.unread) for p in self._promises.values())

    def add(self, lease: Any, keys: Sequence[bytes]) -> None:
        """Remember that `lease` pins `keys` until they are read."""
        if not lease.id or not keys:
            return
        self._promises[lease.id] = Promise(lease, set(keys))
        for k in keys:
            self._by_key.setdefault(k, deque()).append(lease.id)

    def take(self, keys: Sequence[bytes]) -> Taken:
        """Consume one promise per key (the oldest live one)."""
        self.expire()
        groups: dict[int, tuple[Any, list[int]]] = {}
        unpinned: list[int] = []
        done: list[Any] = []
        for i, k in enumerate(keys):
            ids = self._by_key.get(k)
            chosen: Promise | None = None
            while ids:
                promise = self._promises.get(ids[0])
                ids.popleft()
                if promise is not None and k in promise.unread:
                    chosen = promise
                    break
            if ids is not None and not ids:
                del self._by_key[k]
            if chosen is None:
                unpinned.append(i)
                continue
            chosen.unread.discard(k)
            groups.setdefault(chosen.lease.id, (chosen.lease, []))[1].append(i)
            if not chosen.unread:
                done.append(self._promises.pop(chosen.lease.id).lease)
        return Taken(groups, unpinned, done)

    def expire(self) -> int:
        """Drop promises past their lease deadline (the master has let them go)."""
        now = self._clock()
        gone = [lid for lid, p in self._promises.items() if p.lease.expires_at <= now]
        for lid in gone:
            self._forget(lid)
        return len(gone)

    def drain(self) -> list[Any]:
        """Every live lease, forgotten here: release them (close, clear)."""
        leases = [p.lease for p in self._promises.values()]
        self._promises.clear()
        self._by_key.clear()
        return leases

    def _forget(self, lease_id: int) -> None:
        promise = self._promises.pop(lease_id)
        for k in promise.unread:
            ids = self._by_key.get(k)
            if ids is not None:
                with contextlib.suppress(ValueError):
                    ids.remove(lease_id)
                if not ids:
                    del self._by_key[k]
