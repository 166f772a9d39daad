"""A store node serves every master shard: one inventory and one epoch per shard.

Each shard's leader sends `shard=K` on Apply (gRPC and the delta channel), Inventory and
Move. The node refuses an epoch older than the last it saw *of that shard*, lists a
shard's own DRAM entries and the SSD objects whose keys hash to it, and mounts at every
shard's leader. One shard (the default, shard 0 with no count) is exactly as before.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import xxhash
from polling import wait_until_async

from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code
from kvstore.rpc.deltas import DeltaClient, DeltaServer
from kvstore.shards import shard_of
from kvstore.store.daemon import StoreDaemon, StoreOptions
from kvstore.store.inventory import Held, ShardInventories
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import NodeCollector, TierCounters
from kvstore.v1 import store_pb2 as spb


def checksum(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def keys_of(shard: int, shards: int, count: int, prefix: bytes = b"k") -> list[bytes]:
    out: list[bytes] = []
    i = 0
    while len(out) < count:
        key = prefix + str(i).encode()
        if shard_of(key, shards) == shard:
            out.append(key)
        i += 1
    return out


def node(ssd: SsdTier | None = None) -> tuple[StoreNodeService, DramSegment]:
    segment = DramSegment(1 << 20, prefault=False)
    return StoreNodeService("n0", ShardInventories(), segment, ssd, TierCounters()), segment


def add(key: bytes, offset: int, data: bytes, pending: bool = False) -> spb.Change:
    return spb.Change(replica=spb.Replica(key=key, offset=offset, size=len(data),
                                          checksum=checksum(data), tier="dram",
                                          pending=pending))


def listed(reply: spb.InventoryResponse, tier: str = "dram") -> set[bytes]:
    assert reply.error.code == 0, reply.error.message
    return {r.key for r in reply.replicas if r.tier == tier}


def test_a_stale_epoch_of_one_shard_leaves_the_others_epoch_alone() -> None:
    async def main() -> None:
        service, segment = node()
        assert (await service.Apply(spb.ApplyRequest(epoch=10, shard=1), None)).error.code == 0
        # Shard 0's leader is older than shard 1's and still admitted: its own epoch.
        assert (await service.Apply(spb.ApplyRequest(epoch=5, shard=0), None)).error.code == 0
        stale = await service.Apply(spb.ApplyRequest(epoch=9, shard=1), None)
        assert stale.error.code == Code.NOT_LEADER
        assert "shard 1" in stale.error.message
        assert service.inventories.epochs() == {0: 5, 1: 10}
        # And the other way round, on every call that carries an epoch.
        assert (await service.Inventory(spb.InventoryRequest(epoch=4, shard=0), None)
                ).error.code == Code.NOT_LEADER
        assert (await service.Move(spb.MoveRequest(epoch=4, shard=0), None)
                ).error.code == Code.NOT_LEADER
        assert (await service.Move(spb.MoveRequest(epoch=9, shard=1), None)
                ).error.code == Code.NOT_LEADER
        assert (await service.Inventory(spb.InventoryRequest(epoch=10, shard=1, shards=2),
                                        None)).error.code == 0
        assert service.inventories.epochs() == {0: 5, 1: 10}
        # A newer leader of shard 0 moves shard 0's epoch only.
        assert (await service.Apply(spb.ApplyRequest(epoch=12), None)).error.code == 0
        assert service.inventories.epochs() == {0: 12, 1: 10}
        segment.close()
    asyncio.run(main())


def test_a_shards_inventory_lists_its_own_dram_entries_only() -> None:
    async def main() -> None:
        service, segment = node()
        zero, one = keys_of(0, 2, 3), keys_of(1, 2, 3)
        data = b"d" * 64
        await service.Apply(spb.ApplyRequest(epoch=3, shard=0, changes=[
            add(k, i * 4096, data) for i, k in enumerate(zero)]), None)
        # Shard 1's entries, sent the older way (add lists), in its own part.
        await service.Apply(spb.ApplyRequest(epoch=7, shard=1, add=[
            spb.Replica(key=k, offset=(64 + i) * 4096, size=len(data), checksum=checksum(data),
                        tier="dram") for i, k in enumerate(one)]), None)
        assert listed(await service.Inventory(
            spb.InventoryRequest(epoch=3, shard=0, shards=2), None)) == set(zero)
        assert listed(await service.Inventory(
            spb.InventoryRequest(epoch=7, shard=1, shards=2), None)) == set(one)
        # A master of one shard (no shard fields) reads shard 0's, as before shards.
        assert listed(await service.Inventory(spb.InventoryRequest(epoch=3), None)) == set(zero)
        # A drop for shard 1 frees shard 1's entry, never touching shard 0's.
        await service.Apply(spb.ApplyRequest(epoch=7, shard=1, drop=[
            spb.Replica(key=one[0], offset=64 * 4096, tier="dram")]), None)
        assert {k for k, _ in service.inventories.of(1).dram()} == set(one[1:])
        assert {k for k, _ in service.inventories.of(0).dram()} == set(zero)
        assert len(service.inventories) == len(zero) + len(one) - 1
        segment.close()
    asyncio.run(main())


def test_intents_are_settled_against_their_own_shards_epoch() -> None:
    """A newer leader of shard 0 reading its inventory neither adopts nor forgets shard
    1's intents: only a newer leader of shard 1 settles them."""
    async def main() -> None:
        service, segment = node()
        good, torn = b"g" * 4096, b"t" * 4096
        k0, k1, k1_torn = keys_of(0, 2, 1)[0], *keys_of(1, 2, 2)
        await service.Apply(spb.ApplyRequest(epoch=3, shard=1, changes=[
            add(k1, 0, good, pending=True), add(k1_torn, 8192, torn, pending=True)]), None)
        await service.Apply(spb.ApplyRequest(epoch=3, shard=0, changes=[
            add(k0, 16384, good, pending=True)]), None)
        segment.view[0:4096] = good
        segment.view[16384:16384 + 4096] = good
        # Shard 0's new leader (epoch 9) adopts shard 0's verified intent...
        reply = await service.Inventory(spb.InventoryRequest(epoch=9, shard=0, shards=2), None)
        assert listed(reply) == {k0}
        assert service.inventories.of(0).dram() == [(k0, Held(16384, 4096, checksum(good)))]
        # ...and leaves shard 1's intents pending, torn one included.
        assert {k for k, _ in service.inventories.of(1).pending()} == {k1, k1_torn}
        # Shard 1's own new leader settles them: the verified one adopted, the torn one gone.
        reply = await service.Inventory(spb.InventoryRequest(epoch=8, shard=1, shards=2), None)
        assert listed(reply) == {k1}
        assert service.inventories.of(1).dram() == [(k1, Held(0, 4096, checksum(good)))]
        segment.close()
    asyncio.run(main())


