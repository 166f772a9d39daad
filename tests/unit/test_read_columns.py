"""GetReplicas in columns (kvstore/rpc/columns.py): what the master writes, the client
reads back field for field, in version 1 (repeated fields) and 2 (packed bytes); an old
client (no `columns` in its request) still gets `items`, one that does not say which
versions it reads gets version 1; a reply that does not add up, or of a version the
client does not know, is refused with a typed error."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvstore.errors import Code, Internal
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.metrics import MasterMetrics
from kvstore.master.service import MasterService
from kvstore.rpc import columns
from kvstore.rpc.columns import Location, MalformedReply, ReadItem, decode, fill, read_items
from kvstore.rpc.framing import MAX_FRAME
from kvstore.v1 import master_pb2 as pb


class Leader:
    is_leader = True
    epoch = 3
    leader_address = "127.0.0.1:1"
    leader_for = 1.0


def _loc(node: str, seg: str, addr: int, size: int, tier: str = "dram") -> Location:
    return Location(node, seg, addr, size, tier)


def _fields(item: Any) -> tuple[Any, ...]:
    return (int(item.code), item.size, item.checksum, item.placement,
            [(loc.node_id, loc.segment, loc.addr, loc.size, loc.tier) for loc in item.locations])


def _round_trip(results: list[ReadItem], version: int) -> list[ReadItem]:
    reply = pb.GetReplicasResponse(lease_id=9)
    fill(reply.columns, results, version)
    assert reply.columns.version == version
    return read_items(pb.GetReplicasResponse.FromString(reply.SerializeToString()))


VERSIONS = pytest.mark.parametrize("version", [columns.VERSION, columns.PACKED])


@VERSIONS
def test_every_field_survives_the_round_trip(version: int) -> None:
    results = [
        ReadItem(Code.OK, 4096, 2**64 - 1, 2**63 + 5,
                 [_loc("n0", "seg0", 2**47 + 64, 4096), _loc("n1", "ssd-1", 0, 4096, "ssd")]),
        ReadItem(Code.NOT_FOUND, 0, 0, 0, []),
        ReadItem(Code.IN_PROGRESS, 7, 11, 0, [_loc("n1", "ssd-1", 4096, 7, "ssd")]),
        ReadItem(Code.OK, 1, 1, 1, [_loc("n0", "seg0", 128, 1)]),
    ]
    back = _round_trip(results, version)
    assert [_fields(b) for b in back] == [_fields(r) for r in results]
    # the (node, segment, tier) of repeated locations travel once
    reply = pb.GetReplicasResponse()
    fill(reply.columns, results, version)
    assert len(reply.columns.ranges) == 2
    if version == columns.VERSION:
        assert list(reply.columns.location_ranges) == [0, 1, 1, 0]
    else:  # nothing in the repeated fields; everything in `packed`
        assert not reply.columns.location_ranges and not reply.columns.codes
        assert (reply.columns.keys, reply.columns.locations) == (4, 4)
        assert len(reply.columns.packed) == 4 * (columns.PACKED_KEY + columns.PACKED_LOCATION)


@VERSIONS
def test_an_empty_batch_is_empty_columns_not_missing_ones(version: int) -> None:
    reply = pb.GetReplicasResponse()
    fill(reply.columns, [], version)
    wire = pb.GetReplicasResponse.FromString(reply.SerializeToString())
    assert wire.HasField("columns") and read_items(wire) == []


@VERSIONS
def test_a_batch_at_the_key_limit_fits_a_frame(version: int) -> None:
    n = CoreConfig().max_batch
    results = [ReadItem(Code.OK, 1 << 20, 2**64 - 1 - i, 2**64 - 1 - i,
                        [_loc("node-0", "segment-0", 2**48 + i * (1 << 20), 1 << 20)])
               for i in range(n)]
    reply = pb.GetReplicasResponse()
    fill(reply.columns, results, version)
    wire = reply.SerializeToString()
    assert len(wire) < MAX_FRAME
    back = read_items(pb.GetReplicasResponse.FromString(wire))
    assert len(back) == n
    assert _fields(back[0]) == _fields(results[0]) and _fields(back[-1]) == _fields(results[-1])


def _columns_with(version: int = columns.VERSION, **changes: Any) -> Any:
    """Two keys' answer in `version`, with `changes` made to its fields (a list replaces
    the repeated field's contents)."""
    reply = pb.GetReplicasResponse()
    fill(reply.columns, [ReadItem(Code.OK, 10, 1, 2, [_loc("n0", "s0", 64, 10)]),
                         ReadItem(Code.OK, 20, 3, 4, [_loc("n0", "s0", 128, 20)])], version)
    cols = reply.columns
    for name, value in changes.items():
        if isinstance(value, list):
            del getattr(cols, name)[:]
            getattr(cols, name).extend(value)
        else:
            setattr(cols, name, value)
    return reply


