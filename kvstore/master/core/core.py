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
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

import numpy as np

from kvstore.errors import MAX_KEY_BYTES, Code, InvalidArgument, NotFound

from .clock import Clock, MonotonicClock
from .config import CoreConfig, same_structure
from .eviction import LruList
from .keys import all_valid, bad_key_message, norm_key
from .leases import LeaseTable
from .objects import PENDING, SLOT_BITS, SLOT_MASK, ObjectTable, PendingWrite, tenant_prefix
from .placement import place
from .results import (
    CoreStats,
    DrainReport,
    Event,
    EventKind,
    EvictionReport,
    EvictionStats,
    GetReplicasResult,
    Location,
    LookupResult,
    MoveKind,
    NodeInfo,
    NodeStats,
    ObjectInfo,
    PutStartResult,
    ReadResult,
    ReplicaChange,
    SegmentStats,
    TickReport,
    Tier,
    TierEvictions,
    TierMove,
    location,
)
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK, SSD, TIERS, Segment, SegmentMap, alloc_size
from .state import RECENT
from .state import Move as _Move
from .window import RecentCounts

# Space started ahead (put_start(ahead=True)) is granted only while all PENDING space
# stays under this share of the DRAM pool: a client's pool of placeholders must never
# crowd out the writes themselves on a small store.
AHEAD_SHARE = 0.25
_MAX_CHECKSUM = 1 << 64
DEMOTE = MoveKind.DEMOTE
PROMOTE = MoveKind.PROMOTE
_alloc_size = alloc_size
_norm_key = norm_key
_bad_key_message = bad_key_message
_location = location
_new_object = object.__new__
_set_node_id, _set_segment, _set_addr, _set_size, _set_tier = (
    Location.__dict__[f].__set__ for f in ("node_id", "segment", "addr", "size", "tier"))
_RECENT = RECENT


