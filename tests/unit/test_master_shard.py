"""A master of one shard (issue 30): its part of a node segment, the keys it refuses,
the shard on every node request, and the shard label of its metrics."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from kvstore.errors import Code, InvalidArgument
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.core.allocator import ExtentAllocator
from kvstore.master.metrics import MasterMetrics
from kvstore.master.nodes import NodeLinks, apply_request
from kvstore.master.service import foreign_keys
from kvstore.shards import ShardSpec, shard_of
from kvstore.v1 import master_pb2 as pb

MiB = 1024 * 1024
BASE = 1 << 32


def _keys(shard: int, shards: int, n: int) -> list[bytes]:
    out = [k for i in range(10 * n) if shard_of(k := f"k{i}".encode(), shards) == shard]
    return out[:n]


def test_allocator_places_only_inside_its_range() -> None:
    a = ExtentAllocator(MiB, 4096, start=MiB)
    offsets = [a.allocate(4096) for _ in range(256)]
    assert all(MiB <= o < 2 * MiB for o in offsets)
    assert a.allocate(4096) == -1  # the range is full: nothing spills outside it
    assert not a.reserve(0, 4096)  # another shard's part
    assert not a.reserve(2 * MiB, 4096)


def test_a_shards_part_is_mounted_with_segment_relative_offsets() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    start, length = ShardSpec(1, 2).part(64 * MiB)
    core.mount_segment("n0", "seg", BASE, length, "dram", start)
    keys = _keys(1, 2, 4)
    results = core.put_start(keys, [MiB] * len(keys), [1] * len(keys))
    assert [r.code for r in results] == [Code.OK] * len(keys)
    for r in results:
        for loc in r.locations:
            assert BASE + start <= loc.addr < BASE + start + length
    seg = core.stats().nodes["n0"].segments[0]
    assert seg.capacity == length
    # An inventory entry in shard 0's part is not this master's to adopt.
    assert core.adopt_replica(b"x", 4096, 1, "n0", 0, "dram") == Code.INVALID_ARGUMENT
    assert core.adopt_replica(b"y", 4096, 1, "n0", start + length - 4096, "dram") == Code.OK


def test_a_part_must_start_aligned() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    with pytest.raises(InvalidArgument):
        core.mount_segment("n0", "seg", BASE, MiB, "dram", 100)


def test_foreign_keys_are_those_of_other_shards() -> None:
    spec = ShardSpec(0, 2)
    mine, other = _keys(0, 2, 3), _keys(1, 2, 2)
    assert foreign_keys(pb.KeysRequest(keys=mine), spec) == []
    assert foreign_keys(pb.KeysRequest(keys=mine + other), spec) == other
    assert foreign_keys(pb.PutCommitRequest(keys=mine, placeholders=other), spec) == other


def test_a_tenants_keys_belong_to_the_shard_of_the_key_as_stored() -> None:
    spec, prefix = ShardSpec(0, 2), b"acme/"
    keys = [b"k%d" % i for i in range(64)]
    moved = [k for k in keys if spec.owns(k) != spec.owns(prefix + k)]
    assert moved, "some keys must change shard with the prefix for this test to mean much"
    assert foreign_keys(pb.KeysRequest(keys=keys), spec, prefix) == [
        k for k in keys if not spec.owns(prefix + k)]


def test_node_requests_carry_the_shard() -> None:
    assert apply_request(7, [], shard=3).shard == 3
    assert apply_request(7, []).shard == 0
    links = NodeLinks(lambda: 7, shard=1, shards=4)
    assert (links.shard, links.shards) == (1, 4)


def test_metrics_carry_a_shard_label_only_with_shards() -> None:
    one = MasterMetrics()
    one.rpc_errors.labels("Exists", "WRONG_SHARD").inc()
    assert b'shard="' not in generate_latest(one.exposed())
    two = MasterMetrics(shard=1, shards=2)
    two.rpc_errors.labels("Exists", "WRONG_SHARD").inc()
    text = generate_latest(two.exposed()).decode()
    assert 'kvstore_master_rpc_errors_total{code="WRONG_SHARD",method="Exists",shard="1"} 1.0' in text
