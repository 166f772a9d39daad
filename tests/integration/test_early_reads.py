"""Early reads against a real cluster: a client that has seen objects reads them while it
asks where they are, and still returns only what the master's answer vouches for."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from kvstore_client import AsyncKVStoreClient, KVStoreClient
from tests.conftest import Cluster

SIZE = 200_000


@pytest.mark.parametrize(("same_host", "transport"),
                         [(False, "fast"), (True, "fast"), (False, "grpc")],
                         ids=["engine", "same-host", "engine-grpc"])
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
