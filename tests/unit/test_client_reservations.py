"""Puts into space started ahead (reservations.py): one control call per put.

The client's flows and both drivers run for real against the in-memory master, engine
and node of test_client_data_path; a Later step's reply is handed over just before the
client's next control call, as the real synchronous driver does.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvstore.errors import Code
from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore_client import AsyncKVStoreClient, datapath, reservations
from kvstore_client.reservations import DEPTH, Reservations
from tests.unit.test_client_data_path import (
    DriverRig,
    FakeControl,
    KiB,
    Rig,
    _buffers,
    _slices,
    small_thresholds,
)

SIZE = 4 * KiB


class ReservingRig(DriverRig):
    """The driver rig with reservations on: the real synchronous driver (its Later,
    Settle and epoch handling) in front of the fake master."""

    def __init__(self, budget: int = 256 * KiB) -> None:
        super().__init__()
        self.state.reservations = Reservations(self.state.writer_id, budget)

    def settle(self) -> None:
        """Read the reply of the Later call in flight, as the driver does before its next
        control call."""
        for shard in list(self.client._later):
            self.client._drive(self.client._settle_later(shard))

    def placeholders(self) -> list[bytes]:
        return [k for k in self.master.pending if k.startswith(reservations.PREFIX)]


@pytest.fixture(autouse=True)
def _depth_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count placeholders by DEPTH batches; the refill of small batches in
    one go (REFILL_TO) has a test of its own, which turns it back on."""
    monkeypatch.setattr(reservations, "REFILL_TO", 0)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReservingRig]:
    small_thresholds(monkeypatch)
    yield ReservingRig()


def _batch(tag: str, n: int = 4, size: int = SIZE, seed: int = 0) -> tuple[list[bytes], list[bytes]]:
    rng = random.Random(f"{tag}{seed}")
    return [f"{tag}-{i}".encode() for i in range(n)], [rng.randbytes(size) for _ in range(n)]


def _warm(rig: ReservingRig) -> None:
    """Two plain puts of one shape: placeholders are asked for after the second (sizes
    the previous put had too)."""
    assert rig.client.put_many(*_batch("a")) == [None] * 4
    assert rig.client.put_many(*_batch("a2")) == [None] * 4


def _ask(rs: Reservations, sizes: list[int], replicas: int = 1) -> list[tuple[bytes, int]] | None:
    rs._last = (replicas, set(sizes))  # as if the previous put had these sizes
    return rs.wanted(sizes, replicas)


def _stored(rig: Rig, key: bytes) -> bytes:
    addr, size, _ = rig.master.objects[key]
    off = addr - rig.node.base
    return rig.node.mem[off:off + size].tobytes()


def test_the_second_batch_of_a_shape_costs_one_control_call(rig: ReservingRig) -> None:
    keys, values = _batch("a")
    assert rig.client.put_many(keys, values) == [None] * 4
    assert rig.rpcs() == ["PutStart", "PutEnd"]  # a size seen once gets no placeholders
    keys1, values1 = _batch("a1")
    assert rig.client.put_many(keys1, values1) == [None] * 4
    # The plain way, then space for the next batch of this shape, asked without waiting.
    assert rig.rpcs() == ["PutStart", "PutEnd"] * 2 + ["PutStart"]
    # Two batches' worth: a put takes what was granted before the last one.
    assert ("asked", "PutStart") in rig.trace and len(rig.placeholders()) == 4 * DEPTH
    rig.trace.clear()
    keys2, values2 = _batch("b")
    assert rig.client.put_many(keys2, values2) == [None] * 4
    assert rig.rpcs() == ["PutCommit", "PutStart"]  # the commit; the refill (later)
    assert [e[1] for e in rig.trace if e[0] == "asked"] == ["PutStart"]
    assert rig.client.stats.one_call_puts == 4 and rig.client.stats.puts == 12
    for k, v in zip(keys + keys2, values + values2, strict=True):
        assert _stored(rig, k) == v
    assert rig.client.get_many(keys2) == values2
    # The commit carried each value's own checksum: a get verifies against it.
    assert all(rig.master.objects[k][2] for k in keys2)
    # Placements were learned from the placeholders: the get above read early.
    assert rig.client.stats.early_reads == 4


def test_zero_copy_puts_use_placeholders_too(rig: ReservingRig) -> None:
    for tag in ("z", "z1"):
        keys, values = _batch(tag, n=3)
        src, _ = _buffers(rig, values, SIZE)
        assert rig.client.put_from(keys, _slices(src, 3, SIZE)) == [None] * 3
    keys2, values2 = _batch("y", n=3)
    src2, _ = _buffers(rig, values2, SIZE)
    rig.trace.clear()
    assert rig.client.put_from(keys2, _slices(src2, 3, SIZE)) == [None] * 3
    assert rig.rpcs()[0] == "PutCommit"
    assert [_stored(rig, k) for k in keys2] == values2


