"""Membership: store nodes' segments coming and going, the replicas a node reports it
already holds (adopt), and draining a node.

A node that goes takes its replicas with it at once: objects left with no replica are
gone (NODE_LOST), PENDING ones with a replica there too (their put_end gets NOT_FOUND).
A draining node gets no new placements and leaves the DRAM pool the watermarks watch;
drain() empties it step by step without ever touching a pinned or PENDING object.
"""

from __future__ import annotations

from kvstore.errors import Code, InvalidArgument, NotFound

from .checks import is_checksum, is_size
from .keys import norm_key
from .lifecycle import PENDING
from .pins import Pins
from .results import DrainReport, Event, EventKind, MoveKind, NodeInfo, SegmentStats, Tier
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK, SSD, TIERS, Segment, alloc_size
from .state import CoreState


def segment_stats(seg: Segment) -> SegmentStats:
    """A segment's numbers without the pin scan stats() makes."""
    return SegmentStats(node_id=seg.node_id, segment=seg.name, tier=seg.tier,
                        base_addr=seg.base_addr, capacity=seg.alloc.capacity,
                        used=seg.alloc.used_bytes, free_largest=seg.alloc.largest_free(),
                        replicas=seg.replicas, pinned_replicas=0, pinned_bytes=0)


class Membership:
    def __init__(self, state: CoreState, pins: Pins) -> None:
        self._state = state
        self._t = state.objects
        self._pins = pins

    # -- mounts -------------------------------------------------------------------

    def mount_segment(self, node_id: str, segment: str, base_addr: int, size: int,
                      tier: str, start: int = 0) -> None:
        """MasterCore.mount_segment."""
        state = self._state
        alignment = state.config.alignment
        if not node_id:
            raise InvalidArgument("node_id must be a non-empty string")
        if tier not in TIERS:
            raise InvalidArgument(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        if not 0 <= base_addr < 1 << 64:
            raise InvalidArgument(f"base_addr must be a 64-bit address, got {base_addr}")
        if start < 0 or start % alignment:
            raise InvalidArgument(f"a segment part must start on a multiple of {alignment} "
                                  f"bytes, not at {start}")
        if not alignment <= size <= OFFSET_MASK + 1 - start:
            raise InvalidArgument(
                f"segment size must be between {alignment} bytes and "
                f"{OFFSET_MASK + 1} bytes, got {size}"
            )
        t = Tier(tier)
        old = state.segments.get(node_id, t)
        if old is not None:
            if old.same_geometry(segment, base_addr, size, start):
                return
            state.segments.remove(old)
            state.quarantine.unmounted([old])
            self._lose([old], node_id)
        seg = state.segments.add(node_id, segment, base_addr, size, t, alignment, start)
        state.quarantine.remounted(seg)
        state.departed.pop(node_id, None)
        state.refresh_pool()

    def unmount_node(self, node_id: str, reason: str) -> list[bytes]:
        """MasterCore.unmount_node."""
        state = self._state
        segs = state.segments.by_node.get(node_id, {})
        departed = NodeInfo(node_id, reason, [segment_stats(seg) for seg in segs.values()],
                            0, state.clock.now())
        gone = state.segments.remove_node(node_id)
        if not gone:
            return []
        state.quarantine.unmounted(gone)
        state.departed[node_id] = departed
        state.refresh_pool()
        lost = self._lose(gone, node_id)
        departed.objects_lost = len(lost)
        return lost

    def node_ids(self) -> list[str]:
        return sorted(self._state.segments.by_node)

    def forget_departed(self, now: float) -> None:
        state = self._state
        if state.departed:
            keep = state.config.departed_retention
            for node_id in [n for n, d in state.departed.items() if now - d.gone_at > keep]:
                del state.departed[node_id]

    def _lose(self, segments: list[Segment], node_id: str) -> list[bytes]:
        """Segments already unmapped: drop their replicas, and the objects left with
        none. Returns the keys now gone."""
        state = self._state
        t = self._t
        id_set = {seg.seg_id for seg in segments}
        by_id = {seg.seg_id: seg for seg in segments}
        gone: list[bytes] = []
        gone_size = 0
        for s in state.slots_on(id_set):
            key = t.key_of[s]
            assert key is not None
            keep = tuple(h for h in t.handles(s) if h >> OFFSET_BITS not in id_set)
            if not keep or t.phase[s] == PENDING:
                gone.append(key)
                gone_size += t.size[s]
                state.drop(s, gone=by_id)
                continue
            state.set_replicas(s, keep, state.footprint(keep, t.extent(s)),
                               demoting=self._demoting(s))
        if gone:
            state.events.emit(Event(EventKind.NODE_LOST, gone, gone_size, node_id))
        return gone

    def _demoting(self, s: int) -> bool:
        """Whether object s's demotion is in flight (its DRAM counted as about to go)."""
        move = self._state.moves.get(s)
        return move is not None and move.kind == MoveKind.DEMOTE

    # -- adoption (a node's inventory, replayed to a new leader) ---------------------

    def adopt_replica(self, key: bytes, size: int, checksum: int, node_id: str, offset: int,
                      tier: str) -> Code:
        """MasterCore.adopt_replica."""
        k = norm_key(key)
        if (
            k is None
            or not is_size(size)
            or not is_checksum(checksum)
            or not isinstance(offset, int)
            or offset < 0
        ):
            return Code.INVALID_ARGUMENT
        state = self._state
        seg = state.segments.get(node_id, Tier(tier)) if tier in TIERS else None
        if seg is None:
            return Code.NOT_FOUND
        if tier != DRAM:
            return self._adopt_ssd(k, size, checksum, seg)
        if offset < seg.alloc.start or offset + size > seg.alloc.start + seg.alloc.capacity:
            return Code.INVALID_ARGUMENT
        t = self._t
        s = t.index.get(k)
        handle = seg.handle(offset)
        if s is not None:
            if t.phase[s] == PENDING:
                return Code.IN_PROGRESS
            if t.size[s] != size or t.checksum[s] != checksum:
                return Code.INVALID_ARGUMENT
            handles = t.handles(s)
            for h in handles:
                if h >> OFFSET_BITS == seg.seg_id:
                    return Code.OK if h == handle else Code.INVALID_ARGUMENT
            # Every DRAM replica of an object spans its extent (value and record room).
            extent = t.extent(s)
            if not seg.take_at(offset, extent):
                return Code.INVALID_ARGUMENT
            # A demotion in flight frees all the object's DRAM when it ends, this replica
            # too (finish_tier_move ends it with the object's space): count it there.
            state.set_replicas(s, (*handles, handle),
                               t.space[s] + state.footprint((handle,), extent),
                               demoting=self._demoting(s))
            return Code.OK
        if not seg.take_at(offset, size):
            return Code.INVALID_ARGUMENT
        s = t.new(k, size, checksum, (handle,), state.footprint((handle,), size),
                  state.clock.now())
        self._pins.adopt(s)
        return Code.OK

    def _adopt_ssd(self, k: bytes, size: int, checksum: int, seg: Segment) -> Code:
        """Adopt an object a node holds on SSD (after a restart or a failover)."""
        t = self._t
        s = t.index.get(k)
        if s is not None:
            return Code.OK if t.size[s] == size and t.checksum[s] == checksum else Code.INVALID_ARGUMENT
        off = seg.take(alloc_size(SSD, size))
        if off < 0:
            return Code.STORE_FULL
        s = t.new(k, size, checksum, (seg.handle(off),), 0, self._state.clock.now())
        self._pins.adopt(s)
        return Code.OK

    # -- draining -----------------------------------------------------------------

    def set_draining(self, node_id: str, draining: bool, must_exist: bool) -> None:
        """MasterCore.set_draining."""
        state = self._state
        if not node_id:
            raise InvalidArgument("node_id must be a non-empty string")
        if draining:
            if must_exist and node_id not in state.segments.by_node:
                mounted = ", ".join(self.node_ids()) or "none"
                raise NotFound(f"no store node {node_id!r} is mounted (mounted: {mounted})")
            state.draining.add(node_id)
        else:
            state.draining.discard(node_id)
        state.refresh_pool()

    def set_adopting(self, node_id: str, adopting: bool) -> None:
        """MasterCore.set_adopting."""
        state = self._state
        if adopting:
            state.adopting.add(node_id)
        else:
            state.adopting.discard(node_id)
        state.refresh_pool()

    def drain(self, node_id: str, limit: int) -> DrainReport:
        """MasterCore.drain."""
        if limit < 1:
            raise InvalidArgument(f"limit must be >= 1 object per call, got {limit}")
        self.set_draining(node_id, True, True)
        state = self._state
        segs = list(state.segments.by_node[node_id].values())
        ids = {seg.seg_id for seg in segs}
        t = self._t
        dropped = dropped_bytes = pinned = pending = 0
        sole: list[tuple[bytes, int]] = []
        for s in state.slots_on(ids):
            if t.phase[s] == PENDING:
                pending += 1
                continue
            if t.pins[s] > 0:
                pinned += 1
                continue
            keep = tuple(h for h in t.handles(s) if h >> OFFSET_BITS not in ids)
            if not keep:
                if len(sole) < limit:
                    sole.append((t.key_of[s], t.size[s]))  # type: ignore[arg-type]
            elif dropped < limit:
                self._drop_replicas(s, keep)
                dropped += 1
                dropped_bytes += t.size[s]
        return DrainReport(
            dropped=dropped,
            dropped_bytes=dropped_bytes,
            sole=sole,
            remaining=sum(seg.replicas for seg in segs),
            remaining_pinned=pinned,
            remaining_pending=pending,
        )

    def _drop_replicas(self, s: int, keep: tuple[int, ...]) -> None:
        """Free the replicas of unpinned COMPLETE object s that are not in `keep`."""
        state = self._state
        t = self._t
        key = t.key_of[s]
        dropped = tuple(h for h in t.handles(s) if h not in keep)
        if state.journal is not None and key is not None:
            state.journal_replicas(s, key, False, dropped)
        extent = t.extent(s)
        state.free_replicas(dropped, extent)
        state.set_replicas(s, keep, state.footprint(keep, extent))
