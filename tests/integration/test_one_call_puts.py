"""Puts into space started ahead, against a real cluster: a client that put a batch of
some shape puts the next one with a single control call (PutCommit), other clients read
exactly what it wrote, and nothing it held stays behind once it closes.

Each test runs against one master shard and against two (`SHARD_COUNTS`): with two, the
client keeps a pool of placeholders per shard, and each shard's part of a batch commits
in one call to its own shard (kvstore_client/sharded.py). The batches here hold as many
keys of each shard, and the single puts' keys are one shard's, so that each shard's
part has one shape from batch to batch (a pool asks for sizes its previous put had)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
from collections import Counter
from pathlib import Path

import grpc
import pytest

from kvstore.errors import Code
from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore_client import AsyncKVStoreClient, KVStoreClient, reservations
from kvstore_client.reservations import DEPTH, PREFIX
from tests.conftest import Cluster, tenant_access

SHARD_COUNTS = [1, 2]

SIZE = 100_000
N = 8


def _keys(tag: str, shards: int, n: int = N, only: int | None = None,
          route: bytes = b"") -> list[bytes]:
    """n keys `tag-i`: as many of each shard's, or (`only`) all of shard `only`'s; a
    key's shard is that of `route` (a tenant's prefix) and the key."""
    want = Counter({only: n}) if only is not None else \
        Counter(dict.fromkeys(range(shards), n // shards))
    out: list[bytes] = []
    for i in itertools.count():
        key = f"{tag}-{i}".encode()
        k = shard_of(route + key, shards)
        if want[k] > 0:
            want[k] -= 1
            out.append(key)
            if len(out) == n:
                break
    return out


def _batch(rng: random.Random, tag: str, shards: int) -> tuple[list[bytes], list[bytes]]:
    return _keys(tag, shards), [rng.randbytes(SIZE) for _ in range(N)]


def _durable(cluster: Cluster) -> dict[str, int]:
    out: Counter[str] = Counter()
    for st in cluster.statuses():
        counters = json.loads(st.counters_json)
        out.update({k: v for k, v in counters.items() if k.startswith("durable_")})
    return dict(out)


def _placeholders(cluster: Cluster) -> int:
    """Objects PENDING over every shard (placeholders, once no plain put is under way)."""
    return sum(int(st.objects_pending) for st in cluster.statuses())


class _Calls:
    """A client's `phase_timer`: the control methods its steps sent, by kind of step."""

    def __init__(self) -> None:
        self.phases: list[str] = []

    def __call__(self, phase: str | None) -> None:
        if phase:
            self.phases.append(phase)

    def sent(self, method: str) -> list[str]:
        """The kinds of the steps that sent `method` ("rpc", "ask", "later")."""
        return [p.split()[0] for p in self.phases
                if p.endswith(" " + method) and not p.startswith("answer")]


def _one_call_only(calls: _Calls, shards: int) -> None:
    """The batch timed by `calls` committed in one PutCommit per shard: no PutEnd, and
    no PutStart but the refills (Later steps, asked without waiting)."""
    assert len(calls.sent("PutCommit")) == shards, calls.phases
    assert calls.sent("PutEnd") == [], calls.phases
    assert set(calls.sent("PutStart")) <= {"later"}, calls.phases


def _put_batches(a: KVStoreClient, batches: list[tuple[list[bytes], list[bytes]]],
                 shards: int) -> None:
    """Put each batch (same shape); from the third on, each commits in one call per shard
    (the first goes the plain way, the second asks for placeholders)."""
    for j, (keys, values) in enumerate(batches):
        calls = a.phase_timer = _Calls()
        assert a.put_many(keys, values) == [None] * N
        if j >= 2:
            _one_call_only(calls, shards)
    a.phase_timer = None


def _revoke(cluster: Cluster, shard: int, keys: list[bytes], writer: str) -> list[int]:
    """PutRevoke of `keys` at shard `shard`'s master, as `writer` (behind its client's
    back); the per-key codes."""
    with grpc.insecure_channel(cluster.master_of(shard)) as ch:
        reply = pbg.MasterStub(ch).PutRevoke(pb.KeysRequest(keys=keys, writer=writer),
                                             timeout=10)
    assert not reply.error.code, reply.error.message
    return list(reply.codes)