def test_a_placeholder_the_master_no_longer_holds_is_put_again_the_plain_way(
        rig: ReservingRig) -> None:
    _warm(rig)
    rig.settle()
    gone = rig.placeholders()[:2]
    for p in gone:  # reclaimed at the master (put timeout), or its node lost
        rig.master.pending.pop(p)
    keys, values = _batch("b")
    rig.trace.clear()
    assert rig.client.put_many(keys, values) == [None] * 4
    calls = [e for e in rig.trace if e[0] == "rpc"]
    assert calls[0][1] == "PutCommit"
    redo = [e[2] for e in calls if e[1] == "PutStart" and not e[2][0].startswith(b"~")]
    assert len(redo) == 1 and len(redo[0]) == 2  # just the two, the plain way
    assert [_stored(rig, k) for k in keys] == values
    assert rig.client.stats.one_call_puts == 2


def test_an_existing_key_leaves_its_placeholder_for_the_next_put(rig: ReservingRig) -> None:
    _warm(rig)
    keys, values = _batch("a")
    rig.settle()
    held = set(rig.placeholders())
    rig.trace.clear()
    # Two keys are already stored: their placeholders stay PENDING and this client's.
    again = keys[:2] + _batch("b", n=2)[0]
    vals = values[:2] + _batch("b", n=2)[1]
    assert rig.client.put_many(again, vals) == [None] * 4
    assert rig.rpcs()[0] == "PutCommit"
    rig.settle()
    # The first two taken (for the stored keys) are still there; two were committed.
    now = set(rig.placeholders())
    assert len(held - now) == 2 and {p for p in held if p.endswith((b"/1", b"/2"))} <= now
    assert [_stored(rig, k) for k in again] == vals
    # Only what was used is asked for again: the pool holds DEPTH batches' worth.
    assert len(rig.placeholders()) == 4 * DEPTH
    assert len(rig.state.reservations) == 4 * DEPTH  # type: ignore[arg-type]


def test_a_failed_transfer_gives_its_placeholder_up_and_reports_the_failure(
        rig: ReservingRig) -> None:
    _warm(rig)
    rig.settle()
    rs = rig.state.reservations
    assert rs is not None
    first = rs._pool[(SIZE, 0)][0]
    taken = {r.key for r in list(rs._pool[(SIZE, 0)])[:4]}  # what the next put takes
    rig.transfer.fail_remote.add(first.locations[0][1])
    keys, values = _batch("b")
    rig.trace.clear()
    out = rig.client.put_many(keys, values)
    # The node failed the batch (a failure is per node): every value was put again the
    # plain way, into fresh space, and nothing was committed from the placeholders.
    assert out == [None] * 4 and "PutCommit" not in rig.rpcs()
    assert [_stored(rig, k) for k in keys] == values
    rig.transfer.fail_remote.clear()
    rig.client.put_many(*_batch("c"))  # the lost placeholder is revoked with the next put
    revoked = {k for e in rig.trace if e[:2] == ("rpc", "PutRevoke") for k in e[2]}
    assert revoked == taken
    # ... as unsettled: the failed write's bytes may still land (kvstore.errors.Unsettled)
    assert rig.master.revoked_unsettled == [True]


def test_old_placeholders_are_revoked_never_written(rig: ReservingRig,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _warm(rig)
    rig.settle()
    rs = rig.state.reservations
    assert rs is not None
    old = set(rig.placeholders())
    for q in rs._pool.values():
        for r in q:
            r.usable_until = time.monotonic() - 1  # past their age
    keys, values = _batch("b")
    rig.trace.clear()
    assert rig.client.put_many(keys, values) == [None] * 4
    assert rig.rpcs()[:2] == ["PutStart", "PutEnd"]  # the plain way
    revoked = {k for e in rig.trace if e[:2] == ("rpc", "PutRevoke") for k in e[2]}
    assert revoked == old
    rig.settle()
    assert not old & set(rig.placeholders())
    assert [_stored(rig, k) for k in keys] == values


def test_the_age_follows_the_masters_put_timeout(rig: ReservingRig) -> None:
    rs = Reservations("w", 1 << 20, max_age=5.0)
    asked = _ask(rs, [SIZE], 1)
    assert asked is not None and len(asked) == DEPTH
    reply = pb.PutStartResponse(epoch=1, put_timeout=2.0)
    for _ in asked:
        reply.items.add().locations.add(node_id="n", segment="s", addr=64, size=SIZE)
    sent = time.monotonic()
    rs.granted(asked, 1, reply, sent)
    assert [r.usable_until for r in rs._pool[(SIZE, 1)]] == [pytest.approx(sent + 1.0)] * DEPTH
    # (half the put timeout, under 5 s)


def test_a_batch_over_the_budget_goes_the_plain_way_and_reserves_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datapath, "PIPELINE_MIN", 1 << 30)
    rig = ReservingRig(budget=8 * KiB)
    rig.client.put_many(*_batch("a", n=4))
    rig.client.put_many(*_batch("b", n=4))
    assert "PutCommit" not in rig.rpcs() and not rig.placeholders()
    assert not [e for e in rig.trace if e[0] == "asked"]


