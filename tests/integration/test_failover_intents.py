"""kill -9 of the leader right after acknowledged plain puts (PutStart, transfer, PutEnd):
their OK waited for the intent sent at PutStart, not for the commit, so the new leader
finds them by verifying their bytes on the nodes (docs/durability.md, section 1).

Real etcd, masters, store nodes and Transfer Engine. The default client puts into space
started ahead (PutCommit, which still waits for its commit: test_failover.py covers it);
these clients start none, so every put takes the intent's path.
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from kvstore import put_record
from kvstore.checksum import checksum
from kvstore.coord.etcd import read_prefix_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.errors import Code
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg
from kvstore_client import KVStoreClient
from kvstore_client.local import LocalSegments
from tests.conftest import Cluster
from tests.integration.test_failover import two_masters, value, wait_for_leader
from tests.unit.polling import wait_until


@pytest.mark.parametrize(("same_host", "replicas"), [(True, 1), (False, 1), (False, 2)],
                         ids=["same-host", "engine", "engine-2-replicas"])
def test_leader_killed_right_after_acknowledged_plain_puts_loses_none(
        cluster_factory: Cluster, same_host: bool, replicas: int) -> None:
    c = cluster_factory
    _, b = two_masters(c)
    keys = [f"plain-{i}".encode() for i in range(1000)]
    with KVStoreClient(etcd=c.etcd, timeout=15, reserve_bytes=0, same_host=same_host,
                       replicas=replicas) as client:
        for i, key in enumerate(keys):
            client.put(key, value(i))
        c.masters[0][0].kill(signal.SIGKILL)  # at once: the last commits are in flight
        wait_for_leader(c, b)
        c.wait_nodes(2, address=b)
        got = client.get_many(keys)
    lost = [k for i, (k, g) in enumerate(zip(keys, got, strict=True)) if g != value(i)]
    assert not lost, f"{len(lost)}/1000 acknowledged objects lost on failover: {lost[:5]}"


def test_removal_of_plain_puts_right_before_the_leader_dies_stays_removed(
        cluster_factory: Cluster) -> None:
    """A removed key's intent must not bring it back: its bytes still verify."""
    c = cluster_factory
    _, b = two_masters(c)
    keys = [f"plain-rm-{i}".encode() for i in range(200)]
    with KVStoreClient(etcd=c.etcd, timeout=15, reserve_bytes=0) as client:
        for i, key in enumerate(keys):
            client.put(key, value(i))
        for key in keys[:100]:
            client.remove(key)
        c.masters[0][0].kill(signal.SIGKILL)
        wait_for_leader(c, b)
        c.wait_nodes(2, address=b)
        assert client.exists(keys) == [False] * 100 + [True] * 100


def test_a_put_acknowledged_on_its_intent_alone_survives_the_leader(
        cluster_factory: Cluster) -> None:
    """The window itself, made certain: the node is frozen after it applied the intent
    and has another Apply in flight, so the PutEnd's commit is still queued at the leader
    when the leader dies. The PutEnd's OK must not have waited for it (a frozen node
    would have made it wait out the ack timeout and fail), and the new leader must find
    the object through the intent and the bytes the client wrote."""
    c = cluster_factory
    a, b = two_masters(c)
    data = bytes(range(256)) * 256
    nodes = {n.node_id: n for n in (NodeRecord.decode(raw)
                                    for raw in read_prefix_sync(c.etcd, Layout().nodes))}
    procs = {f"node-{i}": p for i, p in enumerate(c.stores)}
    local = LocalSegments(c.etcd, Layout())
    with grpc.insecure_channel(a) as channel:
        master = pbg.MasterStub(channel)
        start = master.PutStart(pb.PutStartRequest(
            keys=[b"x"], sizes=[len(data)], checksums=[checksum(data)], replicas=1,
            writer="t"), timeout=10)
        (item,) = start.items
        assert item.code == Code.OK, item.message
        (loc,) = item.locations
        seg = local.get(loc.segment, loc.node_id)
        assert seg is not None, "the test needs the same-host path"
        buf = ctypes.create_string_buffer(data, len(data))
        seg.write(loc.addr, ctypes.addressof(buf), len(data))
        with grpc.insecure_channel(nodes[loc.node_id].service) as node_channel:
            store = spbg.StoreNodeStub(node_channel)

            def intent_landed() -> bool:
                inv = store.Inventory(spb.InventoryRequest(epoch=start.epoch), timeout=5)
                return any(r.key == b"x" for r in inv.replicas)

            wait_until(intent_landed, timeout=30, what="the node holds x's intent")
        node = procs[loc.node_id]
        _acknowledged_with_the_node_frozen(c, node, master, len(data), lambda: master.PutEnd(
            pb.KeysRequest(keys=[b"x"], writer="t"), timeout=10))
    local.close()
    _the_new_leader_reads_x(c, b, data)