@pytest.mark.parametrize("changes, says", [
    ({"version": 3}, "version 3"),
    ({"version": 0}, "version 0"),
    ({"sizes": [10]}, "number of keys"),
    ({"placements": [2, 4, 6]}, "number of keys"),
    ({"location_counts": [1, 2]}, "count 3 locations"),
    ({"location_addrs": [64]}, "count 2 locations"),
    ({"location_ranges": [0, 5]}, "names range 5 of 1"),
])
def test_a_malformed_reply_is_refused_with_a_typed_error(changes: dict[str, Any],
                                                         says: str) -> None:
    reply = pb.GetReplicasResponse.FromString(_columns_with(**changes).SerializeToString())
    with pytest.raises(MalformedReply, match=says) as err:
        read_items(reply)
    assert isinstance(err.value, Internal) and err.value.code == Code.INTERNAL


@pytest.mark.parametrize("changes, says", [
    ({"keys": 3}, "say 3 keys and 2 locations"),
    ({"locations": 1}, "say 2 keys and 1 locations"),
    ({"packed": b"\0" * 10}, "carry 10"),
    ({"codes": [0, 0]}, "as well as packed"),
    ({"location_addrs": [64, 128]}, "as well as packed"),
])
def test_a_malformed_packed_reply_is_refused_with_a_typed_error(changes: dict[str, Any],
                                                                says: str) -> None:
    reply = pb.GetReplicasResponse.FromString(_columns_with(columns.PACKED, **changes).SerializeToString())
    with pytest.raises(MalformedReply, match=says):
        read_items(reply)


def test_a_packed_reply_whose_counts_disagree_with_its_locations_is_refused() -> None:
    reply = _columns_with(columns.PACKED)
    cols = reply.columns
    blob = bytearray(cols.packed)
    at = 2 * (4 + 8 + 8 + 8)  # the location counts, after codes, sizes, checksums, placements
    blob[at:at + 4] = (2).to_bytes(4, "little")  # key 0 claims two of the two locations
    cols.packed = bytes(blob)
    with pytest.raises(MalformedReply, match="count 3 locations"):
        read_items(reply)


def test_items_and_columns_together_are_refused() -> None:
    reply = _columns_with()
    reply.items.add(code=0, size=1)
    with pytest.raises(MalformedReply, match="both"):
        read_items(reply)


def test_a_reply_without_columns_is_read_as_items() -> None:
    """A master that predates columns ignores the flag: its items are read as they are."""
    reply = pb.GetReplicasResponse()
    item = reply.items.add(code=0, size=5, checksum=6, placement=7)
    item.locations.add(node_id="n0", segment="s0", addr=64, size=5, tier="dram")
    (back,) = read_items(pb.GetReplicasResponse.FromString(reply.SerializeToString()))
    assert _fields(back) == (0, 5, 6, 7, [("n0", "s0", 64, 5, "dram")])


def _service() -> MasterService:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    core.mount_segment("n1", "seg1", 1 << 33, 1 << 20)
    service = MasterService(core, Leader(), MasterMetrics())
    keys = [b"a", b"b", b"c"]
    service.handle("PutStart", pb.PutStartRequest(keys=keys, sizes=[10, 20, 30],
                                                   checksums=[1, 2, 3], replicas=2))
    service.handle("PutEnd", pb.KeysRequest(keys=keys))
    return service


@pytest.mark.parametrize("unpinned", [False, True])
def test_the_master_answers_columns_only_when_asked_and_both_say_the_same(
        unpinned: bool) -> None:
    service = _service()
    keys = [b"a", b"missing", b"b", b"c"]
    old = service.handle("GetReplicas", pb.GetReplicasRequest(
        keys=keys, holder="h", unpinned=unpinned))
    new = service.handle("GetReplicas", pb.GetReplicasRequest(
        keys=keys, holder="h", unpinned=unpinned, columns=True))
    assert not old.error.code and not new.error.code
    assert not old.HasField("columns") and len(old.items) == len(keys)
    assert new.HasField("columns") and len(new.items) == 0
    assert (new.lease_id == 0) == unpinned and new.epoch == old.epoch == 3
    new = pb.GetReplicasResponse.FromString(new.SerializeToString())
    got, want = read_items(new), list(old.items)
    assert [_fields(g) for g in got] == [_fields(w) for w in want]
    assert [int(g.code) for g in got] == [Code.OK, Code.NOT_FOUND, Code.OK, Code.OK]
    assert all(len(g.locations) == 2 for g in got if g.code == Code.OK)


