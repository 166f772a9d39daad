"""Early reads against a real cluster: a client that has seen objects reads them while it
asks where they are, and still returns only what the master's answer vouches for."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import numpy as np
import pytest

from kvstore_client import AsyncKVStoreClient, KVStoreClient
from tests.conftest import Cluster

# The tests on the `cluster` fixture run against one master shard and against two (the
# client routes every key to its shard; tests/conftest.py, pytest_generate_tests).
SHARD_COUNTS = [1, 2]

SIZE = 200_000

# The reader's data and control paths: over the engine, same-host, engine with gRPC control.
EVERY_PATH = pytest.mark.parametrize(("same_host", "transport"),
                                     [(False, "fast"), (True, "fast"), (False, "grpc")],
                                     ids=["engine", "same-host", "engine-grpc"])


@EVERY_PATH
def test_early_reads_return_the_current_object_or_a_miss(cluster: Cluster, same_host: bool,
                                                          transport: str) -> None:
    rng = random.Random(7)
    keys = [f"er-{i}".encode() for i in range(4)]
    values = [rng.randbytes(SIZE) for _ in keys]
    with KVStoreClient(etcd=cluster.etcd, same_host=same_host, transport=transport) as a, \
            KVStoreClient(etcd=cluster.etcd) as b:
        assert a.put_many(keys, values) == [None] * 4
        assert a.get_many(keys) == values
        assert (a.stats.early_reads, a.stats.early_wasted) == (4, 0)
        # Another client removes two of them and writes other bytes under the first (best
        # fit puts them back where the old ones were, if on the same node). The removed
        # one's bytes still sit in its freed range and would pass their checksum.
        b.remove_many(keys[:2], force=True)
        new0 = rng.randbytes(SIZE)
        b.put(keys[0], new0)
        assert a.get_many(keys) == [new0, None, values[2], values[3]]
        assert (a.stats.early_reads, a.stats.early_wasted) == (6, 2)
        # Zero-copy under a lookup's lease: read early too, now that keys[0] is re-learned.
        bufs = [np.zeros(SIZE, dtype=np.uint8) for _ in keys]
        for buf in bufs:
            a.register(buf)
        with a.lookup([keys[0], keys[2], keys[3]]) as lease:
            assert lease.count == 3
            assert a.get_into(lease.keys, [bufs[0], bufs[2], bufs[3]], lease=lease) == [None] * 3
        assert [bufs[i].tobytes() for i in (0, 2, 3)] == [new0, values[2], values[3]]
        assert a.stats.early_reads == 9
        assert a.stats.corrupt_reads == 0  # a thrown-away early read is not a corrupt one
    # Without a placement memory a client asks first, with the same results.
    with KVStoreClient(etcd=cluster.etcd, same_host=same_host, placement_memory=0) as c:
        assert c.get_many(keys) == [new0, None, values[2], values[3]]
        assert (c.stats.early_reads, c.stats.early_wasted) == (0, 0)


def test_async_early_reads_match_the_sync_client(cluster: Cluster) -> None:
    rng = random.Random(8)
    keys = [f"ea-{i}".encode() for i in range(6)]
    values = [rng.randbytes(rng.randint(1, SIZE)) for _ in keys]

    async def main() -> tuple[list[bytes | None], int, bytes | None]:
        async with AsyncKVStoreClient(etcd=cluster.etcd, same_host=False) as a:
            assert await a.put_many(keys, values) == [None] * 6
            with KVStoreClient(etcd=cluster.etcd) as b:
                b.remove(keys[5])
            got = await a.get_many(keys)
            first = await a.get(keys[0])
            return got, a.stats.early_reads, first

    got, early, first = asyncio.run(main())
    assert got == [*values[:5], None] and first == values[0]
    assert early == 5 + 1


@EVERY_PATH
def test_single_gets_are_read_early_without_the_flow(cluster: Cluster, same_host: bool,
                                                     transport: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # quick.py: a single get of a known object is read in straight-line code; whatever it
    # cannot vouch for (moved, rewritten) goes through the flow, and a miss is a miss.
    rng = random.Random(9)
    keys = [f"q-{i}".encode() for i in range(3)]
    values = [rng.randbytes(SIZE) for _ in keys]
    with KVStoreClient(etcd=cluster.etcd, same_host=same_host, transport=transport) as a, \
            KVStoreClient(etcd=cluster.etcd) as b:
        assert a.put_many(keys, values) == [None] * 3
        flows_run: list[object] = []
        real_run = a._run

        def counted(flow: object) -> object:
            flows_run.append(flow)
            return real_run(flow)  # type: ignore[arg-type]

        monkeypatch.setattr(a, "_run", counted)
        granted = _leases_granted(cluster)
        assert [a.get(k) for k in keys] == values
        assert flows_run == [] and a.stats.early_reads == 3
        # Asked unpinned: the master granted no lease for them (none to release).
        assert _leases_granted(cluster) == granted and cluster.status().active_leases == 0
        b.remove_many(keys[:2], force=True)
        new0 = rng.randbytes(SIZE)
        b.put(keys[0], new0)
        assert [a.get(k) for k in keys] == [new0, None, values[2]]
        assert len(flows_run) == 1  # keys[0], rewritten; the miss and the hit were quick
        buf = np.zeros(SIZE, dtype=np.uint8)
        a.register(buf)
        assert a.get_into([keys[0]], [buf]) == [None] and buf.tobytes() == new0
        assert len(flows_run) == 1 and a.stats.corrupt_reads == 0
        assert a.stats.early_reads == 3 + 1 + 1


def _leases_granted(cluster: Cluster) -> int:
    return int(json.loads(cluster.status().counters_json)["leases_granted"])


def test_unpinned_quick_gets_under_eviction_return_the_value_or_a_miss(
        cluster_factory: Cluster) -> None:
    """Quick gets pin nothing, so here the objects they read are evicted and their
    ranges reused by another client's puts, at any moment, read or not: every get must
    return its key's own bytes or a miss, never other bytes and never an error. (Ranges
    reused between the master's answer and the bytes' landing is a window of ~0.1 ms that
    this leaves to chance; test_client_quick_get pins it down with the fakes.)"""
    cluster_factory.start_master()
    cluster_factory.start_store("16MiB")
    cluster_factory.wait_nodes(1)
    rng = random.Random(11)
    size = 64 << 10
    keys = [f"ev-{i}".encode() for i in range(160)]  # 10 MiB of the 16
    values = {k: rng.randbytes(size) for k in keys}
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        with KVStoreClient(etcd=cluster_factory.etcd) as b:
            n = 0
            while not stop.is_set():
                # Same size: best fit puts them into the ranges just freed.
                b.put_many([f"w-{n}-{j}".encode() for j in range(8)], [bytes(size)] * 8)
                n += 1
                time.sleep(0.005)  # 16 MiB turned over in ~0.2 s
            written.append(n)

    with KVStoreClient(etcd=cluster_factory.etcd, same_host=False) as a:
        assert a.put_many(keys, list(values.values())) == [None] * len(keys)
        thread = threading.Thread(target=writer)
        thread.start()
        hits = misses = 0
        try:
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                k = rng.choice(keys)
                got = a.get(k)
                assert got is None or got == values[k], k
                hits += got is not None
                if got is None:
                    misses += 1
                    a.put(k, values[k])  # back, and its placement known again
        finally:
            stop.set()
            thread.join(30)
        # Most hits were read early (~4,800 of ~4,800 in 4 s here), with no lease.
        assert a.stats.corrupt_reads == 0 and a.stats.early_reads > 50
    evicted = json.loads(cluster_factory.status().counters_json)["evictions"]
    assert written and evicted > 0 and hits > 0 and misses > 0, (written, evicted, hits, misses)
