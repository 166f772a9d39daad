"""The offline cache simulator of the trace replay (bench/lru_sim.py): request semantics,
plain LRU, the store-policy mirror, capacity sizing, and the mirror checked against the
master's own core driven the way the replayer drives the store."""

from __future__ import annotations

import random

import pytest

from bench.lru_sim import (
    Request,
    Sizing,
    StoreSim,
    aligned,
    simulate,
    slots_below,
)
from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore

# -- request semantics (plain LRU) ---------------------------------------------------------


def test_hits_are_the_longest_contiguous_present_prefix() -> None:
    c = StoreSim.lru(100)
    assert c.request(["a", "b", "c"]) == 0
    assert c.request(["a", "x", "c"]) == 1          # c is present but after a miss
    assert c.request(["a", "x", "c", "d"]) == 3
    assert c.request(["z", "a"]) == 0


def test_misses_are_inserted_and_hit_next_time() -> None:
    c = StoreSim.lru(100)
    c.request([1, 2, 3])
    assert c.request([1, 2, 3, 4]) == 3
    assert c.request([1, 2, 3, 4]) == 4
    assert len(c) == 4
    assert c.stats.inserted == 4


def test_plain_lru_evicts_the_least_recently_used() -> None:
    c = StoreSim.lru(2)
    c.request(["a"])
    c.request(["b"])
    assert c.request(["a"]) == 1        # a is now the most recent
    c.request(["c"])                    # evicts b
    assert "a" in c and "c" in c and "b" not in c
    assert c.stats.evictions == 1


def test_a_present_key_after_the_prefix_is_not_touched() -> None:
    c = StoreSim.lru(3)
    c.request(["a"])
    c.request(["b"])
    c.request(["x", "a"])               # a is after a miss: put is a no-op, no recency
    c.request(["y"])                    # evicts the oldest: a, not b
    assert "a" not in c and "b" in c


def test_new_keys_are_older_than_the_prefix_released_after_them() -> None:
    # PutEnd pushes the new keys, then the release pushes the pinned prefix.
    c = StoreSim.lru(3)
    c.request(["a"])
    c.request(["a", "b"])               # order afterwards: b, a
    c.request(["c"])
    c.request(["d"])                    # evicts b, the oldest
    assert "b" not in c and "a" in c


def test_the_pinned_prefix_is_not_evicted_by_its_own_request() -> None:
    c = StoreSim.lru(2)
    c.request(["a", "b"])               # a is older than b
    c.request(["a", "c"])               # a is pinned: c evicts b
    assert "a" in c and "c" in c and "b" not in c


def test_a_batch_larger_than_the_cache_fails_what_does_not_fit() -> None:
    c = StoreSim.lru(2)
    assert c.request(["a", "b", "c"]) == 0
    assert c.stats.put_failures == 1    # a and b are PENDING, nothing is evictable
    assert "a" in c and "b" in c and "c" not in c


def test_repeated_keys_in_a_request_take_one_slot() -> None:
    c = StoreSim.lru(10)
    c.request(["a", "b", "b", "c"])
    assert len(c) == 3 and c.count == 3


def test_infinite_cache_hits_every_seen_prefix() -> None:
    c = StoreSim.infinite()
    for i in range(1000):
        c.request([0, i])
    assert c.stats.hit_blocks == 999 + 0   # block 0 hits from the 2nd request on
    assert c.stats.evictions == 0


def test_token_hit_rate_counts_the_partial_last_block() -> None:
    reqs = [Request(0, 1100, 1, (1, 2, 3)), Request(1, 1100, 1, (1, 2, 3))]
    st = simulate(reqs, StoreSim.infinite())
    assert st.hit_blocks == 3 and st.blocks == 6
    assert st.hit_tokens == 1100 and st.tokens == 2200
    assert st.token_hit_rate == pytest.approx(0.5)


def test_constructor_checks() -> None:
    with pytest.raises(ValueError):
        StoreSim(0)
    with pytest.raises(ValueError):
        StoreSim(10, evict_above=9)
    with pytest.raises(ValueError):
        StoreSim(10, evict_above=5, evict_to=6)


