"""What the core hands back: plain dataclasses (and, for what it builds per replica,
NamedTuples) the gRPC layer maps onto messages."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from kvstore.errors import Code


class Tier(StrEnum):
    """Where a replica lives. The values are the wire's (Location.tier, MountSegment)."""

    DRAM = "dram"  # a store node's registered memory, read over the Transfer Engine
    SSD = "ssd"  # a file on a store node; promoted to DRAM before it is read


class MoveKind(StrEnum):
    """A copy between tiers (TierMove.kind; the values are MoveItem.kind's)."""

    DEMOTE = "demote"  # DRAM -> SSD, instead of dropping an evicted object
    PROMOTE = "promote"  # SSD -> DRAM, for a reader


class Location(NamedTuple):
    """Where one replica lives. A NamedTuple, not a frozen dataclass: put_start and
    get_replicas build one per replica, and `location` builds it in under a third of a
    frozen dataclass's time (docs/perf-notes.md)."""

    node_id: str
    segment: str  # the Transfer Engine segment name of the node (e.g. "127.0.0.1:15000")
    addr: int  # absolute address = segment base_addr + offset
    size: int
    tier: str = Tier.DRAM  # a Tier; typed str so callers may pass the wire's value


_new_tuple = tuple.__new__


def location(node_id: str, segment: str, addr: int, size: int, tier: str) -> Location:
    """Location(node_id, segment, addr, size, tier) without the keyword handling of
    its constructor: the tuple built directly."""
    return _new_tuple(Location, (node_id, segment, addr, size, tier))


@dataclass(slots=True)
class PutStartResult:
    # OK: space allocated, write every location then put_end. ALREADY_EXISTS: COMPLETE
    # already (same key, same bytes): success, write nothing. IN_PROGRESS: PENDING by
    # another writer. STORE_FULL, INVALID_ARGUMENT: see message.
    code: Code
    locations: list[Location]
    message: str = ""
    placement: int = 0  # OK: the placement of `locations` (see objects.py)


if tuple(f.name for f in dataclasses.fields(PutStartResult)) != (
        "code", "locations", "message", "placement"):  # pragma: no cover
    raise ImportError("PutStartResult changed: update batch_put.py, which sets its fields "
                      "one by one")


@dataclass(slots=True)
class ReadResult:
    code: Code  # OK, NOT_FOUND, LEASE_NOT_FOUND (key not pinned by the given lease)
    size: int = 0
    checksum: int = 0
    locations: list[Location] = field(default_factory=list)
    placement: int = 0  # OK: names this set of locations (see objects.py)


@dataclass(slots=True)
class LookupResult:
    count: int  # longest contiguous prefix of the keys that is COMPLETE
    lease_id: int  # 0 when count == 0 (no lease created)
    expires_at: float  # clock time; 0.0 when no lease


@dataclass(slots=True)
class ReadColumns:
    """A batch's read answers as one list per field, built without an object per key or
    per location (get_replicas with `columns`; the wire's ReadColumns has the same
    shape). Per key: code, size, checksum, placement and how many locations follow; per
    location: its range's index into `ranges` (node_id, segment, tier), its address and
    size."""

    codes: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    placements: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    loc_ranges: list[int] = field(default_factory=list)
    loc_addrs: list[int] = field(default_factory=list)
    loc_sizes: list[int] = field(default_factory=list)
    ranges: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass(slots=True)
class GetReplicasResult:
    lease_id: int
    expires_at: float
    results: list[ReadResult]
    columns: ReadColumns | None = None  # instead of `results`, where asked and possible


class EventKind(StrEnum):
    EVICTED = "evicted"  # LRU eviction dropped these COMPLETE objects
    RECLAIMED = "reclaimed"  # PENDING objects whose writer vanished
    NODE_LOST = "node_lost"  # objects gone with their last replica's node
    REMOVED = "removed"  # explicit remove()


@dataclass(slots=True)
class Event:
    kind: EventKind
    keys: list[bytes]
    bytes: int  # object bytes (sizes, not counting replicas)
    node_id: str = ""  # NODE_LOST only


@dataclass(slots=True)
class TickReport:
    expired_leases: int = 0
    reclaimed: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    # More leases are past their deadline than one round unpins (EXPIRE_PINS): the
    # caller goes on with expire_leases between other work.
    leases_due: bool = False


@dataclass(slots=True)
class EvictionReport:
    evicted: int
    evicted_bytes: int  # object bytes dropped
    used: int  # DRAM pool bytes in use afterwards
    capacity: int
    reached: bool  # used <= ratio * capacity afterwards
    held: bool = False  # nothing evicted because of hold_eviction_until
    pinned: int = 0  # DRAM pool bytes pinned by leases afterwards (never evicted)


@dataclass(slots=True)
class SegmentStats:
    node_id: str
    segment: str
    tier: Tier
    base_addr: int
    capacity: int
    used: int
    free_largest: int  # largest free extent
    replicas: int
    pinned_replicas: int
    pinned_bytes: int


@dataclass(slots=True)
class NodeStats:
    """One node, summed over its segments (DRAM and, later, SSD)."""

    capacity: int
    used: int
    objects: int  # replicas held by the node
    pinned_objects: int
    pinned_bytes: int
    segments: list[SegmentStats]