@pytest.mark.parametrize(("same_host", "transport"),
                         [(False, "fast"), (True, "fast"), (False, "grpc")],
                         ids=["engine", "same-host", "engine-grpc"])
def test_one_control_call_per_put_and_nothing_left_behind(cluster: Cluster, shards: int,
                                                          same_host: bool,
                                                          transport: str) -> None:
    rng = random.Random(11)
    batches = [_batch(rng, f"oc{j}", shards) for j in range(4)]
    with KVStoreClient(etcd=cluster.etcd, same_host=same_host, transport=transport,
                       replicas=2) as a:
        _put_batches(a, batches, shards)
        # The first two batches went the plain way (placeholders are asked for sizes the
        # previous put had too); the two after them into placeholders.
        assert a.stats.one_call_puts == 2 * N and a.stats.puts == 4 * N
        # Batches this large carry no put records (puts.RECORDS_UP_TO): their commit
        # waits for the store nodes' record instead. At two shards each shard's part is
        # small enough to carry them.
        assert a.stats.recorded_puts == (0 if shards == 1 else 2 * N)
        # DEPTH batches' worth of placeholders is held (PENDING, invisible to readers).
        assert _placeholders(cluster) == DEPTH * N
        with KVStoreClient(etcd=cluster.etcd, same_host=False, placement_memory=0) as b:
            for keys, values in batches:
                assert b.get_many(keys) == values
            # A placeholder is nobody's key: not readable, not listed as stored.
            assert b.exists([PREFIX + a.writer_id.encode() + b"/1"]) == [False]
        # Single puts too (a shape of its own), of one shard: a pool is a shard's.
        singles = _keys("single", shards, 3, only=0)
        for i in range(2):  # the plain way: the first of its shape, then the one that asks
            a.put(singles[i], bytes([i]) * 5000)
        held = _durable(cluster)["durable_held"]
        recorded = a.stats.recorded_puts
        a.put(singles[2], bytes([2]) * 5000)
        assert a.stats.one_call_puts == 2 * N + 1
        # A single put carries its put record: the leader acknowledged it without
        # holding the reply for a store node's record.
        assert a.stats.recorded_puts == recorded + 1
        assert _durable(cluster)["durable_held"] == held
        assert a.get(singles[2]) == bytes([2]) * 5000
    # Closing revoked them all, at every shard.
    assert _placeholders(cluster) == 0


