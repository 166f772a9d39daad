"""One owner of SSD eviction: the master's core decides, and a store node's own cap never
has to. The real core drives a node's real Apply and Move handlers, in the order the
master's mover uses (inventory changes first, then the moves), until the master has
evicted from the node's SSD many times over."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import xxhash

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.store.inventory import Inventory
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import TierCounters
from kvstore.v1 import store_pb2 as spb

SIZE = 50_000  # an object and its 1 KiB worst-case key take 13 blocks, as its file does
SSD_OBJECTS = 12
DRAM = 24 * SIZE
BASE = 1 << 32


class Cluster:
    """One node: its DRAM segment and SSD tier behind its gRPC servicer, called directly."""

    def __init__(self, root: Path) -> None:
        # A DRAM of 24 objects needs a watermark gap of a few objects: demotion frees
        # DRAM only after the node has copied, so a 2 % gap would make most puts BUSY.
        self.core = MasterCore(CoreConfig(evict_high=0.9, evict_low=0.8), ManualClock())
        self.core.journal = []
        cap = SSD_OBJECTS * 13 * 4096
        self.core.mount_segment("n0", "dram:n0", BASE, DRAM)
        self.core.mount_segment("n0", "ssd:n0", 0, cap, tier="ssd")
        self.segment = DramSegment(DRAM)
        self.tier = SsdTier(root, cap, fsync=False)
        self.tier.open()
        self.service = StoreNodeService("n0", Inventory(), self.segment, self.tier,
                                        TierCounters())

    def put(self, key: bytes, data: bytes) -> bool:
        result = self.core.put_start([key], [len(data)], [xxhash.xxh3_64_intdigest(data)])[0]
        if result.code != Code.OK:
            return False
        for loc in result.locations:
            self.segment.view[loc.addr - BASE : loc.addr - BASE + len(data)] = data
        return self.core.put_end([key]) == [Code.OK]

    def apply(self) -> None:
        changes = self.core.take_replica_changes()
        rows = [(spb.Replica(key=c.key, offset=c.offset, size=c.size, checksum=c.checksum,
                             tier=c.tier), c.added) for c in changes]
        request = spb.ApplyRequest(epoch=1, add=[r for r, added in rows if added],
                                   drop=[r for r, added in rows if not added])
        asyncio.run(self.service.Apply(request, None))

    def move(self) -> int:
        """What the master's mover does: deliver the inventory changes, then the moves."""
        moves = self.core.take_tier_moves()
        self.apply()
        if not moves:
            return 0
        items = [spb.MoveItem(kind=m.kind, key=m.key, size=m.size, checksum=m.checksum,
                              dram_offset=m.dram_offset, ssd_offset=m.ssd_offset)
                 for m in moves]
        reply = asyncio.run(self.service.Move(spb.MoveRequest(epoch=1, items=items), None))
        for m, code in zip(moves, reply.codes, strict=True):
            self.core.finish_tier_move(m, Code(code))
        self.apply()
        return len(moves)

    def close(self) -> None:
        self.tier.close()
        self.segment.close()


def test_the_master_evicts_from_ssd_and_the_node_cap_never_has_to(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "ssd")
    try:
        rng = random.Random(3)
        moved = stored = 0
        for i in range(10 * (SSD_OBJECTS + DRAM // SIZE)):
            stored += c.put(f"obj-{i:04d}".encode(), rng.randbytes(SIZE))
            c.core.tick()
            moved += c.move()
        counters = c.core.tier_counters()
        ssd = next(s for n in c.core.node_list() for s in n.segments if s.tier == "ssd")
        stats = c.tier.stats()
        assert stored > 200 and moved > 100 and counters["demotions"] > 100
        assert counters["ssd_evictions"] > 50  # the master made room on the SSD, often
        assert stats.evictions == 0  # and the node's cap never had to
        assert stats.used_bytes <= stats.capacity_bytes
        assert len(c.tier) == ssd.replicas  # the node holds exactly what the master lists
    finally:
        c.close()
