"""Eviction: LRU over unpinned COMPLETE objects only, watermarks, and the pin promise."""

from __future__ import annotations

import pytest

from kvstore.errors import Code, InvalidArgument
from kvstore.master.core import CoreConfig, EventKind, ManualClock, MasterCore

KiB = 1 << 10


def make(nodes: int = 1, seg_size: int = 100 * KiB, **cfg: object) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**cfg), clock)  # type: ignore[arg-type]
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"127.0.0.1:{15000 + i}", (i + 1) << 32, seg_size)
    return core, clock


def ks(n: int, prefix: bytes = b"k") -> list[bytes]:
    return [prefix + b"%05d" % i for i in range(n)]


def put(core: MasterCore, keys: list[bytes], size: int = KiB) -> list[list[tuple[int, int]]]:
    rs = core.put_start(keys, [size] * len(keys), [7] * len(keys))
    assert [r.code for r in rs] == [Code.OK] * len(keys), rs[0].message
    assert core.put_end(keys) == [Code.OK] * len(keys)
    return [[(loc.addr, loc.size) for loc in r.locations] for r in rs]


def evicted(core: MasterCore) -> list[bytes]:
    return [k for e in core.take_events() if e.kind == EventKind.EVICTED for k in e.keys]


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def test_pinned_objects_survive_a_flood_that_evicts_everything_else() -> None:
    core, clock = make(seg_size=100 * KiB)
    old = ks(60, b"old")
    put(core, old)
    clock.advance(1)
    pinned = old[10:30]
    lease = core.lookup(pinned, lease_ttl=300)
    assert lease.count == 20
    before = core.get_replicas(pinned, lease_id=lease.lease_id)
    pinned_ranges = [(loc.addr, loc.size) for r in before.results for loc in r.locations]

    flood = ks(400, b"new")
    flood_ranges: list[tuple[int, int]] = []
    for i in range(0, len(flood), 10):
        clock.advance(0.1)
        for locs in put(core, flood[i : i + 10]):
            flood_ranges += locs
        core.tick()

    # Every pinned object is still there, at the same place, and no flood object was
    # ever given any of its bytes.
    after = core.get_replicas(pinned, lease_id=lease.lease_id)
    assert [r.code for r in after.results] == [Code.OK] * 20
    assert [r.locations for r in after.results] == [r.locations for r in before.results]
    assert not any(overlaps(p, f) for p in pinned_ranges for f in flood_ranges)
    assert core.exists(pinned) == [True] * 20

    # The unpinned old objects went first, oldest first, then the flood in its order.
    order = evicted(core)
    unpinned_old = old[:10] + old[30:]
    assert order[: len(unpinned_old)] == unpinned_old
    assert order[len(unpinned_old) :] == flood[: len(order) - len(unpinned_old)]
    assert core.exists(unpinned_old) == [False] * 40
    st = core.stats()
    assert st.pool_pinned == 20 * KiB and st.evictions == len(order)


def test_watermark_eviction_stops_exactly_at_the_low_mark() -> None:
    core, _ = make(seg_size=100 * KiB, evict_high=0.9, evict_low=0.8)
    keys = ks(91)
    put(core, keys[:90])
    assert core.stats().pool_used == 90 * KiB  # at, not above, the high mark
    assert evicted(core) == []
    put(core, keys[90:])  # 91 % > 90 %: evict down to 80 %
    assert evicted(core) == keys[:11]
    assert core.stats().pool_used == 80 * KiB
    assert core.tick().evicted == 0


def test_watermark_eviction_with_uneven_sizes_stops_at_the_first_object_below() -> None:
    core, _ = make(seg_size=1000 * KiB, evict_high=0.9, evict_low=0.5)
    cap = core.stats().pool_capacity
    size_of: dict[bytes, int] = {}
    runs = 0
    for i, k in enumerate(ks(400)):
        size_of[k] = (i * 37 % 13 + 1) * KiB
        assert core.put_start([k], [size_of[k]], [0])[0].code == Code.OK
        core.put_end([k])
        gone = evicted(core)
        if gone:
            runs += 1
            used = core.stats().pool_used
            # Down to the low mark, and not one object further.
            assert used <= 0.5 * cap < used + size_of[gone[-1]]
    assert runs >= 3


def test_tick_evicts_above_the_high_mark() -> None:
    core, clock = make(seg_size=100 * KiB, evict_high=0.9, evict_low=0.5)
    core.hold_eviction_until(clock.now() + 10)
    put(core, ks(95))
    assert core.tick().evicted == 0
    clock.advance(10)
    report = core.tick()
    assert (report.evicted, report.evicted_bytes) == (45, 45 * KiB)
    assert core.stats().pool_used == 50 * KiB
    assert core.tick().evicted == 0


