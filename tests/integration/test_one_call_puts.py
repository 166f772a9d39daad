"""Puts into space started ahead, against a real cluster: a client that put a batch of
some shape puts the next one with a single control call (PutCommit), other clients read
exactly what it wrote, and nothing it held stays behind once it closes."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from kvstore.errors import Code
from kvstore.v1 import master_pb2 as pb
from kvstore_client import AsyncKVStoreClient, KVStoreClient
from kvstore_client.reservations import DEPTH, PREFIX
from tests.conftest import Cluster

SIZE = 100_000
N = 8


def _batch(rng: random.Random, tag: str) -> tuple[list[bytes], list[bytes]]:
    return [f"{tag}-{i}".encode() for i in range(N)], [rng.randbytes(SIZE) for _ in range(N)]


def _durable(cluster: Cluster) -> dict[str, int]:
    counters = json.loads(cluster.status().counters_json)
    return {k: v for k, v in counters.items() if k.startswith("durable_")}


def _placeholders(cluster: Cluster) -> int:
    st = cluster.status()
    return int(st.objects_pending)


@pytest.mark.parametrize(("same_host", "transport"),
                         [(False, "fast"), (True, "fast"), (False, "grpc")],
                         ids=["engine", "same-host", "engine-grpc"])
def test_one_control_call_per_put_and_nothing_left_behind(cluster: Cluster, same_host: bool,
                                                          transport: str) -> None:
    rng = random.Random(11)
    batches = [_batch(rng, f"oc{j}") for j in range(4)]
    with KVStoreClient(etcd=cluster.etcd, same_host=same_host, transport=transport,
                       replicas=2) as a:
        for keys, values in batches:
            assert a.put_many(keys, values) == [None] * N
        # The first two batches went the plain way (placeholders are asked for sizes the
        # previous put had too); the two after them into placeholders.
        assert a.stats.one_call_puts == 2 * N and a.stats.puts == 4 * N
        # Batches this large carry no put records (puts.RECORDS_UP_TO): their commit
        # waits for the store nodes' record instead.
        assert a.stats.recorded_puts == 0
        # DEPTH batches' worth of placeholders is held (PENDING, invisible to readers).
        assert _placeholders(cluster) == DEPTH * N
        with KVStoreClient(etcd=cluster.etcd, same_host=False, placement_memory=0) as b:
            for keys, values in batches:
                assert b.get_many(keys) == values
            # A placeholder is nobody's key: not readable, not listed as stored.
            assert b.exists([PREFIX + a.writer_id.encode() + b"/1"]) == [False]
        # Single puts too (a shape of its own).
        for i in range(2):  # the plain way: the first of its shape, then the one that asks
            a.put(f"single-{i}".encode(), bytes([i]) * 5000)
        held = _durable(cluster)["durable_held"]
        a.put(b"single-2", bytes([2]) * 5000)
        assert a.stats.one_call_puts == 2 * N + 1
        # A single put carries its put record: the leader acknowledged it without
        # holding the reply for a store node's record.
        assert a.stats.recorded_puts == 1
        assert _durable(cluster)["durable_held"] == held
        assert a.get(b"single-2") == bytes([2]) * 5000
    # Closing revoked them all.
    assert _placeholders(cluster) == 0


def test_placeholders_the_master_dropped_are_put_again(cluster: Cluster) -> None:
    rng = random.Random(12)
    with KVStoreClient(etcd=cluster.etcd, same_host=False) as a:
        for tag in ("dr0", "dr0b"):
            keys, values = _batch(rng, tag)
            assert a.put_many(keys, values) == [None] * N
        # Settle the refill, then take every placeholder away behind the client's back
        # (as the master does after its put timeout or when their node is lost).
        assert a.exists(keys) == [True] * N
        held = [PREFIX + a.writer_id.encode() + f"/{i}".encode()
                for i in range(1, DEPTH * N + 1)]
        reply = a._call("PutRevoke", pb.KeysRequest(keys=held, writer=a.writer_id))
        assert list(reply.codes) == [0] * DEPTH * N
        keys2, values2 = _batch(rng, "dr1")
        assert a.put_many(keys2, values2) == [None] * N
        assert a.stats.one_call_puts == 0  # every commit found its placeholder gone
        with KVStoreClient(etcd=cluster.etcd, same_host=False, placement_memory=0) as b:
            assert b.get_many(keys2) == values2
    assert _placeholders(cluster) == 0


def test_another_writer_cannot_commit_my_placeholders(cluster: Cluster) -> None:
    # Two replicas: a has moved bytes to both nodes, so it writes placeholders on either
    # (only nodes that answered within the last second are written ahead).
    with KVStoreClient(etcd=cluster.etcd, same_host=False, replicas=2) as a, \
            KVStoreClient(etcd=cluster.etcd, same_host=False) as b:
        a.put_many([b"mine-0"], [b"v" * 1000])
        a.put_many([b"mine-0b"], [b"v" * 1000])
        a.exists([b"mine-0"])  # the refill's reply is read
        held = PREFIX + a.writer_id.encode() + b"/1"
        reply = b._call("PutCommit", pb.PutCommitRequest(
            placeholders=[held], keys=[b"stolen"], sizes=[1000], checksums=[1],
            writer=b.writer_id))
        assert list(reply.codes) == [Code.IN_PROGRESS]
        assert b.exists([b"stolen"]) == [False]
        # Still a's: its next put of that shape uses it.
        a.put_many([b"mine-1"], [b"w" * 1000])
        assert a.stats.one_call_puts == 1 and b.get(b"mine-1") == b"w" * 1000


def test_async_puts_commit_in_one_call(cluster: Cluster) -> None:
    rng = random.Random(13)
    batches = [_batch(rng, f"as{j}") for j in range(3)]

    async def main() -> int:
        async with AsyncKVStoreClient(etcd=cluster.etcd, same_host=False) as a:
            for keys, values in batches:
                assert await a.put_many(keys, values) == [None] * N
                await asyncio.sleep(0.05)  # the refill, a task of its own, lands
            for keys, values in batches:
                assert await a.get_many(keys) == values
            assert a.stats.recorded_puts == 0  # batches of N: no put records
            one_call = a.stats.one_call_puts
            for i in range(3):  # single puts: the third carries its put record
                await a.put(f"as-single-{i}".encode(), bytes([i]) * 3000)
                await asyncio.sleep(0.05)
            assert a.stats.recorded_puts == 1
            assert await a.get(b"as-single-2") == bytes([2]) * 3000
            return one_call

    assert asyncio.run(main()) == N  # the first two batches went the plain way
    assert _placeholders(cluster) == 0
