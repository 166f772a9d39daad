"""MasterCore: the whole master minus I/O, driven by method calls and a clock.

Rule 1: everything that decides an object's fate lives behind this facade — PENDING ->
COMPLETE -> (evicted | removed | lost with its node), who pins it, where its replicas
are, when space is reclaimed. The gRPC server and the etcd watcher only translate
messages into these calls and results back into messages.

Rule 2: nothing here blocks, sleeps, logs on a hot path, reads the time except through
the injected clock, or touches a socket or a file. Time-driven work (lease expiry,
zombie PENDING reclaim, watermark eviction) happens in `tick()`, which the server calls
every ~100 ms and after batches.

Rule 3: per-key problems in a batch are per-key result codes; only a malformed call
(batch too large, lists of different lengths, a bad TTL or lease id) raises, and a call
that raises has changed nothing.

The promise (DESIGN.md, "Leases and pins"): an object pinned by a live lease is never
evicted or re-allocated; only a forced remove or the loss of its node can take it, and
the reader then gets NOT_FOUND under its lease instead of someone else's bytes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from kvstore.errors import MAX_KEY_BYTES, Code, InvalidArgument, check_key

from .clock import Clock, MonotonicClock
from .config import CoreConfig
from .eviction import LruList
from .leases import LeaseTable
from .objects import PENDING, SLOT_BITS, SLOT_MASK, ObjectTable, PendingWrite
from .placement import place
from .results import (
    CoreStats,
    Event,
    EventKind,
    EvictionReport,
    GetReplicasResult,
    Location,
    LookupResult,
    NodeStats,
    ObjectInfo,
    PutStartResult,
    ReadResult,
    ReplicaChange,
    SegmentStats,
    TickReport,
)
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK, Segment, SegmentMap

TIERS = ("dram", "ssd")
_MAX_CHECKSUM = 1 << 64


def _norm_key(key: object) -> bytes | None:
    """The key as hashable bytes, or None when it is not a usable key."""
    if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES:
        return key
    try:
        check_key(key)  # type: ignore[arg-type]
    except InvalidArgument:
        return None
    return bytes(key)  # type: ignore[call-overload]


def _bad_key_message(key: object) -> str:
    try:
        check_key(key)  # type: ignore[arg-type]
    except InvalidArgument as err:
        return err.message
    return ""


class MasterCore:
    def __init__(self, config: CoreConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config if config is not None else CoreConfig()
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._align_mask = self.config.alignment - 1
        self._objects = ObjectTable()
        self._lru = LruList()
        self._leases = LeaseTable(self.config.first_lease_id)
        self._segments = SegmentMap()
        self._dram: list[Segment] = []  # placement candidates
        self._pool_capacity = 0
        # DRAM bytes (all replicas, aligned) held by pinned and by PENDING objects.
        self._pinned_space = 0
        self._pending_space = 0
        # Object bytes (sizes) by state.
        self._pending_size = 0
        self._complete_size = 0
        self._hold_until = -math.inf
        self._events: deque[Event] = deque(maxlen=self.config.max_events)
        self._events_dropped = 0
        self._evicted_keys: list[bytes] = []
        self._evicted_size = 0
        # counters
        self._lookups = 0
        self._lookup_keys = 0
        self._hit_keys = 0
        self._leases_granted = 0
        self._leases_expired = 0
        self._leases_released = 0
        self._evictions = 0
        self._evicted_bytes = 0
        self._reclaimed = 0
        self._put_failures: dict[str, int] = {}
        # Replica journal for the store nodes' inventories; off (None) unless the
        # daemon wants it, so that nothing accumulates in tests and benchmarks.
        self.journal: list[ReplicaChange] | None = None

    # ------------------------------------------------------------------ membership

    def mount_segment(
        self, node_id: str, segment: str, base_addr: int, size: int, tier: str = "dram"
    ) -> None:
        """Register a node's segment. Same geometry again: no-op. Different: replace it,
        dropping every replica the old one held (the node restarted with new memory)."""
        if not node_id:
            raise InvalidArgument("node_id must be a non-empty string")
        if tier not in TIERS:
            raise InvalidArgument(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        if not 0 <= base_addr < 1 << 64:
            raise InvalidArgument(f"base_addr must be a 64-bit address, got {base_addr}")
        if not self.config.alignment <= size <= OFFSET_MASK + 1:
            raise InvalidArgument(
                f"segment size must be between {self.config.alignment} bytes and "
                f"{OFFSET_MASK + 1} bytes, got {size}"
            )
        old = self._segments.get(node_id, tier)
        if old is not None:
            if old.same_geometry(segment, base_addr, size):
                return
            self._segments.remove(old)
            self._lose([old], node_id)
        self._segments.add(node_id, segment, base_addr, size, tier, self.config.alignment)
        self._refresh_pool()

    def unmount_node(self, node_id: str) -> list[bytes]:
        """Forget a node. Its replicas vanish at once. Returns the keys now gone: COMPLETE
        objects that lost their last replica, and PENDING objects that had a replica
        there (their writer's put_end will get NOT_FOUND). Unknown node: []."""
        gone = self._segments.remove_node(node_id)
        if not gone:
            return []
        self._refresh_pool()
        return self._lose(gone, node_id)

    def node_ids(self) -> list[str]:
        return sorted(self._segments.by_node)

    # ------------------------------------------------------------------ writes

    def put_start(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        replicas: int | None = None,
        writer: str = "",
    ) -> list[PutStartResult]:
        """Allocate space for new objects (PENDING, invisible to readers).

        `replicas` None or 0 means config.default_replicas; it is best effort: fewer
        nodes, or no room on enough distinct nodes, gives fewer (never zero) replicas.
        When not even one fits, least recently used objects are evicted until it does;
        STORE_FULL when pinned and PENDING objects leave no room.
        A repeated key in the batch gets the first occurrence's result.
        """
        n = len(keys)
        if len(sizes) != n or len(checksums) != n:
            raise InvalidArgument(
                f"put_start needs one size and one checksum per key: got {n} keys, "
                f"{len(sizes)} sizes, {len(checksums)} checksums"
            )
        self._check_batch(n)
        want = replicas if replicas else self.config.default_replicas
        if not 1 <= want <= self.config.max_replicas:
            raise InvalidArgument(
                f"replicas must be between 1 and {self.config.max_replicas}, got {replicas}"
            )
        now = self.clock.now()
        want = min(want, len(self._dram))
        largest = max((s.alloc.capacity for s in self._dram), default=0)
        deadline = now + self.config.put_timeout
        results: list[PutStartResult] = []
        seen: dict[bytes, PutStartResult] = {}
        for key, size, checksum in zip(keys, sizes, checksums, strict=True):
            k = _norm_key(key)
            if k is None:
                results.append(self._put_failed("invalid_argument", _bad_key_message(key)))
                continue
            r = seen.get(k)
            if r is None:
                r = seen[k] = self._put_one(k, size, checksum, want, writer, now, deadline, largest)
            results.append(r)
        self._evict_to_watermark(now)
        self._flush_evictions()
        return results

    def put_end(self, keys: Sequence[bytes], writer: str = "") -> list[Code]:
        """Commit PENDING objects: OK; NOT_FOUND when not PENDING (never started,
        revoked, reclaimed, lost); ALREADY_EXISTS when already COMPLETE (a retry);
        IN_PROGRESS when another named writer holds it."""
        self._check_batch(len(keys))
        t = self._objects
        now = self.clock.now()
        out: list[Code] = []
        seen: dict[bytes, Code] = {}
        for key in keys:
            k = _norm_key(key)
            if k is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            code = seen.get(k)
            if code is None:
                s = t.index.get(k)
                if s is None:
                    code = Code.NOT_FOUND
                elif t.pins[s] != PENDING:
                    code = Code.ALREADY_EXISTS
                elif not self._writer_may(s, writer):
                    code = Code.IN_PROGRESS
                else:
                    del t.pending[s]
                    t.pins[s] = 0
                    t.touched[s] = now
                    self._lru.push(s)
                    if self.journal is not None:
                        self._journal_replicas(s, k, True)
                    self._pending_space -= t.space[s]
                    self._pending_size -= t.size[s]
                    self._complete_size += t.size[s]
                    code = Code.OK
                seen[k] = code
            out.append(code)
        return out

    def put_revoke(self, keys: Sequence[bytes], writer: str = "") -> list[Code]:
        """Free PENDING objects: OK; NOT_FOUND when not there; ALREADY_EXISTS when
        COMPLETE (committed objects are not revoked; use remove); IN_PROGRESS when
        another named writer holds it."""
        self._check_batch(len(keys))
        t = self._objects
        out: list[Code] = []
        seen: dict[bytes, Code] = {}
        for key in keys:
            k = _norm_key(key)
            if k is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            code = seen.get(k)
            if code is None:
                s = t.index.get(k)
                if s is None:
                    code = Code.NOT_FOUND
                elif t.pins[s] != PENDING:
                    code = Code.ALREADY_EXISTS
                elif not self._writer_may(s, writer):
                    code = Code.IN_PROGRESS
                else:
                    self._drop(s)
                    code = Code.OK
                seen[k] = code
            out.append(code)
        return out

    # ------------------------------------------------------------------ reads

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """COMPLETE only; does not touch recency and pins nothing."""
        self._check_batch(len(keys))
        index = self._objects.index
        pins = self._objects.pins
        out: list[bool] = []
        for key in keys:
            k = key if type(key) is bytes else _norm_key(key)
            s = index.get(k) if k is not None else None
            out.append(s is not None and pins[s] >= 0)
        return out

    def lookup(self, keys: Sequence[bytes], lease_ttl: float | None = None, holder: str = "") -> LookupResult:
        """Pin the longest contiguous COMPLETE prefix of `keys` under a new lease.

        A key repeated inside the prefix is pinned once per position, so trimming the
        lease with keep_first_n stays positional.
        """
        self._check_batch(len(keys))
        ttl = self._ttl(lease_ttl)
        t = self._objects
        get = t.index.get
        pins = t.pins
        slots: list[int] = []
        hit = slots.append
        try:
            for key in keys:
                s = get(key)
                if s is None or pins[s] < 0:
                    break
                hit(s)
        except TypeError:
            # An unhashable key (bytearray, list ...): retry with normalised keys.
            return self.lookup(self._hashable(keys), lease_ttl, holder)
        count = len(slots)
        self._lookups += 1
        self._lookup_keys += len(keys)
        self._hit_keys += count
        if not count:
            return LookupResult(0, 0, 0.0)
        now = self.clock.now()
        tokens = self._pin_slots(slots, now)
        lease = self._leases.grant(holder, list(keys[:count]), tokens, ttl, now)
        self._leases_granted += 1
        return LookupResult(count, lease.lease_id, lease.expires_at)

    def renew_lease(self, lease_id: int, ttl: float | None = None) -> float:
        """Extend a live lease to now + ttl; returns the new expires_at."""
        return self._leases.renew(lease_id, self._ttl(ttl), self.clock.now())

    def release_lease(self, lease_id: int, keep_first_n: int | None = None) -> None:
        """Release the lease (None), or keep its first n pins and unpin the rest; a lease
        trimmed to 0 stays alive, empty, until released or expired."""
        if keep_first_n is not None and keep_first_n < 0:
            raise InvalidArgument(f"keep_first_n must be >= 0, got {keep_first_n}")
        now = self.clock.now()
        if keep_first_n is None:
            lease = self._leases.release(lease_id, now)
            self._unpin(lease.tokens)
            self._leases_released += 1
        else:
            self._unpin(self._leases.trim(lease_id, keep_first_n, now))

    def get_replicas(
        self,
        keys: Sequence[bytes],
        lease_id: int | None = None,
        lease_ttl: float | None = None,
        holder: str = "",
    ) -> GetReplicasResult:
        """Where to read each key.

        With a lease (id not None and not 0): only keys that lease pins get locations;
        others LEASE_NOT_FOUND; a pinned object since lost or force-removed NOT_FOUND.
        Without: every COMPLETE key found is pinned under one new lease of `lease_ttl`
        (lease_id 0 when none was found) so that the read is safe; missing keys
        NOT_FOUND. Reading touches recency like a lookup does.
        """
        self._check_batch(len(keys))
        ttl = self._ttl(lease_ttl)
        now = self.clock.now()
        t = self._objects
        results: list[ReadResult] = []
        if lease_id:
            lease = self._leases.get(lease_id, now)
            touched = t.touched
            read = self._read_result
            for key in keys:
                k = key if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES else _norm_key(key)
                if k is None:
                    results.append(ReadResult(Code.INVALID_ARGUMENT))
                    continue
                token = lease.token_for(k)
                if not token:
                    results.append(ReadResult(Code.LEASE_NOT_FOUND))
                    continue
                s = t.slot_of(token)
                if not s:
                    results.append(ReadResult(Code.NOT_FOUND))
                    continue
                touched[s] = now
                results.append(read(s))
            return GetReplicasResult(lease.lease_id, lease.expires_at, results)
        found: list[bytes] = []
        for key in keys:
            k = _norm_key(key)
            if k is None:
                results.append(ReadResult(Code.INVALID_ARGUMENT))
                continue
            slot = t.index.get(k)
            if slot is None or t.pins[slot] < 0:
                results.append(ReadResult(Code.NOT_FOUND))
                continue
            found.append(k)
            results.append(self._read_result(slot))
        if not found:
            return GetReplicasResult(0, 0.0, results)
        index = t.index
        tokens = self._pin_slots([index[k] for k in found], now)
        lease = self._leases.grant(holder, found, tokens, ttl, now)
        self._leases_granted += 1
        return GetReplicasResult(lease.lease_id, lease.expires_at, results)

    def remove(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        """Drop objects: OK, NOT_FOUND, or IN_PROGRESS for a PENDING or pinned object
        unless `force`. A forced remove of a pinned object makes its leases report
        NOT_FOUND for it; a forced remove of a PENDING one makes its put_end NOT_FOUND."""
        self._check_batch(len(keys))
        t = self._objects
        out: list[Code] = []
        seen: dict[bytes, Code] = {}
        removed: list[bytes] = []
        removed_size = 0
        for key in keys:
            k = _norm_key(key)
            if k is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            code = seen.get(k)
            if code is None:
                s = t.index.get(k)
                if s is None:
                    code = Code.NOT_FOUND
                elif t.pins[s] != 0 and not force:
                    code = Code.IN_PROGRESS
                else:
                    removed.append(k)
                    removed_size += t.size[s]
                    self._drop(s)
                    code = Code.OK
                seen[k] = code
            out.append(code)
        if removed:
            self._emit(Event(EventKind.REMOVED, removed, removed_size))
        return out

    # ------------------------------------------------------------------ time

    def tick(self) -> TickReport:
        """Expire leases, reclaim zombie PENDING objects, evict above the high mark."""
        now = self.clock.now()
        report = TickReport()
        for lease in self._leases.expire(now):
            self._unpin(lease.tokens)
            report.expired_leases += 1
        self._leases_expired += report.expired_leases

        t = self._objects
        zombies: list[int] = []
        for s, pw in t.pending.items():
            if pw.deadline > now:
                break
            zombies.append(s)
        if zombies:
            keys: list[bytes] = []
            size = 0
            for s in zombies:
                keys.append(t.key_of[s])  # type: ignore[arg-type]
                size += t.size[s]
                self._drop(s)
            report.reclaimed = len(zombies)
            self._reclaimed += len(zombies)
            self._emit(Event(EventKind.RECLAIMED, keys, size))

        before = (self._evictions, self._evicted_bytes)
        self._evict_to_watermark(now)
        self._flush_evictions()
        report.evicted = self._evictions - before[0]
        report.evicted_bytes = self._evicted_bytes - before[1]
        return report

    def evict_to(self, ratio: float) -> EvictionReport:
        """Admin: evict unpinned COMPLETE objects, oldest first, until used <= ratio of
        the DRAM pool (or nothing evictable is left). Honours hold_eviction_until."""
        if not 0.0 <= ratio <= 1.0:
            raise InvalidArgument(f"ratio must be between 0 and 1, got {ratio}")
        now = self.clock.now()
        before = (self._evictions, self._evicted_bytes)
        held = now < self._hold_until
        used = self._pool_used()
        if not held:
            used = self._evict_until(ratio * self._pool_capacity, used)
            self._flush_evictions()
        return EvictionReport(
            evicted=self._evictions - before[0],
            evicted_bytes=self._evicted_bytes - before[1],
            used=used,
            capacity=self._pool_capacity,
            reached=used <= ratio * self._pool_capacity,
            held=held,
        )

    def drain_events(self) -> list[Event]:
        """Evictions, reclaims, removals and node losses since the last call."""
        out = list(self._events)
        self._events.clear()
        return out

    # ------------------------------------------------------------------ failover seam

    def adopt_replica(
        self,
        key: bytes,
        size: int,
        checksum: int,
        node_id: str,
        offset: int,
        tier: str = "dram",
    ) -> Code:
        """Record a COMPLETE replica that already sits at `offset` of a mounted segment
        (a store node's inventory, replayed to a new leader). OK (also when already
        recorded); NOT_FOUND when no such segment is mounted; IN_PROGRESS when the key
        is PENDING; INVALID_ARGUMENT for a bad key or size, a range outside the segment
        or overlapping other data, or a size/checksum that differs from the object's."""
        k = _norm_key(key)
        if (
            k is None
            or not isinstance(size, int)
            or size <= 0
            or not isinstance(checksum, int)
            or not 0 <= checksum < _MAX_CHECKSUM
            or not isinstance(offset, int)
            or offset < 0
        ):
            return Code.INVALID_ARGUMENT
        seg = self._segments.get(node_id, tier)
        if seg is None:
            return Code.NOT_FOUND
        if offset + size > seg.alloc.capacity:
            return Code.INVALID_ARGUMENT
        t = self._objects
        s = t.index.get(k)
        handle = seg.handle(offset)
        if s is not None:
            if t.pins[s] == PENDING:
                return Code.IN_PROGRESS
            if t.size[s] != size or t.checksum[s] != checksum:
                return Code.INVALID_ARGUMENT
            handles = t.handles(s)
            for h in handles:
                if h >> OFFSET_BITS == seg.seg_id:
                    return Code.OK if h == handle else Code.INVALID_ARGUMENT
            if not seg.alloc.reserve(offset, size):
                return Code.INVALID_ARGUMENT
            seg.replicas += 1
            t.set_handles(s, (*handles, handle))
            grown = self._footprint((handle,), size)
            t.space[s] += grown
            if t.pins[s] > 0:
                self._pinned_space += grown
            return Code.OK
        if not seg.alloc.reserve(offset, size):
            return Code.INVALID_ARGUMENT
        seg.replicas += 1
        now = self.clock.now()
        s = t.new(k, size, checksum, (handle,), self._footprint((handle,), size), now)
        self._lru.grow(t.slots)
        t.pins[s] = 0
        self._lru.push(s)
        self._complete_size += size
        return Code.OK

    def hold_eviction_until(self, t: float) -> None:
        """Evict nothing before clock time t: the pins of the old leader are unknown
        here, so wait one maximum lease TTL before trusting the LRU."""
        self._hold_until = max(self._hold_until, t)

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CoreStats:
        t = self._objects
        pins = np.frombuffer(t.pins, dtype=np.int32).copy()
        where = np.frombuffer(t.where, dtype=np.uint64).copy()
        sizes = np.frombuffer(t.size, dtype=np.int64).copy()
        pinned = pins > 0
        seg_of = (where[pinned] >> np.uint64(OFFSET_BITS)).astype(np.int64)
        asize = (sizes[pinned] + self._align_mask) & ~self._align_mask
        pinned_replicas: dict[int, int] = {}
        pinned_bytes: dict[int, int] = {}
        if len(seg_of):
            ids, inverse, counts = np.unique(seg_of, return_inverse=True, return_counts=True)
            totals = np.bincount(inverse, weights=asize)
            for i, c, b in zip(ids.tolist(), counts.tolist(), totals.tolist(), strict=True):
                pinned_replicas[i] = c
                pinned_bytes[i] = int(b)
        for s, extra in t.extra.items():
            if t.pins[s] > 0:
                a = (t.size[s] + self._align_mask) & ~self._align_mask
                for h in extra:
                    i = h >> OFFSET_BITS
                    pinned_replicas[i] = pinned_replicas.get(i, 0) + 1
                    pinned_bytes[i] = pinned_bytes.get(i, 0) + a

        nodes: dict[str, NodeStats] = {}
        for node_id in sorted(self._segments.by_node):
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
                for seg in self._segments.by_node[node_id].values()
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
        return CoreStats(
            objects_pending=n_pending,
            objects_complete=len(t) - n_pending,
            bytes_pending=self._pending_size,
            bytes_complete=self._complete_size,
            pool_capacity=self._pool_capacity,
            pool_used=self._pool_used(),
            pool_pinned=self._pinned_space,
            pool_pending=self._pending_space,
            active_leases=len(self._leases),
            nodes=nodes,
            lookups=self._lookups,
            lookup_keys=self._lookup_keys,
            hit_keys=self._hit_keys,
            leases_granted=self._leases_granted,
            leases_expired=self._leases_expired,
            leases_released=self._leases_released,
            evictions=self._evictions,
            evicted_bytes=self._evicted_bytes,
            reclaimed_pending=self._reclaimed,
            put_failures=dict(self._put_failures),
            events_dropped=self._events_dropped,
            eviction_held_until=max(self._hold_until, 0.0),
        )

    def inspect(self, key: bytes) -> ObjectInfo | None:
        k = _norm_key(key)
        t = self._objects
        s = t.index.get(k) if k is not None else None
        if s is None:
            return None
        pending = t.pending.get(s)
        return ObjectInfo(
            key=k,  # type: ignore[arg-type]
            state="pending" if pending is not None else "complete",
            size=t.size[s],
            checksum=t.checksum[s],
            locations=self._locations(s),
            pins=max(t.pins[s], 0),
            last_access=t.touched[s],
            created=t.created[s],
            writer=pending.writer if pending is not None else "",
        )

    def keys(self, prefix: bytes = b"", limit: int = 100) -> list[bytes]:
        """The first `limit` keys (PENDING and COMPLETE) starting with `prefix`, in byte
        order. Scans the index: an admin tool, not a hot path."""
        if limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {limit}")
        return heapq.nsmallest(limit, (k for k in self._objects.index if k.startswith(prefix)))

    # ------------------------------------------------------------------ internals

    def _check_batch(self, n: int) -> None:
        if n > self.config.max_batch:
            raise InvalidArgument(
                f"batch of {n} keys is larger than max_batch={self.config.max_batch}; split it"
            )

    def _ttl(self, ttl: float | None) -> float:
        if ttl is None:
            return self.config.default_lease_ttl
        if not 0 < ttl <= self.config.max_lease_ttl:  # also refuses NaN
            raise InvalidArgument(f"lease ttl must be > 0 and <= {self.config.max_lease_ttl} s, got {ttl}")
        return float(ttl)

    @staticmethod
    def _hashable(keys: Iterable[object]) -> list[bytes]:
        out: list[bytes] = []
        for key in keys:
            k = _norm_key(key)
            if k is None:
                raise InvalidArgument(_bad_key_message(key))
            out.append(k)
        return out

    def _writer_may(self, s: int, writer: str) -> bool:
        # Anonymous writers ("") are trusted; two named writers must match.
        owner = self._objects.pending[s].writer
        return not writer or not owner or writer == owner

    def _footprint(self, handles: Iterable[int], size: int) -> int:
        """DRAM bytes the replicas at `handles` occupy (what the allocator reserved)."""
        m = self._align_mask
        total = 0
        by_id = self._segments.by_id
        for h in handles:
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is not None and seg.tier == DRAM:
                off = h & OFFSET_MASK
                total += ((off + size + m) & ~m) - (off & ~m)
        return total

    def _refresh_pool(self) -> None:
        self._dram = self._segments.tier(DRAM)
        self._pool_capacity = sum(s.alloc.capacity for s in self._dram)

    def _pool_used(self) -> int:
        return sum(s.alloc.used_bytes for s in self._dram)

    def _put_failed(self, reason: str, message: str, code: Code = Code.INVALID_ARGUMENT) -> PutStartResult:
        self._put_failures[reason] = self._put_failures.get(reason, 0) + 1
        return PutStartResult(code, [], message)

    def _put_one(
        self,
        key: bytes,
        size: int,
        checksum: int,
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> PutStartResult:
        if not isinstance(size, int) or size <= 0:
            return self._put_failed("invalid_argument", f"object size must be > 0 bytes, got {size}")
        if not isinstance(checksum, int) or not 0 <= checksum < _MAX_CHECKSUM:
            return self._put_failed(
                "invalid_argument", f"checksum must be an unsigned 64-bit integer, got {checksum}"
            )
        t = self._objects
        s = t.index.get(key)
        if s is not None:
            if t.pins[s] >= 0:
                return PutStartResult(Code.ALREADY_EXISTS, [])
            owner = t.pending[s].writer
            if writer and owner == writer and t.size[s] == size and t.checksum[s] == checksum:
                # The same writer retrying a put_start whose reply it lost.
                return PutStartResult(Code.OK, self._locations(s))
            return self._put_failed(
                "in_progress",
                f"key is being written by {owner or 'another writer'}; retry after it "
                f"commits or after put_timeout ({self.config.put_timeout:g} s)",
                Code.IN_PROGRESS,
            )
        if not self._dram:
            return self._put_failed("no_segment", "no store node has mounted a DRAM segment", Code.STORE_FULL)
        if size > largest:
            return self._put_failed(
                "too_large",
                f"object of {size} bytes is larger than the largest segment ({largest} bytes)",
                Code.STORE_FULL,
            )
        asize = (size + self._align_mask) & ~self._align_mask
        placed = place(self._dram, asize, want) or self._evict_for(asize, want, now)
        if not placed:
            return self._put_failed("store_full", self._full_message(now), Code.STORE_FULL)
        handles = []
        for seg, offset in placed:
            seg.replicas += 1
            handles.append(seg.handle(offset))
        space = asize * len(placed)
        s = t.new(key, size, checksum, handles, space, now)
        if s >= len(self._lru.prev):
            self._lru.grow(t.slots)
        t.pending[s] = PendingWrite(writer, deadline)
        self._pending_space += space
        self._pending_size += size
        return PutStartResult(
            Code.OK,
            [Location(seg.node_id, seg.name, seg.base_addr + off, size, seg.tier) for seg, off in placed],
        )

    def _full_message(self, now: float) -> str:
        free = max((s.alloc.largest_free() for s in self._dram), default=0)
        msg = (
            f"store full: {self._pinned_space} bytes pinned, {self._pending_space} bytes "
            f"pending, {free} bytes free in the largest free extent"
        )
        if now < self._hold_until:
            msg += f"; eviction is held for {self._hold_until - now:.1f} s more after a master failover"
        return msg

    def _read_result(self, s: int) -> ReadResult:
        t = self._objects
        size = t.size[s]
        h = t.where[s]
        seg = self._segments.by_id[h >> OFFSET_BITS]
        locations = [Location(seg.node_id, seg.name, seg.base_addr + (h & OFFSET_MASK), size, seg.tier)]
        if s in t.extra:
            locations = self._locations(s)
        return ReadResult(Code.OK, size, t.checksum[s], locations)

    def _locations(self, s: int) -> list[Location]:
        t = self._objects
        size = t.size[s]
        by_id = self._segments.by_id
        out: list[Location] = []
        for h in t.handles(s):
            seg = by_id[h >> OFFSET_BITS]
            out.append(Location(seg.node_id, seg.name, seg.base_addr + (h & OFFSET_MASK), size, seg.tier))
        return out

    def _pin_slots(self, slots: list[int], now: float) -> list[int]:
        """Pin each slot (all COMPLETE) once; returns their tokens in order."""
        t = self._objects
        pins = t.pins
        gen = t.gen
        touched = t.touched
        tokens: list[int] = []
        token = tokens.append
        newly: list[int] = []
        for s in slots:
            p = pins[s]
            if p == 0:
                newly.append(s)
            pins[s] = p + 1
            touched[s] = now
            token(s | gen[s] << SLOT_BITS)
        if newly:
            self._lru.unlink_all(newly)
            space = t.space
            self._pinned_space += sum([space[s] for s in newly])
        return tokens

    def _unpin(self, tokens: Iterable[int]) -> None:
        t = self._objects
        pins = t.pins
        gen = t.gen
        freed: list[int] = []
        for token in tokens:
            s = token & SLOT_MASK
            if gen[s] != token >> SLOT_BITS:
                continue  # force-removed or lost with its node since it was pinned
            p = pins[s] - 1
            pins[s] = p
            if p == 0:
                freed.append(s)
        if freed:
            self._lru.push_all(freed)
            space = t.space
            self._pinned_space -= sum([space[s] for s in freed])

    def _journal_replicas(self, s: int, key: bytes, added: bool) -> None:
        t = self._objects
        by_id = self._segments.by_id
        assert self.journal is not None
        for h in t.handles(s):
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is not None:
                self.journal.append(ReplicaChange(seg.node_id, seg.tier, key, h & OFFSET_MASK,
                                                  t.size[s], t.checksum[s], added))

    def drain_replica_changes(self) -> list[ReplicaChange]:
        """Replicas committed and freed since the last call (journal must be enabled)."""
        if not self.journal:
            return []
        out, self.journal = self.journal, []
        return out

    def _drop(self, s: int) -> None:
        """Forget an object and free its replicas on the segments still mounted."""
        t = self._objects
        size = t.size[s]
        by_id = self._segments.by_id
        if self.journal is not None and t.pins[s] != PENDING:
            key = t.key_of[s]
            if key is not None:
                self._journal_replicas(s, key, False)
        for h in t.handles(s):
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is not None:
                seg.alloc.free(h & OFFSET_MASK, size)
                seg.replicas -= 1
        p = t.pins[s]
        if p == PENDING:
            self._pending_space -= t.space[s]
            self._pending_size -= size
        else:
            self._complete_size -= size
            if p > 0:
                self._pinned_space -= t.space[s]
            else:
                self._lru.unlink(s)
        t.free(s)

    def _lose(self, segments: list[Segment], node_id: str) -> list[bytes]:
        """Segments already unmapped: drop their replicas, and the objects left with
        none. Returns the keys now gone."""
        t = self._objects
        ids = [seg.seg_id for seg in segments]
        id_set = set(ids)
        where = np.frombuffer(t.where, dtype=np.uint64).copy()
        pins = np.frombuffer(t.pins, dtype=np.int32).copy()
        hit = np.isin(where >> np.uint64(OFFSET_BITS), np.array(ids, dtype=np.uint64))
        # Freed slots keep a stale `where`; only live objects count.
        hit &= pins >= PENDING
        affected = set(np.flatnonzero(hit).tolist())
        for s, extra in t.extra.items():
            if any(h >> OFFSET_BITS in id_set for h in extra):
                affected.add(s)
        gone: list[bytes] = []
        gone_size = 0
        for s in sorted(affected):
            key = t.key_of[s]
            assert key is not None
            keep = tuple(h for h in t.handles(s) if h >> OFFSET_BITS not in id_set)
            if not keep or t.pins[s] == PENDING:
                gone.append(key)
                gone_size += t.size[s]
                self._drop(s)
                continue
            new_space = self._footprint(keep, t.size[s])
            if t.pins[s] > 0:
                self._pinned_space += new_space - t.space[s]
            t.space[s] = new_space
            t.set_handles(s, keep)
        if gone:
            self._emit(Event(EventKind.NODE_LOST, gone, gone_size, node_id))
        return gone

    # -- eviction policy (the order itself lives in eviction.LruList) --------------

    def _evict_oldest(self) -> tuple[int, tuple[int, ...]]:
        """Evict the least recently used evictable object: (DRAM bytes freed, its
        replica handles), or (0, ()) when nothing is evictable."""
        s = self._lru.oldest()
        if not s:
            return 0, ()
        t = self._objects
        freed = t.space[s]
        handles = t.handles(s)
        self._evicted_keys.append(t.key_of[s])  # type: ignore[arg-type]
        self._evicted_size += t.size[s]
        self._evictions += 1
        self._evicted_bytes += t.size[s]
        self._drop(s)
        return freed, handles

    def _evict_until(self, target: float, used: int) -> int:
        """Evict until used <= target; returns used afterwards. Stops at the first
        object that gets there, so it never evicts more than needed."""
        while used > target:
            freed, handles = self._evict_oldest()
            if not handles:
                break
            used -= freed
        return used

    def _evict_to_watermark(self, now: float) -> None:
        if now < self._hold_until or not self._pool_capacity:
            return
        used = self._pool_used()
        if used > self.config.evict_high * self._pool_capacity:
            self._evict_until(self.config.evict_low * self._pool_capacity, used)

    def _evict_for(self, asize: int, want: int, now: float) -> list[tuple[Segment, int]]:
        """Evict oldest-first until one replica of `asize` bytes fits, then place up to
        `want`. Only the first replica is worth evicting for: extra replicas are best
        effort, and evicting for them could empty the LRU while the other nodes are
        full of pinned objects. Pinned and PENDING objects are never on the LRU, so
        this cannot touch them; it gives up when the LRU is empty."""
        if now < self._hold_until:
            return []
        by_id = self._segments.by_id
        while True:
            _, handles = self._evict_oldest()
            if not handles:
                return []
            for h in handles:
                seg = by_id.get(h >> OFFSET_BITS)
                if seg is not None and seg.tier == DRAM and seg.alloc.largest_free() >= asize:
                    return place(self._dram, asize, want)

    def _flush_evictions(self) -> None:
        if self._evicted_keys:
            self._emit(Event(EventKind.EVICTED, self._evicted_keys, self._evicted_size))
            self._evicted_keys = []
            self._evicted_size = 0

    def _emit(self, event: Event) -> None:
        if len(self._events) == self._events.maxlen:
            self._events_dropped += 1
        self._events.append(event)
