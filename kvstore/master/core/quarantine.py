"""Space that may still be written after its object left the table.

A writer copies into the ranges PutStart gave it with one-sided transfers the master
cannot stop, and a store node copies into a tier move's destination the same way. When
the object goes before that copy is known to be over (a replica's node was lost, so a
PENDING object is dropped while its writer still writes its other replicas; a forced
remove; an object removed while it moves), handing its ranges out again at once lets
the next put be placed where the old copy still lands: that put is acknowledged, then
its bytes are overwritten, and every read of it fails its checksum. So those ranges
wait here, still allocated, until the copier says it is done (the writer's PutEnd,
PutCommit or PutRevoke for the key, the node's answer for the move) or the put timeout
has passed, by when a writer's transfers have given up.

A node that lost its etcd lease but kept running (a network cut longer than the lease)
mounts again over the very same memory, and copies stalled by the cut are delivered
when it heals. So ranges held on a segment that went are kept, detached, and held
again in the segment that next mounts over the same memory (same node, tier, address
and size), before anything is placed there.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from .keys import norm_keys
from .segments import Segment, SegmentMap


class Until(enum.Enum):
    """How long a PENDING object's ranges stay held when it is dropped (CoreState.drop)."""

    WRITER = "writer"  # until its writer's next call for the key, or the put timeout
    TIMEOUT = "timeout"  # until the put timeout only (an unsettled revoke)
    NOW = "now"  # not held: the writer is done with them (its own revoke, the timeout)


# (segment, offset, length): an allocated range of a segment.
Range = tuple[Segment, int, int]
# (node id, tier, base address, size): the memory a segment maps.
Memory = tuple[str, str, int, int]


def memory_of(seg: Segment) -> Memory:
    return (seg.node_id, seg.tier, seg.base_addr, seg.size)


@dataclass(slots=True)
class Held:
    tag: tuple[str, bytes, str]
    deadline: float
    ranges: list[Range]
    released: bool = False


def put_tag(key: bytes, writer: str) -> tuple[str, bytes, str]:
    """Ranges a writer may still be writing for `key` (a placeholder's key too)."""
    return ("put", key, writer)


def timeout_tag(key: bytes) -> tuple[str, bytes, str]:
    """Ranges only the put timeout gives back: the writer said its transfers for `key`
    ended without an answer (an unsettled PutRevoke), so no later call of its vouches
    for them."""
    return ("timeout", key, "")


def move_tag(key: bytes) -> tuple[str, bytes, str]:
    """A move's destination the node may still be copying `key` into."""
    return ("move", key, "")


class Quarantine:
    """Held ranges by tag, and in the order their deadlines pass."""

    def __init__(self, segments: SegmentMap) -> None:
        self._segments = segments
        self._by_tag: dict[tuple[str, bytes, str], list[Held]] = {}
        self._order: deque[Held] = deque()
        # Ranges of held objects on segments that went, until one mounts over the same
        # memory again: (its Held, the memory, offset, length).
        self._detached: list[tuple[Held, Memory, int, int]] = []

    def hold(self, tag: tuple[str, bytes, str], deadline: float, ranges: list[Range],
             detached: list[tuple[Memory, int, int]] | None = None) -> None:
        """Hold `ranges` (and `detached`: ranges of segments no longer mounted)."""
        if not ranges and not detached:
            return
        held = Held(tag, deadline, ranges)
        for memory, off, n in detached or ():
            self._detached.append((held, memory, off, n))
        self._by_tag.setdefault(tag, []).append(held)
        # Deadlines come from one put timeout after a start or from now, so they arrive
        # almost in order; a late one only waits for those queued before it.
        self._order.append(held)

    def writer_done(self, keys: Iterable[object], writer: str) -> None:
        """`writer` ended its put of each key (PutEnd, PutCommit of a placeholder, a
        settled PutRevoke: it sends them once the engine answered for its transfers),
        whatever the master's answer."""
        if self._by_tag:
            for k in norm_keys(keys):
                if k is not None:
                    self.release(put_tag(k, writer))

    def unmounted(self, segments: Iterable[Segment]) -> None:
        """`segments` went: what is held on them is held detached, for a segment that
        mounts over the same memory again."""
        gone = {seg.seg_id: seg for seg in segments}
        if not gone or not self._by_tag:
            return
        for held in self._order:
            if held.released or not any(r[0].seg_id in gone for r in held.ranges):
                continue
            kept: list[Range] = []
            for seg, off, n in held.ranges:
                if gone.get(seg.seg_id) is seg:
                    self._detached.append((held, memory_of(seg), off, n))
                else:
                    kept.append((seg, off, n))
            held.ranges = kept

    def remounted(self, seg: Segment) -> None:
        """`seg` was just mounted: hold again the ranges held in the same memory when
        the segment that mapped it went."""
        if not self._detached:
            return
        memory = memory_of(seg)
        left: list[tuple[Held, Memory, int, int]] = []
        for entry in self._detached:
            held, m, off, n = entry
            if held.released:
                continue
            if m != memory:
                left.append(entry)
            elif seg.alloc.reserve(off, n):
                held.ranges.append((seg, off, n))
        self._detached = left

    def release(self, tag: tuple[str, bytes, str]) -> None:
        """The copier of `tag` is done: its ranges go back to their allocators."""
        for held in self._by_tag.pop(tag, ()):
            self._free(held)

    def expire(self, now: float) -> None:
        order = self._order
        while order and (order[0].released or order[0].deadline <= now):
            held = order.popleft()
            if not held.released:
                same = self._by_tag.get(held.tag)
                if same is not None:
                    same.remove(held)
                    if not same:
                        del self._by_tag[held.tag]
                self._free(held)
        if self._detached and not order:
            self._detached.clear()
        elif self._detached:
            self._detached = [d for d in self._detached if not d[0].released]

    def ranges(self) -> list[Range]:
        """What is held now, on segments still mounted (for the invariant tests)."""
        by_id = self._segments.by_id
        return [r for h in self._order if not h.released for r in h.ranges
                if by_id.get(r[0].seg_id) is r[0]]

    def _free(self, held: Held) -> None:
        held.released = True
        by_id = self._segments.by_id
        for seg, off, n in held.ranges:
            if by_id.get(seg.seg_id) is seg:  # an unmounted segment took its ranges along
                seg.alloc.free(off, n)