# -- the watermark mirror -------------------------------------------------------------------


def test_watermark_eviction_starts_above_high_and_stops_at_low() -> None:
    c = StoreSim(10, evict_above=9, evict_to=8)
    for i in range(9):
        c.request([i])
    assert c.stats.evictions == 0 and c.count == 9
    c.request([9])                      # 10 > 9: evict down to 8, oldest first
    assert c.stats.evictions == 2 and c.count == 8
    assert 0 not in c and 1 not in c and 2 in c and 9 in c


def test_watermark_geometry_from_segment_bytes() -> None:
    assert aligned(100) == 128 and aligned(128) == 128 and aligned(1) == 64
    c = StoreSim.watermark([1280], 100, high=0.9, low=0.8)    # 10 slots of 128 B
    assert (c.slots, c.evict_above, c.evict_to) == (10, 9, 8)
    c = StoreSim.watermark([1280 + 63], 100)        # the unaligned tail is not capacity
    assert c.slots == 10
    c = StoreSim.watermark([640, 640], 100, high=0.9, low=0.8)  # two nodes: one pool
    assert (c.slots, c.evict_above, c.evict_to) == (10, 9, 8)
    c = StoreSim.watermark([128 * 1000], 100)       # the defaults: 0.98 -> 0.97
    assert (c.slots, c.evict_above, c.evict_to, c.batch) == (1000, 980, 970, 1024)
    assert StoreSim.pool_slots([640, 640 + 63], 100) == 10


@pytest.mark.parametrize("fraction", [0.8, 0.85, 0.9, 0.95, 1.0, 0.1])
def test_slots_below_is_the_masters_float_comparison(fraction: float) -> None:
    for asize in (64, 128, 65536, 100032):
        for slots in (1, 7, 10, 100, 11765, 2942):
            cap = slots * asize
            k = slots_below(fraction, cap, asize)
            assert k * asize <= fraction * cap        # not above the watermark
            assert (k + 1) * asize > fraction * cap   # one more would be


def test_sizing_makes_the_mean_occupancy_the_capacity() -> None:
    sz = Sizing(10000, 64 << 10, high=0.9, low=0.8)
    assert sz.asize == 65536 and sz.slots_per_node == 11765
    assert sz.dram_per_node == 11765 * 65536 and sz.pool_bytes == sz.dram_per_node
    four = Sizing(10000, 64 << 10, nodes=4, high=0.9, low=0.8)
    assert four.slots_per_node == 2942 and four.pool_bytes == 4 * 2942 * 65536
    assert Sizing(10000, 64 << 10).slots_per_node == 10257   # defaults 0.98/0.97
    odd = Sizing(1000, 100_000)
    assert odd.asize == 100_032 and odd.dram_per_node % 64 == 0

    # A long random workload: the store's sawtooth averages the capacity asked for.
    rng = random.Random(7)
    sz = Sizing(2000, 4096, high=0.9, low=0.8)
    c = StoreSim.watermark([sz.dram_per_node], 4096, high=0.9, low=0.8)
    for _ in range(30000):
        c.request([rng.randrange(50000) for _ in range(rng.randint(1, 4))])
    assert c.stats.held_mean is not None
    assert abs(c.stats.held_mean - 2000) / 2000 < 0.02
    assert c.evict_to is not None and c.evict_above is not None
    assert c.evict_to <= c.stats.held_min and c.stats.held_max <= c.evict_above


# -- the mirror against the master's core ---------------------------------------------------


def _trace(seed: int, n: int) -> list[list[int]]:
    """Conversation-like requests: shared system prompts, growing multi-turn prefixes."""
    rng = random.Random(seed)
    next_id = 0
    convs: list[list[int]] = []
    out: list[list[int]] = []
    for _ in range(n):
        if convs and rng.random() < 0.6:
            conv = rng.choice(convs)
            grow = [next_id + i for i in range(rng.randint(1, 6))]
            next_id += len(grow)
            conv += grow
            out.append(list(conv))
        else:
            head = [rng.randrange(3) * 10**9]       # one of three system prompts
            body = [next_id + i for i in range(rng.randint(1, 12))]
            next_id += len(body)
            conv = head + body
            convs.append(conv)
            if len(convs) > 60:
                convs.pop(rng.randrange(len(convs)))
            out.append(list(conv))
    return out


