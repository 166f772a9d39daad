"""A store node's identity outlives its process (docs/ssd.md, "Node identity").

Real etcd, master and store processes. A node restarted at once with the same command
(what systemd's Restart=always does after a crash) comes back under its id, fences its
previous incarnation without waiting for that one's etcd lease, and its SSD objects are
readable again by a client that never wrote them. What must not be adopted is refused at
start with a sentence: another cluster's directory, a directory in use, a live id.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvstore.devcluster import wait_for_port
from kvstore.store.identity import IDENTITY_FILE
from kvstore_client import KVStoreClient
from tests.conftest import Cluster

MiB = 1 << 20


def value(i: int, n: int = MiB) -> bytes:
    return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]


def recorded_id(data_dir: Path) -> str:
    return str(json.loads((data_dir / IDENTITY_FILE).read_text())["node_id"])


def dram_nodes(c: Cluster) -> list[tuple[str, str]]:
    """(node id, segment) of every DRAM segment the leader has mounted."""
    return [(n.node_id, n.segment) for n in c.status().nodes if n.tier == "dram"]


def restart(c: Cluster, proc_name: str, cmd: list[str]) -> None:
    """The same command again, at once: no waiting for anything."""
    c.spawn(proc_name + "-again", cmd)


def run_store(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """A store node expected to refuse to start: run it to its end."""
    return subprocess.run([sys.executable, "-m", "kvstore", "store", "--etcd", c.etcd,
                           "--dram", "16MiB", "--no-prefault", *args],
                          capture_output=True, text=True, timeout=120)


def wait_for(what: str, check: object, c: Cluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout:.0f} s; logs:\n{c.logs()}")


def test_ssd_node_with_default_flags_killed_and_restarted_at_once_keeps_its_objects(
        cluster_factory: Cluster, tmp_path: Path) -> None:
    c = cluster_factory
    ssd_dir = tmp_path / "ssd"
    c.start_master()
    node = c.start_store("16MiB", "--ssd-dir", str(ssd_dir), "--ssd", "256MiB", node_id=None)
    c.wait_nodes(2)  # its DRAM and its SSD segment
    node_id = recorded_id(ssd_dir)
    keys = [f"s-{i}".encode() for i in range(40)]  # 40 MiB through 16 MiB of DRAM
    with KVStoreClient(etcd=c.etcd) as writer:
        for lo in range(0, 40, 8):
            assert writer.put_many(keys[lo:lo + 8], [value(i) for i in range(lo, lo + 8)]) \
                == [None] * 8
    wait_for("no tier move in flight",
             lambda: all(n.pinned == 0 for n in c.status().nodes), c)
    on_ssd = len(list(ssd_dir.rglob("*.kvs")))
    assert on_ssd >= 20
    node.kill(signal.SIGKILL)
    restart(c, node.name, node.cmd)

    back: list[bytes] = []

    def all_back(reader: KVStoreClient) -> bool:
        got = [v for lo in range(0, 40, 4) for v in reader.get_many(keys[lo:lo + 4])]
        back[:] = [k for k, v in zip(keys, got, strict=True) if v is not None]
        for k, v in zip(keys, got, strict=True):
            assert v is None or v == value(keys.index(k)), k  # never wrong bytes
        return len(back) >= on_ssd

    with KVStoreClient(etcd=c.etcd) as reader:  # never wrote anything
        wait_for(f"the {on_ssd} SSD objects readable again (last: {len(back)})",
                 lambda: all_back(reader), c)
    assert len(back) == on_ssd
    assert recorded_id(ssd_dir) == node_id
    assert {n.node_id for n in c.status().nodes} == {node_id}  # one node, its old id


def test_dram_node_with_a_data_dir_keeps_its_id_and_fences_at_once(
        cluster_factory: Cluster, tmp_path: Path) -> None:
    c = cluster_factory
    data = tmp_path / "node"
    c.start_master()
    # A long etcd lease: the old incarnation's record would stay for a minute if the
    # new one waited for it to end.
    node = c.start_store("16MiB", "--data-dir", str(data), "--etcd-lease-ttl", "60",
                         node_id=None)
    c.wait_nodes(1)
    [(node_id, segment)] = dram_nodes(c)
    assert node_id == recorded_id(data)
    node.kill(signal.SIGKILL)
    restart(c, node.name, node.cmd)
    seen: list[list[tuple[str, str]]] = []

    def replaced() -> bool:
        now = dram_nodes(c)
        seen.append(now)
        return len(now) == 1 and now[0][0] == node_id and now[0][1] != segment

    wait_for("the new incarnation mounted in place of the old", replaced, c, timeout=40)
    assert all(len(s) <= 1 for s in seen), seen  # never two nodes
    assert recorded_id(data) == node_id


def test_another_clusters_data_dir_is_refused(cluster_factory: Cluster, tmp_path: Path) -> None:
    c = cluster_factory
    data = tmp_path / "node"
    c.start_master()
    node = c.start_store("16MiB", "--data-dir", str(data), "--no-prefault", node_id=None)
    c.wait_nodes(1)
    node.kill(signal.SIGTERM)
    run = run_store(c, "--cluster", "other", "--data-dir", str(data))
    assert run.returncode == 2, run.stderr
    assert f"the data directory {data} belongs to node {recorded_id(data)!r} of cluster " \
           "'default', not of cluster 'other'" in run.stderr
    assert json.loads((data / IDENTITY_FILE).read_text())["cluster"] == "default"


def test_two_nodes_on_one_data_dir_are_refused(cluster_factory: Cluster, tmp_path: Path) -> None:
    c = cluster_factory
    ssd_dir = tmp_path / "ssd"
    c.start_master()
    first = c.start_store("16MiB", "--ssd-dir", str(ssd_dir), "--ssd", "64MiB", node_id=None)
    c.wait_nodes(2)
    run = run_store(c, "--ssd-dir", str(ssd_dir), "--ssd", "64MiB")
    assert run.returncode == 2, run.stderr
    assert f"the data directory {ssd_dir} is in use by another store node (pid " \
           f"{first.popen.pid})" in run.stderr
    assert first.alive()
    assert len(c.status().nodes) == 2


def test_live_id_is_refused_and_a_frozen_one_is_fenced(cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_master()
    old = c.start_store("16MiB", "--no-prefault", node_id="twin")
    c.wait_nodes(1)
    [(_, old_segment)] = dram_nodes(c)
    run = run_store(c, "--node-id", "twin")
    assert run.returncode == 2, run.stderr
    assert "node id 'twin' is in use by a running store node" in run.stderr
    assert old.alive() and dram_nodes(c) == [("twin", old_segment)]

    # Frozen, it no longer answers: a new process takes the id at once.
    old.kill(signal.SIGSTOP)
    new = c.start_store("16MiB", "--no-prefault", node_id="twin")

    def new_mounted() -> bool:
        now = dram_nodes(c)
        return len(now) == 1 and now[0][1] != old_segment

    wait_for("the new incarnation mounted", new_mounted, c, timeout=40)
    [(_, new_segment)] = dram_nodes(c)
    # Thawed, the old one sees its key name another incarnation and stops.
    old.kill(signal.SIGCONT)
    try:
        code = old.popen.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the fenced incarnation did not stop:\n" + c.logs()) from None
    assert code == 4, c.logs()
    assert "a newer process has taken this node id" in old.log.read_text()
    time.sleep(1.0)  # what it did on its way out must not have touched the new one
    assert new.alive()
    assert dram_nodes(c) == [("twin", new_segment)]


def test_a_node_started_while_etcd_is_away_waits_for_it(cluster_factory: Cluster) -> None:
    c = cluster_factory
    etcd = next(p for p in c.procs if p.name == "etcd")
    etcd.kill(signal.SIGKILL)
    node = c.start_store("16MiB", "--no-prefault")
    wait_for("the node saying it waits for etcd",
             lambda: "retrying until it answers" in node.log.read_text(), c)
    assert node.alive()
    again = c.spawn("etcd-again", etcd.cmd)
    wait_for_port(c.etcd_port, again.popen, "etcd")
    c.start_master()
    c.wait_nodes(1)
    assert node.alive()
