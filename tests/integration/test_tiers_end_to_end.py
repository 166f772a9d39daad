"""DRAM + SSD tiers through real processes: demotion instead of loss, restart without
losing the SSD data, corruption never served, leases hold on SSD objects."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from kvstore.devcluster import free_port
from kvstore_client import KVStoreClient
from tests.conftest import Cluster
from tests.unit.polling import wait_until

MiB = 1 << 20


def value(i: int, n: int = MiB) -> bytes:
    return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def counters(c: Cluster) -> dict[str, int]:
    return dict(json.loads(c.status().counters_json))


def tiered(c: Cluster, ssd_dir: Path, ssd: str = "256MiB", metrics: int = 0) -> None:
    # 1 MiB objects in 16 MiB of DRAM: watermarks a few objects apart (the default
    # 0.98 -> 0.97 gap is a sixth of one), so the bounds below mean something.
    c.start_master("--evict-high", "0.9", "--evict-low", "0.8")
    extra = ["--ssd-dir", str(ssd_dir), "--ssd", ssd, "--ssd-no-fsync"]
    if metrics:
        extra += ["--metrics-port", str(metrics)]
    c.start_store("16MiB", *extra, node_id="tiered")
    c.wait_nodes(2)  # the DRAM and the SSD segment of one node


def settle(c: Cluster, timeout: float = 20.0) -> None:
    """Wait until no tier move is in flight (pinned bytes back to what leases hold)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = c.status()
        if st.active_leases == 0 and all(n.pinned == 0 for n in st.nodes):
            return
        time.sleep(0.1)


@pytest.fixture
def ssd_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ssd"
    d.mkdir()
    return d


def test_fill_dram_beyond_its_size_everything_stays_readable(
        cluster_factory: Cluster, ssd_dir: Path) -> None:
    c = cluster_factory
    tiered(c, ssd_dir)
    keys = [f"t-{i}".encode() for i in range(64)]  # 64 MiB into 16 MiB of DRAM
    with KVStoreClient(etcd=c.etcd) as client:
        for lo in range(0, 64, 8):
            errs = client.put_many(keys[lo:lo + 8], [value(i) for i in range(lo, lo + 8)])
            assert errs == [None] * 8, errs
        settle(c)
        st = c.status()
        dram = next(n for n in st.nodes if n.tier == "dram")
        ssd = next(n for n in st.nodes if n.tier == "ssd")
        assert dram.used <= 0.9 * dram.capacity + MiB
        assert ssd.objects > 40
        assert disk_bytes(ssd_dir) <= 256 * MiB
        for i, key in enumerate(keys):  # the old ones come back from SSD
            assert client.get(key) == value(i), key
        assert client.get_many(keys[:8]) == [value(i) for i in range(8)]
        assert counters(c)["evictions"] == 0  # demoted, never dropped
        assert disk_bytes(ssd_dir) <= 256 * MiB


def test_restart_on_the_same_ssd_dir_keeps_the_ssd_objects(
        cluster_factory: Cluster, ssd_dir: Path) -> None:
    c = cluster_factory
    tiered(c, ssd_dir)
    keys = [f"r-{i}".encode() for i in range(40)]
    with KVStoreClient(etcd=c.etcd) as writer:
        for lo in range(0, 40, 8):
            assert writer.put_many(keys[lo:lo + 8], [value(i) for i in range(lo, lo + 8)]) \
                == [None] * 8
        settle(c)
        on_ssd = len(list(ssd_dir.rglob("*.kvs")))
        assert on_ssd >= 20
    node = c.stores[0]
    node.kill(signal.SIGKILL)
    c.wait_nodes(0, timeout=30)  # its etcd lease ran out: everything it held is gone
    c.start_store("16MiB", "--ssd-dir", str(ssd_dir), "--ssd", "256MiB", node_id="tiered")
    c.wait_nodes(2)

    def adopted() -> bool:  # the leader adopts the node's re-indexed SSD inventory
        return any(n.tier == "ssd" and n.objects >= on_ssd for n in c.status().nodes)

    wait_until(adopted, what=lambda: f"the leader counts the {on_ssd} SSD objects; logs:\n"
               + c.logs())
    with KVStoreClient(etcd=c.etcd) as reader:  # never wrote anything
        # Read in request-sized batches: one batch must fit in DRAM to be promoted.
        got = [v for lo in range(0, 40, 4) for v in reader.get_many(keys[lo:lo + 4])]
        back = [k for k, v in zip(keys, got, strict=True) if v is not None]
        assert len(back) == on_ssd, f"{len(back)} of the {on_ssd} SSD objects came back"
        for k, v in zip(keys, got, strict=True):
            if v is not None:
                assert v == value(keys.index(k))
        # DRAM-only objects are reported missing, not served stale
        assert reader.exists(keys) == [v is not None for v in got]


def test_corrupt_byte_on_disk_is_a_counted_miss(cluster_factory: Cluster, ssd_dir: Path) -> None:
    c = cluster_factory
    port = free_port()
    tiered(c, ssd_dir, metrics=port)
    keys = [f"c-{i}".encode() for i in range(40)]
    with KVStoreClient(etcd=c.etcd) as client:
        for lo in range(0, 40, 8):
            assert client.put_many(keys[lo:lo + 8], [value(i) for i in range(lo, lo + 8)]) \
                == [None] * 8
        settle(c)
        files = sorted(p for p in ssd_dir.rglob("*.kvs"))
        assert files
        victim = files[0]
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) - 4096 - 10)  # inside the data, before padding
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
        got = [v for lo in range(0, 40, 4) for v in client.get_many(keys[lo:lo + 4])]
        misses = [k for k, v in zip(keys, got, strict=True) if v is None]
        assert len(misses) == 1
        for k, v in zip(keys, got, strict=True):
            if v is not None:
                assert v == value(keys.index(k))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        line = next(ln for ln in metrics.decode().splitlines()
                    if ln.startswith("kvstore_store_corrupt_dropped_total"))
        assert float(line.split()[-1]) >= 1
        assert client.get(misses[0]) is None  # gone for good, not served later


def test_lease_on_an_ssd_object_survives_a_flood(cluster_factory: Cluster, ssd_dir: Path) -> None:
    c = cluster_factory
    tiered(c, ssd_dir, ssd="64MiB")
    with KVStoreClient(etcd=c.etcd) as reader, KVStoreClient(etcd=c.etcd) as flood:
        reader.put_many([b"precious"], [value(7)])
        for lo in range(0, 24, 8):  # push it out of DRAM
            flood.put_many([f"f-{i}".encode() for i in range(lo, lo + 8)],
                           [value(100 + i) for i in range(lo, lo + 8)])
        settle(c)
        buf = bytearray(MiB)
        reader.register(buf)
        with reader.lookup([b"precious"], ttl=60) as lease:
            assert lease.count == 1
            for lo in range(24, 120, 8):  # 96 MiB more: DRAM and SSD both churn
                flood.put_many([f"f-{i}".encode() for i in range(lo, lo + 8)],
                               [value(100 + i) for i in range(lo, lo + 8)])
            assert reader.get_into([b"precious"], [buf], lease=lease) == [None]
            assert bytes(buf) == value(7)
        assert disk_bytes(ssd_dir) <= 64 * MiB
