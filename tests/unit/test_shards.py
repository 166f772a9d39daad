"""A key's shard, a master's K/N, and a shard's part of a node segment."""

from __future__ import annotations

import itertools
import random

import pytest
import xxhash

from kvstore.coord.layout import Layout
from kvstore.errors import InvalidArgument
from kvstore.shards import PART_ALIGN, ShardSpec, positions_by_shard, shard_of


def test_a_key_maps_to_the_same_shard_for_a_given_count() -> None:
    rng = random.Random(1)
    keys = [rng.randbytes(rng.randint(1, 80)) for _ in range(500)]
    for n in (1, 2, 3, 8, 64):
        first = [shard_of(k, n) for k in keys]
        assert first == [shard_of(bytes(k), n) for k in keys]  # no per-process salt
        assert all(0 <= s < n for s in first)
        # the documented function, so that any other implementation can agree with it
        assert first == [xxhash.xxh3_64_intdigest(k) % n if n > 1 else 0 for k in keys]


def test_keys_spread_over_every_shard() -> None:
    keys = [f"prefix-block-{i}".encode() for i in range(4000)]
    counts = [0] * 8
    for k in keys:
        counts[shard_of(k, 8)] += 1
    assert min(counts) > 400  # 500 each on average: no shard is starved


def test_positions_by_shard_keep_the_batch_order_and_cover_it() -> None:
    keys = [f"k{i}".encode() for i in range(100)]
    groups = positions_by_shard(keys, 3)
    assert sorted(p for g in groups for p in g) == list(range(100))
    for s, g in enumerate(groups):
        assert g == sorted(g)
        assert all(shard_of(keys[p], 3) == s for p in g)
    assert positions_by_shard(keys, 1) == [list(range(100))]


def test_shard_spec_parses_k_of_n_and_refuses_nonsense_with_a_sentence() -> None:
    assert ShardSpec.parse("1/4") == ShardSpec(1, 4)
    assert str(ShardSpec(1, 4)) == "1/4"
    for bad, says in (("4/4", "count from 0 to 3"), ("x", "is not K/N"), ("1", "is not K/N"),
                      ("0/0", "1 to"), ("-1/2", "does not exist")):
        with pytest.raises(InvalidArgument, match=says):
            ShardSpec.parse(bad)


def test_parts_tile_the_segment_aligned_and_without_overlap() -> None:
    size = (512 << 20) + 12345
    for n in (1, 2, 3, 7):
        parts = [ShardSpec(k, n).part(size) for k in range(n)]
        assert parts[0][0] == 0
        for (s0, l0), (s1, _) in itertools.pairwise(parts):
            assert s0 + l0 == s1
            assert s1 % PART_ALIGN == 0
        assert parts[-1][0] + parts[-1][1] == size


def test_one_shard_keeps_the_layout_of_before_shards() -> None:
    one = Layout("c")
    assert one.leader == b"/kvstore/c/leader" and one.masters == b"/kvstore/c/masters/"
    two = one.for_shard(1, 2)
    assert two.leader == b"/kvstore/c/shards/1/leader"
    assert two.masters == b"/kvstore/c/shards/1/masters/"
    assert two.nodes == one.nodes and two.config == one.config
    assert two.shard_count == one.shard_count == b"/kvstore/c/shards/count"
