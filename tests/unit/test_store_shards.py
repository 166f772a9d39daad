"""A store node serving several master shards: an inventory and an epoch per shard."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvstore.checksum import checksum
from kvstore.errors import Code
from kvstore.shards import shard_of
from kvstore.store.inventory import Inventory
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import TierCounters
from kvstore.v1 import store_pb2 as spb


def _change(key: bytes, offset: int, data: bytes, pending: bool = False) -> spb.Change:
    return spb.Change(replica=spb.Replica(key=key, offset=offset, size=len(data),
                                          checksum=checksum(data), tier="dram",
                                          pending=pending))


def _keys(shard: int, n: int, prefix: str) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}-{i}".encode()
        if shard_of(key, 2) == shard:
            out.append(key)
        i += 1
    return out


def test_each_shard_has_its_own_epoch_and_inventory(tmp_path: Path) -> None:
    async def main() -> None:
        segment = DramSegment(1 << 20, prefault=False)
        ssd = SsdTier(tmp_path / "ssd", 1 << 20, fsync=False)
        ssd.open()
        service = StoreNodeService("n0", Inventory(), segment, ssd, TierCounters())
        a, b = _keys(0, 1, "a")[0], _keys(1, 1, "b")[0]
        data = b"x" * 4096
        segment.view[0:4096] = data
        segment.view[8192:8192 + 4096] = data
        # shard 1's leader is at epoch 9, shard 0's at epoch 3: both are obeyed
        assert not (await service.Apply(spb.ApplyRequest(
            epoch=9, shard=1, changes=[_change(b, 8192, data)]), None)).error.code
        assert not (await service.Apply(spb.ApplyRequest(
            epoch=3, shard=0, changes=[_change(a, 0, data)]), None)).error.code
        # an older leader of shard 0 is refused; shard 1's epoch is untouched by it
        stale = await service.Apply(spb.ApplyRequest(epoch=2, shard=0), None)
        assert stale.error.code == Code.NOT_LEADER
        stale = await service.Inventory(spb.InventoryRequest(epoch=8, shard=1, shards=2), None)
        assert stale.error.code == Code.NOT_LEADER
        # the SSD tier is shared: each shard is told only of the keys that hash to it
        ssd_keys = {s: _keys(s, 2, f"ssd{s}") for s in (0, 1)}
        for keys in ssd_keys.values():
            for k in keys:
                ssd.put(k, memoryview(data), checksum(data), sync=False)
        for shard, epoch, mine in ((0, 3, a), (1, 9, b)):
            reply = await service.Inventory(spb.InventoryRequest(
                epoch=epoch, shard=shard, shards=2), None)
            assert not reply.error.code
            assert {r.key for r in reply.replicas if r.tier == "dram"} == {mine}
            assert {r.key for r in reply.replicas if r.tier == "ssd"} == set(ssd_keys[shard])
        # one shard (the default): everything, as before shards
        whole = await service.Inventory(spb.InventoryRequest(epoch=3), None)
        assert {r.key for r in whole.replicas if r.tier == "ssd"} == set(
            ssd_keys[0] + ssd_keys[1])
        segment.close()
    asyncio.run(main())


def test_a_new_leader_of_one_shard_settles_only_that_shards_intents() -> None:
    async def main() -> None:
        segment = DramSegment(1 << 20, prefault=False)
        inv = Inventory()
        service = StoreNodeService("n0", inv, segment, None, TierCounters())
        a, b = _keys(0, 1, "ia")[0], _keys(1, 1, "ib")[0]
        data = b"y" * 4096
        await service.Apply(spb.ApplyRequest(epoch=5, shard=0, changes=[
            _change(a, 0, data, pending=True)]), None)
        await service.Apply(spb.ApplyRequest(epoch=5, shard=1, changes=[
            _change(b, 8192, data, pending=True)]), None)
        # neither intent's bytes were written: shard 0's new leader forgets its own,
        # and leaves shard 1's (whose leader still lives) as it is
        reply = await service.Inventory(spb.InventoryRequest(epoch=6, shard=0, shards=2), None)
        assert list(reply.replicas) == []
        assert [k for k, _ in inv.dram()] == [b]
        assert inv.epoch_of(0) == 6 and inv.epoch_of(1) == 5
        segment.close()
    asyncio.run(main())
