"""A store node record is mounted only once its node proves itself (issue 29, item 5).

On the dev cluster, where anything that reaches etcd can write a record: one naming an
address where no node answers and one naming a real node's service under another id
are each logged and ignored, while the real node stays mounted and serving.
"""

from __future__ import annotations

import dataclasses

from kvstore.coord.etcd import read_key_sync, write_keys_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.devcluster import free_port
from kvstore_client import KVStoreClient
from tests.conftest import Cluster
from tests.unit.polling import wait_until


def test_forged_node_records_are_not_mounted(cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_master()
    c.start_store("64MiB", node_id="node-a")
    c.wait_nodes(1)
    layout = Layout()
    real = NodeRecord.decode(read_key_sync(c.etcd, layout.node("node-a")) or b"")
    forged = {
        "nobody": dataclasses.replace(real, node_id="nobody",
                                      service=f"127.0.0.1:{free_port()}", pid=1),
        "impostor": dataclasses.replace(real, node_id="impostor", pid=2),
    }
    write_keys_sync(c.etcd, {layout.node(k): r.encode() for k, r in forged.items()})

    def refused() -> bool:
        logs = c.logs()
        return all(f"ignoring the etcd record of node {k}" in logs for k in forged)

    wait_until(refused, what=lambda: "both forged records refused; logs:\n" + c.logs())
    assert "nothing at" in c.logs() and "is 'node-a'" in c.logs()
    assert [n.node_id for n in c.status().nodes] == ["node-a"]

    with KVStoreClient(etcd=c.etcd, timeout=30) as client:
        assert client.put_many([b"x"], [b"y" * 4096]) == [None]
        assert client.get_many([b"x"]) == [b"y" * 4096]
    assert [n.node_id for n in c.status().nodes] == ["node-a"]
