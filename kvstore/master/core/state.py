"""The core's one explicit state, and the verbs that keep its tables consistent.

Everything the master knows lives in one CoreState: the object table, the mounted
segments, the LRU lists, the leases, the moves between tiers, the event queue, the
counters. The collaborators (writes, batch_put, reads, pins, eviction, tiers, quotas,
membership, introspect) are mechanisms over it and keep nothing of their own, so a
test or a reader finds every fact in one place.

Each fact has one writer:
  * the space counters (DRAM bytes pinned, PENDING and about to be freed by demotions;
    object bytes PENDING and COMPLETE) change only through SpaceLedger's verbs, which
    name the event that changes them;
  * an object's phase (PENDING, COMPLETE, gone) only in ObjectTable, pin counts only
    in pins.py; the moves between states are lifecycle.py's table;
  * a segment's replica count only through its take / give verbs (segments.py);
  * the replica journal only through journal_replicas / journal_range here.
An object leaves only through CoreState.drop, and a replica's range goes back to its
allocator only through CoreState.free_replicas (or, if something may still be copying
into it, through the quarantine).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from kvstore.errors import InvalidArgument

from .clock import Clock
from .config import CoreConfig
from .leases import LeaseTable
from .lifecycle import GONE, PENDING
from .lru import LruList
from .objects import ObjectTable
from .quarantine import Memory, Quarantine, Range, Until, memory_of, move_tag, put_tag, timeout_tag
from .results import (
    Event,
    Location,
    MoveKind,
    NodeInfo,
    ReplicaChange,
    Tier,
    TierMove,
    location,
    replica_change,
)
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK, SSD, Segment, SegmentMap, alloc_size
from .window import RecentCounts

# Running totals the core keeps a one-minute, per-second history of (window.py).
RECENT = ("lookup_keys", "hit_keys", "evictions", "evicted_bytes", "demotions", "demoted_bytes",
          "ssd_evictions", "ssd_evicted_bytes")
# The tier counters tier_counters() reports, in its order.
TIER_COUNTERS = ("demotions", "demoted_bytes", "demotion_failures", "promotions",
                 "promoted_bytes", "promotion_failures", "ssd_evictions", "ssd_evicted_bytes")

# Replica ranges to give back, by segment: filled by a batch, given back at its end
# (CoreState.free_replicas, Segment.give_many).
Frees = dict[Segment, list[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class SpaceCounts:
    """The space counters at one moment (SpaceLedger.counts())."""

    pinned: int  # DRAM bytes (all replicas, aligned) of pinned COMPLETE objects
    pending: int  # DRAM bytes of PENDING objects
    demoting: int  # DRAM bytes that in-flight demotions will free
    pending_size: int  # object bytes (sizes) of PENDING objects
    complete_size: int  # object bytes of COMPLETE objects


class SpaceLedger:
    """The only writer of the space counters: one verb per event that changes them.

    "space" is DRAM bytes an object's replicas hold (ObjectTable.space), "size" its
    object bytes. Readers use the properties, or counts() for all of them at once.
    """

    __slots__ = ("_complete_size", "_demoting", "_pending", "_pending_size", "_pinned")

    def __init__(self) -> None:
        self._pinned = 0
        self._pending = 0
        self._demoting = 0
        self._pending_size = 0
        self._complete_size = 0

    @property
    def pinned(self) -> int:
        return self._pinned

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def demoting(self) -> int:
        return self._demoting

    @property
    def pending_size(self) -> int:
        return self._pending_size

    @property
    def complete_size(self) -> int:
        return self._complete_size

    def counts(self) -> SpaceCounts:
        return SpaceCounts(self._pinned, self._pending, self._demoting, self._pending_size,
                           self._complete_size)

    def started(self, space: int, size: int) -> None:
        """PENDING objects created (put_start)."""
        self._pending += space
        self._pending_size += size

    def committed(self, space: int, size: int) -> None:
        """PENDING objects became COMPLETE and unpinned (put_end, put_commit)."""
        self._pending -= space
        self._pending_size -= size
        self._complete_size += size

    def adopted(self, size: int) -> None:
        """An unpinned COMPLETE object recorded from a node's inventory."""
        self._complete_size += size

    def pinned_now(self, space: int) -> None:
        """Objects went from no pins to some."""
        self._pinned += space

    def unpinned(self, space: int) -> None:
        """Objects lost their last pin."""
        self._pinned -= space

    def resized(self, delta: int, pinned: bool, demoting: bool) -> None:
        """A COMPLETE object's DRAM footprint changed by `delta` (replicas gained or
        lost); `pinned`: it is pinned; `demoting`: its demotion is in flight."""
        if pinned:
            self._pinned += delta
        if demoting:
            self._demoting += delta

    def demotion_started(self, space: int) -> None:
        """A demotion will free this DRAM once the node has copied the object."""
        self._demoting += space

    def demotion_ended(self, space: int) -> None:
        """A demotion finished, failed or was cancelled with its object."""
        self._demoting -= space

    def dropped(self, space: int, size: int, pending: bool, pinned: bool) -> None:
        """An object left the table: a PENDING one, or a COMPLETE one `pinned` or not."""
        if pending:
            self._pending -= space
            self._pending_size -= size
        else:
            self._complete_size -= size
            if pinned:
                self._pinned -= space


