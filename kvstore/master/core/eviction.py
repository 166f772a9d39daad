"""The eviction policy, and the one bookkeeping every eviction goes through.

When to start (above evict_high of the DRAM pool, or when an allocation finds no room),
where to stop (evict_low, or the first victim that makes room), how much one round may
take (evict_batch objects: the marks sit close to the top so the pool stays full, and a
round stays small however large the pool is), the post-failover hold
(nothing is evicted before hold_eviction_until: the old leader's pins are unknown),
demoting instead of dropping where the node has an SSD tier, and the bookkeeping
(Eviction.evict: counters, the EVICTED event, the drop). Victims come oldest first
from the LRU list of evictable objects (lru.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kvstore.errors import InvalidArgument

from .placement import place
from .results import Event, EventKind, EvictionReport, Tier
from .segments import DRAM, OFFSET_BITS, Segment
from .state import CoreState, Frees


def _no_demotion(s: int) -> bool:
    return False


class Eviction:
    """Eviction policy and bookkeeping over the core's state."""

    def __init__(self, state: CoreState) -> None:
        self._state = state
        self._t = state.objects
        self._lru = state.lru
        # Start demoting slot s instead of dropping it: True if it is on its way to SSD.
        # Tiers demote for eviction and evict for their moves; the facade ties the knot.
        self.demote: Callable[[int], bool] = _no_demotion
        self._unfinished = False  # the last watermark round stopped at evict_batch

    # -- bookkeeping --------------------------------------------------------------

    def evict(self, s: int, frees: Frees | None = None, tier: Tier = DRAM) -> None:
        """Drop COMPLETE object s as evicted: counted under `tier`'s evictions (SSD:
        dropped to make room on its SSD tier) and reported in the next EVICTED event
        (flush). `frees`: see CoreState.free_replicas."""
        state = self._state
        t = self._t
        size = t.size[s]
        state.evicted_keys.append(t.key_of[s])  # type: ignore[arg-type]
        state.evicted_size += size
        c = state.counts
        if tier == DRAM:
            c.evictions += 1
            c.evicted_bytes += size
        else:
            c.ssd_evictions += 1
            c.ssd_evicted_bytes += size
        state.drop(s, frees)

    def flush(self) -> None:
        """Report the evictions since the last flush as one EVICTED event."""
        state = self._state
        if state.evicted_keys:
            state.events.emit(Event(EventKind.EVICTED, state.evicted_keys, state.evicted_size))
            state.evicted_keys = []
            state.evicted_size = 0

    def note_blocked(self, shortfall: int) -> None:
        """Eviction stopped short by `shortfall` bytes: all that is left is pinned or
        PENDING (never called while eviction is held after a failover)."""
        c = self._state.counts
        c.blocked += 1
        c.blocked_bytes += max(shortfall, 0)
        c.blocked_pinned = self._state.ledger.pinned

    # -- policy -------------------------------------------------------------------

    def hold_until(self, t: float) -> None:
        self._state.hold_until = max(self._state.hold_until, t)

    def evict_oldest(
        self, demote: bool = False, frees: Frees | None = None
    ) -> tuple[int, tuple[int, ...]]:
        """Evict the least recently used evictable object: (DRAM bytes freed, its
        replica handles), or (0, ()) when nothing is evictable. With `demote`, an object
        whose node has SSD room is demoted instead of dropped (its DRAM is freed once
        the node has copied it). `frees`: see CoreState.free_replicas."""
        s = self._lru.oldest()
        if not s:
            return 0, ()
        t = self._t
        freed = t.space[s]
        handles = t.handles(s)
        if demote and self._state.tiered and self.demote(s):
            return freed, handles
        self.evict(s, frees)
        return freed, handles

    def evict_until(self, target: float, used: int, limit: int | None = None) -> int:
        """Evict until used <= target (or `limit` objects went); returns used afterwards.
        Stops at the first object that gets there, so it never evicts more than needed."""
        return self._evict_until(target, used, limit)[0]

    def _evict_until(self, target: float, used: int,
                     limit: int | None = None) -> tuple[int, int]:
        """evict_until, and how many objects went (evicted or demoting)."""
        n = 0
        # Nothing here allocates DRAM or looks at its free extents (`used` counts the
        # objects' footprints), so the victims' ranges can be freed together at the end:
        # the LRU's oldest were mostly written together and sit together.
        frees: Frees = {}
        try:
            while used > target and (limit is None or n < limit):
                freed, handles = self.evict_oldest(True, frees)
                if not handles:
                    break
                used -= freed
                n += 1
        finally:
            for seg, ranges in frees.items():
                seg.give_many(ranges)
        return used, n

    def to_watermark(self, now: float) -> None:
        """Above evict_high of the DRAM pool, evict (or demote) down to evict_low, at
        most evict_batch objects per round: with the default marks close together the
        pool stays near full, and a round never costs more than the batch. A round the
        batch cut short is not blocked: the next put or tick goes on from there."""
        state = self._state
        if now < state.hold_until or not state.pool_capacity:
            return
        used = state.pool_used()
        config = state.config
        if used > config.evict_high * state.pool_capacity or self._unfinished:
            target = config.evict_low * state.pool_capacity
            used, n = self._evict_until(target, used, config.evict_batch)
            # Cut short by the batch: the next round goes on down to evict_low, even
            # from below evict_high.
            self._unfinished = used > target and n >= config.evict_batch
            if self._unfinished:
                return
            if used > target:
                # Every tick retries; one shortfall episode is counted once.
                if not state.watermark_blocked:
                    self.note_blocked(int(used - target))
                state.watermark_blocked = True
                return
        state.watermark_blocked = False

    def evict_for(self, asize: int, want: int, now: float) -> list[tuple[Segment, int]]:
        """Evict oldest-first until one replica of `asize` bytes fits, then place up to
        `want`. Only the first replica is worth evicting for: extra replicas are best
        effort, and evicting for them could empty the LRU while the other nodes are
        full of pinned objects. Pinned and PENDING objects are never on the LRU, so
        this cannot touch them; it gives up when the LRU is empty."""
        state = self._state
        if now < state.hold_until:
            return []
        by_id = state.segments.by_id
        while True:
            _, handles = self.evict_oldest()
            if not handles:
                self.note_blocked(asize)
                return []
            for h in handles:
                seg = by_id.get(h >> OFFSET_BITS)
                if (seg is not None and seg.tier == DRAM and seg.node_id not in state.draining
                        and seg.alloc.largest_free() >= asize):
                    return place(state.dram, asize, want)

    def evict_tenant(self, prefix: bytes, need: int) -> None:
        """Evict the tenant's least recently used unpinned objects, DRAM first, then SSD,
        until `need` bytes are free or none of its objects is left to evict."""
        state = self._state
        t = self._t
        key_of = t.key_of
        victims: list[int] = []
        freed = 0
        for lru in (self._lru, *state.ssd_lru.values()):
            nxt = lru.next
            s = nxt[0]
            while s > 0 and freed < need:
                k = key_of[s]
                if k is not None and k.startswith(prefix):
                    victims.append(s)
                    freed += t.size[s]
                s = nxt[s]
            if freed >= need:
                break
        for s in victims:
            state.counts.quota_evictions += 1
            self.evict(s)

    def evict_to(self, ratio: float, limit: int | None = None) -> EvictionReport:
        """MasterCore.evict_to."""
        if not 0.0 <= ratio <= 1.0:
            raise InvalidArgument(f"ratio must be between 0 and 1, got {ratio}")
        if limit is not None and limit < 1:
            raise InvalidArgument(f"limit must be >= 1 object per call, got {limit}")
        state = self._state
        c = state.counts
        now = state.clock.now()
        before = (c.evictions, c.evicted_bytes)
        held = now < state.hold_until
        used = state.pool_used()
        target = ratio * state.pool_capacity
        if not held:
            used = self.evict_until(target, used, limit)
            self.flush()
            if used > target and (limit is None or c.evictions - before[0] < limit):
                self.note_blocked(int(used - target))
        return EvictionReport(
            evicted=c.evictions - before[0],
            evicted_bytes=c.evicted_bytes - before[1],
            used=used,
            capacity=state.pool_capacity,
            reached=used <= target,
            held=held,
            pinned=state.ledger.pinned,
        )