def test_the_pool_stays_within_its_budget_across_shapes() -> None:
    rs = Reservations("w", budget=DEPTH * 10 * KiB)
    assert _ask(rs, [6 * KiB, 6 * KiB], 1) is None  # DEPTH such batches exceed it
    a = _ask(rs, [4 * KiB, 4 * KiB], 1)
    assert a is not None and rs.held == DEPTH * 8 * KiB
    assert _ask(rs, [4 * KiB, 4 * KiB], 1) is None  # already asked for
    # Another shape that does not fit beside it: nothing in the pool to give up yet.
    assert _ask(rs, [3 * KiB], 1) is None and rs.held == DEPTH * 8 * KiB
    rs.granted(a, 1, None, time.monotonic())  # the answer never came: revoke them all
    assert rs.held == 0 and sorted(rs.expired()) == sorted(k for k, _ in a)
    assert _ask(rs, [3 * KiB], 1) is not None and rs.held == DEPTH * 3 * KiB


def test_placeholders_of_an_older_leader_are_dropped() -> None:
    rs = Reservations("w", budget=1 << 20)

    def grant(sizes: list[int], epoch: int) -> None:
        asked = _ask(rs, sizes, 1)
        assert asked is not None and len(asked) == DEPTH
        reply = pb.PutStartResponse(epoch=epoch, put_timeout=30.0)
        for _ in asked:
            reply.items.add(placement=7).locations.add(node_id="n", segment="s", addr=64,
                                                       size=SIZE)
        rs.granted(asked, 1, reply, time.monotonic())

    grant([SIZE], 1)
    assert len(rs) == DEPTH and rs.held == DEPTH * SIZE
    grant([SIZE, SIZE], 2)  # DEPTH more asked for; a new leader answered
    assert [r.epoch for q in rs._pool.values() for r in q] == [2] * DEPTH
    assert rs.held == DEPTH * SIZE
    assert rs.take([SIZE] * (DEPTH + 1), 1) is None and rs.take([SIZE] * DEPTH, 1) is not None


def test_a_commit_from_a_new_leader_is_not_learned_as_a_placement(rig: ReservingRig) -> None:
    _warm(rig)
    rig.settle()
    rig.master.epoch = 2  # the placeholders' placements were named by epoch 1
    keys, values = _batch("b")
    assert rig.client.put_many(keys, values) == [None] * 4
    assert all(rig.state.placements.recall([k]) is None for k in keys)


class AsyncFakeControl(FakeControl):
    """FakeControl for the asyncio driver: its replies are awaited (after a turn of the
    loop), and `methods` lists every request sent."""

    def __init__(self, master: Any, methods: list[str]) -> None:
        super().__init__(master)
        self.methods = methods

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        self.methods.append(method)
        return super().ask(method, request, timeout)

    async def call(self, method: str, request: Any, timeout: float,  # type: ignore[override]
                   spin: bool = True) -> Any:
        return await self.answer(self.ask(method, request, timeout), method, spin)

    async def answer(self, asked: Any, method: str,  # type: ignore[override]
                     spin: bool = True) -> Any:
        await asyncio.sleep(0)
        return FakeControl.answer(self, asked, method, spin)