@dataclass(slots=True)
class Counters:
    """Running totals: what stats(), eviction_stats() and tier_counters() report."""

    lookups: int = 0
    lookup_keys: int = 0
    hit_keys: int = 0
    leases_granted: int = 0
    leases_expired: int = 0
    leases_released: int = 0
    evictions: int = 0  # DRAM (and quota) evictions
    evicted_bytes: int = 0
    reclaimed: int = 0  # zombie PENDING objects
    quota_evictions: int = 0
    # Eviction that stopped short because what was left was pinned or PENDING.
    blocked: int = 0
    blocked_bytes: int = 0
    blocked_pinned: int = 0
    demotions: int = 0
    demoted_bytes: int = 0
    demotion_failures: int = 0
    promotions: int = 0
    promoted_bytes: int = 0
    promotion_failures: int = 0
    ssd_evictions: int = 0
    ssd_evicted_bytes: int = 0
    put_failures: dict[str, int] = field(default_factory=dict)  # reason -> count


class Move:
    """An object moving between tiers: its token, and the reserved destination."""

    __slots__ = ("dest", "kind", "token")

    def __init__(self, kind: MoveKind, token: int, dest: int) -> None:
        self.kind = kind
        self.token = token
        self.dest = dest


class EventLog:
    """Events for the I/O layer, bounded: past maxlen the oldest go (and are counted)."""

    __slots__ = ("_events", "dropped")

    def __init__(self, maxlen: int) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)
        self.dropped = 0

    def emit(self, event: Event) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)

    def take(self) -> list[Event]:
        out = list(self._events)
        self._events.clear()
        return out


