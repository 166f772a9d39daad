"""One-call puts whose commit travels with their bytes: the put record
(kvstore/put_record.py), the record room the core sets aside after a placeholder, the
leader acknowledging a PutCommit on the placeholder's intent (kvstore.master.durability)
and a new leader adopting the key the record names (kvstore.store.service;
docs/durability.md, section 1)."""

from __future__ import annotations

import asyncio
import ctypes
import itertools
from typing import Any

import pytest

from kvstore import put_record
from kvstore.checksum import checksum
from kvstore.errors import Code, InvalidArgument
from kvstore.master.core import CoreConfig, ManualClock, MasterCore, ReplicaChange
from kvstore.master.core.writes import MAX_RECORD_ROOM
from kvstore.store.inventory import Held
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import store_pb2 as spb
from tests.unit.polling import wait_until_async
from tests.unit.test_master_intents import _node, changes, placed, recorder, run, settle

KiB = 1 << 10
W = "w1"
PH = b"~put/w1/7"

# -- the record ----------------------------------------------------------------------


def test_a_record_resolves_to_its_key_with_the_placeholders_tenant_prefix() -> None:
    rec = put_record.encode(PH, b"block-1", 4096, 0xABC, 3)
    assert len(rec) == put_record.record_bytes(len(b"block-1")) <= put_record.room_for(7)
    room = rec + b"\0" * 40  # what follows in the segment
    assert put_record.resolve(room, PH, 4096) == put_record.Record(b"block-1", 4096, 0xABC, 3)
    # The leader held the placeholder under the writer's tenant: the key goes there too.
    got = put_record.resolve(room, b"team-a/" + PH, 4096)
    assert got is not None and got.key == b"team-a/block-1"


@pytest.mark.parametrize("damage", ["flip", "short", "other placeholder", "other size",
                                    "zeros"])
def test_a_damaged_or_foreign_record_is_none(damage: str) -> None:
    rec = bytearray(put_record.encode(PH, b"block-1", 4096, 0xABC, 3))
    placeholder, size = PH, 4096
    if damage == "flip":
        rec[20] ^= 1
    elif damage == "short":
        rec = rec[:-3]
    elif damage == "other placeholder":
        placeholder = b"~put/w1/8"  # a record an earlier placement left in the range
    elif damage == "other size":
        size = 4095
    else:
        rec = bytearray(len(rec))
    assert put_record.resolve(bytes(rec), placeholder, size) is None


# -- the core: the room after each placeholder ----------------------------------------


def _core(tiered: bool = False) -> MasterCore:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 64 * KiB)
    core.mount_segment("n1", "seg1", 2 << 32, 64 * KiB)
    if tiered:
        core.mount_segment("n0", "ssd0", 0, 1 << 20, "ssd")
    return core


def _ahead(core: MasterCore, names: list[bytes], size: int, room: int,
           replicas: int = 1) -> list[int]:
    rs = core.put_start(names, [size] * len(names), [0] * len(names), replicas, W, ahead=True,
                        record_room=room)
    assert [r.code for r in rs] == [Code.OK] * len(names), rs
    return [loc.addr for r in rs for loc in r.locations]


def _used(core: MasterCore) -> int:
    return core.stats().pool_used


def test_placeholders_hold_their_record_room_until_the_object_goes() -> None:
    core = _core()
    size, room = 1000, 128
    addrs = _ahead(core, [b"p1", b"p2", b"p3"], size, room)
    extent = (size + room + 63) & ~63
    assert _used(core) == 3 * extent
    # Ranges of one node never overlap, room included.
    for node_base in (1 << 32, 2 << 32):
        mine = sorted(a for a in addrs if a >> 32 == node_base >> 32)
        assert all(b - a >= extent for a, b in itertools.pairwise(mine))
    assert core.put_commit([b"p1", b"p2"], [b"k1", b"k2"], [size] * 2, [5, 6], W) == [Code.OK] * 2
    info = core.inspect(b"k1")
    assert info is not None and info.size == size  # readers see the value alone
    assert _used(core) == 3 * extent  # the committed objects keep their room
    assert core.remove([b"k1"]) == [Code.OK]
    assert core.put_revoke([b"p3"], W) == [Code.OK]
    assert _used(core) == extent
    core.evict_to(0.0)
    assert _used(core) == 0