def test_the_async_client_commits_in_one_call_too(rig: ReservingRig) -> None:
    client = AsyncKVStoreClient.__new__(AsyncKVStoreClient)
    client._later = {}
    client._state = rig.state
    client._background = set()
    methods: list[str] = []

    client._control = AsyncFakeControl(rig.master, methods)
    client.timeout = 5.0
    keys, values = _batch("a")
    keys1, values1 = _batch("a1")
    keys2, values2 = _batch("b")

    async def main() -> None:
        client._staging_turn = asyncio.Lock()
        assert await client.put_many(keys, values) == [None] * 4
        assert await client.put_many(keys1, values1) == [None] * 4
        await asyncio.gather(*client._background)  # the refill, a task of its own
        assert await client.put_many(keys2, values2) == [None] * 4

    asyncio.run(main())
    assert methods == ["PutStart", "PutEnd"] * 2 + ["PutStart", "PutCommit", "PutStart"]
    assert [_stored(rig, k) for k in keys + keys1 + keys2] == values + values1 + values2
    assert rig.state.stats.one_call_puts == 4


def test_an_unknown_commit_code_never_loses_a_value(rig: ReservingRig) -> None:
    _warm(rig)
    rig.settle()
    held = set(rig.placeholders())

    def refusing(req: pb.PutCommitRequest) -> pb.CodesResponse:
        # e.g. a quota's tenant check: the plain way gives the canonical answer
        return pb.CodesResponse(codes=[Code.INVALID_ARGUMENT] * len(req.keys), epoch=1)

    rig.master.PutCommit = refusing  # type: ignore[method-assign]
    keys, values = _batch("b")
    assert rig.client.put_many(keys, values) == [None] * 4
    assert [_stored(rig, k) for k in keys] == values
    # The refused placeholders are given up: revoked with the next put.
    rig.client.put_many(*_batch("c"))
    revoked = {k for e in rig.trace if e[:2] == ("rpc", "PutRevoke") for k in e[2]}
    assert held <= revoked


def test_values_of_varied_sizes_never_hold_placeholders(rig: ReservingRig) -> None:
    rng = random.Random(5)
    for j in range(5):
        keys = [f"v{j}-{i}".encode() for i in range(4)]
        values = [rng.randbytes(rng.randint(1, 3 * KiB)) for _ in keys]
        assert rig.client.put_many(keys, values) == [None] * 4
        assert [_stored(rig, k) for k in keys] == values
    assert not rig.placeholders() and "PutCommit" not in rig.rpcs()
    assert not [e for e in rig.trace if e[0] == "asked"]


def test_placeholders_of_a_deposed_leader_are_never_written(rig: ReservingRig) -> None:
    _warm(rig)
    rig.settle()
    rs = rig.state.reservations
    assert rs is not None and len(rs) == 4 * DEPTH
    old = [(r.locations[0][1], r.size) for q in rs._pool.values() for r in q]
    rig.master.epoch = 2  # a failover: the new leader knows none of them
    keys, values = _batch("a")
    assert rig.client.get_many(keys) == values  # any reply tells the client
    assert rig.state.epoch == 2
    rig.trace.clear()
    keys2, values2 = _batch("b")
    assert rig.client.put_many(keys2, values2) == [None] * 4
    assert rig.rpcs()[:2] == ["PutStart", "PutEnd"] and "PutCommit" not in rig.rpcs()
    for addr, size in old:  # not one byte went to where the old leader had put them
        off = addr - rig.node.base
        assert not rig.node.mem[off:off + size].any()
    assert [_stored(rig, k) for k in keys2] == values2


def test_a_shape_the_master_refused_is_not_asked_for_again_for_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rs = Reservations("w", budget=1 << 20, max_age=5.0)
    asked = _ask(rs, [SIZE, SIZE], 1)
    assert asked is not None
    reply = pb.PutStartResponse(epoch=1, put_timeout=30.0)
    for _ in asked:  # a full store: no free space to start ahead
        reply.items.add(code=Code.STORE_FULL, message="no free space to start ahead")
    rs.granted(asked, 1, reply, time.monotonic())
    assert len(rs) == 0 and rs.held == 0 and not rs.expired()  # nothing started, nothing to revoke
    assert _ask(rs, [SIZE, SIZE], 1) is None  # every put of a full store would ask again
    assert _ask(rs, [2 * SIZE], 1) is not None  # another shape is asked for
    later = time.monotonic() + 6.0
    monkeypatch.setattr(time, "monotonic", lambda: later)  # what MonotonicClock reads
    assert _ask(rs, [SIZE, SIZE], 1) is not None


def test_too_few_replicas_are_revoked_and_the_shape_rests() -> None:
    rs = Reservations("w", budget=1 << 20)
    asked = _ask(rs, [SIZE], 2)
    assert asked is not None
    reply = pb.PutStartResponse(epoch=1, put_timeout=30.0)
    for _ in asked:  # one node only: one replica each
        reply.items.add(placement=3).locations.add(node_id="n", segment="s", addr=64, size=SIZE)
    rs.granted(asked, 2, reply, time.monotonic())
    assert len(rs) == 0 and sorted(rs.expired()) == sorted(k for k, _ in asked)
    assert _ask(rs, [SIZE], 2) is None


