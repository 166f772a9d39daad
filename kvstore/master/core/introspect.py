"""Introspection: stats, eviction stats, inspect, keys and the node list.

Read-only views of the state for operators, metrics and admin tools. The scans here
(numpy over the object table, the whole index for keys()) are for those callers, never
for a hot path.
"""

from __future__ import annotations

import heapq

import numpy as np

from kvstore.errors import InvalidArgument

from .keys import norm_key
from .lifecycle import COMPLETE
from .membership import Membership
from .quotas import Quotas
from .results import (
    CoreStats,
    EvictionStats,
    NodeInfo,
    NodeStats,
    ObjectInfo,
    SegmentStats,
    TierEvictions,
)
from .segments import DRAM, OFFSET_BITS, SSD
from .state import RECENT, CoreState

if RECENT != ("lookup_keys", "hit_keys", "evictions", "evicted_bytes", "demotions",
              "demoted_bytes", "ssd_evictions", "ssd_evicted_bytes"):  # pragma: no cover
    raise ImportError("state.RECENT changed: update Introspect.recent_totals(), which "
                      "lists the same counters in the same order")


class Introspect:
    def __init__(self, state: CoreState, membership: Membership, quotas: Quotas) -> None:
        self._state = state
        self._t = state.objects
        self._membership = membership
        self._quotas = quotas

    def recent_totals(self) -> list[int]:
        """The running totals window.RecentCounts keeps a history of, in RECENT's order
        (tick() takes them every call: spelled out rather than looked up by name)."""
        c = self._state.counts
        return [c.lookup_keys, c.hit_keys, c.evictions, c.evicted_bytes, c.demotions,
                c.demoted_bytes, c.ssd_evictions, c.ssd_evicted_bytes]

    def stats(self) -> CoreStats:
        state = self._state
        now = state.clock.now()
        t = self._t
        mask = state.align_mask
        pins = np.frombuffer(t.pins, dtype=np.int32).copy()
        phase = np.frombuffer(t.phase, dtype=np.int8).copy()
        where = np.frombuffer(t.where, dtype=np.uint64).copy()
        sizes = np.frombuffer(t.size, dtype=np.int64).copy()
        # A pin count means something for COMPLETE objects only (objects.py).
        pinned = (pins > 0) & (phase == COMPLETE)
        seg_of = (where[pinned] >> np.uint64(OFFSET_BITS)).astype(np.int64)
        asize = (sizes[pinned] + mask) & ~mask
        pinned_replicas: dict[int, int] = {}
        pinned_bytes: dict[int, int] = {}
        if len(seg_of):
            ids, inverse, counts = np.unique(seg_of, return_inverse=True, return_counts=True)
            totals = np.bincount(inverse, weights=asize)
            for i, c, b in zip(ids.tolist(), counts.tolist(), totals.tolist(), strict=True):
                pinned_replicas[i] = c
                pinned_bytes[i] = int(b)
        for s, extra in t.extra.items():
            if t.phase[s] == COMPLETE and t.pins[s] > 0:
                a = (t.size[s] + mask) & ~mask
                for h in extra:
                    i = h >> OFFSET_BITS
                    pinned_replicas[i] = pinned_replicas.get(i, 0) + 1
                    pinned_bytes[i] = pinned_bytes.get(i, 0) + a

        by_node = state.segments.by_node
        nodes: dict[str, NodeStats] = {}
        for node_id in sorted(by_node):
            segs = [
                SegmentStats(
                    node_id=node_id,
                    segment=seg.name,
                    tier=seg.tier,
                    base_addr=seg.base_addr,
                    capacity=seg.alloc.capacity,
                    used=seg.alloc.used_bytes,
                    free_largest=seg.alloc.largest_free(),
                    replicas=seg.replicas,
                    pinned_replicas=pinned_replicas.get(seg.seg_id, 0),
                    pinned_bytes=pinned_bytes.get(seg.seg_id, 0),
                )
                for seg in by_node[node_id].values()
            ]
            nodes[node_id] = NodeStats(
                capacity=sum(s.capacity for s in segs),
                used=sum(s.used for s in segs),
                objects=sum(s.replicas for s in segs),
                pinned_objects=sum(s.pinned_replicas for s in segs),
                pinned_bytes=sum(s.pinned_bytes for s in segs),
                segments=segs,
            )
        n_pending = len(t.pending)
        space = state.ledger.counts()
        c = state.counts
        return CoreStats(
            objects_pending=n_pending,
            objects_complete=len(t) - n_pending,
            bytes_pending=space.pending_size,
            bytes_complete=space.complete_size,
            pool_capacity=state.pool_capacity,
            pool_used=state.pool_used(),
            pool_pinned=space.pinned,
            pool_pending=space.pending,
            active_leases=len(state.leases),
            nodes=nodes,
            lookups=c.lookups,
            lookup_keys=c.lookup_keys,
            hit_keys=c.hit_keys,
            leases_granted=c.leases_granted,
            leases_expired=c.leases_expired,
            leases_released=c.leases_released,
            evictions=c.evictions,
            evicted_bytes=c.evicted_bytes,
            reclaimed_pending=c.reclaimed,
            put_failures=dict(c.put_failures),
            events_dropped=state.events.dropped,
            eviction_held_until=max(state.hold_until, 0.0),
            recent=state.recent.recent(now, self.recent_totals()),
            recent_seconds=state.recent.covered(now),
            draining=sorted(state.draining),
            eviction_blocked=c.blocked,
            eviction_blocked_bytes=c.blocked_bytes,
            tenants={p[:-1].decode(errors="replace"): v
                     for p, v in self._quotas.tenant_usage().items()},
            quota_evictions=c.quota_evictions,
        )

    def eviction_stats(self) -> EvictionStats:
        state = self._state
        now = state.clock.now()
        recent = state.recent.recent(now, self.recent_totals())
        c = state.counts
        tiers = [TierEvictions(
            DRAM, c.evictions, c.evicted_bytes, recent["evictions"],
            recent["evicted_bytes"], c.demotions, c.demoted_bytes,
            recent["demotions"], recent["demoted_bytes"],
        )]
        if state.segments.tier(SSD) or c.ssd_evictions:
            tiers.append(TierEvictions(
                SSD, c.ssd_evictions, c.ssd_evicted_bytes,
                recent["ssd_evictions"], recent["ssd_evicted_bytes"],
            ))
        space = state.ledger.counts()
        return EvictionStats(
            tiers=tiers,
            evict_high=state.config.evict_high,
            evict_low=state.config.evict_low,
            pool_capacity=state.pool_capacity,
            pool_used=state.pool_used(),
            pool_pinned=space.pinned,
            pool_pending=space.pending,
            blocked=c.blocked,
            blocked_bytes=c.blocked_bytes,
            blocked_pinned_bytes=c.blocked_pinned,
            held_for=max(0.0, state.hold_until - now),
            recent_seconds=state.recent.covered(now),
        )

    def inspect(self, key: bytes) -> ObjectInfo | None:
        k = norm_key(key)
        t = self._t
        s = t.index.get(k) if k is not None else None
        if s is None:
            return None
        pending = t.pending.get(s)
        return ObjectInfo(
            key=k,  # type: ignore[arg-type]
            state="pending" if pending is not None else "complete",
            size=t.size[s],
            checksum=t.checksum[s],
            locations=self._state.locations(s),
            pins=t.pins[s] if pending is None else 0,
            last_access=t.touched[s],
            created=t.created[s],
            writer=pending.writer if pending is not None else "",
        )

    def keys(self, prefix: bytes, limit: int) -> list[bytes]:
        if limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {limit}")
        return heapq.nsmallest(limit, (k for k in self._t.index if k.startswith(prefix)))

    def node_list(self) -> list[NodeInfo]:
        state = self._state
        self._membership.forget_departed(state.clock.now())
        out = [
            NodeInfo(node_id, "draining" if node_id in state.draining else "alive",
                     ns.segments, ns.objects)
            for node_id, ns in self.stats().nodes.items()
        ]
        out += sorted(state.departed.values(), key=lambda n: n.node_id)
        return out
