"""The per-segment extent allocator: alignment, best fit, coalescing, reserve."""

from __future__ import annotations

import itertools
import random

import pytest

from kvstore.errors import Internal
from kvstore.master.core.allocator import ExtentAllocator


def test_offsets_are_aligned_and_capacity_rounds_down() -> None:
    a = ExtentAllocator(1000, 64)
    assert a.capacity == 960
    offs = [a.allocate(n) for n in (1, 63, 64, 65)]
    assert offs == [0, 64, 128, 192]
    assert all(o % 64 == 0 for o in offs)
    assert a.used_bytes == 64 * 5
    assert a.allocate(10_000) == -1


def test_free_coalesces_with_both_neighbours() -> None:
    a = ExtentAllocator(64 * 10, 64)
    offs = [a.allocate(64) for _ in range(10)]
    assert a.allocate(64) == -1 and a.extents() == 0
    a.free(offs[3], 64)
    a.free(offs[5], 64)
    assert a.extents() == 2
    a.free(offs[4], 64)  # bridges 3 and 5
    assert a.extents() == 1 and a.largest_free() == 192
    for o in offs[:3] + offs[6:]:
        a.free(o, 64)
    assert a.extents() == 1 and a.largest_free() == a.capacity == a.free_bytes


def test_best_fit_keeps_large_extents_whole() -> None:
    a = ExtentAllocator(64 * 100, 64)
    offs = [a.allocate(64 * 10) for _ in range(10)]
    a.free(offs[1], 64 * 10)  # a 640-byte hole
    a.free(offs[5], 64 * 10)
    a.free(offs[6], 64 * 10)  # a 1280-byte hole
    assert a.allocate(64 * 10) == offs[1]  # exact fit, not the front of the big hole
    assert a.largest_free() == 64 * 20


def test_double_free_is_detected() -> None:
    a = ExtentAllocator(64 * 4, 64)
    o = a.allocate(64)
    a.free(o, 64)
    with pytest.raises(Internal):
        a.free(o, 64)


def test_reserve_claims_exact_ranges_and_refuses_overlap() -> None:
    a = ExtentAllocator(64 * 10, 64)
    assert a.reserve(128, 100)  # covers [128, 256)
    assert not a.reserve(192, 10)  # inside it
    assert not a.reserve(64, 128)  # straddles its start
    assert not a.reserve(600, 64)  # past the end
    assert not a.reserve(0, 0)
    assert a.used_bytes == 128
    assert a.allocate(64) == 0
    assert a.allocate(64) == 64
    assert a.allocate(64) == 256  # the reserved range was skipped
    a.free(128, 100)
    assert a.allocate(128) == 128


def test_random_churn_to_90_percent_keeps_free_space_usable() -> None:
    rng = random.Random(7)
    cap = 64 << 20
    a = ExtentAllocator(cap, 64)
    live: dict[int, int] = {}
    order: list[int] = []
    # Object sizes from a KV-cache-like mix: mostly block-sized, some odd sizes.
    sizes = [16 << 10, 32 << 10, 64 << 10, 100_000, 256 << 10, 3000]
    # Churn: each step frees a random live object with probability 0.4, else allocates
    # one, so the pool fills to 90 % through many holes of many sizes.
    failed = 0
    while a.used_bytes < 0.9 * cap:
        if order and rng.random() < 0.4:
            i = rng.randrange(len(order))
            order[i], order[-1] = order[-1], order[i]
            o = order.pop()
            a.free(o, live.pop(o))
            continue
        n = rng.choice(sizes)
        o = a.allocate(n)
        if o < 0:
            failed += 1
            continue
        live[o] = n
        order.append(o)
    # No two live ranges overlap and the accounting matches.
    spans = sorted((o, o + a.round_up(n)) for o, n in live.items())
    assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(spans))
    assert a.used_bytes == sum(a.round_up(n) for n in live.values())
    usable = a.largest_free() / a.free_bytes
    print(
        f"\nallocator at {a.used_bytes / cap:.1%} full: free {a.free_bytes} bytes in "
        f"{a.extents()} extents, largest {a.largest_free()} bytes "
        f"({usable:.1%} of free space in one extent); {failed} allocations did not fit"
    )
    # Best fit with coalescing keeps most free bytes in one usable extent.
    assert usable > 0.5
    assert a.largest_free() >= max(sizes)
    for o, n in list(live.items()):
        a.free(o, n)
    assert a.extents() == 1 and a.free_bytes == a.capacity