class CoreState:
    """Every table of the master core; see the module docstring."""

    def __init__(self, config: CoreConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.align_mask = config.alignment - 1
        self.objects = ObjectTable()
        self.segments = SegmentMap()
        # Ranges a writer or a node may still be copying into (quarantine.py).
        self.quarantine = Quarantine(self.segments)
        self.leases = LeaseTable(config.first_lease_id)
        self.ledger = SpaceLedger()
        self.counts = Counters()
        self.events = EventLog(config.max_events)
        # LRU of unpinned COMPLETE objects in DRAM, and per node of those on its SSD.
        self.lru = LruList()
        self.ssd_lru: dict[str, LruList] = {}
        # The DRAM placement candidates and their capacity: the pool the watermarks
        # watch (draining nodes' DRAM is not in it); tiered: any SSD segment mounted.
        self.dram: list[Segment] = []
        self.pool_capacity = 0
        self.tiered = False
        # Nodes that get no new placements (kvstore drain). Kept while unmounted, so a
        # draining node that restarts stays draining.
        self.draining: set[str] = set()
        # Nodes mounted again whose inventory is still being replayed (set_adopting):
        # no placements there until it is, or a new object takes the range of one the
        # node still holds and the node's entry is refused.
        self.adopting: set[str] = set()
        # Nodes that missed their last inventory delta (set_unresponsive): likely dead
        # before their etcd lease ends; no placements there until one lands again.
        self.unresponsive: set[str] = set()
        # Nodes gone recently, listed by node_list() for config.departed_retention s.
        self.departed: dict[str, NodeInfo] = {}
        # No eviction before this clock time (after a failover, see hold_eviction_until).
        self.hold_until = -math.inf
        self.watermark_blocked = False  # a watermark shortfall counts once per episode
        # Evicted keys and their bytes not yet reported in an EVICTED event.
        self.evicted_keys: list[bytes] = []
        self.evicted_size = 0
        # Objects moving between tiers (slot -> move), and the moves queued for the
        # I/O layer to carry out; on_move_queued (no I/O: it only wakes the mover) is
        # called whenever one is queued.
        self.moves: dict[int, Move] = {}
        self.move_queue: list[TierMove] = []
        self.on_move_queued: Callable[[], None] | None = None
        # Tenant prefix -> quota in bytes; empty: no quotas (ObjectTable.usage is None).
        self.quotas: dict[bytes, int] = {}
        # Replica journal for the store nodes' inventories; off (None) unless the
        # daemon wants it, so that nothing accumulates in tests and benchmarks.
        self.journal: list[ReplicaChange] | None = None
        self.recent = RecentCounts(RECENT, 60, start=clock.now())

    # -- checks -------------------------------------------------------------------

    def check_batch(self, n: int) -> None:
        if n > self.config.max_batch:
            raise InvalidArgument(
                f"batch of {n} keys is larger than max_batch={self.config.max_batch}; split it"
            )

    def ttl(self, ttl: float | None) -> float:
        if ttl is None:
            return self.config.default_lease_ttl
        if not 0 < ttl <= self.config.max_lease_ttl:  # also refuses NaN
            raise InvalidArgument(f"lease ttl must be > 0 and <= {self.config.max_lease_ttl} s, got {ttl}")
        return float(ttl)

    # -- the DRAM pool ------------------------------------------------------------

    def refresh_pool(self) -> None:
        self.tiered = bool(self.segments.tier(SSD))
        # Draining nodes get no new placements, and their DRAM is not in the pool the
        # watermarks watch: the rest of the cluster must hold the working set.
        self.dram = [s for s in self.segments.tier(DRAM)
                     if s.node_id not in self.draining and s.node_id not in self.adopting
                     and s.node_id not in self.unresponsive]
        self.pool_capacity = sum(s.alloc.capacity for s in self.dram)

    def pool_used(self) -> int:
        # DRAM that in-flight demotions are about to free counts as free already, or
        # every batch would demote more while the first demotions are still copying.
        return sum(s.alloc.used_bytes for s in self.dram) - self.ledger.demoting

    # -- replicas -----------------------------------------------------------------

    def footprint(self, handles: Iterable[int], size: int) -> int:
        """DRAM bytes the replicas at `handles` occupy (what the allocator reserved)."""
        m = self.align_mask
        total = 0
        by_id = self.segments.by_id
        for h in handles:
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is not None and seg.tier == DRAM:
                off = h & OFFSET_MASK
                total += ((off + size + m) & ~m) - (off & ~m)
        return total

    def free_replicas(self, handles: Iterable[int], size: int, frees: Frees | None = None) -> None:
        """Give the ranges of the replicas at `handles` (of an object of `size` bytes)
        back to their segments, where those are still mounted (Segment.give). With `frees`,
        the ranges are added there instead, for the caller to give back in bulk
        (Segment.give_many) before anything allocates again."""
        by_id = self.segments.by_id
        for h in handles:
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is None:
                continue
            if frees is None:
                seg.give(h & OFFSET_MASK, alloc_size(seg.tier, size))
            else:
                ranges = frees.get(seg)
                if ranges is None:
                    ranges = frees[seg] = []
                ranges.append((h & OFFSET_MASK, alloc_size(seg.tier, size)))

    def hold_replicas(self, handles: Iterable[int], size: int, tag: tuple[str, bytes, str],
                      deadline: float, gone: dict[int, Segment] | None = None) -> None:
        """Like free_replicas, except that the ranges stay allocated, in the quarantine
        under `tag` until `deadline` (or its release). `gone`: segments just unmounted
        (by id), whose ranges are held for a segment mounted over the same memory."""
        by_id = self.segments.by_id
        ranges: list[Range] = []
        detached: list[tuple[Memory, int, int]] = []
        for h in handles:
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is None:
                lost = gone.get(h >> OFFSET_BITS) if gone else None
                if lost is not None:
                    detached.append((memory_of(lost), h & OFFSET_MASK,
                                     alloc_size(lost.tier, size)))
                continue
            ranges.append((seg, h & OFFSET_MASK, alloc_size(seg.tier, size)))
            seg.give_held()
        self.quarantine.hold(tag, deadline, ranges, detached)

    def _hold_deadline(self) -> float:
        return self.clock.now() + self.config.put_timeout

    def set_replicas(self, s: int, handles: tuple[int, ...], space: int,
                     demoting: bool = False) -> None:
        """COMPLETE object s now has the replicas at `handles`, holding `space` DRAM
        bytes (the ranges of those it lost already freed); `demoting`: count the
        change against its in-flight demotion too."""
        t = self.objects
        self.ledger.resized(space - t.space[s], t.pins[s] > 0, demoting)
        t.space[s] = space
        t.set_handles(s, handles)

    def locations(self, s: int) -> list[Location]:
        t = self.objects
        size = t.size[s]
        by_id = self.segments.by_id
        out: list[Location] = []
        for h in t.handles(s):
            seg = by_id[h >> OFFSET_BITS]
            out.append(location(seg.node_id, seg.name, seg.base_addr + (h & OFFSET_MASK), size,
                                seg.tier))
        return out

    # -- the replica journal: appended here only -------------------------------------

    def journal_replicas(self, s: int, key: bytes, added: bool,
                         handles: Iterable[int] | None = None) -> None:
        """Journal object s's replicas (or those at `handles`, some of its) as `added`
        or freed, on the segments still mounted. The journal must be on."""
        t = self.objects
        by_id = self.segments.by_id
        size = t.size[s]
        checksum = t.checksum[s]
        assert self.journal is not None
        append = self.journal.append  # journal_range, inlined: once per replica
        for h in t.handles(s) if handles is None else handles:
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is not None:
                append(replica_change(seg.node_id, seg.tier, key, h & OFFSET_MASK, size,
                                      checksum, added))

    def journal_range(self, node_id: str, tier: Tier, key: bytes, offset: int, size: int,
                      checksum: int, added: bool) -> None:
        """Journal one range of a node's inventory (the journal must be on): also one no
        object owns any more (a demotion's file whose object went while it moved)."""
        assert self.journal is not None
        self.journal.append(replica_change(node_id, tier, key, offset, size, checksum, added))

    def slots_on(self, seg_ids: set[int]) -> list[int]:
        """Live objects (PENDING or COMPLETE) with a replica in one of these segments,
        in slot order. Scans the table with numpy: for membership changes and admin
        calls, not for a hot path."""
        t = self.objects
        where = np.frombuffer(t.where, dtype=np.uint64).copy()
        phase = np.frombuffer(t.phase, dtype=np.int8).copy()
        hit = np.isin(where >> np.uint64(OFFSET_BITS), np.array(sorted(seg_ids), dtype=np.uint64))
        # Freed slots keep a stale `where`; only live objects count.
        hit &= phase != GONE
        found = set(np.flatnonzero(hit).tolist())
        for s, extra in t.extra.items():
            if any(h >> OFFSET_BITS in seg_ids for h in extra):
                found.add(s)
        return sorted(found)

    # -- LRU lists ----------------------------------------------------------------

    def lru_of(self, s: int) -> LruList:
        """The LRU an unpinned COMPLETE object belongs on: DRAM's, or its node's SSD one."""
        seg = self.segments.by_id.get(self.objects.where[s] >> OFFSET_BITS)
        if seg is None or seg.tier == DRAM:
            return self.lru
        lru = self.ssd_lru.get(seg.node_id)
        if lru is None:
            lru = self.ssd_lru[seg.node_id] = LruList()
            lru.grow(self.objects.slots)
        return lru

    def grow_lrus(self) -> None:
        slots = self.objects.slots
        self.lru.grow(slots)
        for lru in self.ssd_lru.values():
            lru.grow(slots)

    # -- the one way out ----------------------------------------------------------

    def drop(self, s: int, frees: Frees | None = None, gone: dict[int, Segment] | None = None,
             until: Until = Until.WRITER) -> None:
        """Forget an object and free its replicas on the segments still mounted (and a
        move's reservation). `frees`: see free_replicas. A PENDING object's ranges are
        held in the quarantine instead, for as long as `until` says; so is a move's
        destination, until the node answers for the move (quarantine.py). `gone`: see
        hold_replicas."""
        t = self.objects
        size = t.size[s]
        pending = t.phase[s] == PENDING
        p = 0 if pending else t.pins[s]
        key = t.key_of[s]
        if self.journal is not None and not pending and key is not None:
            self.journal_replicas(s, key, False)
        if pending and until is not Until.NOW and key is not None:
            pw = t.pending.get(s)
            deadline = pw.deadline if pw is not None else self._hold_deadline()
            tag = (put_tag(key, pw.writer if pw else "") if until is Until.WRITER
                   else timeout_tag(key))
            self.hold_replicas(t.handles(s), t.extent(s), tag, deadline, gone)
        else:
            self.free_replicas(t.handles(s), t.extent(s), frees)
        move = self.moves.pop(s, None)
        if move is not None:
            if key is not None:
                self.hold_replicas((move.dest,), size, move_tag(key), self._hold_deadline(),
                                   gone)
            else:
                self.free_replicas((move.dest,), size)
            if move.kind == MoveKind.DEMOTE:
                self.ledger.demotion_ended(t.space[s])
        self.ledger.dropped(t.space[s], size, pending, p > 0)
        if not pending and p == 0:
            self.lru_of(s).unlink(s)
        t.free(s)
