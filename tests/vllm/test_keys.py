"""Keys, options and timelines: the connector's pure parts, no store, no engine."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from kvstore_vllm.keys import (
    FORMAT_VERSION,
    KeyPlan,
    Namespace,
    RankLayers,
    block_hashes_for_blocks,
)
from kvstore_vllm.settings import Settings, role_flags
from kvstore_vllm.timeline import (
    FORWARD_START,
    LOOKUP_START,
    REQUEST_RESUMED,
    TRANSFER_COMPLETE,
    TRANSFER_SUBMITTED,
    Timeline,
    merge_stats_data,
    new_stats_data,
    observe,
    reduce_stats,
)

BASE = Namespace(model="llama@abc", revision="main", kv_dtype="bfloat16", block_size=16,
                 hash_algo="sha256", hash_seed="s1", tp_size=2, tp_rank=0, pp_size=1, pp_rank=0,
                 layout='{"kv_cache_layout":"LBHNC"}')
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
H = [hashlib.sha256(bytes([i])).digest() for i in range(4)]


def test_same_namespace_same_keys() -> None:
    again = Namespace(**dataclasses.asdict(BASE))
    assert RankLayers(again, LAYERS).keys(H[0]) == RankLayers(BASE, LAYERS).keys(H[0])
    assert BASE.format_version == FORMAT_VERSION


@pytest.mark.parametrize("field, value", [
    ("model", "llama@def"), ("revision", "v2"), ("kv_dtype", "float16"), ("block_size", 32),
    ("hash_algo", "xxhash"), ("hash_seed", "s2"), ("tp_size", 4), ("tp_rank", 1),
    ("pp_size", 2), ("pp_rank", 1), ("layout", '{"kv_cache_layout":"LBNHC"}'),
    ("format_version", FORMAT_VERSION + 1),
])
def test_any_difference_in_the_namespace_gives_other_keys(field: str, value: object) -> None:
    other = dataclasses.replace(BASE, **{field: value})
    ours = set(RankLayers(BASE, LAYERS).keys(H[0]))
    theirs = set(RankLayers(other, LAYERS).keys(H[0]))
    assert not ours & theirs


def test_keys_are_block_major_across_ranks() -> None:
    plan = KeyPlan([RankLayers(BASE.for_rank(t, 0), LAYERS) for t in range(2)])
    keys = plan.keys(H[:3])
    assert plan.keys_per_block == 4 and len(keys) == 12 and len(set(keys)) == 12
    assert keys[:4] == plan.block_keys(H[0])
    assert plan.whole_blocks(7) == 1  # a block counts only when every rank's layer is there
    worker = RankLayers(BASE.for_rank(1, 0), LAYERS)
    assert worker.keys(H[1]) == keys[6:8]


def test_block_hashes_at_a_coarser_block_size() -> None:
    assert block_hashes_for_blocks(H, 16, 16) == H
    assert block_hashes_for_blocks(H, 32, 16) == [H[1], H[3]]
    with pytest.raises(ValueError):
        block_hashes_for_blocks(H, 24, 16)


def test_settings_parse_and_refuse_typos() -> None:
    s = Settings.from_extra_config({"etcd": "10.0.0.1:2379", "layerwise_load": "true",
                                    "lease_ttl": "12"})
    assert s.etcd == "10.0.0.1:2379" and s.layerwise_load is True and s.lease_ttl == 12.0
    with pytest.raises(ValueError, match="unknown"):
        Settings.from_extra_config({"etc": "x"})
    with pytest.raises(ValueError, match="lease_ttl"):
        Settings.from_extra_config({"lease_ttl": 0})
    assert role_flags("kv_both") == (True, True)
    assert role_flags("kv_producer") == (False, True)
    assert role_flags("kv_consumer") == (True, False)
    with pytest.raises(ValueError):
        role_flags("kv_sideways")


def test_timeline_intervals_and_overlap() -> None:
    tl = Timeline()
    for point, t in [(LOOKUP_START, 0.0), (TRANSFER_SUBMITTED, 0.010), (FORWARD_START, 0.012),
                     (TRANSFER_COMPLETE, 0.020), (REQUEST_RESUMED, 0.030)]:
        tl.mark(point, t)
    tl.load_wait = 0.002  # the forward waited 2 ms of the 8 ms the transfer ran past its start
    iv = tl.intervals()
    assert iv["transfer"] == pytest.approx(0.010) and iv["lookup_to_resume"] == pytest.approx(0.030)
    assert tl.overlapped()
    tl.load_wait = 0.008
    assert not tl.overlapped()
    assert "transfer_complete=+20.00ms" in tl.describe()


def test_stats_data_aggregates_and_reduces() -> None:
    a, b = new_stats_data(), new_stats_data()
    observe(a, "load_transfer", 0.003)
    observe(b, "load_transfer", 0.030)
    b["counters"]["hit_tokens"] = 64
    merged = merge_stats_data(a, b)
    out = reduce_stats(merged)
    assert out["hit_tokens"] == 64 and out["load_transfer_count"] == 2
    assert out["load_transfer_avg_ms"] == pytest.approx(16.5)


def test_the_namespace_digest_is_unchanged() -> None:
    """Keys already in a store stay readable: the digest (kvstore_client.namespace) of a
    fixed namespace is pinned."""
    ns = Namespace(model="m@abc", revision="r", kv_dtype="torch.float16", block_size=16,
                   hash_algo="sha256", hash_seed="0123", tp_size=2, tp_rank=1, pp_size=1,
                   pp_rank=0, layout="NHD")
    assert ns.digest.hex() == "22b24b05ea4b436b91982c07252751c7"