def test_a_shards_inventory_lists_the_ssd_objects_whose_keys_hash_to_it(
        tmp_path: Path) -> None:
    async def main() -> None:
        with SsdTier(tmp_path / "ssd", capacity_bytes=1 << 22, fsync=False) as ssd:
            ssd.open()
            keys = [b"ssd" + str(i).encode() for i in range(24)]
            for key in keys:
                ssd.put(key, key * 8, checksum(key * 8))
            service, segment = node(ssd)
            by_shard = []
            for shard in range(3):
                reply = await service.Inventory(
                    spb.InventoryRequest(epoch=1, shard=shard, shards=3), None)
                got = listed(reply, "ssd")
                assert got == {k for k in keys if shard_of(k, 3) == shard}
                by_shard.append(got)
            assert set().union(*by_shard) == set(keys)
            assert all(by_shard)  # the keys do spread: each shard has some
            # One shard (shards 0 or 1): every SSD object, as before shards.
            assert listed(await service.Inventory(spb.InventoryRequest(epoch=1), None),
                          "ssd") == set(keys)
            assert listed(await service.Inventory(spb.InventoryRequest(epoch=1, shards=1),
                                                  None), "ssd") == set(keys)
            segment.close()
    asyncio.run(main())


def test_apply_over_the_delta_channel_goes_to_its_requests_shard() -> None:
    async def main() -> None:
        service, segment = node()
        server = DeltaServer(lambda request: service.Apply(request, None))
        client = DeltaClient(await server.start("127.0.0.1"))
        key = keys_of(1, 2, 1)[0]
        reply = await client.apply(spb.ApplyRequest(epoch=6, shard=1, changes=[
            add(key, 4096, b"x" * 10)]), 5)
        assert reply.error.code == 0
        assert [k for k, _ in service.inventories.of(1).dram()] == [key]
        assert service.inventories.of(0).dram() == []
        assert service.inventories.epochs() == {0: 0, 1: 6}
        stale = await client.apply(spb.ApplyRequest(epoch=5, shard=1), 5)
        assert stale.error.code == Code.NOT_LEADER
        assert (await client.apply(spb.ApplyRequest(epoch=5, shard=0), 5)).error.code == 0
        await client.close()
        await server.close()
        segment.close()
    asyncio.run(main())


