"""MasterCore: the whole master minus I/O, driven by method calls and a clock.

Rule 1: everything that decides an object's fate lives behind this facade — PENDING ->
COMPLETE -> pinned / moving -> gone (lifecycle.py's table: every move, the verbs that
make it and what it changes), who pins it, where its replicas are, when space is
reclaimed. The gRPC server and the etcd watcher only translate
messages into these calls and results back into messages.

Rule 2: nothing here blocks, sleeps, logs on a hot path, reads the time except through
the injected clock, or touches a socket or a file. Time-driven work (lease expiry,
zombie PENDING reclaim, watermark eviction) happens in `tick()`, which the server calls
every ~100 ms and after batches.

Rule 3: per-key problems in a batch are per-key result codes; only a malformed call
(batch too large, lists of different lengths, a bad TTL or lease id) raises, and a call
that raises has changed nothing.

The promise (docs/architecture.md, "Leases and pins"): an object pinned by a live lease is never
evicted or re-allocated; only a forced remove or the loss of its node can take it, and
the reader then gets NOT_FOUND under its lease instead of someone else's bytes.

The facade holds the rules and the public verbs; the mechanisms are collaborators over
one explicit state (state.py), each with one reason to change:

    lifecycle.py   an object's states and moves, as one table (the tests hold every
                   call to it)
    state.py       the tables, the space ledger, the counters, the replica journal,
                   CoreState.drop
    objects.py     the object table: columns by slot, the phase of each
    segments.py    mounted segments; Segment.take / give keep a segment's replica count
    keys.py        the one key check
    checks.py      the one object check (size, checksum)
    writes.py      put_start's general path, put_end, put_commit, put_revoke, remove
    batch_put.py   put_start's batch path (held to put_each's answers by a twin test)
    reads.py       exists, lookup, get_replicas
    pins.py        the only writer of pin counts; leases turned into pins
    lru.py         the LRU order of evictable objects
    eviction.py    the eviction policy and its bookkeeping
    tiers.py       demotion to SSD and promotion back
    quotas.py      tenant quotas
    membership.py  segments mounted and lost, adoption, draining a node
    introspect.py  stats, eviction stats, inspect, keys, the node list
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.errors import Code, InvalidArgument

from .batch_put import BatchPut
from .clock import Clock, MonotonicClock
from .config import CoreConfig, same_structure
from .eviction import Eviction
from .introspect import Introspect
from .membership import Membership
from .pin_cap import PinCap
from .pins import EXPIRE_PINS, Pins
from .quotas import Quotas
from .reads import Reads
from .results import (
    CoreStats,
    DrainReport,
    Event,
    EvictionReport,
    EvictionStats,
    GetReplicasResult,
    LookupResult,
    NodeInfo,
    ObjectInfo,
    PutStartResult,
    ReplicaChange,
    TickReport,
    TierMove,
)
from .segments import DRAM
from .state import CoreState
from .tiers import Tiers
from .writes import Writes


class MasterCore:
    def __init__(self, config: CoreConfig | None = None, clock: Clock | None = None) -> None:
        state = CoreState(config if config is not None else CoreConfig(),
                          clock if clock is not None else MonotonicClock())
        self._state = state
        self._pins = Pins(state)
        self._eviction = Eviction(state)
        self._tiers = Tiers(state, self._pins, self._eviction)
        # Eviction demotes through tiers, and tiers evict through eviction.
        self._eviction.demote = self._tiers.start_demotion
        self._quotas = Quotas(state, self._eviction)
        self._writes = Writes(state, self._pins, self._eviction, self._tiers, self._quotas)
        self._reads = Reads(state, self._pins, self._tiers)
        self._pin_cap = self._reads.pin_cap = PinCap(state)
        self._membership = Membership(state, self._pins)
        self._introspect = Introspect(state, self._membership, self._quotas)

    # -- settable from outside: the daemon wires these ---------------------------

    @property
    def config(self) -> CoreConfig:
        return self._state.config

    @property
    def clock(self) -> Clock:
        return self._state.clock

    @property
    def journal(self) -> list[ReplicaChange] | None:
        """Replica journal for the store nodes' inventories; off (None) unless the
        daemon sets it to a list, so that nothing accumulates in tests and benchmarks."""
        return self._state.journal

    @journal.setter
    def journal(self, journal: list[ReplicaChange] | None) -> None:
        self._state.journal = journal

    @property
    def on_move_queued(self) -> Callable[[], None] | None:
        """Called (no I/O: it only wakes the mover) whenever a tier move is queued."""
        return self._state.on_move_queued

    @on_move_queued.setter
    def on_move_queued(self, wake: Callable[[], None] | None) -> None:
        self._state.on_move_queued = wake

    @property
    def _batch(self) -> BatchPut:
        """put_start's batch path (the twin tests switch it off)."""
        return self._writes.batch

    # ------------------------------------------------------------------ membership

    def mount_segment(
        self, node_id: str, segment: str, base_addr: int, size: int, tier: str = DRAM,
        start: int = 0,
    ) -> None:
        """Register a node's segment. Same geometry again: no-op. Different: replace it,
        dropping every replica the old one held (the node restarted with new memory).
        `start`: only [start, start + size) of it is this master's (its shard's part);
        offsets stay relative to the segment."""
        self._membership.mount_segment(node_id, segment, base_addr, size, tier, start)

    def unmount_node(self, node_id: str, reason: str = "lost") -> list[bytes]:
        """Forget a node. Its replicas vanish at once. Returns the keys now gone: COMPLETE
        objects that lost their last replica, and PENDING objects that had a replica
        there (their writer's put_end will get NOT_FOUND). Unknown node: [].
        `reason` ("lost": its etcd lease ended; "left": it unmounted itself) is what
        node_list() shows for it during config.departed_retention."""
        return self._membership.unmount_node(node_id, reason)

    def node_ids(self) -> list[str]:
        return self._membership.node_ids()

    # ------------------------------------------------------------------ writes

    def put_timeout(self, ahead: bool = False) -> float:
        """Seconds a PENDING object started now stays so before it is reclaimed: the
        put timeout, or for space started ahead the shorter AHEAD_TIMEOUT (writes.py);
        a writer writes it only in the first half of that."""
        return self._writes.ahead_timeout() if ahead else self.config.put_timeout

    def put_start(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        replicas: int | None = None,
        writer: str = "",
        ahead: bool = False,
        record_room: int = 0,
    ) -> list[PutStartResult]:
        """Allocate space for new objects (PENDING, invisible to readers).

        `ahead`: space a writer starts before it has the values (placeholders, see
        put_commit). It is only ever taken from free space: never by evicting, demoting
        or waiting, never past the eviction watermark or AHEAD_SHARE of the pool in
        PENDING space, and not where quotas apply; otherwise every key is refused
        (STORE_FULL) and nothing changes. `record_room` (ahead only, at most
        MAX_RECORD_ROOM): bytes each replica also holds after the value, for the put
        record its writer appends (kvstore/put_record.py); the object keeps them.

        `replicas` None or 0 means config.default_replicas; it is best effort: fewer
        nodes, or no room on enough distinct nodes, gives fewer (never zero) replicas.
        When not even one fits, least recently used objects are evicted until it does;
        STORE_FULL when pinned and PENDING objects leave no room.
        A repeated key in the batch gets the first occurrence's result.
        """
        return self._writes.put_start(keys, sizes, checksums, replicas, writer, ahead,
                                      record_room)

    def put_end(self, keys: Sequence[bytes], writer: str = "") -> list[Code]:
        """Commit PENDING objects: OK; NOT_FOUND when not PENDING (never started,
        revoked, reclaimed, lost); ALREADY_EXISTS when already COMPLETE (a retry);
        IN_PROGRESS when another named writer holds it."""
        return self._writes.put_end(keys, writer)

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
        return self._writes.put_commit(placeholders, keys, sizes, checksums, writer)

    def put_revoke(self, keys: Sequence[bytes], writer: str = "",
                   unsettled: bool = False) -> list[Code]:
        """Free PENDING objects: OK; NOT_FOUND when not there; ALREADY_EXISTS when
        COMPLETE (committed objects are not revoked; use remove); IN_PROGRESS when
        another named writer holds it. `unsettled`: the writer's transfers ended
        without an answer, so bytes may still land; the keys are free at once, their
        space is held until the put timeout (quarantine.py)."""
        return self._writes.put_revoke(keys, writer, unsettled)

    def remove(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        """Drop objects: OK, NOT_FOUND, or IN_PROGRESS for a PENDING or pinned object
        unless `force`. A forced remove of a pinned object makes its leases report
        NOT_FOUND for it; a forced remove of a PENDING one makes its put_end NOT_FOUND."""
        return self._writes.remove(keys, force)

    # ------------------------------------------------------------------ reads

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """COMPLETE only; does not touch recency and pins nothing."""
        return self._reads.exists(keys)

    def lookup(self, keys: Sequence[bytes], lease_ttl: float | None = None, holder: str = "",
               owner: str = "") -> LookupResult:
        """Pin the longest contiguous COMPLETE prefix of `keys` under a new lease.

        A key repeated inside the prefix is pinned once per position, so trimming the
        lease with keep_first_n stays positional. A prefix that would take the holder
        or the owner past pin_share of the DRAM pool is cut where it fits (pin_cap.py).
        """
        return self._reads.lookup(keys, lease_ttl, holder, owner)

    def get_replicas(
        self,
        keys: Sequence[bytes],
        lease_id: int | None = None,
        lease_ttl: float | None = None,
        holder: str = "",
        owner: str | None = None,
        pin: bool = True,
        columns: bool = False,
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

        With `columns`, a batch of valid keys whose objects found all sit in DRAM is
        answered in `columns` (one list per field; `results` is then empty), otherwise in
        `results` as without it.
        """
        return self._reads.get_replicas(keys, lease_id, lease_ttl, holder, owner, pin, columns)

    # ------------------------------------------------------------------ leases

    def renew_lease(self, lease_id: int, ttl: float | None = None, owner: str | None = None) -> float:
        """Extend a live lease to now + ttl; returns the new expires_at. With `owner`,
        only that tenant's lease (the same holds for release_lease and get_replicas)."""
        state = self._state
        return state.leases.renew(lease_id, state.ttl(ttl), state.clock.now(), owner)

    def release_lease(self, lease_id: int, keep_first_n: int | None = None,
                      owner: str | None = None) -> None:
        """Release the lease (None), or keep its first n pins and unpin the rest; a lease
        trimmed to 0 stays alive, empty, until released or expired."""
        if keep_first_n is not None and keep_first_n < 0:
            raise InvalidArgument(f"keep_first_n must be >= 0, got {keep_first_n}")
        self._pins.release(lease_id, keep_first_n, self._state.clock.now(), owner)

    # ------------------------------------------------------------------ time

    def tick(self) -> TickReport:
        """Expire leases, reclaim zombie PENDING objects, evict above the high mark."""
        state = self._state
        now = state.clock.now()
        report = TickReport()
        report.expired_leases, report.leases_due = self._expire_round(now)
        report.reclaimed = self._writes.reclaim(now)
        state.quarantine.expire(now)
        c = state.counts
        before = (c.evictions, c.evicted_bytes)
        self._eviction.to_watermark(now)
        self._eviction.flush()
        report.evicted = c.evictions - before[0]
        report.evicted_bytes = c.evicted_bytes - before[1]
        state.recent.observe(now, self._introspect.recent_totals())
        self._membership.forget_departed(now)
        return report

    def expire_leases(self) -> tuple[int, bool]:
        """One more round of the tick's lease expiry (at most EXPIRE_PINS pins): how many
        leases expired, and whether more are past their deadline. A lease past its
        deadline is dead to every verb already; this only hands its pins back."""
        return self._expire_round(self._state.clock.now())

    def _expire_round(self, now: float) -> tuple[int, bool]:
        return self._pins.expire(now, EXPIRE_PINS), self._state.leases.due(now)

    def evict_to(self, ratio: float, limit: int | None = None) -> EvictionReport:
        """Admin: evict unpinned COMPLETE objects, oldest first, until used <= ratio of
        the DRAM pool (or nothing evictable is left). Honours hold_eviction_until.
        With `limit`, evict at most that many objects in this call (an admin tool calls
        again until `reached`, so one call never holds the master for long)."""
        return self._eviction.evict_to(ratio, limit)

    def hold_eviction_until(self, t: float) -> None:
        """Evict nothing before clock time t: the pins of the old leader are unknown
        here, so wait one maximum lease TTL before trusting the LRU."""
        self._eviction.hold_until(t)

    # ------------------------------------------------------------------ queues

    def take_events(self) -> list[Event]:
        """Evictions, reclaims, removals and node losses since the last call."""
        return self._state.events.take()

    def take_tier_moves(self) -> list[TierMove]:
        """Demotions and promotions started since the last call, for the nodes to carry
        out (finish_tier_move takes their answers)."""
        return self._tiers.take_tier_moves()

    def take_replica_changes(self) -> list[ReplicaChange]:
        """Replicas committed and freed since the last call (journal must be enabled)."""
        state = self._state
        if not state.journal:
            return []
        out, state.journal = state.journal, []
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
        return self._membership.adopt_replica(key, size, checksum, node_id, offset, tier)

    # ------------------------------------------------------------------ tiers

    def promote(self, keys: Sequence[bytes]) -> list[TierMove]:
        """Start bringing SSD-only objects back into DRAM on their node, so readers can
        read them over the Transfer Engine. Returns the moves started now; keys already
        moving, missing, or in DRAM start nothing (concurrent readers of one SSD object
        cause one SSD read)."""
        return self._tiers.promote(keys)

    def moving(self, key: bytes) -> bool:
        return self._tiers.moving(key)

    def finish_tier_move(self, move: TierMove, code: Code) -> None:
        """The node's answer to a move: OK, or why not. CORRUPT/NOT_FOUND from a
        promotion means the SSD copy is bad or gone: the object is dropped."""
        self._tiers.finish_tier_move(move, code)

    def tier_counters(self) -> dict[str, int]:
        return self._tiers.tier_counters()

    # ------------------------------------------------------------------ quotas

    def set_quotas(self, quotas: dict[bytes, int]) -> None:
        """Cap the bytes each tenant key prefix (b"team-a/") may hold, PENDING included.

        A put over its tenant's quota first evicts that tenant's own least recently
        used objects (never another tenant's); QUOTA_EXCEEDED when what is left of the
        tenant's is pinned or PENDING. An empty mapping turns quotas off.
        """
        self._quotas.set_quotas(quotas)

    def tenant_usage(self) -> dict[bytes, tuple[int, int]]:
        """Tenant prefix -> (bytes used, quota), for the tenants with a quota."""
        return self._quotas.tenant_usage()

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CoreStats:
        st = self._introspect.stats()
        st.pin_capped = self._pin_cap.capped
        st.pin_capped_keys = self._pin_cap.capped_keys
        return st

    def inspect(self, key: bytes) -> ObjectInfo | None:
        return self._introspect.inspect(key)

    def keys(self, prefix: bytes = b"", limit: int = 100) -> list[bytes]:
        """The first `limit` keys (PENDING and COMPLETE) starting with `prefix`, in byte
        order. Scans the index: an admin tool, not a hot path."""
        return self._introspect.keys(prefix, limit)

    def node_list(self) -> list[NodeInfo]:
        """Mounted nodes (alive or draining), then nodes gone within
        config.departed_retention seconds, with what went with them."""
        return self._introspect.node_list()

    def eviction_stats(self) -> EvictionStats:
        return self._introspect.eviction_stats()

    # ------------------------------------------------------------------ administration

    def set_draining(self, node_id: str, draining: bool = True, *, must_exist: bool = True) -> None:
        """Mark a node draining or not. A draining node gets no new placements and its
        DRAM leaves the pool the watermarks watch; what it holds stays readable until
        drain() or eviction takes it. NotFound when marking a node that is not mounted,
        unless `must_exist` is False (a new leader restores the marks before the nodes
        mount). Unmarking an unknown node is a no-op."""
        self._membership.set_draining(node_id, draining, must_exist)

    def draining(self) -> list[str]:
        return sorted(self._state.draining)

    def set_adopting(self, node_id: str, adopting: bool) -> None:
        """While a node mounted again replays its inventory (adopt_replica), place
        nothing new on it: a new object could take the range of one it still holds,
        whose entry would then be refused and the object lost. Like draining, without
        the operator's mark."""
        self._membership.set_adopting(node_id, adopting)

    def set_unresponsive(self, node_id: str, unresponsive: bool) -> None:
        """A node that missed a record (its last inventory delta failed: killed, cut off)
        gets no new placements until one lands again, though its etcd lease still runs:
        a put placed there would only fail. Like adopting, without the operator's mark."""
        state = self._state
        if unresponsive:
            state.unresponsive.add(node_id)
        else:
            state.unresponsive.discard(node_id)
        state.refresh_pool()

    def drain(self, node_id: str, limit: int = 1000) -> DrainReport:
        """Admin: one step of emptying a node; marks it draining first.

        Frees up to `limit` of its replicas whose object has another replica on another
        node (readers still find that one), and lists up to `limit` COMPLETE objects
        whose only replicas are here: the master never touches bytes, so a client must
        copy those elsewhere (read, remove, put again) or let them go. Pinned and
        PENDING objects are left alone: the promise holds, and a later step finds them
        unpinned or committed. Call again until `remaining` is 0."""
        return self._membership.drain(node_id, limit)

    def reconfigure(self, config: CoreConfig) -> None:
        """Swap in changed live settings (config.LIVE_SETTINGS) without a restart; a
        config that differs in anything else is InvalidArgument. New watermarks apply
        from the next put or tick, put_timeout to puts started from now on, the lease
        TTLs to leases granted or renewed from now on."""
        if not same_structure(self._state.config, config):
            raise InvalidArgument(
                "only live settings (evict_high, evict_low, evict_batch, pin_share, "
                "max_lease_ttl, default_lease_ttl, put_timeout) can change without a restart")
        self._state.config = config
