"""Leases keep the lookup promise through real processes; zero-copy reads; corruption."""

from __future__ import annotations

import json
import mmap
import os
import random
import time

import pytest
import torch

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.v1 import master_pb2 as pb
from kvstore_client import CorruptObject, InvalidArgument, KVStoreClient, LeaseExpired
from tests.conftest import Cluster

MiB = 1 << 20


@pytest.fixture
def small(cluster_factory: Cluster) -> Cluster:
    """One 64 MiB node: a few dozen 1 MiB objects push it past the 0.9 watermark."""
    cluster_factory.start_master("--evict-high", "0.9", "--evict-low", "0.8")
    cluster_factory.start_store("64MiB")
    cluster_factory.wait_nodes(1)
    return cluster_factory


def _value(i: int, n: int = MiB) -> bytes:
    return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]


def test_leased_objects_survive_a_flood_past_the_watermark(small: Cluster) -> None:
    keys = [f"prefix-{i}".encode() for i in range(16)]
    with KVStoreClient(etcd=small.etcd) as writer:
        assert writer.put_many(keys, [_value(i) for i in range(16)]) == [None] * 16
    with KVStoreClient(etcd=small.etcd) as reader, KVStoreClient(etcd=small.etcd) as flood:
        kv = torch.zeros(16 * MiB, dtype=torch.uint8)
        reader.register(kv)
        with reader.lookup([*keys, b"prefix-missing", keys[0]], ttl=60) as lease:
            assert lease.count == 16
            # Another client writes three times the node's capacity.
            for j in range(0, 192, 16):
                batch = [f"flood-{k}".encode() for k in range(j, j + 16)]
                errs = flood.put_many(batch, [_value(1000 + k) for k in range(j, j + 16)])
                assert all(e is None for e in errs), errs
            status = small.status()
            assert status.nodes[0].used <= 0.9 * status.nodes[0].capacity + MiB
            assert json.loads(status.counters_json)["evictions"] > 0
            slices = [kv[i * MiB:(i + 1) * MiB] for i in range(16)]
            assert reader.get_into(keys, slices, lease=lease) == [None] * 16
            for i in range(16):
                assert bytes(slices[i].numpy()) == _value(i)
        # early flood objects were evicted, the leased prefix was not
        assert reader.exists([b"flood-0"]) == [False]
        assert reader.exists(keys) == [True] * 16


def test_lease_release_keep_first_and_renew(small: Cluster) -> None:
    keys = [f"k{i}".encode() for i in range(10)]
    with KVStoreClient(etcd=small.etcd) as c:
        c.put_many(keys[:4] + keys[5:], [b"v"] * 9)
        lease = c.lookup(keys, ttl=5)
        assert lease.count == 4  # the hole at key 4 ends the prefix
        before = lease.expires_at
        c.renew(lease, ttl=20)
        assert lease.expires_at > before + 10
        c.release(lease, keep_first=2)
        assert lease.keys == keys[:2]
        # A release is one-way on the fast channel: the client's next call on the same
        # connection is handled after it, so its own status already shows it.
        mine = c._call("ClusterStatus", pb.ClusterStatusRequest())
        assert mine.active_leases == 1 and sum(n.pinned for n in mine.nodes) > 0
        c.release(lease)
        mine = c._call("ClusterStatus", pb.ClusterStatusRequest())
        assert mine.active_leases == 0 and sum(n.pinned for n in mine.nodes) == 0
        assert lease.id == 0


def test_lease_that_expires_during_a_slow_read_raises(small: Cluster) -> None:
    # The slow transfer is simulated on the Transfer Engine path.
    # Both ways a read starts: asking first (a blocking engine call) and early (the
    # client wrote the key, so it reads while it asks: a polled engine transfer).
    for early in (False, True):
        _slow_read_under_a_lapsing_lease(small, early)


def _slow_read_under_a_lapsing_lease(small: Cluster, early: bool) -> None:
    with KVStoreClient(etcd=small.etcd, same_host=False,
                       placement_memory=65536 if early else 0) as c:
        key = f"slow-{early}".encode()
        c.put(key, _value(1, 4096))
        buf = bytearray(4096)
        c.register(buf)
        lease = c.lookup([key], ttl=1)
        transfer = c._state.transfer
        real_read, real_status = transfer.read, transfer.status

        def slow_read(*args: object) -> None:
            real_read(*args)  # type: ignore[arg-type]
            time.sleep(1.3)  # the bytes are here, but the lease lapsed meanwhile

        def slow_status(tid: int) -> int:
            st = real_status(tid)
            if st == 1:
                time.sleep(1.3)
            return st

        transfer.read = slow_read  # type: ignore[method-assign]
        transfer.status = slow_status  # type: ignore[method-assign]
        with pytest.raises(LeaseExpired):
            c.get_into([key], [buf], lease=lease)
        assert c.stats.early_reads == (1 if early else 0)
        transfer.read, transfer.status = real_read, real_status  # type: ignore[method-assign]
        # with the lease gone at the master too, the next read under it is refused (no
        # pause: its deadline, 1 s after it was granted, passed during the 1.3 s read)
        with pytest.raises(LeaseExpired):
            c.get_into([key], [buf], lease=lease)


def test_unregistered_buffer_is_refused(small: Cluster) -> None:
    with KVStoreClient(etcd=small.etcd) as c, pytest.raises(InvalidArgument, match="register"):
        c.get_into([b"x"], [bytearray(10)])


def test_corrupted_segment_byte_is_detected(small: Cluster) -> None:
    with KVStoreClient(etcd=small.etcd) as c:
        c.put(b"victim", _value(7, 8192))
        c.put(b"bystander", _value(8, 8192))
        item = c._call("GetReplicas", pb.GetReplicasRequest(keys=[b"victim"])).items[0]
        raw = read_key_sync(small.etcd, Layout().node("node-0"))
        assert raw is not None
        node = NodeRecord.decode(raw)
        # Flip one byte in the store node's own memory (its memfd, mapped from here).
        fd = os.open(node.shm_path, os.O_RDWR)
        try:
            with mmap.mmap(fd, node.size) as seg:
                off = item.locations[0].addr - node.base_addr + 100
                seg[off] ^= 0xFF
        finally:
            os.close(fd)
        with pytest.raises(CorruptObject):
            c.get(b"victim")
        assert c.get_many([b"victim", b"bystander"]) == [None, _value(8, 8192)]
        assert c.stats.corrupt_reads >= 2


def test_same_host_path_and_tcp_path_agree(small: Cluster) -> None:
    rng = random.Random(11)
    keys = [f"sh-{i}".encode() for i in range(24)]
    values = [rng.randbytes(rng.randint(1, 512 << 10)) for _ in keys]
    with KVStoreClient(etcd=small.etcd) as local, \
            KVStoreClient(etcd=small.etcd, same_host=False) as tcp:
        assert local.put_many(keys[:12], values[:12]) == [None] * 12
        assert tcp.put_many(keys[12:], values[12:]) == [None] * 12
        assert local.get_many(keys) == values
        assert tcp.get_many(keys) == values
        assert local.stats.local_transfers >= 36  # 12 puts + 24 gets went by memcpy
        assert tcp.stats.local_transfers == 0