def test_placeholders_the_master_dropped_are_put_again(cluster: Cluster, shards: int) -> None:
    rng = random.Random(12)
    with KVStoreClient(etcd=cluster.etcd, same_host=False) as a:
        for tag in ("dr0", "dr0b"):
            keys, values = _batch(rng, tag, shards)
            assert a.put_many(keys, values) == [None] * N
        # Settle the refill, then take every placeholder away behind the client's back
        # (as the master does after its put timeout or when their node is lost). Each
        # pool asked for DEPTH parts' worth, or REFILL_TO if that is more.
        assert a.exists(keys) == [True] * N
        each = max(DEPTH * N // shards, reservations.REFILL_TO)
        for k in range(shards):
            held = list(itertools.islice(reservations.names(a.writer_id, k, shards), each))
            assert _revoke(cluster, k, held, a.writer_id) == [0] * each
        keys2, values2 = _batch(rng, "dr1", shards)
        assert a.put_many(keys2, values2) == [None] * N
        assert a.stats.one_call_puts == 0  # every commit found its placeholder gone
        with KVStoreClient(etcd=cluster.etcd, same_host=False, placement_memory=0) as b:
            assert b.get_many(keys2) == values2
    assert _placeholders(cluster) == 0


def test_keys_already_stored_leave_their_placeholders_for_the_next_put(
        cluster: Cluster, shards: int) -> None:
    rng = random.Random(14)
    batches = [_batch(rng, f"ex{j}", shards) for j in range(2)]
    with KVStoreClient(etcd=cluster.etcd, same_host=False) as a:
        for keys, values in batches:
            assert a.put_many(keys, values) == [None] * N
        # Half of the next batch is already stored (same keys, same bytes), as many of
        # each shard's: each shard's part keeps its shape.
        old, old_values = batches[0]
        per: Counter[int] = Counter()
        again = []
        for i, key in enumerate(old):
            k = shard_of(key, shards)
            if per[k] < N // (2 * shards):
                per[k] += 1
                again.append(i)
        fresh = _keys("ex-new", shards, N // 2)
        keys = [old[i] for i in again] + fresh
        values = [old_values[i] for i in again] + [rng.randbytes(SIZE) for _ in fresh]
        calls = a.phase_timer = _Calls()
        assert a.put_many(keys, values) == [None] * N
        a.phase_timer = None
        _one_call_only(calls, shards)
        # The stored keys' placeholders went back to their pools (still PENDING and
        # this client's); only the new keys were committed.
        assert a.stats.one_call_puts == N // 2 and a.stats.puts == 3 * N
        with KVStoreClient(etcd=cluster.etcd, same_host=False, placement_memory=0) as b:
            assert b.get_many(keys) == values
            assert b.get_many(batches[1][0]) == batches[1][1]
        # The placeholders given back are used by the next batch of that shape.
        keys3, values3 = _batch(rng, "ex3", shards)
        assert a.put_many(keys3, values3) == [None] * N
        assert a.stats.one_call_puts == N // 2 + N
        assert a.get_many(keys3) == values3
    assert _placeholders(cluster) == 0


def test_another_writer_cannot_commit_my_placeholders(cluster: Cluster, shards: int) -> None:
    # Two replicas: a has moved bytes to both nodes, so it writes placeholders on either
    # (only nodes that answered within the last second are written ahead). Every key
    # here is shard 0's, as is the placeholder b tries (`_call` asks shard 0).
    mine = _keys("mine", shards, 3, only=0)
    stolen = _keys("stolen", shards, 1, only=0)[0]
    with KVStoreClient(etcd=cluster.etcd, same_host=False, replicas=2) as a, \
            KVStoreClient(etcd=cluster.etcd, same_host=False) as b:
        a.put_many([mine[0]], [b"v" * 1000])
        a.put_many([mine[1]], [b"v" * 1000])
        a.exists([mine[0]])  # the refill's reply is read
        held = next(reservations.names(a.writer_id, 0, shards))
        reply = b._call("PutCommit", pb.PutCommitRequest(
            placeholders=[held], keys=[stolen], sizes=[1000], checksums=[1],
            writer=b.writer_id))
        assert list(reply.codes) == [Code.IN_PROGRESS]
        assert b.exists([stolen]) == [False]
        # Still a's: its next put of that shape uses it.
        a.put_many([mine[2]], [b"w" * 1000])
        assert a.stats.one_call_puts == 1 and b.get(mine[2]) == b"w" * 1000


def test_async_puts_commit_in_one_call(cluster: Cluster, shards: int) -> None:
    rng = random.Random(13)
    batches = [_batch(rng, f"as{j}", shards) for j in range(3)]
    singles = _keys("as-single", shards, 3, only=0)

    async def main() -> tuple[int, int]:
        async with AsyncKVStoreClient(etcd=cluster.etcd, same_host=False) as a:
            for j, (keys, values) in enumerate(batches):
                calls = a.phase_timer = _Calls()
                assert await a.put_many(keys, values) == [None] * N
                if j == 2:
                    _one_call_only(calls, shards)
                await asyncio.sleep(0.05)  # the refill, a task of its own, lands
            a.phase_timer = None
            for keys, values in batches:
                assert await a.get_many(keys) == values
            one_call, recorded = a.stats.one_call_puts, a.stats.recorded_puts
            for i in range(3):  # single puts: the third carries its put record
                await a.put(singles[i], bytes([i]) * 3000)
                await asyncio.sleep(0.05)
            assert a.stats.recorded_puts == recorded + 1
            assert await a.get(singles[2]) == bytes([2]) * 3000
            return one_call, recorded

    one_call, recorded = asyncio.run(main())
    assert one_call == N  # the first two batches went the plain way
    # Batches of N carry no put records; each shard's part of one, at two shards, does.
    assert recorded == (0 if shards == 1 else N)
    assert _placeholders(cluster) == 0


def test_a_leader_killed_under_held_placeholders_puts_its_part_the_plain_way(
        cluster_factory: Cluster, shards: int) -> None:
    """The leader that granted a pool's placeholders dies: its standby knows none of
    them, so the part of the next batch for that shard is committed NOT_FOUND and put
    again the plain way there, while any other shard's part commits in one call."""
    c = cluster_factory
    c.start_masters(shards=shards)
    for _ in range(2):
        c.start_store("512MiB")
    c.wait_nodes(2)
    killed = shards - 1
    leader, _ = c.by_shard[killed][0]
    standby = c.start_master(shard=killed if shards > 1 else None)
    rng = random.Random(15)
    batches = [_batch(rng, f"lk{j}", shards) for j in range(3)]
    with KVStoreClient(etcd=c.etcd, same_host=False, timeout=30) as a:
        for keys, values in batches[:2]:
            assert a.put_many(keys, values) == [None] * N
        assert a.exists(batches[1][0]) == [True] * N  # the refill's reply is read
        leader.kill(signal.SIGKILL)
        keys, values = batches[2]
        calls = a.phase_timer = _Calls()
        assert a.put_many(keys, values) == [None] * N
        a.phase_timer = None
        # Every part tried its commit; the killed shard's part then went the plain way.
        # (At two shards a part is small enough to carry put records, and the new leader
        # may have adopted its keys from them already: its PutStart then finds them
        # stored, and no PutEnd follows. Either way nothing is lost, below.)
        assert len(calls.sent("PutCommit")) == shards
        assert {"rpc", "ask"} & set(calls.sent("PutStart")), " | ".join(calls.phases)
        assert a.stats.one_call_puts == N - N // shards
        with KVStoreClient(etcd=c.etcd, same_host=False, placement_memory=0) as b:
            assert b.get_many(keys) == values
            assert b.get_many(batches[0][0]) == batches[0][1]
    # What the client held at the new leader, and at any other shard's, was revoked.
    leaders = [c.master_of(k) for k in range(shards) if k != killed] + [standby]
    assert sum(int(c.status(addr).objects_pending) for addr in leaders) == 0


def test_a_tenants_placeholders_route_to_its_shards(cluster_factory: Cluster,
                                                    tmp_path: Path) -> None:
    """Two shards and a tenant: a key is stored (and routed) as `tenant/key`, and so is a
    placeholder, so each shard's pool names its placeholders to route there under the
    tenant's prefix; else every commit would be refused as another shard's."""
    c = cluster_factory
    tokens, flags = tenant_access(tmp_path)
    shards = c.shards = 2
    masters = [c.start_master(*flags, shard=k) for k in range(shards)]
    c.start_store("512MiB", *flags)
    admin = [("authorization", f"Bearer {tokens['ops']}")]

    def pending() -> int:
        total = 0
        for address in masters:
            with grpc.insecure_channel(address) as ch:
                reply = pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(),
                                                         timeout=5, metadata=admin)
            assert not reply.error.code, reply.error.message
            total += reply.objects_pending
        return total

    rng = random.Random(16)
    batches = [(_keys(f"tn{j}", shards, route=b"a/"), [rng.randbytes(SIZE) for _ in range(N)])
               for j in range(4)]
    # The batches' keys would split otherwise without the prefix: the test tells.
    assert any(_keys(f"tn{j}", shards) != batches[j][0] for j in range(4))
    with KVStoreClient(etcd=c.etcd, token=tokens["alice"], same_host=False,
                       timeout=30) as a:
        _put_batches(a, batches, shards)
        assert a.stats.one_call_puts == 2 * N
        assert pending() == DEPTH * N
        for keys, values in batches:
            assert a.get_many(keys) == values
    assert pending() == 0
