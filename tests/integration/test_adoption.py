"""A verified SSD copy of a key that has no live replica is adopted, also when the data
comes back under another node id (docs/durability.md, section 2).

Real etcd, master and store processes: a node's SSD directory is started again at once
under a new id while the old incarnation's etcd lease is still alive. The leader then
still maps those keys to the old node, so the new node's copies add nothing; once the
old lease ends and the keys lose their last replica, the leader adopts them again from
the new node's SSD.
"""

from __future__ import annotations

import signal
from pathlib import Path

from kvstore_client import KVStoreClient
from tests.conftest import Cluster
from tests.integration.test_node_identity import value, wait_for


def test_ssd_data_back_under_another_id_is_adopted_when_the_old_node_goes(
        cluster_factory: Cluster, tmp_path: str) -> None:
    c = cluster_factory
    ssd_dir = f"{tmp_path}/ssd"
    c.start_master()
    old = c.start_store("16MiB", "--ssd-dir", ssd_dir, "--ssd", "256MiB",
                        "--etcd-lease-ttl", "4", node_id="first")
    c.wait_nodes(2)
    keys = [f"a-{i}".encode() for i in range(40)]  # 40 MiB through 16 MiB of DRAM
    with KVStoreClient(etcd=c.etcd) as writer:
        for lo in range(0, 40, 8):
            assert writer.put_many(keys[lo:lo + 8], [value(i) for i in range(lo, lo + 8)]) \
                == [None] * 8
    wait_for("no tier move in flight", lambda: all(n.pinned == 0 for n in c.status().nodes), c)
    on_ssd = len(list(Path(ssd_dir).rglob("*.kvs")))
    assert on_ssd >= 20
    old.kill(signal.SIGKILL)
    c.start_store("16MiB", "--ssd-dir", ssd_dir, "--ssd", "256MiB", node_id="second")
    wait_for("the old node declared gone",
             lambda: {n.node_id for n in c.status().nodes} == {"second"}, c)
    with KVStoreClient(etcd=c.etcd) as reader:
        got: list[bytes | None] = []

        def readable() -> bool:
            # a few at a time: each is brought back from SSD into 16 MiB of DRAM
            got[:] = [v for lo in range(0, 40, 4) for v in reader.get_many(keys[lo:lo + 4])]
            return sum(g is not None for g in got) >= on_ssd

        wait_for("the SSD copies adopted under the new id", readable, c)
        # every object read is the one written (no stale or foreign bytes)
        assert all(g is None or g == value(i) for i, g in enumerate(got))
