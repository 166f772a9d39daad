"""A rolling restart keeps the cache: each store node stopped with SIGTERM (systemd's stop
or restart, a rolling upgrade) writes its DRAM objects to its SSD tier before it exits,
and comes back with them (kvstore/store/shutdown.py, docs/operations.md).

Two nodes with 64 MiB of DRAM and 512 MiB of SSD each, default flags otherwise, 200 x
64 KiB objects, none demoted yet; then, in the immediate sequence: SIGTERM node 0, start
it again with the same command, SIGTERM node 1, start it again. Before the flush, 0 of
the 200 came back."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from kvstore_client import KVStoreClient
from tests.conftest import Cluster

KiB = 1 << 10
N = 200


def value(i: int, n: int = 64 * KiB) -> bytes:
    return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]


def test_rolling_restart_with_sigterm_keeps_the_objects(cluster_factory: Cluster,
                                                        tmp_path: Path) -> None:
    c = cluster_factory
    c.start_master()
    nodes = [c.start_store("64MiB", "--ssd-dir", str(tmp_path / f"ssd-{i}"), "--ssd", "512MiB",
                           node_id=None) for i in range(2)]
    c.wait_nodes(4)  # two DRAM and two SSD segments
    keys = [f"obj-{i}".encode() for i in range(N)]
    with KVStoreClient(etcd=c.etcd) as writer:
        for lo in range(0, N, 50):
            assert writer.put_many(keys[lo:lo + 50], [value(i) for i in range(lo, lo + 50)]) \
                == [None] * 50
    held = {n.node_id: n.objects for n in c.status().nodes if n.tier == "dram"}
    assert sum(held.values()) == N and all(held.values())  # both nodes hold some, in DRAM

    for node in nodes:  # the rolling restart: stop, start again, next; no waiting
        node.kill(signal.SIGTERM)
        assert node.popen.returncode == 0, c.logs()
        c.spawn(node.name + "-again", node.cmd)

    readable: list[int] = []

    def count(reader: KVStoreClient) -> int:
        got = [v for lo in range(0, N, 50) for v in reader.get_many(keys[lo:lo + 50])]
        for i, v in enumerate(got):
            assert v is None or v == value(i), keys[i]  # never wrong bytes
        readable[:] = [i for i, v in enumerate(got) if v is not None]
        return len(readable)

    with KVStoreClient(etcd=c.etcd) as reader:  # never wrote anything
        deadline = time.monotonic() + 90
        while count(reader) < N and time.monotonic() < deadline:
            time.sleep(0.2)
    assert len(readable) >= 0.95 * N, f"{len(readable)}/{N} readable\n" + c.logs()
    logs = "".join(p.log.read_text(errors="replace") for p in nodes)
    assert "to its SSD tier before stopping" in logs
