"""Where this client last saw each object: the memory behind early reads.

A get costs a GetReplicas round trip (where is it? pin it) before any byte moves. When
the client has seen the object recently, written it itself or read it before, it already
knows where it was, so it starts reading there while it asks, and keeps the bytes only if
the answer names the same *placement*: the master's name for an object's current set of
replica ranges, restamped whenever a range is taken or given up and never handed out
twice within a leader's epoch (see kvstore/master/core/objects.py). The same epoch and
placement then mean the object sat at those ranges, unchanged, from when this client
learned them until the master pinned it for this read, so bytes read from there in the
meantime are the object's, exactly as if they had been read after the answer; and they
are checksum-verified as always. Any other answer (moved, evicted, removed, a new leader)
throws the early bytes away and reads where the answer says.

An entry is trusted for MAX_AGE seconds at most: the master's placement counter is 32
bits wide, and no master stamps four billion placements in a minute. The memory is
bounded (oldest learned first out, an eighth of it at a time) and costs nothing on the
master.
"""

from __future__ import annotations

from itertools import islice
from typing import NamedTuple

from kvstore_client.clock import MONOTONIC, Clock

MAX_AGE = 60.0
DEFAULT_CAPACITY = 65536
EVICT_SHARE = 1 / 8  # of the memory dropped (oldest first) when it is full


class Seen(NamedTuple):  # a tuple: built for every object a client writes or reads
    epoch: int
    placement: int
    size: int
    checksum: int
    segment: str  # the first replica's: where an early read goes
    node_id: str
    addr: int
    at: float  # when learned, on the client's clock

    def matches(self, epoch: int, item: object) -> bool:
        """Whether a ReadItem in a reply of `epoch` names this very placement."""
        return (epoch == self.epoch and item.placement == self.placement  # type: ignore[attr-defined]
                and item.size == self.size and item.checksum == self.checksum)  # type: ignore[attr-defined]


class Placements:
    """key -> the placement this client last saw it at (bounded, oldest learned out)."""

    __slots__ = ("_seen", "capacity", "clock", "max_age")

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_age: float = MAX_AGE,
                 clock: Clock = MONOTONIC) -> None:
        if capacity < 0:
            raise ValueError(f"placement memory must hold >= 0 objects, got {capacity}")
        self.capacity = capacity
        self.max_age = max_age
        self.clock = clock
        self._seen: dict[bytes, Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def learn(self, key: bytes, epoch: int, placement: int, size: int, checksum: int,
              segment: str, node_id: str, addr: int, now: float | None = None) -> None:
        if not self.capacity or not placement:
            return
        seen = self._seen
        if seen.pop(key, None) is None and len(seen) >= self.capacity:
            seen = self._evict()
        seen[key] = Seen(epoch, placement, size, checksum, segment, node_id, addr,
                         self.clock.now() if now is None else now)

    def learn_many(self, learned: list[tuple[bytes, Seen]]) -> None:
        """`learn` for a batch, each key with what was seen of it (oldest first)."""
        if not self.capacity:
            return
        seen, capacity = self._seen, self.capacity
        for key, s in learned:
            if s.placement:
                if seen.pop(key, None) is None and len(seen) >= capacity:
                    seen = self._evict()
                seen[key] = s

    def _evict(self) -> dict[bytes, Seen]:
        """Make room: the oldest learned EVICT_SHARE of the memory go, at once. Not one
        at a time: a dict keeps the slots of its first entries once deleted, so finding
        the oldest one left would scan all of them (µs per object at capacity)."""
        seen = self._seen
        drop = max(1, int(self.capacity * EVICT_SHARE))
        self._seen = dict(islice(seen.items(), drop, None))
        return self._seen

    def learn_item(self, key: bytes, epoch: int, item: object) -> None:
        """From a ReadItem that answered OK (its first location is readable: in DRAM)."""
        locs = item.locations  # type: ignore[attr-defined]
        if locs and item.placement:  # type: ignore[attr-defined]
            loc = locs[0]
            self.learn(key, epoch, item.placement, item.size, item.checksum,  # type: ignore[attr-defined]
                       loc.segment, loc.node_id, loc.addr)

    def forget(self, key: bytes) -> None:
        self._seen.pop(key, None)

    def recall_one(self, key: bytes) -> Seen | None:
        """What was seen of `key`, or None if unknown or too old."""
        seen = self.recall([key])
        return seen[0] if seen else None

    def recall(self, keys: list[bytes]) -> list[Seen] | None:
        """What was seen of every key, or None if any is unknown or too old (an early
        read of part of a batch would not save its round trip)."""
        if not self.capacity:
            return None
        seen = self._seen
        oldest = self.clock.now() - self.max_age
        out: list[Seen] = []
        for k in keys:
            s = seen.get(k)
            if s is None or s.at < oldest:
                return None
            out.append(s)
        return out