def test_unpin_and_reads_refresh_recency() -> None:
    core, clock = make()
    put(core, [b"a", b"b", b"c", b"d"])
    clock.advance(1)
    r = core.lookup([b"a"])
    core.release_lease(r.lease_id)  # a returns as the most recent
    g = core.get_replicas([b"b"])
    core.release_lease(g.lease_id)
    assert core.exists([b"c"]) == [True]  # exists is not a use
    report = core.evict_to(0.0)
    assert report.evicted == 4 and report.reached and report.used == 0
    assert evicted(core) == [b"c", b"d", b"a", b"b"]


def test_expired_lease_makes_its_objects_evictable_again() -> None:
    core, clock = make()
    put(core, [b"a", b"b"])
    core.lookup([b"a"], lease_ttl=5)
    assert core.evict_to(0.0).evicted == 1
    clock.advance(5)
    core.tick()
    assert core.evict_to(0.0).evicted == 1
    assert evicted(core) == [b"b", b"a"]


def test_allocation_evicts_just_enough_lru_to_fit() -> None:
    core, _ = make(seg_size=100 * KiB, evict_high=1.0, evict_low=0.99)
    put(core, ks(100))
    assert core.stats().pool_used == 100 * KiB
    [r] = core.put_start([b"big"], [3 * KiB], [0])
    assert r.code == Code.OK
    assert evicted(core) == ks(3)
    core.put_end([b"big"])
    assert core.stats().pool_used == 100 * KiB


def test_all_pinned_is_store_full_with_a_sentence() -> None:
    core, _ = make(seg_size=100 * KiB)
    keys = ks(60)
    put(core, keys)
    core.lookup(keys)  # pin 60 KiB
    core.put_start(ks(30, b"p"), [KiB] * 30, [0] * 30)  # 30 KiB pending
    before = core.stats()
    rs = core.put_start(ks(20, b"x"), [KiB] * 20, [0] * 20)
    codes = [r.code for r in rs]
    assert codes[:10] == [Code.OK] * 10 and codes[10:] == [Code.STORE_FULL] * 10
    assert rs[-1].message == (
        f"store full: {60 * KiB} bytes pinned, {40 * KiB} bytes pending, "
        "0 bytes free in the largest free extent"
    )
    st = core.stats()
    assert st.evictions == before.evictions == 0
    assert st.put_failures == {"store_full": 10}
    assert core.exists(keys) == [True] * 60


def test_pending_objects_are_never_evicted() -> None:
    core, _ = make(seg_size=10 * KiB)
    core.put_start(ks(10), [KiB] * 10, [0] * 10)
    assert core.evict_to(0.0).evicted == 0
    assert core.tick().evicted == 0
    assert core.put_end(ks(10)) == [Code.OK] * 10


def test_eviction_visits_only_evictable_objects() -> None:
    # Pinned and PENDING objects are off the LRU list, so evicting one object is O(1)
    # no matter how many cannot be evicted.
    core, _ = make(seg_size=10_000 * KiB)
    many = ks(5000)
    put(core, many, size=64)
    core.lookup(many)
    core.put_start(ks(3000, b"p"), [64] * 3000, [0] * 3000)
    put(core, [b"x", b"y"], size=64)
    assert len(core._state.lru) == 2
    assert core.evict_to(0.0).evicted == 2


def test_hold_eviction_until_after_failover() -> None:
    core, clock = make(seg_size=10 * KiB, evict_high=0.9, evict_low=0.8)
    core.hold_eviction_until(clock.now() + 300)
    put(core, ks(10))
    [r] = core.put_start([b"new"], [KiB], [0])
    assert r.code == Code.STORE_FULL and "held" in r.message
    assert core.tick().evicted == 0
    report = core.evict_to(0.0)
    assert report.held and report.evicted == 0 and not report.reached
    assert core.stats().eviction_held_until == 1300.0
    clock.advance(300)
    assert core.tick().evicted == 2  # down to the low watermark (80 %)
    [r] = core.put_start([b"new"], [KiB], [0])
    assert r.code == Code.OK


def test_evict_to_validates_and_reports() -> None:
    core, _ = make(seg_size=100 * KiB)
    put(core, ks(60))
    core.lookup(ks(20))
    with pytest.raises(InvalidArgument):
        core.evict_to(1.5)
    report = core.evict_to(0.3)
    assert (report.evicted, report.used, report.capacity, report.reached) == (30, 30 * KiB, 100 * KiB, True)
    report = core.evict_to(0.0)
    assert (report.evicted, report.used, report.reached) == (10, 20 * KiB, False)


def test_extra_replicas_are_not_worth_emptying_the_lru_for() -> None:
    core, _ = make(nodes=2, seg_size=10 * KiB, evict_high=1.0, evict_low=0.99)
    keys = ks(20)
    put(core, keys)
    on_n1 = []
    for k in keys:
        info = core.inspect(k)
        assert info is not None
        if info.locations[0].node_id == "n1":
            on_n1.append(k)
            core.lookup([k])  # n1 is all pinned
    assert len(on_n1) == 10
    [r] = core.put_start([b"x"], [KiB], [0], replicas=2)
    assert r.code == Code.OK and [loc.node_id for loc in r.locations] == ["n0"]
    assert len(evicted(core)) == 1