@pytest.mark.parametrize(("nodes", "seg_kib", "size", "high", "low", "batch"), [
    (1, 160, 1000, 0.9, 0.8, 1024),
    (1, 97, 4096, 0.9, 0.8, 1024),   # requests larger than the watermark gap: the tick matters
    (1, 30, 1000, 0.9, 0.8, 1024),   # requests larger than the store: STORE_FULL
    (4, 40, 1000, 0.9, 0.8, 1024),
    (4, 8, 1000, 0.9, 0.8, 1024),
    (3, 20, 3000, 0.9, 0.8, 1024),
    (2, 50, 1000, 0.95, 0.5, 1024),
    (1, 160, 1000, 0.98, 0.97, 1024),  # the defaults: the pool stays near full
    (2, 97, 1000, 0.98, 0.97, 1024),
    (1, 160, 1000, 0.9, 0.5, 3),       # rounds cut short by evict_batch
    (4, 40, 1000, 0.98, 0.9, 2),
])
def test_mirror_matches_the_master_core_request_by_request(
        nodes: int, seg_kib: int, size: int, high: float, low: float, batch: int) -> None:
    """Drive MasterCore as bench/replay.py drives the store (lookup with a lease, put the
    rest, release) and StoreSim.watermark over the same segments: same hits, same
    evictions, same failed puts. A change of the master's eviction or lookup policy
    fails here."""
    clock = ManualClock()
    core = MasterCore(CoreConfig(evict_high=high, evict_low=low, evict_batch=batch), clock)
    segs = [seg_kib * 1024 + 8 * i for i in range(nodes)]
    for i, seg in enumerate(segs):
        core.mount_segment(f"n{i}", f"127.0.0.1:{16000 + i}", (i + 1) << 36, seg)
    sim = StoreSim.watermark(segs, size, high=high, low=low, batch=batch)
    failed = 0
    evictions0 = core.stats().evictions
    for req in _trace(seed=nodes * 1000 + seg_kib, n=1500):
        keys = [b"%d" % h for h in req]
        clock.advance(0.01)
        lk = core.lookup(keys, lease_ttl=30)
        rest = keys[lk.count:]
        if rest:
            started = core.put_start(rest, [size] * len(rest), [1] * len(rest))
            failed += sum(r.code == Code.STORE_FULL for r in started)
            core.put_end([k for k, r in zip(rest, started, strict=True) if r.code == Code.OK])
        if lk.lease_id:
            core.release_lease(lk.lease_id)
        core.tick()
        assert lk.count == sim.request(keys), "hit counts diverged"
    st = core.stats()
    assert st.evictions - evictions0 == sim.stats.evictions > 0
    assert st.objects_complete == sim.count
    assert failed == sim.stats.put_failures


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_default_policy_is_within_half_a_point_of_a_plain_lru_of_the_whole_pool(
        seed: int) -> None:
    """The store's default marks keep the pool near full: its mirror's block hit rate is
    within 0.5 points of a plain LRU as large as the whole pool, and closer to it than
    the old 0.90 -> 0.80 marks."""
    trace = _trace(seed=seed, n=6000)
    segs = [2000 * 1024]
    lru = StoreSim.lru(StoreSim.pool_slots(segs, 1000))
    ours = StoreSim.watermark(segs, 1000)
    old = StoreSim.watermark(segs, 1000, high=0.9, low=0.8)
    for req in trace:
        lru.request(req)
        ours.request(req)
        old.request(req)
    gap = 100 * (lru.stats.block_hit_rate - ours.stats.block_hit_rate)
    assert ours.stats.evictions > 1000 and 0 <= gap <= 0.5
    assert lru.stats.block_hit_rate - old.stats.block_hit_rate > gap / 100
    # The pool stays in its band: never below the low mark less one round.
    assert ours.evict_to is not None and ours.batch is not None and ours.evict_above is not None
    assert ours.evict_to - ours.batch <= ours.stats.held_min
    assert ours.stats.held_max <= ours.evict_above
