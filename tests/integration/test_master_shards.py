"""Master shards (issue 30): a master runs one shard of a cluster's control plane.

The count is recorded in etcd by the first master and a master of another count is
refused; two masters of a 2-shard cluster each mount their part of one store node and
refuse the other shard's keys. (Per-shard fencing on the node is not relied on here.)
"""

from __future__ import annotations

import sys
import time

import grpc

from kvstore.errors import Code
from kvstore.shards import ShardSpec, shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from tests.conftest import Cluster

SEGMENT = 256 * 1024 * 1024


def _leading(cluster: Cluster, address: str) -> pb.ClusterStatusResponse:
    """The address's ClusterStatus once it leads its shard with one node mounted."""
    deadline = time.monotonic() + 60
    last: object = None
    while time.monotonic() < deadline:
        try:
            st = cluster.status(address)
            last = st
            if not st.error.code and len(st.nodes) == 1:
                return st
        except grpc.RpcError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{address} did not lead with one node ({last}):\n" + cluster.logs())


def _key_of(shard: int, shards: int) -> bytes:
    return next(k for i in range(1000) if shard_of(k := f"key-{i}".encode(), shards) == shard)


def test_master_with_another_count_is_refused(cluster_factory: Cluster) -> None:
    cluster_factory.start_master("--shard", "0/2")
    proc = cluster_factory.spawn("master-wrong", [
        sys.executable, "-m", "kvstore", "master", "--etcd", cluster_factory.etcd,
        "--listen", "127.0.0.1:0", "--shard", "0/3"])
    proc.signalled = True  # it is meant to exit
    assert proc.popen.wait(timeout=60) != 0
    log = proc.log.read_text()
    assert "has 2 master shard(s)" in log and "--shard K/2" in log, log


def test_first_master_of_one_shard_records_the_count(cluster_factory: Cluster) -> None:
    cluster_factory.start_master()
    proc = cluster_factory.spawn("master-wrong", [
        sys.executable, "-m", "kvstore", "master", "--etcd", cluster_factory.etcd,
        "--listen", "127.0.0.1:0", "--shard", "1/2"])
    proc.signalled = True
    assert proc.popen.wait(timeout=60) != 0
    assert "has 1 master shard(s)" in proc.log.read_text()


def test_two_shards_share_a_node_and_refuse_each_others_keys(
        cluster_factory: Cluster) -> None:
    c = cluster_factory
    # One after the other: a store node of today keeps one epoch for every shard, so the
    # later-elected shard (the higher epoch) must be the later to reach the node.
    first = c.start_master("--shard", "0/2")
    c.start_store("256MiB")
    _leading(c, first)
    second = c.start_master("--shard", "1/2")
    _leading(c, second)
    for k, address in enumerate((first, second)):
        st = _leading(c, address)
        assert (st.shard, st.shards) == (k, 2)
        _, length = ShardSpec(k, 2).part(SEGMENT)
        dram = [n for n in st.nodes if n.tier == "dram"]
        assert [n.capacity for n in dram] == [length]
        other = _key_of(1 - k, 2)
        mine = _key_of(k, 2)
        with grpc.insecure_channel(address) as ch:
            stub = pbg.MasterStub(ch)
            refused = stub.Exists(pb.KeysRequest(keys=[mine, other]), timeout=5)
            assert refused.error.code == Code.WRONG_SHARD, refused
            assert "shard" in refused.error.message
            served = stub.Exists(pb.KeysRequest(keys=[mine]), timeout=5)
            assert not served.error.code and list(served.exists) == [False]
            who = pbg.CoordinationStub(ch)
            leads = who.WhoLeads(pb.WhoLeadsRequest(shard=k), timeout=5)
            assert (leads.shard, leads.shards, leads.is_leader) == (k, 2, True)
            wrong = who.WhoLeads(pb.WhoLeadsRequest(shard=1 - k), timeout=5)
            assert wrong.error.code == Code.WRONG_SHARD
