"""The client API beyond put/get: async parity, tensors, partial batches, idle cost."""

from __future__ import annotations

import asyncio
import random
import resource
import time

import torch

from kvstore_client import AsyncKVStoreClient, KVStoreClient, NotFound
from tests.conftest import Cluster

# The tests on the `cluster` fixture run against one master shard and against two (the
# client routes every key to its shard; tests/conftest.py, pytest_generate_tests).
SHARD_COUNTS = [1, 2]


def test_async_and_sync_give_identical_results(cluster: Cluster) -> None:
    rng = random.Random(5)
    keys = [f"as-{i}".encode() for i in range(40)]
    values = [rng.randbytes(rng.randint(1, 300_000)) for _ in keys]
    probe = [*keys[::3], b"as-missing"]

    async def async_side() -> tuple[list[bytes | None], list[bool], int]:
        async with AsyncKVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20) as a:
            assert await a.put_many(keys[:20], values[:20]) == [None] * 20
            got = await asyncio.gather(a.get_many(probe), a.exists(probe))
            async with await a.lookup(keys) as lease:
                count = lease.count
            return got[0], got[1], count

    with KVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20) as s:
        assert s.put_many(keys[20:], values[20:]) == [None] * 20
        a_get, a_exists, a_count = asyncio.run(async_side())
        assert a_get == s.get_many(probe)
        assert a_exists == s.exists(probe)
        assert a_count == s.lookup(keys).count == 40
        assert a_get[-1] is None and a_get[0] == values[0]


def test_zero_copy_into_slices_of_one_large_tensor(cluster: Cluster) -> None:
    block = 256 << 10
    src = torch.randint(0, 255, (32, block), dtype=torch.uint8)
    dst = torch.zeros(32 * block + 4096, dtype=torch.uint8)  # like a KV cache: one tensor
    keys = [f"blk-{i}".encode() for i in range(32)]
    with KVStoreClient(etcd=cluster.etcd) as c:
        c.register(src)
        c.register(dst)
        assert c.put_from(keys, [src[i] for i in range(32)]) == [None] * 32
        # read them back reversed into slices at odd offsets of the big tensor
        slices = [dst[4096 + i * block: 4096 + (i + 1) * block] for i in range(32)]
        assert c.get_into(keys[::-1], slices) == [None] * 32
        for i in range(32):
            assert torch.equal(slices[i], src[31 - i])


def test_partial_batch_reports_per_key(cluster: Cluster) -> None:
    with KVStoreClient(etcd=cluster.etcd) as c:
        c.put_many([b"p1", b"p3"], [b"one", b"three"])
        assert c.get_many([b"p1", b"p2", b"p3"]) == [b"one", None, b"three"]
        bufs = [bytearray(16) for _ in range(3)]
        for b in bufs:
            c.register(b)
        errs = c.get_into([b"p1", b"p2", b"p3"], bufs)
        assert errs[0] is None and errs[2] is None and isinstance(errs[1], NotFound)
        assert bytes(bufs[0][:3]) == b"one" and bytes(bufs[2][:5]) == b"three"


def test_idle_sync_client_does_not_spin(cluster: Cluster) -> None:
    with KVStoreClient(etcd=cluster.etcd) as c:
        c.put(b"warm", b"up")
        before = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(2.0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 0.5, f"idle client used {cpu:.2f} s of CPU in 2 s"