def test_two_replicas_and_a_lost_node_free_the_room_of_each() -> None:
    core = _core()
    size, room = 3000, 64
    extent = (size + room + 63) & ~63
    _ahead(core, [b"p1"], size, room, replicas=2)
    assert core.put_commit([b"p1"], [b"k"], [size], [9], W) == [Code.OK]
    assert _used(core) == 2 * extent
    core.unmount_node("n1")
    assert _used(core) == extent
    assert core.remove([b"k"]) == [Code.OK]
    assert _used(core) == 0


def test_a_demoted_object_gives_back_its_room_and_comes_back_without_it() -> None:
    core = _core(tiered=True)
    size, room = 2000, 192
    _ahead(core, [b"p1"], size, room)
    assert core.put_commit([b"p1"], [b"k"], [size], [9], W) == [Code.OK]
    core.evict_to(0.0)  # with an SSD tier: a demotion
    (move,) = core.take_tier_moves()
    core.finish_tier_move(move, Code.OK)
    assert _used(core) == 0
    info = core.inspect(b"k")
    assert info is not None and [loc.tier for loc in info.locations] == ["ssd"]
    read = core.get_replicas([b"k"])  # a read starts its promotion
    (back,) = core.take_tier_moves()
    core.finish_tier_move(back, Code.OK)
    core.release_lease(read.lease_id)
    assert _used(core) == (size + 63) & ~63  # the promoted copy has no record room
    assert core.remove([b"k"]) == [Code.OK]
    assert _used(core) == 0


def test_record_room_is_for_placeholders_and_bounded() -> None:
    core = _core()
    with pytest.raises(InvalidArgument, match="record_room"):
        core.put_start([b"k"], [10], [1], None, W, record_room=64)
    with pytest.raises(InvalidArgument, match="record_room"):
        core.put_start([b"k"], [10], [0], None, W, ahead=True, record_room=MAX_RECORD_ROOM + 1)
    assert _used(core) == 0


# -- the leader: PutCommit acknowledged on the placeholder's intent --------------------


def _commit(node: str, key: bytes, offset: int) -> ReplicaChange:
    return ReplicaChange(node, "dram", key, offset, 4, 7, True)  # type: ignore[arg-type]


async def _placeholder_intent_landed(journal: list[ReplicaChange]) -> Any:
    """A recorder with one node, "a", that has applied PH's intent (placed at 64)."""
    rec, links, nodes = recorder(journal, "a")
    p = placed(PH, 64, "a", checksum=0)
    rec.record("PutStart", pb.PutStartResponse(), {},
               [type(p)(p.key, 0, p.locations, record=True)])
    await wait_until_async(lambda: links._links["a"].applied == 1, what="the intent landed")
    return rec, links, nodes


def test_a_commit_with_records_waits_only_for_the_placeholders_intent() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = await _placeholder_intent_landed(journal)
        (c,) = nodes["a"].calls[0].changes
        assert (c.replica.key, c.replica.pending, c.replica.record) == (PH, True, True)
        nodes["a"].gate.clear()  # the commit will not land while the reply is decided
        journal.append(_commit("a", b"k", 64))
        reply = pb.CodesResponse(codes=[Code.OK])
        assert rec.record("PutCommit", reply, {}, (), (), {b"k": PH}, True) is None, \
            "the reply waited for the commit"
        assert rec.early == 1
        nodes["a"].gate.set()
        link = links._links["a"]
        await wait_until_async(lambda: link.applied == link.queued, what="the commit")
        # The commit, then the placeholder's intent dropped after it, in one Apply.
        assert changes(nodes["a"].calls) == [(PH, 64, "intent"), (b"k", 64, "commit"),
                                             (PH, 64, "drop")]
        await links.close()
    run(main())


def test_a_commit_without_records_waits_for_its_own_delta() -> None:
    """A client that wrote no records (an older one, or no room for its keys): the old
    rule, and the placeholder's intent is dropped all the same."""
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = await _placeholder_intent_landed(journal)
        nodes["a"].gate.clear()
        journal.append(_commit("a", b"k", 64))
        reply = pb.CodesResponse(codes=[Code.OK])
        wait = rec.record("PutCommit", reply, {}, (), (), {b"k": PH}, False)
        assert wait is not None
        task = asyncio.ensure_future(wait)
        await settle()
        assert not task.done(), "acknowledged before the node had the commit"
        nodes["a"].gate.set()
        await task
        assert reply.error.code == 0 and rec.early == 0
        assert changes(nodes["a"].calls)[-1] == (PH, 64, "drop")
        await links.close()
    run(main())


# -- the node: a new leader finds the key the record names -----------------------------