@pytest.mark.parametrize("asked, answered", [(0, 1), (1, 1), (2, 2), (99, 2)])
def test_the_master_answers_the_highest_version_both_read(asked: int, answered: int) -> None:
    service = _service()
    keys = [b"a", b"missing", b"c"]
    plain = service.handle("GetReplicas", pb.GetReplicasRequest(keys=keys, holder="h",
                                                                columns=True))
    reply = service.handle("GetReplicas", pb.GetReplicasRequest(
        keys=keys, holder="h", columns=True, columns_version=asked))
    assert plain.columns.version == columns.VERSION
    assert reply.columns.version == answered
    assert bool(reply.columns.packed) == (answered == columns.PACKED)
    assert [_fields(g) for g in read_items(reply)] == [_fields(g) for g in read_items(plain)]


def test_the_version_is_the_one_the_reader_knows() -> None:
    reply = pb.GetReplicasResponse()
    fill(reply.columns, [])
    assert reply.columns.version == columns.VERSION
    assert decode(reply.columns) == []


# -- PutStart's answer in columns -----------------------------------------------------


def _starts(columns_version: int, keys: list[bytes], replicas: int = 2) -> Any:
    service = _service()
    reply = service.handle("PutStart", pb.PutStartRequest(
        keys=keys, sizes=[8 * (i + 1) for i in range(len(keys))], checksums=[0] * len(keys),
        replicas=replicas, writer="w", columns_version=columns_version))
    assert not reply.error.code
    return pb.PutStartResponse.FromString(reply.SerializeToString())


def _placement(item: Any) -> tuple[Any, ...]:
    return (int(item.code), item.placement,
            [(loc.node_id, loc.segment, loc.addr, loc.size, loc.tier) for loc in item.locations])


@pytest.mark.parametrize("asked", [columns.PACKED, 99])
def test_put_start_answers_in_columns_when_every_key_is_placed(asked: int) -> None:
    keys = [b"k%d" % i for i in range(5)]
    old, new = _starts(0, keys), _starts(asked, keys)  # two masters in the same state
    assert not old.HasField("columns") and len(old.items) == len(keys)
    assert new.HasField("columns") and len(new.items) == 0
    assert new.columns.version == columns.PACKED and new.epoch == old.epoch
    got = columns.start_items(new, len(keys))
    assert [_placement(g) for g in got] == [_placement(w) for w in old.items]
    assert [g.size for g in got] == [8 * (i + 1) for i in range(len(keys))]
    assert all(len(g.locations) == 2 for g in got)
    placements, where = columns.placed(new.columns, len(keys))
    assert placements == [w.placement for w in old.items]
    assert where == [[((loc.segment, loc.node_id), loc.addr) for loc in w.locations]
                     for w in old.items]


def test_put_start_with_a_key_not_placed_is_answered_in_items_with_its_message() -> None:
    # b"a" is stored already (see _service): ALREADY_EXISTS, and a too-large key
    # refused; the batch goes in items, so each refusal keeps its sentence.
    reply = _starts(columns.PACKED, [b"new", b"a", b"x" * 5000])
    assert not reply.HasField("columns")
    items = columns.start_items(reply, 3)
    assert [int(i.code) for i in items] == [Code.OK, Code.ALREADY_EXISTS,
                                            Code.INVALID_ARGUMENT]
    assert items[2].message


def test_a_version_1_reader_gets_items() -> None:
    reply = _starts(columns.VERSION, [b"k"])
    assert not reply.HasField("columns") and len(reply.items) == 1


def test_an_empty_put_start_in_columns_is_empty() -> None:
    reply = _starts(columns.PACKED, [])
    assert columns.start_items(reply, 0) == []
    assert columns.placed(reply.columns, 0) == ([], [])


def test_a_malformed_put_start_answer_is_refused_with_a_typed_error() -> None:
    keys = [b"k0", b"k1"]
    reply = _starts(columns.PACKED, keys)
    with pytest.raises(MalformedReply, match="answer 2 keys of 3"):
        columns.start_items(reply, 3)
    with pytest.raises(MalformedReply, match="answer 2 keys of 1"):
        columns.placed(reply.columns, 1)
    both = pb.PutStartResponse.FromString(reply.SerializeToString())
    both.items.add()
    with pytest.raises(MalformedReply, match="both items and columns"):
        columns.start_items(both, 2)
    # A key marked not placed: such a batch comes in items, so this is no master's.
    refused = pb.PutStartResponse()
    columns.fill_lists(refused.columns, SimpleNamespace(
        codes=[int(Code.STORE_FULL)], sizes=[8], checksums=[0], placements=[0], counts=[1],
        loc_ranges=[0], loc_addrs=[64], loc_sizes=[8], ranges=[("n", "s", "dram")]),
        columns.PACKED)
    with pytest.raises(MalformedReply, match="not placed"):
        columns.placed(refused.columns, 1)
    torn = pb.PutStartResponse.FromString(reply.SerializeToString())
    torn.columns.packed = torn.columns.packed[:-1]
    with pytest.raises(MalformedReply, match="packed bytes"):
        columns.placed(torn.columns, 2)
    assert issubclass(MalformedReply, Internal)
