"""The client over two master shards, end to end: real etcd, masters and a store node.

Each shard is its own master process (`kvstore master --shard K/2`) with its own leader
key and epoch, and the client routes every key to its shard (docs/scaling.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore_client import AsyncKVStoreClient, KVStoreClient
from tests.conftest import Cluster
from tests.unit.polling import wait_until

SHARDS = 2


def start_sharded(c: Cluster, standbys: Sequence[int] = (), nodes: int = 1) -> list[str]:
    """One master per shard (and a standby for each shard in `standbys`), `nodes` store
    nodes; returns each shard's first master's address, once every shard mounted them."""
    leaders = [c.start_master("--shard", f"{k}/{SHARDS}") for k in range(SHARDS)]
    for k in standbys:
        c.start_master("--shard", f"{k}/{SHARDS}")
    for _ in range(nodes):
        c.start_store("256MiB")
    for address in leaders:
        c.wait_nodes(nodes, address=address)
    return leaders



def pins(address: str, keys: Sequence[bytes]) -> list[int]:
    with grpc.insecure_channel(address) as ch:
        reply = pbg.MasterStub(ch).Inspect(pb.KeysRequest(keys=list(keys)), timeout=5)
    assert not reply.error.code, reply.error.message
    return [item.object.pins for item in reply.items]


def keys_for(pattern: Sequence[int], prefix: str) -> list[bytes]:
    """Keys whose shards follow `pattern` (one shard index per key), found by search."""
    out: list[bytes] = []
    i = 0
    for want in pattern:
        while shard_of(key := f"{prefix}-{i}".encode(), SHARDS) != want:
            i += 1
        out.append(key)
        i += 1
    return out


def test_a_batch_spans_both_shards_and_reads_back(cluster_factory: Cluster) -> None:
    leaders = start_sharded(cluster_factory)
    keys = [f"span-{i}".encode() for i in range(64)]
    values = [bytes([i]) * (1000 + 97 * i) for i in range(64)]
    with KVStoreClient(etcd=cluster_factory.etcd) as c:
        assert c.put_many(keys, values) == [None] * 64
        assert c.get_many(keys[::-1]) == values[::-1]
        assert c.exists([*keys, b"span-missing"]) == [True] * 64 + [False]
        assert c.get(keys[7]) == values[7]
    held = [cluster_factory.status(a).objects_complete for a in leaders]
    mine = [sum(shard_of(k, SHARDS) == s for k in keys) for s in range(SHARDS)]
    assert held == mine and all(held)  # each shard holds exactly its own keys
    st = [cluster_factory.status(a) for a in leaders]
    assert [(s.shard, s.shards) for s in st] == [(0, 2), (1, 2)]


def test_a_lookup_whose_prefix_ends_on_another_shard_is_trimmed_on_every_shard(
        cluster_factory: Cluster) -> None:
    leaders = start_sharded(cluster_factory)
    # positions 0-4 on both shards, 5 missing (shard 1), 6-9 present on both shards
    keys = keys_for([0, 1, 0, 1, 0, 1, 0, 1, 1, 0], "pfx")
    present = keys[:5] + keys[6:]
    with KVStoreClient(etcd=cluster_factory.etcd) as c:
        assert c.put_many(present, [b"v" * 100] * len(present)) == [None] * len(present)
        lease = c.lookup(keys, ttl=30)
        assert lease.count == 5

        def pinned(ks: Sequence[bytes]) -> list[int]:
            return [p for k in ks for p in pins(leaders[shard_of(k, SHARDS)], [k])]

        # beyond the prefix nothing stays pinned, on either shard; the prefix is
        wait_until(lambda: pinned(keys[6:]) == [0] * 4, timeout=30,
                   what="pins beyond the prefix released")
        assert pinned(keys[:5]) == [1] * 5
        assert c.get_many(keys[:5]) == [b"v" * 100] * 5
        c.release(lease)
        wait_until(lambda: pinned(keys[:5]) == [0] * 5, timeout=30,
                   what="the prefix's pins released")


def test_a_shards_leader_killed_leaves_the_other_serving_and_loses_nothing(
        cluster_factory: Cluster) -> None:
    leaders = start_sharded(cluster_factory, standbys=[1])
    keys = [f"ha-{i}".encode() for i in range(200)]
    values = [f"value-{i}".encode() * 50 for i in range(200)]
    on = [[i for i, k in enumerate(keys) if shard_of(k, SHARDS) == s] for s in range(SHARDS)]
    with KVStoreClient(etcd=cluster_factory.etcd, timeout=20) as c:
        assert c.put_many(keys, values) == [None] * 200  # acknowledged: must survive
        leader_1 = next(p for p, a in cluster_factory.masters if a == leaders[1])
        leader_1.kill()
        # shard 0 serves on, its calls never touch shard 1
        zero = [keys[i] for i in on[0]]
        assert c.get_many(zero) == [values[i] for i in on[0]]
        fresh = keys_for([0] * 20, "after-kill")
        assert c.put_many(fresh, [b"f"] * 20) == [None] * 20
        assert c.lookup(zero).count == len(zero)
        # shard 1's standby takes over from the node's inventory of shard 1: nothing lost
        one = [keys[i] for i in on[1]]
        wait_until(lambda: c.get_many(one) == [values[i] for i in on[1]], timeout=60,
                   what="shard 1's acknowledged keys back")
        assert c.get_many(keys) == values


def test_master_addresses_and_the_async_client_find_every_shard(
        cluster_factory: Cluster) -> None:
    """`master=` (no etcd): the count and each shard's leader from the masters' WhoLeads
    replies; the asyncio client routes, pins over both shards and releases as the
    blocking one does."""
    leaders = start_sharded(cluster_factory)
    keys = [f"m-{i}".encode() for i in range(16)]
    assert {shard_of(k, SHARDS) for k in keys} == {0, 1}
    with KVStoreClient(master=",".join(leaders), timeout=15) as client:
        assert client._shards == SHARDS  # from the masters' WhoLeads replies
        assert client.put_many(keys, [b"by address"] * len(keys)) == [None] * len(keys)
        assert client.get(keys[3]) == b"by address"
    held = [cluster_factory.status(a).objects_complete for a in leaders]
    assert held == [sum(shard_of(k, SHARDS) == s for k in keys) for s in range(SHARDS)]

    async def main() -> list[bytes | None]:
        async with AsyncKVStoreClient(etcd=cluster_factory.etcd, timeout=15) as store:
            lease = await store.lookup(keys)
            assert lease.count == len(keys)
            # each key pinned once, at its own shard's leader
            assert [pins(leaders[shard_of(k, SHARDS)], [k])[0] for k in keys] == [1] * len(keys)
            await store.release(lease)
            return await store.get_many(keys)

    assert asyncio.run(main()) == [b"by address"] * len(keys)
    wait_until(lambda: not any(cluster_factory.status(a).active_leases for a in leaders),
               timeout=30, what="the async client's lease released on both shards")
