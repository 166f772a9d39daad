"""A control plane of two master shards over one store node, with real processes.

Each shard is its own `kvstore master --shard K/2` with its own leader key and epoch and
its own part of the node's segment; the node keeps an inventory and an epoch per shard.
Calls go to each shard's master directly here (as `bench.master_ops --shards` sends
them), to see each shard's part; the admin CLI finds every shard's leader and shows the
cluster as one. tests/integration/test_sharded_client.py drives it through the client."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from kvstore.coord.etcd import read_items_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.shards import ShardSpec, shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg
from kvstore_client import KVStoreClient
from tests.conftest import Cluster, tenant_access
from tests.unit.polling import wait_until

SHARDS = 2
SEGMENT = 256 << 20



def put(address: str, keys: list[bytes], size: int = 4096) -> list[int]:
    """PutStart + PutEnd (allocate and commit; no bytes written): the per-key codes."""
    with grpc.insecure_channel(address) as ch:
        stub = pbg.MasterStub(ch)
        start = stub.PutStart(pb.PutStartRequest(keys=keys, sizes=[size] * len(keys),
                                                 checksums=[0] * len(keys), writer="t"),
                              timeout=20)
        assert not start.error.code, start.error.message
        end = stub.PutEnd(pb.KeysRequest(keys=keys, writer="t"), timeout=20)
        assert not end.error.code, end.error.message
        return [max(a.code, b) for a, b in zip(start.items, end.codes, strict=True)]


def exists(address: str, keys: list[bytes]) -> list[bool]:
    with grpc.insecure_channel(address) as ch:
        reply = pbg.MasterStub(ch).Exists(pb.KeysRequest(keys=keys), timeout=10)
    assert not reply.error.code, reply.error.message
    return list(reply.exists)


def keys_of(shard: int, n: int, prefix: str) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        if shard_of(key := f"{prefix}-{i}".encode(), SHARDS) == shard:
            out.append(key)
        i += 1
    return out


def kvstore_json(c: Cluster, *words: str) -> dict:  # type: ignore[type-arg]
    run = subprocess.run([sys.executable, "-m", "kvstore", *words, "--etcd", c.etcd, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr + c.logs()
    return json.loads(run.stdout)  # type: ignore[no-any-return]


def test_two_shards_split_one_node_and_the_cli_shows_them_as_one(
        cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_masters(shards=SHARDS)
    c.start_store("256MiB")
    c.wait_nodes(1)
    # each shard mounts its own part of the node, and knows its place
    statuses = c.statuses()
    assert [(s.shard, s.shards) for s in statuses] == [(0, 2), (1, 2)]
    parts = [sum(seg.capacity for seg in s.nodes if seg.tier == "dram") for s in statuses]
    assert parts == [ShardSpec(k, SHARDS).part(SEGMENT)[1] for k in range(SHARDS)]
    mine = {k: keys_of(k, 30 + 10 * k, f"k{k}") for k in range(SHARDS)}
    for k, keys in mine.items():
        assert put(c.master_of(k), keys) == [0] * len(keys)
    assert [s.objects_complete for s in c.statuses()] == [30, 40]
    # the admin CLI sums the shards: one node, its whole segment, every object
    status = kvstore_json(c, "status")
    assert status["objects"]["complete"] == 70
    assert [s["shard"] for s in status["shards"]] == [0, 1]
    assert status["tiers"]["dram"]["capacity"] == SEGMENT
    capacity = kvstore_json(c, "capacity")
    assert capacity["tiers"]["dram"]["capacity"] == SEGMENT
    assert capacity["tiers"]["dram"]["used"] >= 70 * 4096
    assert [s["objects"] for s in kvstore_json(c, "status", "--shard", "1")["shards"]] == [40]
    # the client routes every key to its shard
    with KVStoreClient(etcd=c.etcd) as client:
        (fresh,) = keys_of(1, 1, "routed")
        client.put(fresh, b"routed")
        assert client.get(fresh) == b"routed"
        assert client.exists(mine[0] + mine[1]) == [True] * 70


def test_a_shards_leader_killed_leaves_the_other_serving_and_its_keys_come_back(
        cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_masters(shards=SHARDS, per_shard=1)
    c.start_store("256MiB")
    c.wait_nodes(1)
    zero, one = keys_of(0, 50, "z"), keys_of(1, 50, "o")
    assert put(c.master_of(0), zero) == [0] * 50
    assert put(c.master_of(1), one) == [0] * 50  # acknowledged: must survive its leader
    old_epoch = c.status(shard=1).epoch
    c.by_shard[1][0][0].kill(signal.SIGKILL)
    # shard 0 goes on serving, and the node goes on obeying it: shard 1's fate is not its
    more = keys_of(0, 20, "z-after")
    assert put(c.master_of(0), more) == [0] * 20
    assert exists(c.master_of(0), zero + more) == [True] * 70
    # a new master for shard 1 (a newer epoch of shard 1 only) adopts shard 1's keys
    # from the node's inventory of shard 1; shard 0 keeps its own epoch at the node
    address = c.start_master(shard=1)
    c.wait_nodes(1, address=address)
    wait_until(lambda: exists(address, one) == [True] * 50, timeout=60,
               what="shard 1's keys back")
    assert c.status(address).epoch > old_epoch
    assert c.status(address).objects_complete == 50
    assert put(c.master_of(0), keys_of(0, 5, "z-late")) == [0] * 5
    assert c.status(shard=0).objects_complete == 75


# -- a tenant's keys on two shards ---------------------------------------------------------

TENANT_TTL = 2  # s: the masters' etcd lease here, so that a standby takes over quickly


def test_a_tenants_ssd_objects_are_adopted_by_the_shard_its_client_asks(
        cluster_factory: Cluster, tmp_path: Path) -> None:
    """A tenant's keys are stored as `tenant/key`, and every shard hashes what it stores
    (a node lists a shard the SSD objects whose stored key hashes to it): so the client
    must route `tenant/key` too, or a new leader adopts the tenant's SSD objects at the
    shard the client does not ask, and they read as misses."""
    c = cluster_factory
    tokens, flags = tenant_access(tmp_path)
    c.shards = SHARDS
    ttl = ("--etcd-lease-ttl", str(TENANT_TTL))
    first = [c.start_master(*flags, *ttl, shard=k) for k in range(SHARDS)]
    (tmp_path / "ssd").mkdir()
    c.start_store("64MiB", "--ssd-dir", str(tmp_path / "ssd"), "--ssd", "64MiB", *flags)
    admin = [("authorization", f"Bearer {tokens['ops']}")]

    def status(address: str) -> pb.ClusterStatusResponse:
        with grpc.insecure_channel(address) as ch:
            reply = pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=5,
                                                     metadata=admin)
        assert not reply.error.code, reply.error.message
        return reply  # type: ignore[no-any-return]

    def objects(address: str, tier: str) -> int:
        return sum(n.objects for n in status(address).nodes if n.tier == tier)

    def mounted(address: str) -> bool:
        with contextlib.suppress(grpc.RpcError, AssertionError):
            return {n.tier for n in status(address).nodes} == {"dram", "ssd"}
        return False

    for address in first:
        wait_until(lambda a=address: mounted(a), timeout=60,  # type: ignore[misc]
                   what=lambda: f"the node mounted at every shard; logs:\n{c.logs()}")
    second = [c.start_master(*flags, *ttl, shard=k) for k in range(SHARDS)]
    # Keys whose shard changes with the tenant's prefix, and keys whose shard does not.
    moved = [k for k in (f"t-{i}".encode() for i in range(400))
             if shard_of(k, SHARDS) != shard_of(b"a/" + k, SHARDS)][:24]
    stayed = [k for k in (f"t-{i}".encode() for i in range(400))
              if shard_of(k, SHARDS) == shard_of(b"a/" + k, SHARDS)][:8]
    keys = moved + stayed
    values = [k * 200 for k in keys]
    with KVStoreClient(etcd=c.etcd, token=tokens["alice"], timeout=15) as client:
        assert client.put_many(keys, values) == [None] * len(keys)
        # An operator's evict to 0 demotes every DRAM object to the node's SSD tier.
        for address in first:
            with grpc.insecure_channel(address) as ch:
                reply = pbg.MasterStub(ch).Evict(pb.EvictRequest(ratio=0.0), timeout=10,
                                                 metadata=admin)
            assert not reply.error.code, reply.error.message
        wait_until(lambda: sum(objects(a, "ssd") for a in first) == len(keys)
                   and sum(objects(a, "dram") for a in first) == 0, timeout=30,
                   what=lambda: f"every object demoted to SSD; logs:\n{c.logs()}")
    # The freed DRAM copies leave the node's inventories with the leaders' next deltas:
    # until then a new leader would adopt them too, and read the keys from DRAM.
    node = NodeRecord.decode(read_items_sync(c.etcd, Layout().nodes)[0][1])

    def inventory(shard: int) -> list[spb.Replica]:
        with grpc.insecure_channel(node.service) as ch:
            reply = spbg.StoreNodeStub(ch).Inventory(spb.InventoryRequest(
                epoch=status(first[shard]).epoch, shard=shard, shards=SHARDS), timeout=5,
                metadata=[("authorization", f"Bearer {tokens['nodes']}")])
        assert not reply.error.code, reply.error.message
        return list(reply.replicas)

    wait_until(lambda: all(r.tier == "ssd" for k in range(SHARDS) for r in inventory(k)),
               timeout=30, what="the node's inventories hold the SSD copies only")
    assert sum(len(inventory(k)) for k in range(SHARDS)) == len(keys)
    # kill -9 of every shard's leader: each standby adopts its shard's SSD objects from
    # the node's inventory.
    procs = {a: p for p, a in c.masters}
    for address in first:
        procs[address].kill(signal.SIGKILL)
    for address in second:
        wait_until(lambda a=address: mounted(a)  # type: ignore[misc]
                   and objects(a, "ssd") + objects(a, "dram") > 0, timeout=60,
                   what=lambda: f"a standby leads and adopted; logs:\n{c.logs()}")
    wait_until(lambda: sum(objects(a, "ssd") for a in second) == len(keys), timeout=30,
               what=lambda: "every SSD object adopted by one shard or the other: "
               f"{[(objects(a, 'dram'), objects(a, 'ssd')) for a in second]} (DRAM, SSD) "
               f"per shard; logs:\n{c.logs()}")
    with KVStoreClient(etcd=c.etcd, token=tokens["alice"], timeout=15) as client:
        found = client.exists(keys)
        assert [k for k, f in zip(keys, found, strict=True) if not f] == []
        assert client.get_many(keys) == values