def test_single_puts_refill_their_placeholders_in_one_go(
        rig: ReservingRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream of single puts asks for REFILL_TO placeholders when it runs below DEPTH,
    not for one more per put: one PutStart per that many puts."""
    monkeypatch.setattr(reservations, "REFILL_TO", 8)
    rs = Reservations("w", 1 << 20)
    asked = _ask(rs, [SIZE], 1)
    assert asked is not None and len(asked) == 8
    reply = pb.PutStartResponse(epoch=1)
    for _ in asked:
        reply.items.add().locations.add(node_id="n", segment="s", addr=64, size=SIZE)
    rs.granted(asked, 1, reply, time.monotonic())
    asks = 0
    for _ in range(6):  # the pool stays at or above DEPTH: nothing asked
        assert rs.take([SIZE], 1) is not None
        asks += _ask(rs, [SIZE], 1) is not None
    assert asks == 0 and len(rs) == 2
    assert rs.take([SIZE], 1) is not None
    again = _ask(rs, [SIZE], 1)  # below DEPTH: refilled up to REFILL_TO at once
    assert again is not None and len(again) == 7
    # Over the budget, only DEPTH batches are asked for.
    small = Reservations("w", DEPTH * SIZE)
    tight = _ask(small, [SIZE], 1)
    assert tight is not None and len(tight) == DEPTH


def test_placeholders_granted_in_columns_join_the_pool_and_too_few_replicas_rest() -> None:
    """The master answers a batch it placed whole in columns (kvstore/rpc/columns.py):
    the pool takes them as from items, and a placeholder with fewer replicas than asked
    is revoked, not written."""
    from kvstore.master.core.results import Location, PutStartResult
    from kvstore.rpc import columns

    def answer(asked: list[tuple[bytes, int]], copies: int) -> pb.PutStartResponse:
        reply = pb.PutStartResponse(epoch=1, put_timeout=30.0, record_room=40)
        columns.fill_placed(reply.columns, [
            PutStartResult(Code.OK, [Location(f"n{c}", f"s{c}", 64 * (i + 1), SIZE, "dram")
                                     for c in range(copies)], placement=i + 1)
            for i in range(len(asked))], [size for _, size in asked])
        return pb.PutStartResponse.FromString(reply.SerializeToString())

    rs = Reservations("w", budget=1 << 20)
    asked = _ask(rs, [SIZE], 2)
    assert asked is not None
    rs.granted(asked, 2, answer(asked, 2), time.monotonic())
    assert len(rs) == len(asked)
    taken = rs.take([SIZE], 2, epoch=1)
    assert taken is not None
    (r,) = taken
    assert r.key == asked[0][0] and r.placement == 1 and r.room == 40 and r.epoch == 1
    assert r.locations == [(("s0", "n0"), 64), (("s1", "n1"), 64)]

    rs = Reservations("w", budget=1 << 20)
    asked = _ask(rs, [SIZE], 2)
    assert asked is not None
    rs.granted(asked, 2, answer(asked, 1), time.monotonic())
    assert len(rs) == 0 and sorted(rs.expired()) == sorted(k for k, _ in asked)
    assert _ask(rs, [SIZE], 2) is None  # the shape rests, as from items


@pytest.mark.parametrize("prefix", [b"", b"team-a/"], ids=["no-tenant", "tenant"])
@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_each_shards_placeholders_route_to_that_shard(shards: int, prefix: bytes) -> None:
    """A placeholder and the key it becomes must be one shard's (the master refuses a
    foreign one): every placeholder of shard k's pool hashes to shard k, as the masters
    store it (under the tenant's prefix), and no two pools of one writer share a name."""
    seen: set[bytes] = set()
    for k in range(shards):
        rs = Reservations("w1", 1 << 30, shard=k, shards=shards, route=prefix)
        asked = _ask(rs, [SIZE] * 8)
        assert asked is not None and len(asked) == 8 * DEPTH
        named = [name for name, _ in asked]
        named += list(itertools.islice(reservations.names("w1", k, shards, prefix), 200))
        assert all(shard_of(prefix + n, shards) == k for n in named)
        assert all(n.startswith(reservations.PREFIX + b"w1/") for n in named)
        assert not seen & set(named)
        seen |= set(named)
    if shards == 1:  # one shard: every number, as before shards
        assert [n for n, _ in _ask(Reservations("w1"), [SIZE]) or []][:2] == [b"~put/w1/1", b"~put/w1/2"]
