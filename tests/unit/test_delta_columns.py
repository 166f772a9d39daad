"""The leader's deltas in columns (kvstore.rpc.delta_columns): every field round-trips,
an empty batch and a batch of the leader's queue bound, malformed frames are refused
with a typed error, a node applies columns as it applies the same ApplyRequest, and a
node that predates columns gets ApplyRequests."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from kvstore.errors import MAX_KEY_BYTES
from kvstore.master.nodes import MAX_QUEUED
from kvstore.rpc import delta_columns as dc
from kvstore.rpc.deltas import DeltaClient, DeltaServer, apply_request
from kvstore.store.inventory import Inventory
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.tier_metrics import TierCounters
from kvstore.v1 import store_pb2 as spb

U64 = (1 << 64) - 1


def rows(n: int, seed: int = 1) -> list[dc.Row]:
    rnd = random.Random(seed)
    out: list[dc.Row] = []
    for i in range(n):
        drop, pending = rnd.random() < 0.3, rnd.random() < 0.5
        out.append(dc.row(b"key-%d-" % i + rnd.randbytes(rnd.randrange(0, 40)),
                          rnd.randrange(0, U64), rnd.randrange(0, U64), rnd.randrange(0, U64),
                          rnd.choice(("dram", "ssd")), pending and not drop,
                          pending and not drop and rnd.random() < 0.5, drop))
    return out


def test_a_rows_flags_are_its_tier_and_booleans_and_read_back_as_such() -> None:
    for tier in ("dram", "ssd"):
        for pending in (False, True):
            for record in (False, True):
                for drop in (False, True):
                    flags = dc.row(b"k", 0, 0, 0, tier, pending, record, drop)[4]
                    assert flags == (drop * dc.DROP | pending * dc.PENDING
                                     | record * dc.RECORD | (tier == "ssd") * dc.SSD)
                    assert dc.fields(flags) == (tier, pending, record, drop)
    # The constants the leader's hot paths queue with are the same rows.
    assert dc.row(b"k", 1, 2, 3, "dram", pending=True)[4] == dc.INTENT
    assert dc.row(b"k", 1, 2, 3, "dram", pending=True, record=True)[4] == dc.INTENT_RECORD
    assert dc.row(b"k", 1, 0, 0, "dram", drop=True)[4] == dc.DRAM_DROP


def test_every_field_round_trips() -> None:
    sent = rows(300)
    sent.append(dc.row(b"\x00" * MAX_KEY_BYTES, U64, U64, U64, "dram", True, True, False))
    sent.append(dc.row(b"", 0, 0, 0, "ssd", False, False, True))
    got = dc.decode(dc.encode(U64, 4_000_000_000, sent))
    assert (got.epoch, got.shard) == (U64, 4_000_000_000)
    assert got.keys == [r[0] for r in sent]
    assert got.offsets == [r[1] for r in sent]
    assert got.sizes == [r[2] for r in sent]
    assert got.checksums == [r[3] for r in sent]
    assert list(got.flags) == [r[4] for r in sent]


def test_an_empty_batch_and_one_of_the_queue_bound() -> None:
    got = dc.decode(dc.encode(7, 0, []))
    assert (got.epoch, got.keys, got.flags) == (7, [], b"")
    big = [dc.row(b"k%d" % i, i, 4096, i * 31, "dram", drop=i % 2 == 0)
           for i in range(MAX_QUEUED)]
    got = dc.decode(dc.encode(9, 1, big))
    assert len(got.keys) == MAX_QUEUED and got.keys[-1] == b"k%d" % (MAX_QUEUED - 1)
    assert got.offsets[-1] == MAX_QUEUED - 1 and got.flags[0] == dc.DROP


def test_rows_the_columns_cannot_hold_are_the_callers_bug() -> None:
    with pytest.raises(ValueError, match="tier"):
        dc.row(b"k", 0, 0, 0, "nvme")
    with pytest.raises(ValueError, match="flags"):
        dc.encode(1, 0, [(b"k", 0, 0, 0, dc.SSD << 1)])
    with pytest.raises(ValueError, match="fit"):
        dc.encode(1, 0, [dc.row(b"k", 1 << 64, 0, 0, "dram")])


def test_malformed_frames_are_refused_with_a_typed_error() -> None:
    good = dc.encode(3, 0, rows(5))
    with pytest.raises(dc.MalformedDeltas, match="header"):
        dc.decode(good[:10])
    with pytest.raises(dc.MalformedDeltas, match="version 2"):
        dc.decode(bytes([2]) + good[1:])
    with pytest.raises(dc.MalformedDeltas, match="says 5 rows"):
        dc.decode(good[:dc.HEAD.size + 20])
    with pytest.raises(dc.MalformedDeltas, match="key lengths"):
        dc.decode(good + b"x")  # trailing bytes a key length does not account for
    lying = bytearray(good)
    struct.pack_into("<I", lying, dc.HEAD.size, 10_000)  # the first key's length
    with pytest.raises(dc.MalformedDeltas, match="key lengths"):
        dc.decode(bytes(lying))


def service() -> StoreNodeService:
    segment = DramSegment(1 << 20)
    return StoreNodeService("n1", Inventory(), segment, None, TierCounters())


def test_a_node_applies_columns_as_it_applies_the_same_request() -> None:
    # An intent, its commit, a placeholder's intent and a drop of another key, in order.
    sent: list[dc.Row] = [
        dc.row(b"a", 0, 64, 0, "dram"),
        dc.row(b"k", 64, 64, 9, "dram", pending=True),
        dc.row(b"~put/w/1", 128, 64, 0, "dram", pending=True, record=True),
        dc.row(b"k", 64, 64, 9, "dram"),
        dc.row(b"a", 0, 0, 0, "dram", drop=True),
        dc.row(b"s", 0, 64, 5, "ssd"),
    ]

    async def main() -> None:
        by_columns, by_request = service(), service()
        assert not (await by_columns.apply_columns(dc.decode(dc.encode(4, 0, sent)))).error.code
        assert not (await by_request.Apply(apply_request(4, sent), None)).error.code
        assert sorted(by_columns.inventory.dram()) == sorted(by_request.inventory.dram())
        held = dict(by_columns.inventory.dram())
        assert set(held) == {b"k", b"~put/w/1"}
        assert (held[b"k"].pending, held[b"~put/w/1"].pending, held[b"~put/w/1"].record) == (
            0, 4, True)
        # An older leader's columns are refused as its requests are.
        stale = await by_columns.apply_columns(dc.decode(dc.encode(3, 0, [])))
        assert stale.error.code
    asyncio.run(main())


def test_the_leader_sends_columns_and_falls_back_for_a_node_that_predates_them() -> None:
    sent = rows(20, seed=5)

    async def main() -> None:
        got_columns: list[dc.Columns] = []
        got_requests: list[spb.ApplyRequest] = []

        async def apply(request: spb.ApplyRequest) -> spb.ApplyResponse:
            got_requests.append(request)
            return spb.ApplyResponse()

        async def apply_columns(columns: dc.Columns) -> spb.ApplyResponse:
            got_columns.append(columns)
            return spb.ApplyResponse()

        new, old = DeltaServer(apply, apply_columns=apply_columns), DeltaServer(apply)
        to_new = DeltaClient(await new.start("127.0.0.1"))
        to_old = DeltaClient(await old.start("127.0.0.1"))
        await to_new.apply_rows(6, 0, sent, 5)
        assert [c.keys for c in got_columns] == [[r[0] for r in sent]] and not got_requests
        await to_old.apply_rows(6, 0, sent, 5)
        await to_old.apply_rows(7, 0, sent[:1], 5)
        assert not to_old.columns and to_new.columns
        assert [len(r.changes) for r in got_requests] == [20, 1]
        assert [c.replica.key for c in got_requests[0].changes] == [r[0] for r in sent]
        assert len(got_columns) == 1
        for end in (to_new, to_old):
            await end.close()
        for server in (new, old):
            await server.close()
    asyncio.run(main())
