"""The foundation path through real processes: etcd, master, two store nodes, client."""

from __future__ import annotations

import random
import signal
import time

import pytest

from kvstore.transfer import POOL_ENV
from kvstore_client import InvalidArgument, KVStoreClient, StoreFull, Unavailable
from tests.conftest import Cluster

# The tests on the `cluster` fixture run against one master shard and against two (the
# client routes every key to its shard; tests/conftest.py, pytest_generate_tests).
SHARD_COUNTS = [1, 2]


def test_put_get_200_random_objects(cluster: Cluster) -> None:
    rng = random.Random(7)
    sizes = [1, 2, 63, 64, 65, 4096, 4 << 20] + [rng.randint(1, 4 << 20) for _ in range(193)]
    objects = {f"obj-{i}".encode(): rng.randbytes(n) for i, n in enumerate(sizes)}
    with KVStoreClient(etcd=cluster.etcd) as client:
        for key, value in objects.items():
            client.put(key, value)
        for key, value in objects.items():
            assert client.get(key) == value, key
        keys = list(objects)
        assert client.exists([*keys[:5], b"missing"]) == [True] * 5 + [False]
        assert client.get(b"never-written") is None
        assert client.remove(keys[0]) is True
        assert client.remove(keys[0]) is False
        assert client.get(keys[0]) is None
        assert client.exists([keys[0]]) == [False]
        # objects are spread over both nodes
        status = cluster.status()
        assert sorted(n.objects > 0 for n in status.nodes) == [True, True]
    # a second client that never wrote anything reads the same bytes
    with KVStoreClient(etcd=cluster.etcd) as reader:
        for key in keys[1:20]:
            assert reader.get(key) == objects[key]


def test_batch_put_get_and_content_addressing(cluster: Cluster) -> None:
    rng = random.Random(3)
    keys = [f"b-{i}".encode() for i in range(64)]
    values = [rng.randbytes(rng.randint(1, 256 << 10)) for _ in keys]
    with KVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20) as client:
        assert client.put_many(keys, values) == [None] * len(keys)
        # same key again: a no-op success, the first bytes stay
        assert client.put_many(keys[:3], [b"other"] * 3) == [None] * 3
        got = client.get_many([*keys, b"nope"])
        assert got[:-1] == values
        assert got[-1] is None


def test_bad_input_is_typed_and_harmless(cluster: Cluster) -> None:
    with KVStoreClient(etcd=cluster.etcd) as client:
        client.put(b"keep", b"committed bytes")
        with pytest.raises(InvalidArgument, match="empty key"):
            client.put(b"", b"x")
        with pytest.raises(InvalidArgument, match="1024-byte limit"):
            client.put(b"k" * 1025, b"x")
        with pytest.raises(InvalidArgument, match="empty value"):
            client.put(b"k", b"")
        assert client.get(b"keep") == b"committed bytes"
    assert all(p.alive() for p in cluster.procs)


def test_unknown_etcd_and_master_down(cluster_factory: Cluster) -> None:
    from tests.conftest import free_port

    with pytest.raises(Unavailable, match="cannot reach etcd"):
        KVStoreClient(etcd=f"127.0.0.1:{free_port()}", timeout=2)
    # etcd is up but no master was ever started
    with pytest.raises(Unavailable, match="no kvstore master is registered"):
        KVStoreClient(etcd=cluster_factory.etcd, timeout=2)
    address = cluster_factory.start_master()
    cluster_factory.start_store("16MiB")
    cluster_factory.wait_nodes(1, address=address)
    with KVStoreClient(etcd=cluster_factory.etcd, timeout=2) as client:
        client.put(b"a", b"b")
        with pytest.raises(StoreFull, match="larger than"):
            client.put(b"huge", bytes(17 << 20))
        assert client.get(b"a") == b"b"
        cluster_factory.masters[0][0].kill()
        with pytest.raises(Unavailable):
            client.get(b"a")


def test_a_store_node_stops_promptly_while_it_reserves_its_dram(cluster_factory: Cluster) -> None:
    # Reserving takes ~0.5 s per GiB: minutes for a large node, which must still stop on
    # SIGTERM (systemd and Kubernetes kill what does not stop in time).
    cluster_factory.start_master()
    node = cluster_factory.start_store("3GiB")
    deadline = time.monotonic() + 30
    while "reserving its" not in node.log.read_text():
        assert node.alive() and time.monotonic() < deadline, node.log.read_text()[-2000:]
        time.sleep(0.005)
    node.popen.send_signal(signal.SIGTERM)
    assert node.popen.wait(timeout=30) == 0
    log = node.log.read_text()
    # It stopped between two steps, not after the whole reservation (which a wall-clock
    # bound tried to say, and a loaded machine broke).
    assert "stopped while reserving its DRAM segment" in log, log[-2000:]
    assert "DRAM segment reserved" not in log


def _time_wait() -> int:
    """TCP sockets in TIME_WAIT in this network namespace (the test's own)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            count += sum(1 for line in list(f)[1:] if line.split()[3] == "06")
    return count


@pytest.mark.parametrize("pool", ["default", "0"])
def test_engine_transfers_reuse_their_connections_unless_the_operator_says_not_to(
        cluster: Cluster, pool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each transfer on a fresh connection would leave a socket in TIME_WAIT: between hosts
    # a busy client then runs out of ports (see kvstore/transfer.py, POOL_ENV).
    if pool != "default":
        monkeypatch.setenv(POOL_ENV, pool)
    with KVStoreClient(etcd=cluster.etcd, same_host=False) as client:
        keys = [b"c%d" % i for i in range(16)]
        values = [bytes([i]) * (1 << 20) for i in range(16)]
        assert client.put_many(keys, values) == [None] * 16
        before = _time_wait()
        for _ in range(3):
            for key, value in zip(keys, values, strict=True):
                assert client.get(key) == value
            assert client.get_many(keys) == values
        grown = _time_wait() - before
    if pool == "default":
        assert grown < 10
    else:
        assert grown >= 48  # one per transfer at least: the engine's own behaviour


def _shmem_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    raise AssertionError("no RssShmem line")


def test_a_store_node_reserves_its_dram_at_start_unless_told_not_to(
        cluster_factory: Cluster) -> None:
    cluster_factory.start_master()
    eager = cluster_factory.start_store("96MiB")
    lazy = cluster_factory.start_store("96MiB", "--no-prefault")
    cluster_factory.wait_nodes(2)
    # Mounted means the segment is there: every page of it resident in the eager node,
    # next to none in the lazy one until bytes are written.
    assert _shmem_kib(eager.popen.pid) >= 96 << 10
    assert _shmem_kib(lazy.popen.pid) < 8 << 10
    assert "DRAM segment reserved" in eager.log.read_text()
    with KVStoreClient(etcd=cluster_factory.etcd, same_host=False) as client:
        keys = [b"r%d" % i for i in range(8)]
        assert client.put_many(keys, [bytes([i]) * (1 << 20) for i in range(8)]) == [None] * 8
        assert client.get_many(keys) == [bytes([i]) * (1 << 20) for i in range(8)]
