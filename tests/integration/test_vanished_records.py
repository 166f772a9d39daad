"""A record that vanishes from etcd while its owner lives comes back (issue 29, item 4).

On the dev cluster (no etcd auth), where anything that reaches etcd may delete a record:
a store node whose record is deleted announces itself again and the leader adopts its
inventory back; a master's own record is put again; a leader whose leader key vanished
campaigns again and leads (or a standby does) with the objects still readable.
"""

from __future__ import annotations

from kvstore.coord.etcd import read_key_sync, write_keys_sync
from kvstore.coord.layout import Layout, MasterRecord, NodeRecord
from kvstore_client import KVStoreClient
from tests.conftest import Cluster
from tests.unit.polling import wait_until

N = 50


def value(i: int) -> bytes:
    return i.to_bytes(4, "little") * 1024


def readable(c: KVStoreClient, keys: list[bytes]) -> int:
    got = c.get_many(keys)
    return sum(1 for i, v in enumerate(got) if v == value(i))


def test_a_deleted_node_record_comes_back_with_its_objects(cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_master()
    c.start_store("64MiB", node_id="node-a")
    c.wait_nodes(1)
    layout = Layout()
    keys = [f"v{i}".encode() for i in range(N)]
    with KVStoreClient(etcd=c.etcd, timeout=30) as client:
        assert client.put_many(keys, [value(i) for i in range(N)]) == [None] * N
        before = read_key_sync(c.etcd, layout.node("node-a"))
        assert before is not None

        write_keys_sync(c.etcd, {}, [layout.node("node-a")])  # an operator's mistake

        wait_until(lambda: read_key_sync(c.etcd, layout.node("node-a")) is not None,
                   what=lambda: "the node's record back in etcd; logs:\n" + c.logs())
        back = NodeRecord.decode(read_key_sync(c.etcd, layout.node("node-a")) or b"")
        assert back.segment == NodeRecord.decode(before).segment  # the same live process
        wait_until(lambda: readable(client, keys) == N,
                   what=lambda: "all objects readable again; logs:\n" + c.logs())
        # New puts find the node's space again (they failed with StoreFull before).
        assert client.put_many([b"after"], [value(7)]) == [None]
        assert client.get_many([b"after"]) == [value(7)]
    assert "announced again" in c.logs()


def test_a_deleted_master_record_and_leader_key_come_back(cluster_factory: Cluster) -> None:
    c = cluster_factory
    address = c.start_master("--etcd-lease-ttl", "2")
    c.start_store("64MiB", node_id="node-a")
    c.wait_nodes(1)
    layout = Layout()
    leader = MasterRecord.decode(read_key_sync(c.etcd, layout.leader) or b"")
    assert leader.address == address
    own = layout.master(leader.master_id)

    write_keys_sync(c.etcd, {}, [own])
    wait_until(lambda: read_key_sync(c.etcd, own) is not None,
               what=lambda: "the master's record back in etcd; logs:\n" + c.logs())

    keys = [f"m{i}".encode() for i in range(8)]
    with KVStoreClient(etcd=c.etcd, timeout=30) as client:
        assert client.put_many(keys, [value(i) for i in range(8)]) == [None] * 8
        write_keys_sync(c.etcd, {}, [layout.leader])
        wait_until(lambda: read_key_sync(c.etcd, layout.leader) is not None,
                   what=lambda: "a leader key again; logs:\n" + c.logs())
        # The master campaigned again: it leads under a newer epoch, with the node's
        # objects adopted back.
        wait_until(lambda: readable(client, keys) == 8,
                   what=lambda: "the objects readable under the new term; logs:\n" + c.logs())
    assert "leader key vanished" in c.logs()
