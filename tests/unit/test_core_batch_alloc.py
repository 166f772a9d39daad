"""put_start's batch path (BatchPut.put, batch_put.py) against the one-key-at-a-time path.

The batch path places a whole batch with a few allocator calls per segment; it must be
indistinguishable from _put_each: the same result for every key (codes, messages,
locations, placements), and afterwards the same allocator extents, object table, pending
writes and counters. These tests drive two cores through the same random operations, one
of them with the batch path switched off, and compare everything after every call.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from kvstore.errors import Code, Internal
from kvstore.master.core import CoreConfig, Location, ManualClock, MasterCore
from kvstore.master.core.allocator import ExtentAllocator
from kvstore.master.core.objects import ObjectTable
from kvstore.master.core.results import location as _location
from kvstore.master.core.segments import OFFSET_BITS, OFFSET_MASK
from tests.unit.test_core_invariants import Watched

KiB = 1024


# -- the allocator's batch verbs -------------------------------------------------------


def fragmented(rng: random.Random, cap: int = 1 << 20) -> tuple[ExtentAllocator, dict[int, int]]:
    a = ExtentAllocator(cap, 64)
    live: dict[int, int] = {}
    for _ in range(rng.randrange(0, 400)):
        if live and rng.random() < 0.45:
            o = rng.choice(list(live))
            a.free(o, live.pop(o))
        else:
            n = rng.choice([64, 100, 640, 1000, 4096, 5000, 30_000])
            o = a.allocate(n)
            if o >= 0:
                live[o] = n
    return a, live


def state(a: ExtentAllocator) -> tuple[Any, ...]:
    return (list(a._by_offset.items()), list(a._by_size), a.free_bytes)


def clone(a: ExtentAllocator) -> ExtentAllocator:
    b = ExtentAllocator(a.capacity, a.alignment)
    b._by_offset = a._by_offset.copy()
    b._by_size = a._by_size.copy()
    b.free_bytes = a.free_bytes
    return b


@pytest.mark.parametrize("seed", range(200))
def test_allocate_run_is_exactly_repeated_allocate(seed: int) -> None:
    rng = random.Random(seed)
    a, _ = fragmented(rng)
    b = clone(a)
    for _ in range(5):
        size = rng.choice([1, 64, 65, 640, 1000, 4096, 30_000, 200_000])
        count = rng.randrange(0, 80)
        one_by_one = [a.allocate(size) for _ in range(count)]
        assert b.allocate_run(size, count) == one_by_one
        assert state(b) == state(a)


@pytest.mark.parametrize("seed", range(200))
def test_free_many_is_exactly_repeated_free(seed: int) -> None:
    rng = random.Random(seed)
    a, live = fragmented(rng)
    # Add a run of adjacent ranges, the usual shape of a batch freed together.
    for o in a.allocate_run(4096, rng.randrange(0, 40)):
        if o >= 0:
            live[o] = 4096
    b = clone(a)
    gone = rng.sample(sorted(live.items()), rng.randrange(0, len(live) + 1))
    for o, n in gone:
        a.free(o, n)
    b.free_many(gone)
    assert state(b) == state(a)


def test_free_many_detects_double_frees() -> None:
    a = ExtentAllocator(64 * 10, 64)
    offs = a.allocate_run(64, 4)
    assert offs == [0, 64, 128, 192]
    with pytest.raises(Internal):
        a.free_many([(64, 64), (64, 64)])
    b = ExtentAllocator(64 * 10, 64)
    b.allocate_run(64, 4)
    with pytest.raises(Internal):
        b.free_many([(0, 64), (256, 64)])  # 256 was never allocated: already free


def test_location_helper_builds_equal_locations() -> None:
    loc = _location("n1", "seg", 123, 456, "dram")
    assert loc == Location("n1", "seg", 123, 456, "dram")
    assert hash(loc) == hash(Location("n1", "seg", 123, 456, "dram"))
    with pytest.raises(AttributeError):
        loc.addr = 1  # type: ignore[misc]  # still frozen


# -- put_start: batch path against the general path -------------------------------------


def core_state(core: MasterCore) -> dict[str, Any]:
    t = core._state.objects
    segs = {
        sid: (list(seg.alloc._by_offset.items()), list(seg.alloc._by_size), seg.alloc.free_bytes,
              seg.replicas)
        for sid, seg in core._state.segments.by_id.items()
    }
    return {
        "segs": segs,
        "index": dict(t.index),
        "key_of": list(t.key_of),
        "cols": [list(c) for c in (t.size, t.checksum, t.where, t.space, t.phase, t.pins, t.gen,
                                   t.placed, t.created, t.touched)],
        "placements": t.placements,
        "extra": dict(t.extra),
        "pending": [(s, p.writer, p.deadline) for s, p in t.pending.items()],
        "free_slots": list(t._free_slots),
        "lru": (list(core._state.lru.prev), list(core._state.lru.next), len(core._state.lru)),
        "space": (core._state.ledger.pending, core._state.ledger.pending_size,
                  core._state.ledger.complete_size, core._state.ledger.pinned),
        "failures": dict(core._state.counts.put_failures),
        "events": [(e.kind, list(e.keys), e.bytes) for e in core.take_events()],
        "evictions": (core._state.counts.evictions, core._state.counts.evicted_bytes,
                      core._state.counts.blocked),
    }


def check_free_extents(core: MasterCore) -> None:
    """Every segment's free extents are exactly the coalesced gaps between the ranges its
    live objects hold, and those held for a writer: nothing freed twice, nothing lost
    (deferred frees included)."""
    t = core._state.objects
    held: dict[int, list[tuple[int, int]]] = {sid: [] for sid in core._state.segments.by_id}
    for s in t.index.values():
        for h in t.handles(s):
            seg = core._state.segments.by_id[h >> OFFSET_BITS]
            off = h & OFFSET_MASK
            held[seg.seg_id].append((off, off + seg.alloc.round_up(t.size[s])))
    # Ranges a writer may still be writing after its object went (quarantine.py).
    for seg, off, n in core._state.quarantine.ranges():
        held[seg.seg_id].append((off, off + seg.alloc.round_up(n)))
    for sid, spans in held.items():
        alloc = core._state.segments.by_id[sid].alloc
        spans.sort()
        gaps: list[tuple[int, int]] = []
        at = 0
        for start, end in spans:
            assert start >= at, "overlapping replicas"
            if start > at:
                gaps.append((at, start - at))
            at = end
        if at < alloc.capacity:
            gaps.append((at, alloc.capacity - at))
        assert list(alloc._by_offset.items()) == gaps
        assert sorted((n, o) for o, n in gaps) == list(alloc._by_size)
        assert alloc.free_bytes == sum(n for _, n in gaps)


def results(rs: list[Any]) -> list[Any]:
    return [(r.code, r.message, r.placement, list(r.locations)) for r in rs]


class Twins:
    """Two cores fed the same calls: `fast` as shipped, `slow` without the batch path."""

    def __init__(self, rng: random.Random, quotas: bool = False) -> None:
        self.rng = rng
        self.batched = 0
        cfg = CoreConfig(evict_high=0.9, evict_low=0.7, max_replicas=3)
        self.fast = MasterCore(cfg, ManualClock())
        self.slow = MasterCore(cfg, ManualClock())
        self.slow._batch.put = lambda *a, **k: None  # type: ignore[method-assign]
        real = self.fast._batch.put

        def counting(*a: Any, **k: Any) -> Any:
            r = real(*a, **k)
            self.batched += r is not None
            return r

        self.fast._batch.put = counting  # type: ignore[method-assign]
        self.watch = Watched(self.fast)
        nodes = rng.randrange(1, 4)
        for i in range(nodes):
            size = rng.choice([64 * KiB, 200 * KiB, 1 << 20, 8 << 20])
            for c in (self.fast, self.slow):
                c.mount_segment(f"n{i}", f"seg{i}", (i + 1) << 32, size)
        if quotas:
            for c in (self.fast, self.slow):
                c.set_quotas({b"t/": 300 * KiB})
        self.keys = [f"k{i}".encode() for i in range(60)] + [f"t/k{i}".encode() for i in range(20)]

    def both(self, name: str, *args: Any, **kw: Any) -> Any:
        a = getattr(self.watch, name)(*args, **kw)  # held to the lifecycle table too
        b = getattr(self.slow, name)(*args, **kw)
        if name == "put_start":
            assert results(a) == results(b)
        else:
            assert a == b
        assert core_state(self.fast) == core_state(self.slow)
        check_free_extents(self.fast)
        return a

    def random_key(self) -> Any:
        r = self.rng.random()
        if r < 0.02:
            return b""  # invalid
        if r < 0.04:
            return bytearray(self.rng.choice(self.keys))  # not bytes, but a key
        if r < 0.05:
            return "text"  # invalid type
        return self.rng.choice(self.keys)

    def random_size(self, base: int) -> Any:
        r = self.rng.random()
        if r < 0.02:
            return 0
        if r < 0.03:
            return 1 << 40  # larger than any segment
        if r < 0.04:
            return self.rng.choice([1.5, True])
        if r < 0.15:
            return self.rng.choice([1, 100, 4 * KiB, 17 * KiB, 64 * KiB])
        return base

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        if op < 0.5:
            n = rng.randrange(0, 40)
            base = rng.choice([64, 1000, 4 * KiB, 16 * KiB, 64 * KiB])
            keys = [self.random_key() for _ in range(n)]
            sizes = [self.random_size(base) for _ in range(n)]
            checksums = [rng.choice([1, 2, -1, True]) if rng.random() < 0.03 else 1
                         for _ in range(n)]
            writer = rng.choice(["", "w", "w", "v"])
            replicas = rng.choice([None, None, 1, 2, 3])
            self.both("put_start", keys, sizes, checksums, replicas=replicas, writer=writer)
        elif op < 0.75:
            keys = rng.sample(self.keys, rng.randrange(0, 30))
            self.both("put_end", keys, writer=rng.choice(["", "w"]))
        elif op < 0.85:
            keys = rng.sample(self.keys, rng.randrange(0, 30))
            self.both("remove", keys, force=rng.random() < 0.3)
        elif op < 0.9:
            self.both("put_revoke", rng.sample(self.keys, rng.randrange(0, 10)))
        elif op < 0.95:
            got = self.both("lookup", rng.sample(self.keys, 5))
            if got.lease_id and rng.random() < 0.5:
                self.both("release_lease", got.lease_id)
        else:
            dt = rng.choice([0.1, 5.0, 40.0])
            for c in (self.fast, self.slow):
                c.clock.advance(dt)  # type: ignore[attr-defined]
            self.both("tick")


@pytest.mark.parametrize("seed", range(60))
def test_batch_path_matches_the_general_path(seed: int) -> None:
    twins = Twins(random.Random(seed))
    for _ in range(150):
        twins.step()


def test_batch_path_runs_in_these_tests() -> None:
    batched = 0
    for seed in range(10):
        twins = Twins(random.Random(seed))
        for _ in range(100):
            twins.step()
        batched += twins.batched
    assert batched > 100


@pytest.mark.parametrize("seed", range(10))
def test_quotas_take_the_general_path(seed: int) -> None:
    twins = Twins(random.Random(seed), quotas=True)
    for _ in range(100):
        twins.step()
    assert twins.batched == 0


def test_same_size_batch_on_one_node_is_contiguous_and_distinct() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 64 << 20)
    keys = [f"k{i}".encode() for i in range(32)]
    got = core.put_start(keys, [64 * KiB] * 32, list(range(32)))
    assert [r.code for r in got] == [Code.OK] * 32
    addrs = [r.locations[0].addr for r in got]
    assert addrs == [(1 << 32) + i * 64 * KiB for i in range(32)]
    assert len({r.placement for r in got}) == 32


def test_two_nodes_alternate_and_replicas_land_on_distinct_nodes() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 64 << 20)
    core.mount_segment("n1", "seg1", 1 << 33, 64 << 20)
    keys = [f"k{i}".encode() for i in range(8)]
    got = core.put_start(keys, [4 * KiB] * 8, [1] * 8)
    assert [r.locations[0].node_id for r in got] == ["n0", "n1"] * 4
    keys2 = [f"r{i}".encode() for i in range(8)]
    got2 = core.put_start(keys2, [4 * KiB] * 8, [1] * 8, replicas=2)
    for r in got2:
        assert sorted(loc.node_id for loc in r.locations) == ["n0", "n1"]
    spans = sorted(
        (loc.addr, loc.addr + loc.size) for r in itertools.chain(got, got2) for loc in r.locations)
    assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(spans))


def test_a_full_store_falls_back_and_evicts_like_before() -> None:
    twins = Twins(random.Random(1))
    for c in (twins.fast, twins.slow):
        for nid in c.node_ids():
            c.unmount_node(nid)
        c.mount_segment("n0", "seg0", 1 << 32, 256 * KiB)
    for r in range(10):
        keys = [f"f{r}-{i}".encode() for i in range(6)]
        twins.both("put_start", keys, [16 * KiB] * 6, [1] * 6)
        twins.both("put_end", keys)
    # The batch that no longer fits whole is placed by the general path, which evicts.
    keys = [f"big{i}".encode() for i in range(12)]
    got = twins.both("put_start", keys, [16 * KiB] * 12, [1] * 12)
    assert all(r.code == Code.OK for r in got)
    assert twins.fast._state.counts.evictions > 0


def test_eviction_and_remove_free_every_range() -> None:
    core = MasterCore(CoreConfig(evict_high=0.9, evict_low=0.5), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    core.mount_segment("n1", "seg1", 1 << 33, 1 << 20)
    rng = random.Random(5)
    for r in range(200):
        keys = [f"k{r}-{i}".encode() for i in range(rng.randrange(1, 20))]
        sizes = [rng.choice([100, 4 * KiB, 9 * KiB, 16 * KiB]) for _ in keys]
        core.put_start(keys, sizes, [1] * len(keys), replicas=rng.choice([1, 2]))
        core.put_end(keys)
        check_free_extents(core)
        if r % 7 == 0:
            live = core.keys(limit=10**6)
            core.remove(rng.sample(live, min(10, len(live))))
            check_free_extents(core)
    assert core._state.counts.evictions > 100
    core.evict_to(0.0)
    check_free_extents(core)
    assert core.stats().pool_used == 0


def table_state(t: ObjectTable) -> list[Any]:
    return [dict(t.index), list(t.key_of), t.placements, list(t._free_slots)] + [
        list(c) for c in (t.size, t.checksum, t.where, t.space, t.phase, t.pins, t.gen, t.placed,
                          t.created, t.touched)]


@pytest.mark.parametrize("seed", range(100))
def test_new_many_is_exactly_repeated_new(seed: int) -> None:
    """Slots reused in runs (both directions), scattered, or appended: same table."""
    rng = random.Random(seed)
    a, b = ObjectTable(), ObjectTable()
    serial = itertools.count()
    now = 1.0
    for _ in range(30):
        if rng.random() < 0.01:
            a.placements = b.placements = 2**32 - 1 - rng.randrange(5)  # about to wrap
        live = list(a.index.values())
        if live and rng.random() < 0.5:
            # Free some: a run in key order, a run backwards, or scattered.
            how = rng.choice(["run", "backwards", "scattered"])
            live.sort()
            if how == "scattered":
                gone = rng.sample(live, rng.randrange(1, len(live) + 1))
            else:
                i = rng.randrange(len(live))
                gone = live[i:i + rng.randrange(1, 40)]
                if how == "backwards":
                    gone.reverse()
            for s in gone:
                a.free(s)
                b.free(s)
            continue
        n = rng.randrange(1, 40)
        keys = [f"k{next(serial)}".encode() for _ in range(n)]
        sizes = [rng.randrange(1, 1 << 20) for _ in range(n)]
        checksums = [rng.randrange(1 << 64) for _ in range(n)]
        firsts = [rng.randrange(1 << 60) for _ in range(n)]
        spaces = [rng.randrange(1 << 30) for _ in range(n)]
        now += 1.0
        one_by_one = [b.new(k, z, c, (f,), sp, now)
                      for k, z, c, f, sp in zip(keys, sizes, checksums, firsts, spaces, strict=True)]
        assert a.new_many(keys, sizes, checksums, firsts, spaces, now) == one_by_one
        assert table_state(a) == table_state(b)