def _acknowledged_with_the_node_frozen(c: Cluster, node: Any, master: Any, size: int,
                                       acknowledge: Callable[[], Any]) -> None:
    """Freeze `node` with an Apply to it in flight (a PutStart placed there), so that
    x's commit queues behind it; `acknowledge` x's put (its OK must not wait for the
    node); kill the leader; thaw the node."""
    node.kill(signal.SIGSTOP)
    try:
        other = master.PutStart(pb.PutStartRequest(
            keys=[b"y"], sizes=[size], checksums=[1], replicas=1, writer="t"), timeout=10)
        assert other.items[0].code == Code.OK
        reply = acknowledge()
        assert not reply.error.code, reply.error.message
        assert list(reply.codes) == [Code.OK]
        c.masters[0][0].kill(signal.SIGKILL)
    finally:
        node.kill(signal.SIGCONT)


def _the_new_leader_reads_x(c: Cluster, b: str, data: bytes) -> None:
    wait_for_leader(c, b)
    c.wait_nodes(2, address=b)
    with KVStoreClient(etcd=c.etcd, timeout=15) as client:
        assert client.get(b"x") == data


def test_a_one_call_put_acknowledged_on_its_record_survives_the_leader(
        cluster_factory: Cluster) -> None:
    """The same window for a one-call put (PutCommit into space started ahead): the
    client wrote the put record after the value (kvstore/put_record.py), so PutCommit's
    OK waits only for the placeholder's intent, landed long before; the node is frozen
    with an Apply in flight, so the commit is still queued at the leader when it dies,
    and the new leader must find the key through the placeholder's intent and its
    record."""
    c = cluster_factory
    a, b = two_masters(c)
    data = bytes(range(256)) * 64
    procs = {f"node-{i}": p for i, p in enumerate(c.stores)}
    local = LocalSegments(c.etcd, Layout())
    placeholder, room = b"~put/t/1", put_record.room_for(len(b"x"))
    with grpc.insecure_channel(a) as channel:
        master = pbg.MasterStub(channel)
        start = master.PutStart(pb.PutStartRequest(
            keys=[placeholder], sizes=[len(data)], checksums=[0], replicas=1, writer="t",
            ahead=True, record_room=room), timeout=10)
        assert start.record_room == room
        (item,) = start.items
        assert item.code == Code.OK, item.message
        (loc,) = item.locations
        seg = local.get(loc.segment, loc.node_id)
        assert seg is not None, "the test needs the same-host path"
        rec = put_record.encode(placeholder, b"x", len(data), checksum(data), start.epoch)
        buf = ctypes.create_string_buffer(data + rec, len(data) + len(rec))
        seg.write(loc.addr, ctypes.addressof(buf), len(data) + len(rec))
        node = procs[loc.node_id]
        # A plain put on every node acknowledged: its intents, queued after the
        # placeholder's, have landed, so the placeholder's has too.
        probe = master.PutStart(pb.PutStartRequest(
            keys=[b"probe"], sizes=[1], checksums=[1], replicas=2, writer="t"), timeout=10)
        assert probe.items[0].code == Code.OK
        assert loc.node_id in {p.node_id for p in probe.items[0].locations}
        done = master.PutEnd(pb.KeysRequest(keys=[b"probe"], writer="t"), timeout=10)
        assert not done.error.code, done.error.message
        _acknowledged_with_the_node_frozen(c, node, master, len(data), lambda: master.PutCommit(
            pb.PutCommitRequest(placeholders=[placeholder], keys=[b"x"], sizes=[len(data)],
                                checksums=[checksum(data)], writer="t", records=True),
            timeout=10))
    local.close()
    _the_new_leader_reads_x(c, b, data)