def _ph_intent(key: bytes, offset: int, size: int) -> spb.Change:
    return spb.Change(replica=spb.Replica(key=key, offset=offset, size=size, tier="dram",
                                          pending=True, record=True))


def test_a_new_leader_adopts_the_key_an_intact_record_names() -> None:
    async def main() -> None:
        service, segment, inv = _node()
        value = b"v" * 4096
        placeholder = b"team-a/" + PH
        await service.Apply(spb.ApplyRequest(epoch=3, changes=[
            _ph_intent(placeholder, 0, 4096), _ph_intent(b"team-a/~put/w1/8", 8192, 4096),
            _ph_intent(b"team-a/~put/w1/9", 16384, 4096)]), None)
        rec = put_record.encode(PH, b"block-1", 4096, checksum(value), 3)
        segment.view[0:4096] = value
        segment.view[4096:4096 + len(rec)] = rec
        # w1/8: a torn value under an intact record; w1/9: never written.
        torn = put_record.encode(b"~put/w1/8", b"block-2", 4096, checksum(value), 3)
        segment.view[8192:8192 + 2048] = value[:2048]
        segment.view[8192 + 4096:8192 + 4096 + len(torn)] = torn
        # The current leader's own placeholders are neither adopted nor forgotten.
        reply = await service.Inventory(spb.InventoryRequest(epoch=3), None)
        assert list(reply.replicas) == [] and len(inv.pending()) == 3
        reply = await service.Inventory(spb.InventoryRequest(epoch=4), None)
        assert [(r.key, r.offset, r.size, r.checksum) for r in reply.replicas] == [
            (b"team-a/block-1", 0, 4096, checksum(value))]
        assert inv.dram() == [(b"team-a/block-1", Held(0, 4096, checksum(value)))]
        segment.close()
    run(main())


def test_the_commit_applied_replaces_the_placeholders_intent() -> None:
    async def main() -> None:
        service, segment, inv = _node()
        value = b"v" * 100
        commit = spb.Change(replica=spb.Replica(key=b"k", offset=0, size=100,
                                                checksum=checksum(value), tier="dram"))
        drop = spb.Change(replica=spb.Replica(key=PH, offset=0, tier="dram"), drop=True)
        await service.Apply(spb.ApplyRequest(epoch=1, changes=[_ph_intent(PH, 0, 100)]), None)
        await service.Apply(spb.ApplyRequest(epoch=1, changes=[commit, drop]), None)
        assert inv.dram() == [(b"k", Held(0, 100, checksum(value)))]
        segment.close()
    run(main())


# -- the client: the record after the value --------------------------------------------


def test_a_record_written_into_the_values_tail_lengthens_its_transfer() -> None:
    from collections import defaultdict

    from kvstore_client.buffers import Dest
    from kvstore_client.datapath import Xfer
    from kvstore_client.puts import _add_records
    from kvstore_client.reservations import Reserved

    value = b"v" * 1000
    need = put_record.record_bytes(len(b"key-a"))
    buf = ctypes.create_string_buffer(value + b"\0" * need, len(value) + need)
    addr = ctypes.addressof(buf)
    src = Dest(addr, memoryview(buf).cast("B")[:1000], tail=need)
    target = ("seg", "n0")
    r = Reserved(PH, 1000, 3, 1, [(target, 1 << 32)], 1e9, room=128)
    plan: dict = defaultdict(list)
    plan[target].append(Xfer(addr, 1 << 32, 1000))
    area = memoryview(bytearray(4096))
    _add_records(plan, area, 0, 0, [b"key-a"], [r], [checksum(value)], [src])
    (x,) = plan[target]  # no second transfer: the record rides on the value's
    assert (x.local, x.remote, x.size) == (addr, 1 << 32, 1000 + need)
    got = put_record.resolve(bytes(buf)[1000:], PH, 1000)
    assert got == put_record.Record(b"key-a", 1000, checksum(value), 3)
    # Without a tail, the record goes from the record area, as a transfer of its own.
    plan2: dict = defaultdict(list)
    plan2[target].append(Xfer(addr, 1 << 32, 1000))
    _add_records(plan2, area, 5000, 64, [b"key-a"], [r], [checksum(value)],
                 [Dest(addr, src.view)])
    assert [(x.local, x.remote, x.size) for x in plan2[target]] == [
        (addr, 1 << 32, 1000), (5064, (1 << 32) + 1000, need)]
    assert put_record.resolve(bytes(area[64:]), PH, 1000) is not None