@dataclass(slots=True)
class CoreStats:
    objects_pending: int
    objects_complete: int
    bytes_pending: int  # object bytes (sizes)
    bytes_complete: int
    pool_capacity: int  # the DRAM pool, the one eviction watches
    pool_used: int
    pool_pinned: int  # DRAM bytes held by pinned objects, all replicas
    pool_pending: int  # DRAM bytes held by PENDING objects, all replicas
    active_leases: int
    nodes: dict[str, NodeStats]
    lookups: int
    lookup_keys: int
    hit_keys: int
    leases_granted: int
    leases_expired: int
    leases_released: int
    evictions: int
    evicted_bytes: int
    reclaimed_pending: int
    put_failures: dict[str, int]
    events_dropped: int
    eviction_held_until: float  # 0.0 when never held
    # Counts over the last `recent_seconds` (at most one minute; see window.py), keyed
    # like the counters above: lookup_keys, hit_keys, evictions, evicted_bytes.
    recent: dict[str, int] = field(default_factory=dict)
    recent_seconds: float = 0.0
    draining: list[str] = field(default_factory=list)  # nodes that get no new placements
    # Times eviction stopped short because what was left was pinned or PENDING, and the
    # bytes it could not free (see EvictionStats).
    eviction_blocked: int = 0
    eviction_blocked_bytes: int = 0
    # Tenants with a quota: name -> (bytes held, quota); and objects evicted to make room
    # inside a tenant's quota.
    tenants: dict[str, tuple[int, int]] = field(default_factory=dict)
    quota_evictions: int = 0
    # Lookups cut short by the pin cap (pin_cap.py), and the keys they did not report.
    pin_capped: int = 0
    pin_capped_keys: int = 0


@dataclass(slots=True)
class ObjectInfo:
    key: bytes
    state: str  # "pending" or "complete"
    size: int
    checksum: int
    locations: list[Location]
    pins: int
    last_access: float
    created: float
    writer: str = ""  # PENDING only


class ReplicaChange(NamedTuple):
    """One replica committed on (added) or freed from (not added) a node's segment. A
    NamedTuple, as Location: every commit and every free journals one per replica."""

    node_id: str
    tier: Tier
    key: bytes
    offset: int
    size: int
    checksum: int
    added: bool


def replica_change(node_id: str, tier: Tier, key: bytes, offset: int, size: int,
                   checksum: int, added: bool) -> ReplicaChange:
    """ReplicaChange(...), the tuple built directly (see `location`)."""
    return _new_tuple(ReplicaChange, (node_id, tier, key, offset, size, checksum, added))


@dataclass(frozen=True, slots=True)
class TierMove:
    """A copy a store node must make between its DRAM segment and its SSD tier:
    DEMOTE (DRAM at dram_offset -> SSD file) or PROMOTE (SSD file -> DRAM)."""

    kind: MoveKind
    node_id: str
    key: bytes
    size: int
    checksum: int
    dram_offset: int
    ssd_offset: int = 0  # demotions: the SSD reservation (see MoveItem.ssd_offset)


@dataclass(slots=True)
class NodeInfo:
    """One node as an operator sees it: mounted (alive or draining) or recently gone."""

    node_id: str
    state: str  # "alive", "draining", "lost" (its etcd lease ended) or "left" (unmounted)
    segments: list[SegmentStats]  # for a gone node: as they were when it went
    objects: int  # replicas it holds now (0 once gone)
    gone_at: float = 0.0  # clock time it went; 0.0 while mounted
    objects_lost: int = 0  # objects that went with it (their last replica was there)


@dataclass(slots=True)
class DrainReport:
    """One step of draining a node (MasterCore.drain)."""

    dropped: int  # replicas freed here whose object has another replica elsewhere
    dropped_bytes: int
    # (key, size) of COMPLETE, unpinned objects whose only replicas are on this node:
    # they must be copied elsewhere by a client (or let go) for the node to empty.
    sole: list[tuple[bytes, int]]
    remaining: int  # replicas still on the node after this step
    remaining_pinned: int  # ...of which pinned by a lease: wait for it to end
    remaining_pending: int  # ...of which PENDING: wait for put_end or the timeout


@dataclass(slots=True)
class TierEvictions:
    """Eviction from one tier. `demoted*` count objects moved one tier down (DRAM ->
    SSD) instead of dropped; they stay 0 until a tier reports demotions."""

    tier: Tier
    evicted: int = 0
    evicted_bytes: int = 0
    evicted_recent: int = 0  # over EvictionStats.recent_seconds
    evicted_bytes_recent: int = 0
    demoted: int = 0
    demoted_bytes: int = 0
    demoted_recent: int = 0
    demoted_bytes_recent: int = 0


@dataclass(slots=True)
class EvictionStats:
    tiers: list[TierEvictions]
    evict_high: float
    evict_low: float
    pool_capacity: int
    pool_used: int
    pool_pinned: int
    pool_pending: int
    # Times eviction stopped short because everything left was pinned or PENDING (an
    # allocation that found no room, a watermark pass or an admin evict that could not
    # reach its target), the bytes it could not free those times, and the pinned bytes
    # when it last happened.
    blocked: int
    blocked_bytes: int
    blocked_pinned_bytes: int
    held_for: float  # seconds eviction is still held after a failover (0: not held)
    recent_seconds: float
