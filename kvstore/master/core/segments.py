"""Mounted segments and the compact handle that names one replica's place in them.

A store node mounts one DRAM segment (later also an SSD one). Each mount gets a fresh
segment id that is never reused, so a replica handle that outlives its segment (the node
left, or re-mounted with other geometry) can never alias a new segment's bytes.

A replica is stored in the object index as one integer, `seg_id << OFFSET_BITS | offset`,
instead of a Location object: 8 bytes in an array column rather than ~150 bytes of
objects per replica. Locations are built only when a reader asks for them.
"""

from __future__ import annotations

from kvstore.errors import MAX_KEY_BYTES

from .allocator import ExtentAllocator
from .results import Tier

OFFSET_BITS = 44  # 16 TiB per segment
OFFSET_MASK = (1 << OFFSET_BITS) - 1
MAX_SEGMENT_ID = (1 << (64 - OFFSET_BITS)) - 1

# Module constants: a hot loop reads a global faster than an enum class attribute.
DRAM = Tier.DRAM
SSD = Tier.SSD
TIERS = tuple(Tier)
# Room an object takes in an SSD tier: the store node's file is a 64-byte header, the
# key (at most 1 KiB) and the data, padded to 4 KiB (kvstore/store/ssd_format.py).
# Accounting for the worst case keeps the node's disk use under its cap by construction.
_SSD_OVERHEAD = 64 + MAX_KEY_BYTES


def alloc_size(tier: Tier, size: int) -> int:
    """The bytes an object of `size` takes from a segment of `tier`'s allocator."""
    if tier == DRAM:
        return size
    return (size + _SSD_OVERHEAD + 4095) & ~4095


class Segment:
    """One mounted region of one store node, with its own allocator."""

    __slots__ = (
        "alloc",
        "base_addr",
        "name",
        "node_id",
        "replicas",
        "seg_id",
        "size",
        "tier",
    )

    def __init__(
        self,
        seg_id: int,
        node_id: str,
        name: str,
        base_addr: int,
        size: int,
        tier: Tier,
        alignment: int,
        start: int = 0,
    ) -> None:
        self.seg_id = seg_id
        self.node_id = node_id
        self.name = name
        self.base_addr = base_addr
        self.size = size
        self.tier = tier
        self.alloc = ExtentAllocator(size, alignment, start)
        # Replicas (PENDING or COMPLETE, and tier moves' destinations) placed here:
        # written only by the take and give verbs below, which keep it beside the
        # allocator's books. The allocator's other ranges are the quarantine's.
        self.replicas = 0

    # -- a replica's range: taken, given back ----------------------------------------

    def take(self, nbytes: int) -> int:
        """Allocate a replica's range (best fit); its offset, or -1 when none fits."""
        off = self.alloc.allocate(nbytes)
        if off >= 0:
            self.replicas += 1
        return off

    def take_at(self, offset: int, nbytes: int) -> bool:
        """Allocate the replica range that starts at `offset` (a node's inventory, replayed);
        False, taking nothing, when any of it is taken."""
        if not self.alloc.reserve(offset, nbytes):
            return False
        self.replicas += 1
        return True

    def take_run(self, nbytes: int, n: int) -> list[int]:
        """take(nbytes) n times over, in one allocator call (ExtentAllocator.allocate_run)."""
        got = self.alloc.allocate_run(nbytes, n)
        self.replicas += len(got)
        return got

    def give(self, offset: int, nbytes: int) -> None:
        """A replica's range back to the allocator."""
        self.alloc.free(offset, nbytes)
        self.replicas -= 1

    def give_many(self, ranges: list[tuple[int, int]]) -> None:
        """give() for many (offset, nbytes) ranges, in one allocator call
        (ExtentAllocator.free_many: adjacent ranges cost one free)."""
        self.alloc.free_many(ranges)
        self.replicas -= len(ranges)

    def give_held(self) -> None:
        """A replica's range stops being a replica but stays allocated: the quarantine
        holds it now and frees it once its copier is done (quarantine.py)."""
        self.replicas -= 1

    def same_geometry(self, name: str, base_addr: int, size: int, start: int = 0) -> bool:
        return (self.name == name and self.base_addr == base_addr and self.size == size
                and self.alloc.start == start)

    def handle(self, offset: int) -> int:
        return self.seg_id << OFFSET_BITS | offset


class SegmentMap:
    """Which segments are mounted, by id and by node."""

    __slots__ = ("_next_id", "by_id", "by_node")

    def __init__(self) -> None:
        self.by_id: dict[int, Segment] = {}
        self.by_node: dict[str, dict[Tier, Segment]] = {}  # node -> tier -> segment
        self._next_id = 1

    def add(self, node_id: str, name: str, base_addr: int, size: int, tier: Tier, alignment: int,
            start: int = 0) -> Segment:
        if self._next_id > MAX_SEGMENT_ID:
            raise OverflowError("segment ids exhausted; restart the master")
        seg = Segment(self._next_id, node_id, name, base_addr, size, tier, alignment, start)
        self._next_id += 1
        self.by_id[seg.seg_id] = seg
        self.by_node.setdefault(node_id, {})[tier] = seg
        return seg

    def remove_node(self, node_id: str) -> list[Segment]:
        gone = list(self.by_node.pop(node_id, {}).values())
        for seg in gone:
            del self.by_id[seg.seg_id]
        return gone

    def remove(self, seg: Segment) -> None:
        del self.by_id[seg.seg_id]
        tiers = self.by_node[seg.node_id]
        del tiers[seg.tier]
        if not tiers:
            del self.by_node[seg.node_id]

    def get(self, node_id: str, tier: Tier) -> Segment | None:
        tiers = self.by_node.get(node_id)
        return tiers.get(tier) if tiers else None

    def tier(self, tier: Tier) -> list[Segment]:
        return [s for s in self.by_id.values() if s.tier == tier]