def _all_new(keys: Sequence[object], sizes: Sequence[object], checksums: Sequence[object],
             largest: int, index: dict[bytes, int]) -> bool:
    """True when every key is bytes of a valid length, distinct and not indexed, every
    size an int in (0, largest], every checksum a 64-bit unsigned int: what put_start's
    per-key checks would find of each, without a Python-level loop."""
    try:
        return (
            all_valid(keys)
            and set(map(type, sizes)) == {int}
            and set(map(type, checksums)) == {int}
            and min(sizes) > 0 and max(sizes) <= largest  # type: ignore[type-var,operator]
            and min(checksums) >= 0 and max(checksums) < _MAX_CHECKSUM  # type: ignore[type-var,operator]
            and len(set(keys)) == len(keys)
            and index.keys().isdisjoint(keys)
        )
    except TypeError:
        return False


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
        # Eviction that stopped short because what was left was pinned or PENDING.
        self._blocked = 0
        self._blocked_bytes = 0
        self._blocked_pinned = 0
        self._watermark_blocked = False  # a watermark shortfall counts once per episode
        self._recent = RecentCounts(_RECENT, 60, start=self.clock.now())
        # Nodes that get no new placements (kvstore drain). Kept while unmounted, so a
        # draining node that restarts stays draining.
        self._draining: set[str] = set()
        # Nodes gone recently, listed by node_list() for config.departed_retention s.
        self._departed: dict[str, NodeInfo] = {}
        # Replica journal for the store nodes' inventories; off (None) unless the
        # daemon wants it, so that nothing accumulates in tests and benchmarks.
        self.journal: list[ReplicaChange] | None = None
        # SSD tier: per node, the LRU of SSD-only objects nobody pins; objects moving
        # between tiers (slot -> move); moves queued for the I/O layer to carry out.
        self._ssd_lru: dict[str, LruList] = {}
        self._quotas: dict[bytes, int] = {}
        self._quota_evictions = 0
        self._moves: dict[int, _Move] = {}
        self._move_queue: list[TierMove] = []
        self._demoting_space = 0  # DRAM bytes that in-flight demotions will free
        self._tiered = False  # any SSD segment mounted
        # Called (no I/O: it only wakes the mover) whenever a tier move is queued.
        self.on_move_queued: Callable[[], None] | None = None
        self._tier_counts: dict[str, int] = dict.fromkeys(
            ("demotions", "demoted_bytes", "demotion_failures", "promotions",
             "promoted_bytes", "promotion_failures", "ssd_evictions", "ssd_evicted_bytes"), 0)

    # ------------------------------------------------------------------ membership

    def mount_segment(
        self, node_id: str, segment: str, base_addr: int, size: int, tier: str = DRAM
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
        tier = Tier(tier)
        old = self._segments.get(node_id, tier)
        if old is not None:
            if old.same_geometry(segment, base_addr, size):
                return
            self._segments.remove(old)
            self._lose([old], node_id)
        self._segments.add(node_id, segment, base_addr, size, tier, self.config.alignment)
        self._departed.pop(node_id, None)
        self._refresh_pool()

    def unmount_node(self, node_id: str, reason: str = "lost") -> list[bytes]:
        """Forget a node. Its replicas vanish at once. Returns the keys now gone: COMPLETE
        objects that lost their last replica, and PENDING objects that had a replica
        there (their writer's put_end will get NOT_FOUND). Unknown node: [].
        `reason` ("lost": its etcd lease ended; "left": it unmounted itself) is what
        node_list() shows for it during config.departed_retention."""
        segs = self._segments.by_node.get(node_id, {})
        departed = NodeInfo(node_id, reason, [self._segment_stats(seg) for seg in segs.values()],
                            0, self.clock.now())
        gone = self._segments.remove_node(node_id)
        if not gone:
            return []
        self._departed[node_id] = departed
        self._refresh_pool()
        lost = self._lose(gone, node_id)
        departed.objects_lost = len(lost)
        return lost

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
        ahead: bool = False,
    ) -> list[PutStartResult]:
        """Allocate space for new objects (PENDING, invisible to readers).

        `ahead`: space a writer starts before it has the values (placeholders, see
        put_commit). It is only ever taken from free space: never by evicting, demoting
        or waiting, never past the eviction watermark or AHEAD_SHARE of the pool in
        PENDING space, and not where quotas apply; otherwise every key is refused
        (STORE_FULL) and nothing changes.

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
        if ahead:
            return self._put_ahead(keys, sizes, checksums, want, writer, now, deadline, largest)
        results = self._put_batch(keys, sizes, checksums, want, writer, now, deadline, largest)
        if results is None:
            results = self._put_each(keys, sizes, checksums, want, writer, now, deadline, largest)
        self._evict_to_watermark(now)
        self._flush_evictions()
        return results

    def _put_ahead(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> list[PutStartResult]:
        """put_start(ahead=True): all of the batch from free space, or none of it."""
        mask = self._align_mask
        ints = all(isinstance(z, int) and z > 0 for z in sizes)
        need = sum((z + mask) & ~mask for z in sizes) * want if ints else 0
        cap = self._pool_capacity
        results = None
        if ints and cap and self._pending_space + need <= AHEAD_SHARE * cap \
                and self._pool_used() + need <= self.config.evict_high * cap:
            # _put_batch places only what surely fits: it never evicts and never refuses.
            results = self._put_batch(keys, sizes, checksums, want, writer, now, deadline,
                                      largest)
        if results is None:
            refused = PutStartResult(Code.STORE_FULL, [], message="no free space to start "
                                     "ahead; put the values the usual way")
            return [refused] * len(keys)
        return results

    def _put_each(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> list[PutStartResult]:
        """put_start one key at a time: the general path."""
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
        return results

    def _put_batch(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> list[PutStartResult] | None:
        """put_start of a whole batch with a few allocator calls per segment instead of
        one per replica; None, having changed nothing, when it cannot promise exactly
        the results and state of _put_each (the caller then runs that).

        _put_each places the new objects one at a time: each on the DRAM segment with
        the most free bytes among those with an extent that fits (want > 1: the `want`
        such segments, most free first), best fit inside it. When every segment that
        would receive objects has one free extent at least as large as all it would
        receive together, no placement can fail, so nothing is evicted and nothing is
        refused: which segment each object goes to then depends only on the segments'
        free bytes, which this replays with arithmetic, and the offsets inside each
        segment are those of the same sequence of best-fit allocations
        (ExtentAllocator.allocate_run). Keys that place nothing (invalid, repeated,
        already there, too large) get _put_one's answer, computed at their position.
        Quotas (which may evict per key) always take the general path.
        """
        dram = self._dram
        t = self._objects
        if not dram or t.usage is not None or not keys:
            return None
        index = t.index
        mask = self._align_mask
        # 1. Which positions create an object (all of _put_one's checks pass).
        if _all_new(keys, sizes, checksums, largest, index):
            # The usual batch, checked at C speed: every key new, distinct and valid.
            new_at: Sequence[int] = range(len(keys))
            new_keys = list(keys)
            new_sizes = list(sizes)
            new_checksums = list(checksums)
        else:
            new_at = []  # positions
            new_keys = []
            new_sizes = []
            new_checksums = []
            first_seen: set[bytes] = set()
            for pos, (key, size, checksum) in enumerate(zip(keys, sizes, checksums, strict=True)):
                k = key if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES else _norm_key(key)
                if k is not None and k not in first_seen:
                    first_seen.add(k)
                    if (
                        isinstance(size, int) and 0 < size <= largest
                        and isinstance(checksum, int) and 0 <= checksum < _MAX_CHECKSUM
                        and k not in index
                    ):
                        new_at.append(pos)
                        new_keys.append(k)
                        new_sizes.append(size)
                        new_checksums.append(checksum)
            if not new_at:
                return None
        # 2. Which segments each new object would get, and whether it surely fits.
        asizes = [(z + mask) & ~mask for z in new_sizes]
        nseg = len(dram)
        # flat[j * want + r]: the index in dram of new object j's replica r (None: all
        # on dram[0], the only segment).
        flat: list[int] | None = None
        if nseg == 1:
            totals = [sum(asizes)]
        else:
            totals = [0] * nseg
            flat = []
            pick = flat.append
            # Most free bytes first, ties to the earlier segment: place()'s order.
            heap = [(-seg.alloc.free_bytes, i) for i, seg in enumerate(dram)]
            heapq.heapify(heap)
            if want == 1:
                replace = heapq.heapreplace
                for a in asizes:
                    free, i = heap[0]
                    replace(heap, (free + a, i))
                    totals[i] += a
                    pick(i)
            else:
                pop = heapq.heappop
                push = heapq.heappush
                for a in asizes:
                    top = [pop(heap) for _ in range(want)]
                    for free, i in top:
                        push(heap, (free + a, i))
                        totals[i] += a
                        pick(i)
        for seg, total in zip(dram, totals, strict=True):
            if total and seg.alloc.largest_free() < total:
                return None
        # 3. Allocate, segment by segment, in the order _put_each would have.
        if flat is None:
            wants = [asizes]
        else:
            wants = [[] for _ in dram]
            per_replica = asizes if want == 1 else [a for a in asizes for _ in range(want)]
            for i, a in zip(flat, per_replica, strict=True):
                wants[i].append(a)
        offsets: list[list[int]] = []
        for seg, mine in zip(dram, wants, strict=False):
            got: list[int] = []
            j = 0
            while j < len(mine):
                a = mine[j]
                run = j + 1
                while run < len(mine) and mine[run] == a:
                    run += 1
                got += seg.alloc.allocate_run(a, run - j)
                j = run
            seg.replicas += len(got)
            offsets.append(got)
        # 4. Index the objects (slots and placements in key order, as _put_each would)
        # and answer.
        make_location = _location
        extras: list[tuple[int, ...]] | None = None
        spaces = asizes
        if flat is None:
            seg = dram[0]
            node_id, name, base, tier = seg.node_id, seg.name, seg.base_addr, seg.tier
            h0 = seg.seg_id << OFFSET_BITS
            offs = offsets[0]
            firsts = [h0 | o for o in offs]
            locations = [[make_location(node_id, name, base + o, z, tier)]
                         for o, z in zip(offs, new_sizes, strict=True)]
        else:
            its = [iter(o) for o in offsets]
            info = [(seg.seg_id << OFFSET_BITS, seg.node_id, seg.name, seg.base_addr, seg.tier)
                    for seg in dram]
            firsts = []
            locations = []
            if want == 1:
                for i, z in zip(flat, new_sizes, strict=True):
                    h0, node_id, name, base, tier = info[i]
                    o = next(its[i])
                    firsts.append(h0 | o)
                    locations.append([make_location(node_id, name, base + o, z, tier)])
            else:
                extras = []
                spaces = [a * want for a in asizes]
                for j, z in enumerate(new_sizes):
                    handles: list[int] = []
                    locs: list[Location] = []
                    for i in flat[j * want:(j + 1) * want]:
                        h0, node_id, name, base, tier = info[i]
                        o = next(its[i])
                        handles.append(h0 | o)
                        locs.append(make_location(node_id, name, base + o, z, tier))
                    firsts.append(handles[0])
                    extras.append(tuple(handles[1:]))
                    locations.append(locs)
        slots = t.new_many(new_keys, new_sizes, new_checksums, firsts, spaces, now)
        if extras is not None:
            extra = t.extra
            for s, rest in zip(slots, extras, strict=True):
                if rest:
                    extra[s] = rest
        # A PendingWrite never changes: the objects of one batch can share one.
        t.pending.update(zip(slots, repeat(PendingWrite(writer, deadline))))
        made: list[PutStartResult] = []
        ok = Code.OK
        placed = t.placed
        new_result = _new_object
        for s, locs in zip(slots, locations, strict=True):
            r = new_result(PutStartResult)  # PutStartResult(ok, locs, "", placed[s]), faster
            r.code = ok
            r.locations = locs
            r.message = ""
            r.placement = placed[s]
            made.append(r)
        added_space = sum(spaces)
        added_size = sum(new_sizes)
        if t.slots > len(self._lru.prev):
            self._grow_lrus()
        self._pending_space += added_space
        self._pending_size += added_size
        if len(made) == len(keys):
            return made
        by_pos = dict(zip(new_at, zip(new_keys, made, strict=True), strict=True))
        results: list[PutStartResult] = []
        seen: dict[bytes, PutStartResult] = {}
        for pos, (key, size, checksum) in enumerate(zip(keys, sizes, checksums, strict=True)):
            done = by_pos.get(pos)
            if done is not None:
                seen[done[0]] = done[1]
                results.append(done[1])
                continue
            k = _norm_key(key)
            if k is None:
                results.append(self._put_failed("invalid_argument", _bad_key_message(key)))
                continue
            answer = seen.get(k)
            if answer is None:
                # Never reaches placement (step 1 said so), so it changes no space.
                answer = seen[k] = self._put_one(k, size, checksum, want, writer, now, deadline, largest)
            results.append(answer)
        return results

    def put_end(self, keys: Sequence[bytes], writer: str = "") -> list[Code]:
        """Commit PENDING objects: OK; NOT_FOUND when not PENDING (never started,
        revoked, reclaimed, lost); ALREADY_EXISTS when already COMPLETE (a retry);
        IN_PROGRESS when another named writer holds it."""
        self._check_batch(len(keys))
        t = self._objects
        now = self.clock.now()
        index = t.index
        pins = t.pins
        pending = t.pending
        touched = t.touched
        ok, not_found, exists, in_progress = (Code.OK, Code.NOT_FOUND, Code.ALREADY_EXISTS,
                                              Code.IN_PROGRESS)
        out: list[Code] = []
        seen: dict[bytes, Code] = {}
        done: list[int] = []  # slots committed, in key order
        for key in keys:
            k = key if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES else _norm_key(key)
            if k is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            code = seen.get(k)
            if code is None:
                s = index.get(k)
                if s is None:
                    code = not_found
                elif pins[s] != PENDING:
                    code = exists
                else:
                    # Anonymous writers ("") are trusted; two named writers must match.
                    owner = pending[s].writer
                    if writer and owner and writer != owner:
                        code = in_progress
                    else:
                        del pending[s]
                        pins[s] = 0
                        touched[s] = now
                        done.append(s)
                        code = ok
                seen[k] = code
            out.append(code)
        self._committed(done)
        return out

    def put_commit(self, placeholders: Sequence[bytes], keys: Sequence[bytes],
                   sizes: Sequence[int], checksums: Sequence[int], writer: str) -> list[Code]:
        """Rename each PENDING placeholder to its key and commit it with its checksum.

        A writer starts objects ahead under placeholder keys of its own (put_start), writes
        a value into one, then names the value's key here: a put costs one call instead
        of two (put_start, put_end). The object keeps the placeholder's ranges, placement
        and size. Per pair: OK; ALREADY_EXISTS when the key is stored (the placeholder
        stays PENDING and the writer's, to be written again); IN_PROGRESS when another
        writer writes the key, or the placeholder is not this writer's (placeholders
        need a named writer); NOT_FOUND when the placeholder is not PENDING (never
        started, revoked, reclaimed, lost); INVALID_ARGUMENT for a bad key, a size other
        than the placeholder's, or a key in another tenant than its placeholder where
        either has a quota.
        """
        n = len(keys)
        if len(placeholders) != n or len(sizes) != n or len(checksums) != n:
            raise InvalidArgument(
                f"put_commit needs one placeholder, size and checksum per key: got {n} keys, "
                f"{len(placeholders)} placeholders, {len(sizes)} sizes, "
                f"{len(checksums)} checksums")
        self._check_batch(n)
        t = self._objects
        now = self.clock.now()
        index, pins, pending, size_of = t.index, t.pins, t.pending, t.size
        quotas = self._quotas
        out: list[Code] = []
        done: list[int] = []
        for p, key, size, checksum in zip(placeholders, keys, sizes, checksums, strict=True):
            # The usual keys, checked inline (as put_end does); _norm_key for the rest.
            k = key if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES else _norm_key(key)
            pk = p if type(p) is bytes and 0 < len(p) <= MAX_KEY_BYTES else _norm_key(p)
            if k is None or pk is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            s = index.get(pk)
            if s is None or pins[s] != PENDING:
                out.append(Code.NOT_FOUND)
                continue
            if not writer or pending[s].writer != writer:
                out.append(Code.IN_PROGRESS)
                continue
            if size_of[s] != size or type(checksum) is not int or not 0 <= checksum < 1 << 64:
                out.append(Code.INVALID_ARGUMENT)
                continue
            other = index.get(k)
            if other is not None:
                out.append(Code.IN_PROGRESS if pins[other] == PENDING else Code.ALREADY_EXISTS)
                continue
            if quotas and (tenant_prefix(pk) in quotas or tenant_prefix(k) in quotas) \
                    and tenant_prefix(pk) != tenant_prefix(k):
                # Bytes would enter a tenant with a quota without its check (put_start's).
                out.append(Code.INVALID_ARGUMENT)
                continue
            t.rename(s, k)
            t.checksum[s] = checksum
            del pending[s]
            pins[s] = 0
            t.touched[s] = now
            done.append(s)
            out.append(Code.OK)
        self._committed(done)
        return out

    def _committed(self, done: list[int]) -> None:
        """Bookkeeping for PENDING slots just made COMPLETE (pins 0, touched set)."""
        if not done:
            return
        t = self._objects
        # What one push per object would do: none of these was on the LRU (PENDING
        # objects never are) and nothing above reads it.
        self._lru.push_all(done)
        if self.journal is not None:
            key_of = t.key_of
            for s in done:
                self._journal_replicas(s, key_of[s], True)  # type: ignore[arg-type]
        size = t.size
        space = t.space
        committed = sum([size[s] for s in done])
        self._pending_space -= sum([space[s] for s in done])
        self._pending_size -= committed
        self._complete_size += committed

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

    def lookup(self, keys: Sequence[bytes], lease_ttl: float | None = None, holder: str = "",
               owner: str = "") -> LookupResult:
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
            return self.lookup(self._hashable(keys), lease_ttl, holder, owner)
        count = len(slots)
        self._lookups += 1
        self._lookup_keys += len(keys)
        self._hit_keys += count
        if not count:
            return LookupResult(0, 0, 0.0)
        now = self.clock.now()
        tokens = self._pin_slots(slots, now)
        if self._tiered:
            # Hits on SSD start their way back to DRAM now, so the load finds them there.
            for s in slots:
                if self._segments.by_id[t.where[s] >> OFFSET_BITS].tier != DRAM:
                    self._queue_promotion(s)
        lease = self._leases.grant(holder, list(keys[:count]), tokens, ttl, now, owner)
        self._leases_granted += 1
        return LookupResult(count, lease.lease_id, lease.expires_at)

    def renew_lease(self, lease_id: int, ttl: float | None = None, owner: str | None = None) -> float:
        """Extend a live lease to now + ttl; returns the new expires_at. With `owner`,
        only that tenant's lease (the same holds for release_lease and get_replicas)."""
        return self._leases.renew(lease_id, self._ttl(ttl), self.clock.now(), owner)

    def release_lease(self, lease_id: int, keep_first_n: int | None = None,
                      owner: str | None = None) -> None:
        """Release the lease (None), or keep its first n pins and unpin the rest; a lease
        trimmed to 0 stays alive, empty, until released or expired."""
        if keep_first_n is not None and keep_first_n < 0:
            raise InvalidArgument(f"keep_first_n must be >= 0, got {keep_first_n}")
        now = self.clock.now()
        if keep_first_n is None:
            lease = self._leases.release(lease_id, now, owner)
            self._unpin(lease.tokens)
            self._leases_released += 1
        else:
            self._unpin(self._leases.trim(lease_id, keep_first_n, now, owner))

    def get_replicas(
        self,
        keys: Sequence[bytes],
        lease_id: int | None = None,
        lease_ttl: float | None = None,
        holder: str = "",
        owner: str | None = None,
        pin: bool = True,
    ) -> GetReplicasResult:
        """Where to read each key.

        With a lease (id not None and not 0): only keys that lease pins get locations;
        others LEASE_NOT_FOUND; a pinned object since lost or force-removed NOT_FOUND.
        Without: every COMPLETE key found is pinned under one new lease of `lease_ttl`
        (lease_id 0 when none was found) so that the read is safe; missing keys
        NOT_FOUND. Reading touches recency like a lookup does.

        With `pin` False (and no lease id) nothing is pinned and no lease granted: the
        object may be evicted, moved or rewritten while the caller reads it. Only for a
        reader that needs no promise: one whose read began before it asked, and which
        keeps the bytes only if this answer names the placement it read from and they
        match the checksum (the client's quick get).
        """
        self._check_batch(len(keys))
        ttl = self._ttl(lease_ttl)
        now = self.clock.now()
        t = self._objects
        results: list[ReadResult] = []
        if lease_id:
            lease = self._leases.get(lease_id, now, owner)
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
        batch = self._read_batch(keys)
        if batch is not None:
            results, found, slots = batch
        else:
            found = []
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
            index = t.index
            slots = [index[k] for k in found] if found else []
        if not found:
            return GetReplicasResult(0, 0.0, results)
        if not pin:
            self._touch_slots(slots, now)
            return GetReplicasResult(0, 0.0, results)
        tokens = self._pin_slots(slots, now)
        lease = self._leases.grant(holder, found, tokens, ttl, now, owner or "")
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
        index = t.index
        pins = t.pins
        # The batch's ranges, freed together at the end: a batch written together sits
        # together, and adjacent ranges then cost one free instead of one each.
        frees: dict[Segment, list[tuple[int, int]]] = {}
        try:
            for key in keys:
                k = key if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES else _norm_key(key)
                if k is None:
                    out.append(Code.INVALID_ARGUMENT)
                    continue
                code = seen.get(k)
                if code is None:
                    s = index.get(k)
                    if s is None:
                        code = Code.NOT_FOUND
                    elif pins[s] != 0 and not force:
                        code = Code.IN_PROGRESS
                    else:
                        removed.append(k)
                        removed_size += t.size[s]
                        self._drop(s, frees)
                        code = Code.OK
                    seen[k] = code
                out.append(code)
        finally:
            for seg, ranges in frees.items():
                seg.alloc.free_many(ranges)
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
        self._recent.observe(now, self._recent_totals())
        self._forget_departed(now)
        return report

    def evict_to(self, ratio: float, limit: int | None = None) -> EvictionReport:
        """Admin: evict unpinned COMPLETE objects, oldest first, until used <= ratio of
        the DRAM pool (or nothing evictable is left). Honours hold_eviction_until.
        With `limit`, evict at most that many objects in this call (an admin tool calls
        again until `reached`, so one call never holds the master for long)."""
        if not 0.0 <= ratio <= 1.0:
            raise InvalidArgument(f"ratio must be between 0 and 1, got {ratio}")
        if limit is not None and limit < 1:
            raise InvalidArgument(f"limit must be >= 1 object per call, got {limit}")
        now = self.clock.now()
        before = (self._evictions, self._evicted_bytes)
        held = now < self._hold_until
        used = self._pool_used()
        target = ratio * self._pool_capacity
        if not held:
            used = self._evict_until(target, used, limit)
            self._flush_evictions()
            if used > target and (limit is None or self._evictions - before[0] < limit):
                self._note_blocked(int(used - target))
        return EvictionReport(
            evicted=self._evictions - before[0],
            evicted_bytes=self._evicted_bytes - before[1],
            used=used,
            capacity=self._pool_capacity,
            reached=used <= target,
            held=held,
            pinned=self._pinned_space,
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
        tier: str = DRAM,
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
        seg = self._segments.get(node_id, Tier(tier)) if tier in TIERS else None
        if seg is None:
            return Code.NOT_FOUND
        if tier != DRAM:
            return self._adopt_ssd(k, size, checksum, seg)
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
        self._grow_lrus()
        t.pins[s] = 0
        self._lru_of(s).push(s)
        self._complete_size += size
        return Code.OK

    def hold_eviction_until(self, t: float) -> None:
        """Evict nothing before clock time t: the pins of the old leader are unknown
        here, so wait one maximum lease TTL before trusting the LRU."""
        self._hold_until = max(self._hold_until, t)

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CoreStats:
        now = self.clock.now()
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
            recent=self._recent.recent(now, self._recent_totals()),
            recent_seconds=self._recent.covered(now),
            draining=sorted(self._draining),
            eviction_blocked=self._blocked,
            eviction_blocked_bytes=self._blocked_bytes,
            tenants={p[:-1].decode(errors="replace"): v for p, v in self.tenant_usage().items()},
            quota_evictions=self._quota_evictions,
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

    # ------------------------------------------------------------------ administration

    def set_draining(self, node_id: str, draining: bool = True, *, must_exist: bool = True) -> None:
        """Mark a node draining or not. A draining node gets no new placements and its
        DRAM leaves the pool the watermarks watch; what it holds stays readable until
        drain() or eviction takes it. NotFound when marking a node that is not mounted,
        unless `must_exist` is False (a new leader restores the marks before the nodes
        mount). Unmarking an unknown node is a no-op."""
        if not node_id:
            raise InvalidArgument("node_id must be a non-empty string")
        if draining:
            if must_exist and node_id not in self._segments.by_node:
                mounted = ", ".join(self.node_ids()) or "none"
                raise NotFound(f"no store node {node_id!r} is mounted (mounted: {mounted})")
            self._draining.add(node_id)
        else:
            self._draining.discard(node_id)
        self._refresh_pool()

    def draining(self) -> list[str]:
        return sorted(self._draining)

    def drain(self, node_id: str, limit: int = 1000) -> DrainReport:
        """Admin: one step of emptying a node; marks it draining first.

        Frees up to `limit` of its replicas whose object has another replica on another
        node (readers still find that one), and lists up to `limit` COMPLETE objects
        whose only replicas are here: the master never touches bytes, so a client must
        copy those elsewhere (read, remove, put again) or let them go. Pinned and
        PENDING objects are left alone: the promise holds, and a later step finds them
        unpinned or committed. Call again until `remaining` is 0."""
        if limit < 1:
            raise InvalidArgument(f"limit must be >= 1 object per call, got {limit}")
        self.set_draining(node_id, True)
        segs = list(self._segments.by_node[node_id].values())
        ids = {seg.seg_id for seg in segs}
        t = self._objects
        dropped = dropped_bytes = pinned = pending = 0
        sole: list[tuple[bytes, int]] = []
        for s in self._slots_on(ids):
            p = t.pins[s]
            if p == PENDING:
                pending += 1
                continue
            if p > 0:
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

    def node_list(self) -> list[NodeInfo]:
        """Mounted nodes (alive or draining), then nodes gone within
        config.departed_retention seconds, with what went with them."""
        now = self.clock.now()
        self._forget_departed(now)
        out = [
            NodeInfo(node_id, "draining" if node_id in self._draining else "alive",
                     ns.segments, ns.objects)
            for node_id, ns in self.stats().nodes.items()
        ]
        out += sorted(self._departed.values(), key=lambda n: n.node_id)
        return out

    def eviction_stats(self) -> EvictionStats:
        now = self.clock.now()
        recent = self._recent.recent(now, self._recent_totals())
        tc = self._tier_counts
        tiers = [TierEvictions(
            DRAM, self._evictions, self._evicted_bytes, recent["evictions"],
            recent["evicted_bytes"], tc.get("demotions", 0), tc.get("demoted_bytes", 0),
            recent["demotions"], recent["demoted_bytes"],
        )]
        if self._segments.tier(SSD) or tc.get("ssd_evictions", 0):
            tiers.append(TierEvictions(
                SSD, tc.get("ssd_evictions", 0), tc.get("ssd_evicted_bytes", 0),
                recent["ssd_evictions"], recent["ssd_evicted_bytes"],
            ))
        return EvictionStats(
            tiers=tiers,
            evict_high=self.config.evict_high,
            evict_low=self.config.evict_low,
            pool_capacity=self._pool_capacity,
            pool_used=self._pool_used(),
            pool_pinned=self._pinned_space,
            pool_pending=self._pending_space,
            blocked=self._blocked,
            blocked_bytes=self._blocked_bytes,
            blocked_pinned_bytes=self._blocked_pinned,
            held_for=max(0.0, self._hold_until - now),
            recent_seconds=self._recent.covered(now),
        )

    def reconfigure(self, config: CoreConfig) -> None:
        """Swap in changed live settings (config.LIVE_SETTINGS) without a restart; a
        config that differs in anything else is InvalidArgument. New watermarks apply
        from the next put or tick, put_timeout to puts started from now on, the lease
        TTLs to leases granted or renewed from now on."""
        if not same_structure(self.config, config):
            raise InvalidArgument(
                "only live settings (evict_high, evict_low, max_lease_ttl, "
                "default_lease_ttl, put_timeout) can change without a restart")
        self.config = config

    def _recent_totals(self) -> list[int]:
        tc = self._tier_counts
        return [self._lookup_keys, self._hit_keys, self._evictions, self._evicted_bytes,
                tc.get("demotions", 0), tc.get("demoted_bytes", 0),
                tc.get("ssd_evictions", 0), tc.get("ssd_evicted_bytes", 0)]

    def _forget_departed(self, now: float) -> None:
        if self._departed:
            keep = self.config.departed_retention
            for node_id in [n for n, d in self._departed.items() if now - d.gone_at > keep]:
                del self._departed[node_id]

    def _no_segment_message(self) -> str:
        if self._draining and self._segments.tier(DRAM):
            return ("every store node with a DRAM segment is draining; undrain one "
                    "(kvstore drain NODE --cancel) or add a node")
        return "no store node has mounted a DRAM segment"

    @staticmethod
    def _segment_stats(seg: Segment) -> SegmentStats:
        """A segment's numbers without the pin scan stats() makes."""
        return SegmentStats(node_id=seg.node_id, segment=seg.name, tier=seg.tier,
                            base_addr=seg.base_addr, capacity=seg.alloc.capacity,
                            used=seg.alloc.used_bytes, free_largest=seg.alloc.largest_free(),
                            replicas=seg.replicas, pinned_replicas=0, pinned_bytes=0)

    def _slots_on(self, seg_ids: set[int]) -> list[int]:
        """Live objects (PENDING or COMPLETE) with a replica in one of these segments.
        Scans the index with numpy: for admin calls, not for a hot path."""
        t = self._objects
        where = np.frombuffer(t.where, dtype=np.uint64).copy()
        pins = np.frombuffer(t.pins, dtype=np.int32).copy()
        hit = np.isin(where >> np.uint64(OFFSET_BITS), np.array(sorted(seg_ids), dtype=np.uint64))
        hit &= pins >= PENDING
        found = set(np.flatnonzero(hit).tolist())
        for s, extra in t.extra.items():
            if any(h >> OFFSET_BITS in seg_ids for h in extra):
                found.add(s)
        return sorted(found)

    def _drop_replicas(self, s: int, keep: tuple[int, ...]) -> None:
        """Free the replicas of unpinned COMPLETE object s that are not in `keep`."""
        t = self._objects
        size = t.size[s]
        key = t.key_of[s]
        by_id = self._segments.by_id
        for h in t.handles(s):
            if h in keep:
                continue
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is None:
                continue
            if self.journal is not None and key is not None:
                self.journal.append(ReplicaChange(seg.node_id, seg.tier, key, h & OFFSET_MASK,
                                                  size, t.checksum[s], False))
            seg.alloc.free(h & OFFSET_MASK, _alloc_size(seg.tier, size))
            seg.replicas -= 1
        t.space[s] = self._footprint(keep, size)
        t.set_handles(s, keep)

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
        self._tiered = bool(self._segments.tier(SSD))
        # Draining nodes get no new placements, and their DRAM is not in the pool the
        # watermarks watch: the rest of the cluster must hold the working set.
        self._dram = [s for s in self._segments.tier(DRAM) if s.node_id not in self._draining]
        self._pool_capacity = sum(s.alloc.capacity for s in self._dram)

    def _pool_used(self) -> int:
        # DRAM that in-flight demotions are about to free counts as free already, or
        # every batch would demote more while the first demotions are still copying.
        return sum(s.alloc.used_bytes for s in self._dram) - self._demoting_space

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
                return PutStartResult(Code.OK, self._locations(s), placement=t.placed[s])
            return self._put_failed(
                "in_progress",
                f"key is being written by {owner or 'another writer'}; retry after it "
                f"commits or after put_timeout ({self.config.put_timeout:g} s)",
                Code.IN_PROGRESS,
            )
        if not self._dram:
            return self._put_failed("no_segment", self._no_segment_message(), Code.STORE_FULL)
        if t.usage is not None:
            refused = self._quota_room(key, size, now)
            if refused is not None:
                return refused
        if size > largest:
            return self._put_failed(
                "too_large",
                f"object of {size} bytes is larger than the largest segment ({largest} bytes)",
                Code.STORE_FULL,
            )
        asize = (size + self._align_mask) & ~self._align_mask
        placed = place(self._dram, asize, want)
        if not placed and self._tiered and now >= self._hold_until and self._demote_for(asize):
            # Dropping would lose objects the SSD tier has room for: make the writer
            # wait a few ms for the demotions instead.
            return self._put_failed(
                "busy", f"making room: {self._demoting_space} bytes are moving to SSD; "
                "retry in a few milliseconds", Code.BUSY)
        if not placed:
            placed = self._evict_for(asize, want, now)
        if not placed:
            return self._put_failed("store_full", self._full_message(now), Code.STORE_FULL)
        handles = []
        for seg, offset in placed:
            seg.replicas += 1
            handles.append(seg.handle(offset))
        space = asize * len(placed)
        s = t.new(key, size, checksum, handles, space, now)
        if s >= len(self._lru.prev):
            self._grow_lrus()
        t.pending[s] = PendingWrite(writer, deadline)
        self._pending_space += space
        self._pending_size += size
        return PutStartResult(
            Code.OK,
            [Location(seg.node_id, seg.name, seg.base_addr + off, size, seg.tier) for seg, off in placed],
            placement=t.placed[s],
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
        if seg.tier != DRAM:
            # Not readable over the Transfer Engine from a file: bring it into DRAM
            # first; the reader asks again shortly (the object is pinned meanwhile).
            self._queue_promotion(s)
            return ReadResult(Code.IN_PROGRESS, size, t.checksum[s])
        locations = [Location(seg.node_id, seg.name, seg.base_addr + (h & OFFSET_MASK), size, seg.tier)]
        if s in t.extra:
            locations = self._locations(s)
        return ReadResult(Code.OK, size, t.checksum[s], locations, t.placed[s])

    def _locations(self, s: int) -> list[Location]:
        t = self._objects
        size = t.size[s]
        by_id = self._segments.by_id
        out: list[Location] = []
        for h in t.handles(s):
            seg = by_id[h >> OFFSET_BITS]
            out.append(_location(seg.node_id, seg.name, seg.base_addr + (h & OFFSET_MASK), size, seg.tier))
        return out

    def _read_batch(
        self, keys: Sequence[bytes],
    ) -> tuple[list[ReadResult], list[bytes], list[int]] | None:
        """get_replicas's scan without a lease, when every key is bytes of a valid length
        and every object found sits in DRAM: the results (each what _read_result or
        NOT_FOUND would give), the keys found and their slots, in order; nothing is
        changed. None (the per-key path's turn) otherwise: an invalid key, or an object
        on SSD, whose promotion must be queued at its place in the scan."""
        if len(keys) == 1:  # the single get: its checks without building a set
            k = keys[0]
            if type(k) is not bytes or not 0 < len(k) <= MAX_KEY_BYTES:
                return None
        else:
            if not keys:
                return None
            try:
                if (set(map(type, keys)) != {bytes} or min(map(len, keys)) == 0
                        or max(map(len, keys)) > MAX_KEY_BYTES):
                    return None
            except TypeError:
                return None
        t = self._objects
        get = t.index.get
        pins = t.pins
        sizes = t.size
        checksums = t.checksum
        where = t.where
        placed = t.placed
        extra = t.extra
        by_id = self._segments.by_id
        new = _new_object
        ok = Code.OK
        not_found = Code.NOT_FOUND
        results: list[ReadResult] = []
        result = results.append
        found: list[bytes] = []
        slots: list[int] = []
        for k in keys:
            s = get(k)
            if s is None or pins[s] < 0:
                result(ReadResult(not_found))
                continue
            h = where[s]
            seg = by_id[h >> OFFSET_BITS]
            tier = seg.tier
            if tier != DRAM:
                return None
            size = sizes[s]
            if s in extra:
                locations = self._locations(s)
            else:
                loc = new(Location)
                _set_node_id(loc, seg.node_id)
                _set_segment(loc, seg.name)
                _set_addr(loc, seg.base_addr + (h & OFFSET_MASK))
                _set_size(loc, size)
                _set_tier(loc, tier)
                locations = [loc]
            result(ReadResult(ok, size, checksums[s], locations, placed[s]))
            found.append(k)
            slots.append(s)
        return results, found, slots

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
            if self._tiered or self._ssd_lru:
                for s in newly:
                    self._lru_of(s).unlink(s)
            else:
                self._lru.unlink_all(newly)
            space = t.space
            self._pinned_space += sum([space[s] for s in newly])
        return tokens

    def _touch_slots(self, slots: list[int], now: float) -> None:
        """A read without a pin: each slot becomes the most recently used (a pinned one,
        off the LRU, goes to its end when its last pin goes)."""
        t = self._objects
        pins = t.pins
        touched = t.touched
        lru_of = self._lru_of if self._tiered or self._ssd_lru else None
        for s in slots:
            touched[s] = now
            if pins[s] == 0:
                (self._lru if lru_of is None else lru_of(s)).touch(s)

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
            if self._tiered or self._ssd_lru:
                for s in freed:
                    self._lru_of(s).push(s)
            else:
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

    def _drop(self, s: int, frees: dict[Segment, list[tuple[int, int]]] | None = None) -> None:
        """Forget an object and free its replicas on the segments still mounted. With
        `frees`, its ranges are added there instead, for the caller to free in bulk
        (ExtentAllocator.free_many) before anything allocates again."""
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
                if frees is None:
                    seg.alloc.free(h & OFFSET_MASK, _alloc_size(seg.tier, size))
                else:
                    ranges = frees.get(seg)
                    if ranges is None:
                        ranges = frees[seg] = []
                    ranges.append((h & OFFSET_MASK, _alloc_size(seg.tier, size)))
                seg.replicas -= 1
        move = self._moves.pop(s, None)
        if move is not None:
            self._cancel_move(s, move)
        p = t.pins[s]
        if p == PENDING:
            self._pending_space -= t.space[s]
            self._pending_size -= size
        else:
            self._complete_size -= size
            if p > 0:
                self._pinned_space -= t.space[s]
            else:
                self._lru_of(s).unlink(s)
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
            move = self._moves.get(s)
            if move is not None and move.kind == DEMOTE:
                self._demoting_space += new_space - t.space[s]
            t.space[s] = new_space
            t.set_handles(s, keep)
        if gone:
            self._emit(Event(EventKind.NODE_LOST, gone, gone_size, node_id))
        return gone

    # -- SSD tier: demotion and promotion ----------------------------------------
    #
    # An object lives in one tier at a time: DRAM (one or more replicas) or SSD (one
    # replica, a file on one node). Moving it is a copy the store node makes, so a move
    # is two steps: the core reserves the destination and pins the object with a
    # synthetic pin (nothing evicts or re-allocates it meanwhile; readers still read
    # the source), the I/O layer has the node copy (drain_tier_moves), then
    # finish_tier_move swaps the replica and frees the source. A move whose node fails
    # to copy leaves the object where it was (promotion) or drops it (a demotion was
    # an eviction anyway).

    def drain_tier_moves(self) -> list[TierMove]:
        """Demotions started by eviction since the last call, for the nodes to carry out."""
        out, self._move_queue = self._move_queue, []
        return out

    def _queue_promotion(self, s: int) -> None:
        key = self._objects.key_of[s]
        if key is not None and s not in self._moves:
            self._move_queue.extend(self.promote([key]))
            if self.on_move_queued is not None:
                self.on_move_queued()

    def promote(self, keys: Sequence[bytes]) -> list[TierMove]:
        """Start bringing SSD-only objects back into DRAM on their node, so readers can
        read them over the Transfer Engine. Returns the moves started now; keys already
        moving, missing, or in DRAM start nothing (concurrent readers of one SSD object
        cause one SSD read)."""
        self._check_batch(len(keys))
        t = self._objects
        now = self.clock.now()
        started: list[TierMove] = []
        by_id = self._segments.by_id
        for key in keys:
            k = _norm_key(key)
            s = t.index.get(k) if k is not None else None
            if s is None or t.pins[s] < 0 or s in self._moves:
                continue
            h = t.where[s]
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is None or seg.tier == DRAM:
                continue
            dram = self._segments.get(seg.node_id, DRAM)
            if dram is None:
                continue
            size = t.size[s]
            off = dram.alloc.allocate(size)
            if off < 0:
                # Make room by demoting (never by dropping: that would trade one
                # object for another); the reader asks again and finds room then.
                if now >= self._hold_until:
                    self._demote_for(size)
                continue
            dram.replicas += 1
            self._moves[s] = _Move(PROMOTE, s | t.gen[s] << SLOT_BITS, dram.handle(off))
            if t.pins[s] == 0:
                self._lru_of(s).unlink(s)
            t.pins[s] += 1
            t.touched[s] = now
            started.append(TierMove(PROMOTE, seg.node_id, k, size, t.checksum[s], off))  # type: ignore[arg-type]
        self._flush_evictions()
        return started

    def moving(self, key: bytes) -> bool:
        s = self._objects.index.get(key)
        return s is not None and s in self._moves

    def finish_tier_move(self, move: TierMove, code: Code) -> None:
        """The node's answer to a move: OK, or why not. CORRUPT/NOT_FOUND from a
        promotion means the SSD copy is bad or gone: the object is dropped."""
        t = self._objects
        s = t.index.get(move.key)
        m = self._moves.get(s) if s is not None else None
        if s is None or m is None or m.kind != move.kind or t.slot_of(m.token) != s:
            # The object went (removed, lost with its node) while moving. A demotion the
            # node carried out left a file under this move's reservation, which nothing
            # else will ever free: tell the node to drop it (the node skips the drop if
            # the key has been demoted again since, under another reservation).
            if move.kind == DEMOTE and code == Code.OK and self.journal is not None:
                self.journal.append(ReplicaChange(move.node_id, SSD, move.key, move.ssd_offset,
                                                  move.size, move.checksum, False))
            return
        del self._moves[s]
        by_id = self._segments.by_id
        dest = by_id.get(m.dest >> OFFSET_BITS)
        size = t.size[s]
        old = t.handles(s)
        t.pins[s] -= 1  # the synthetic pin
        if move.kind == DEMOTE:
            self._demoting_space -= t.space[s]
            self._pinned_space -= t.space[s]
        if code == Code.OK and dest is not None:
            if self.journal is not None:
                self._journal_replicas(s, move.key, False)
            for h in old:
                seg = by_id.get(h >> OFFSET_BITS)
                if seg is not None:
                    seg.alloc.free(h & OFFSET_MASK, _alloc_size(seg.tier, size))
                    seg.replicas -= 1
            t.set_handles(s, (m.dest,))
            t.space[s] = self._footprint((m.dest,), size)
            if t.pins[s] > 0:
                self._pinned_space += t.space[s]
            if self.journal is not None:
                self._journal_replicas(s, move.key, True)
            name = "demot" if move.kind == DEMOTE else "promot"
            self._tier_counts[f"{name}ions"] += 1
            self._tier_counts[f"{name}ed_bytes"] += size
            if t.pins[s] == 0:
                self._lru_of(s).push(s)
            return
        if dest is not None:
            dest.alloc.free(m.dest & OFFSET_MASK, _alloc_size(dest.tier, size))
            dest.replicas -= 1
        name = "demotion" if move.kind == DEMOTE else "promotion"
        self._tier_counts[f"{name}_failures"] += 1
        if move.kind == DEMOTE and t.pins[s] > 0:
            self._pinned_space += t.space[s]  # still pinned by a reader, still in DRAM
        bad_copy = move.kind == PROMOTE and code in (Code.CORRUPT, Code.NOT_FOUND)
        if t.pins[s] == 0:
            self._lru_of(s).push(s)
            if move.kind == DEMOTE or bad_copy:
                # The demotion was an eviction: finish it by dropping the object.
                self._evicted_keys.append(move.key)
                self._evicted_size += size
                self._evictions += 1
                self._evicted_bytes += size
                self._drop(s)
                self._flush_evictions()
        elif bad_copy:
            self._drop(s)  # readers under a lease get NOT_FOUND, never bad bytes

    def _demote_for(self, asize: int) -> bool:
        """Demote oldest-first until in-flight demotions will free `asize` bytes;
        True if any demotion is in flight (the caller should retry shortly)."""
        while self._demoting_space < asize:
            s = self._lru.oldest()
            if not s or not self._start_demotion(s):
                break
        return self._demoting_space > 0

    def _start_demotion(self, s: int) -> bool:
        """Reserve SSD room on the node of s's first DRAM replica and queue the copy;
        False when that node has no SSD tier or no room even after SSD eviction."""
        t = self._objects
        seg = self._segments.by_id[t.where[s] >> OFFSET_BITS]
        ssd = self._segments.get(seg.node_id, SSD)
        if ssd is None or s in self._moves:
            return False
        size = t.size[s]
        need = _alloc_size(SSD, size)
        off = ssd.alloc.allocate(need)
        lru = self._ssd_lru.get(seg.node_id)
        while off < 0 and lru is not None and lru.oldest():
            victim = lru.oldest()
            self._tier_counts["ssd_evictions"] += 1
            self._tier_counts["ssd_evicted_bytes"] += t.size[victim]
            self._evicted_keys.append(t.key_of[victim])  # type: ignore[arg-type]
            self._evicted_size += t.size[victim]
            self._drop(victim)
            off = ssd.alloc.allocate(need)
        if off < 0:
            self._tier_counts["demotion_failures"] += 1
            return False
        ssd.replicas += 1
        self._lru.unlink(s)
        t.pins[s] = 1
        self._pinned_space += t.space[s]
        self._demoting_space += t.space[s]
        key = t.key_of[s]
        assert key is not None
        self._moves[s] = _Move(DEMOTE, s | t.gen[s] << SLOT_BITS, ssd.handle(off))
        self._move_queue.append(TierMove(DEMOTE, seg.node_id, key, size, t.checksum[s],
                                         t.where[s] & OFFSET_MASK, off))
        if self.on_move_queued is not None:
            self.on_move_queued()
        return True

    def _cancel_move(self, s: int, m: _Move) -> None:
        """The object is being dropped mid-move: release the move's reservation."""
        t = self._objects
        dest = self._segments.by_id.get(m.dest >> OFFSET_BITS)
        if dest is not None:
            dest.alloc.free(m.dest & OFFSET_MASK, _alloc_size(dest.tier, t.size[s]))
            dest.replicas -= 1
        if m.kind == DEMOTE:
            self._demoting_space -= t.space[s]

    def _adopt_ssd(self, k: bytes, size: int, checksum: int, seg: Segment) -> Code:
        """Adopt an object a node holds on SSD (after a restart or a failover)."""
        t = self._objects
        s = t.index.get(k)
        if s is not None:
            return Code.OK if t.size[s] == size and t.checksum[s] == checksum else Code.INVALID_ARGUMENT
        off = seg.alloc.allocate(_alloc_size(SSD, size))
        if off < 0:
            return Code.STORE_FULL
        seg.replicas += 1
        s = t.new(k, size, checksum, (seg.handle(off),), 0, self.clock.now())
        self._grow_lrus()
        t.pins[s] = 0
        self._lru_of(s).push(s)
        self._complete_size += size
        return Code.OK

    def _lru_of(self, s: int) -> LruList:
        """The LRU an unpinned COMPLETE object belongs on: DRAM's, or its node's SSD one."""
        seg = self._segments.by_id.get(self._objects.where[s] >> OFFSET_BITS)
        if seg is None or seg.tier == DRAM:
            return self._lru
        lru = self._ssd_lru.get(seg.node_id)
        if lru is None:
            lru = self._ssd_lru[seg.node_id] = LruList()
            lru.grow(self._objects.slots)
        return lru

    def _grow_lrus(self) -> None:
        slots = self._objects.slots
        self._lru.grow(slots)
        for lru in self._ssd_lru.values():
            lru.grow(slots)

    def tier_counters(self) -> dict[str, int]:
        return dict(self._tier_counts)

    # -- tenant quotas ------------------------------------------------------------

    def set_quotas(self, quotas: dict[bytes, int]) -> None:
        """Cap the bytes each tenant key prefix (b"team-a/") may hold, PENDING included.

        A put over its tenant's quota first evicts that tenant's own least recently
        used objects (never another tenant's); QUOTA_EXCEEDED when what is left of the
        tenant's is pinned or PENDING. An empty mapping turns quotas off.
        """
        self._quotas = {p: q for p, q in quotas.items() if q > 0}
        t = self._objects
        if not self._quotas:
            t.usage = None
            return
        usage = dict.fromkeys(self._quotas, 0)
        for key, s in t.index.items():
            p = tenant_prefix(key)
            if p in usage:
                usage[p] += t.size[s]
        t.usage = usage

    def tenant_usage(self) -> dict[bytes, tuple[int, int]]:
        """Tenant prefix -> (bytes used, quota), for the tenants with a quota."""
        usage = self._objects.usage or {}
        return {p: (usage.get(p, 0), q) for p, q in self._quotas.items()}

    def _quota_room(self, key: bytes, size: int, now: float) -> PutStartResult | None:
        prefix = tenant_prefix(key)
        quota = self._quotas.get(prefix)
        usage = self._objects.usage
        if not quota or usage is None:
            return None
        need = usage[prefix] + size - quota
        if need <= 0:
            return None
        tenant = prefix[:-1].decode(errors="replace")
        if size > quota:
            return self._put_failed(
                "quota", f"object of {size} bytes is larger than tenant {tenant}'s whole quota "
                f"({quota} bytes)", Code.QUOTA_EXCEEDED)
        if now >= self._hold_until:
            self._evict_own(prefix, need)
            need = usage[prefix] + size - quota
            if need <= 0:
                return None
        return self._put_failed(
            "quota", f"tenant {tenant} is at its quota: {usage[prefix]} of {quota} bytes held "
            "by objects that are pinned or still being written; retry after readers release "
            "their leases, or ask for a larger quota", Code.QUOTA_EXCEEDED)

    def _evict_own(self, prefix: bytes, need: int) -> None:
        """Evict the tenant's least recently used unpinned objects, DRAM first, then SSD,
        until `need` bytes are free or none of its objects is left to evict."""
        t = self._objects
        key_of = t.key_of
        victims: list[int] = []
        freed = 0
        for lru in (self._lru, *self._ssd_lru.values()):
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
            self._evicted_keys.append(key_of[s])  # type: ignore[arg-type]
            self._evicted_size += t.size[s]
            self._evictions += 1
            self._evicted_bytes += t.size[s]
            self._quota_evictions += 1
            self._drop(s)

    # -- eviction policy (the order itself lives in eviction.LruList) --------------

    def _evict_oldest(
        self, demote: bool = False, frees: dict[Segment, list[tuple[int, int]]] | None = None
    ) -> tuple[int, tuple[int, ...]]:
        """Evict the least recently used evictable object: (DRAM bytes freed, its
        replica handles), or (0, ()) when nothing is evictable. With `demote`, an object
        whose node has SSD room is demoted instead of dropped (its DRAM is freed once
        the node has copied it). `frees`: see _drop."""
        s = self._lru.oldest()
        if not s:
            return 0, ()
        t = self._objects
        freed = t.space[s]
        handles = t.handles(s)
        if demote and self._tiered and self._start_demotion(s):
            return freed, handles
        self._evicted_keys.append(t.key_of[s])  # type: ignore[arg-type]
        self._evicted_size += t.size[s]
        self._evictions += 1
        self._evicted_bytes += t.size[s]
        self._drop(s, frees)
        return freed, handles

    def _evict_until(self, target: float, used: int, limit: int | None = None) -> int:
        """Evict until used <= target (or `limit` objects went); returns used afterwards.
        Stops at the first object that gets there, so it never evicts more than needed."""
        n = 0
        # Nothing here allocates DRAM or looks at its free extents (`used` counts the
        # objects' footprints), so the victims' ranges can be freed together at the end:
        # the LRU's oldest were mostly written together and sit together.
        frees: dict[Segment, list[tuple[int, int]]] = {}
        try:
            while used > target and (limit is None or n < limit):
                freed, handles = self._evict_oldest(True, frees)
                if not handles:
                    break
                used -= freed
                n += 1
        finally:
            for seg, ranges in frees.items():
                seg.alloc.free_many(ranges)
        return used

    def _evict_to_watermark(self, now: float) -> None:
        if now < self._hold_until or not self._pool_capacity:
            return
        used = self._pool_used()
        if used > self.config.evict_high * self._pool_capacity:
            target = self.config.evict_low * self._pool_capacity
            used = self._evict_until(target, used)
            if used > target:
                # Every tick retries; one shortfall episode is counted once.
                if not self._watermark_blocked:
                    self._note_blocked(int(used - target))
                self._watermark_blocked = True
                return
        self._watermark_blocked = False

    def _note_blocked(self, shortfall: int) -> None:
        """Eviction stopped short by `shortfall` bytes: all that is left is pinned or
        PENDING (never called while eviction is held after a failover)."""
        self._blocked += 1
        self._blocked_bytes += max(shortfall, 0)
        self._blocked_pinned = self._pinned_space

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
                self._note_blocked(asize)
                return []
            for h in handles:
                seg = by_id.get(h >> OFFSET_BITS)
                if (seg is not None and seg.tier == DRAM and seg.node_id not in self._draining
                        and seg.alloc.largest_free() >= asize):
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