def test_a_shard_that_cannot_exist_is_refused_with_a_sentence() -> None:
    async def main() -> None:
        service, segment = node()
        reply = await service.Apply(spb.ApplyRequest(epoch=1, shard=5000), None)
        assert reply.error.code == Code.INVALID_ARGUMENT
        assert "at most" in reply.error.message
        assert 5000 not in service.inventories.shards()
        segment.close()
    asyncio.run(main())


def test_the_nodes_dram_metrics_sum_every_shard() -> None:
    inventories = ShardInventories()
    inventories.of(0).apply([(b"a", Held(0, 100, 1))], [])
    inventories.of(3).apply([(b"b", Held(4096, 50, 2)), (b"c", Held(8192, 25, 3))], [])
    collector = NodeCollector("n0", 1 << 20, inventories, lambda: None, TierCounters())
    values = {(m.name, s.labels.get("tier")): s.value
              for m in collector.collect() for s in m.samples}
    assert values[("kvstore_store_objects", "dram")] == 3
    assert values[("kvstore_store_used_bytes", "dram")] == 175
    assert sorted(k for k, _ in inventories.dram()) == [b"a", b"b", b"c"]


class FakeEtcd:
    """The few reads the mount loop makes: the shard count and each shard's leader."""

    def __init__(self, values: dict[bytes, tuple[bytes, int]]) -> None:
        self.values = values

    async def get(self, key: bytes) -> bytes | None:
        got = self.values.get(key)
        return got[0] if got else None

    async def get_with_revision(self, key: bytes) -> tuple[bytes, int] | None:
        return self.values.get(key)

    async def delete(self, key: bytes) -> None:
        self.values.pop(key, None)

    async def close(self) -> None:
        pass


def leader(address: str, epoch: int) -> tuple[bytes, int]:
    return MasterRecord("m", address, 1).encode(), epoch


def test_a_node_mounts_at_every_shards_leader_and_again_when_one_changes() -> None:
    async def main() -> None:
        daemon = StoreDaemon(StoreOptions(cluster="c"))
        one, two = Layout("c", 0, 2), Layout("c", 1, 2)
        fake = FakeEtcd({one.shard_count: (b"2", 1), one.leader: leader("m0:1", 11),
                         two.leader: leader("m1:1", 12)})
        daemon.etcd = fake  # type: ignore[assignment]
        mounts: list[str] = []

        async def mount(address: str, tls: bool) -> bool:
            mounts.append(address)
            return True

        async def owner() -> str:
            return "us"

        daemon._mount = mount  # type: ignore[method-assign]
        daemon._owner = owner  # type: ignore[method-assign]
        task = asyncio.create_task(daemon._mount_at_leaders())
        await wait_until_async(lambda: sorted(mounts) == ["m0:1", "m1:1"],
                               what=lambda: f"mounts at both shards' leaders, not {mounts}")
        fake.values[two.leader] = leader("m1:2", 20)  # shard 1 failed over
        await wait_until_async(lambda: "m1:2" in mounts,
                               what="a mount at shard 1's new leader")
        assert mounts.count("m0:1") == 1  # shard 0's leader did not change: mounted once
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(main())


def test_with_no_shard_count_a_node_mounts_where_it_always_did() -> None:
    async def main() -> None:
        daemon = StoreDaemon(StoreOptions(cluster="c"))
        daemon.etcd = FakeEtcd({})  # type: ignore[assignment]
        assert await daemon._leader_keys() == [Layout("c").leader]
        daemon.etcd = FakeEtcd({Layout("c").shard_count: (b"1", 1)})  # type: ignore[assignment]
        assert await daemon._leader_keys() == [Layout("c").leader]
        daemon.etcd = FakeEtcd({Layout("c").shard_count: (b"3", 1)})  # type: ignore[assignment]
        assert await daemon._leader_keys() == [Layout("c", k, 3).leader for k in range(3)]
    asyncio.run(main())


def test_a_clean_stop_unmounts_at_every_shards_leader() -> None:
    async def main() -> None:
        daemon = StoreDaemon(StoreOptions(cluster="c"))
        layout = Layout("c")
        daemon.etcd = FakeEtcd({layout.shard_count: (b"2", 1)})  # type: ignore[assignment]
        unmounted: list[bytes] = []

        async def unmount(leader_key: bytes) -> None:
            unmounted.append(leader_key)

        async def owner() -> str:
            return "us"

        daemon._unmount = unmount  # type: ignore[method-assign]
        daemon._owner = owner  # type: ignore[method-assign]
        await daemon._leave()
        assert sorted(unmounted) == sorted(Layout("c", k, 2).leader for k in range(2))
    asyncio.run(main())
