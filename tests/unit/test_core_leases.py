"""Lookup pins, leases and their verbs: the promise that a positive lookup holds."""

from __future__ import annotations

import math

import pytest

from kvstore.errors import Code, InvalidArgument, LeaseExpired, LeaseNotFound
from kvstore.master.core import CoreConfig, ManualClock, MasterCore

MiB = 1 << 20


def make(nodes: int = 1, seg_size: int = MiB, **cfg: object) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**cfg), clock)  # type: ignore[arg-type]
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"127.0.0.1:{15000 + i}", (i + 1) << 32, seg_size)
    return core, clock


def ks(n: int, prefix: bytes = b"k") -> list[bytes]:
    return [prefix + b"%05d" % i for i in range(n)]


def put(core: MasterCore, keys: list[bytes], size: int = 1024) -> None:
    rs = core.put_start(keys, [size] * len(keys), [7] * len(keys))
    assert all(r.code == Code.OK for r in rs)
    assert core.put_end(keys) == [Code.OK] * len(keys)


def pins(core: MasterCore, keys: list[bytes]) -> list[int]:
    out = []
    for k in keys:
        info = core.inspect(k)
        out.append(-1 if info is None else info.pins)
    return out


def test_lookup_pins_exactly_the_contiguous_prefix() -> None:
    core, _ = make()
    keys = ks(10)
    put(core, keys[:4] + keys[5:])  # a hole at 4
    r = core.lookup(keys, holder="sched-1")
    assert r.count == 4 and r.lease_id == 1 and r.expires_at == 1030.0
    assert pins(core, keys) == [1, 1, 1, 1, -1, 0, 0, 0, 0, 0]
    st = core.stats()
    assert (st.lookups, st.lookup_keys, st.hit_keys, st.active_leases) == (1, 10, 4, 1)
    assert st.pool_pinned == 4 * 1024


def test_a_pending_key_ends_the_prefix() -> None:
    core, _ = make()
    put(core, [b"a"])
    core.put_start([b"b"], [10], [0])
    put(core, [b"c"])
    assert core.lookup([b"a", b"b", b"c"]).count == 1


def test_a_miss_grants_no_lease() -> None:
    core, _ = make()
    put(core, [b"a"])
    r = core.lookup([b"x", b"a"])
    assert (r.count, r.lease_id, r.expires_at) == (0, 0, 0.0)
    assert core.lookup([]).count == 0
    st = core.stats()
    assert (st.active_leases, st.leases_granted, st.pool_pinned) == (0, 0, 0)


def test_lookup_accepts_bytearray_and_refuses_non_keys() -> None:
    core, _ = make()
    put(core, [b"a", b"b"])
    assert core.lookup([bytearray(b"a"), b"b"]).count == 2  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        core.lookup([b"a", ["not", "a", "key"]])  # type: ignore[list-item]


def test_repeated_key_in_prefix_is_pinned_per_position() -> None:
    core, _ = make()
    put(core, [b"a", b"b"])
    r = core.lookup([b"a", b"a", b"b"])
    assert r.count == 3 and pins(core, [b"a", b"b"]) == [2, 1]
    core.release_lease(r.lease_id, keep_first_n=1)
    assert pins(core, [b"a", b"b"]) == [1, 0]
    core.release_lease(r.lease_id)
    assert pins(core, [b"a", b"b"]) == [0, 0]


def test_ttl_default_custom_and_bounds() -> None:
    core, _ = make(default_lease_ttl=30.0, max_lease_ttl=300.0)
    put(core, [b"a"])
    assert core.lookup([b"a"]).expires_at == 1030.0
    assert core.lookup([b"a"], lease_ttl=5).expires_at == 1005.0
    assert core.lookup([b"a"], lease_ttl=300).expires_at == 1300.0
    before = core.stats()
    for bad in (300.5, 0, -1, math.nan, math.inf):
        with pytest.raises(InvalidArgument):
            core.lookup([b"a"], lease_ttl=bad)
        with pytest.raises(InvalidArgument):
            core.get_replicas([b"a"], lease_ttl=bad)
        with pytest.raises(InvalidArgument):
            core.renew_lease(1, ttl=bad)
    assert core.stats() == before


def test_lease_expires_at_ttl_and_unpins_on_tick() -> None:
    core, clock = make()
    put(core, [b"a", b"b"])
    r = core.lookup([b"a", b"b"], lease_ttl=10)
    clock.advance(9.999)
    assert core.tick().expired_leases == 0
    assert core.get_replicas([b"a"], lease_id=r.lease_id).results[0].code == Code.OK
    clock.advance(0.001)
    # Dead at its deadline even though no tick has reaped it yet.
    before = core.stats()
    with pytest.raises(LeaseExpired):
        core.renew_lease(r.lease_id)
    with pytest.raises(LeaseExpired):
        core.get_replicas([b"a"], lease_id=r.lease_id)
    with pytest.raises(LeaseExpired):
        core.release_lease(r.lease_id)
    assert core.stats() == before
    assert pins(core, [b"a", b"b"]) == [1, 1]

    assert core.tick().expired_leases == 1
    assert pins(core, [b"a", b"b"]) == [0, 0]
    st = core.stats()
    assert (st.active_leases, st.leases_expired, st.pool_pinned) == (0, 1, 0)
    # Still reported as expired (not merely unknown) after the reaping.
    with pytest.raises(LeaseExpired) as err:
        core.renew_lease(r.lease_id)
    assert type(err.value) is LeaseExpired


def test_renew_extends() -> None:
    core, clock = make()
    put(core, [b"a"])
    r = core.lookup([b"a"], lease_ttl=10)
    clock.advance(8)
    assert core.renew_lease(r.lease_id, ttl=10) == 1018.0
    clock.advance(5)
    assert core.tick().expired_leases == 0
    g = core.get_replicas([b"a"], lease_id=r.lease_id)
    assert g.expires_at == 1018.0 and g.results[0].code == Code.OK
    assert core.renew_lease(r.lease_id) == 1043.0  # default ttl from now
    clock.advance(30)
    assert core.tick().expired_leases == 1
    assert pins(core, [b"a"]) == [0]


def test_many_renewals_keep_the_expiry_heap_bounded() -> None:
    core, clock = make()
    put(core, [b"a"])
    r = core.lookup([b"a"], lease_ttl=10)
    for _ in range(5000):
        clock.advance(0.001)
        core.renew_lease(r.lease_id, ttl=10)
    assert len(core._state.leases._heap) < 2000
    clock.advance(10)
    assert core.tick().expired_leases == 1


def test_release_keep_first_n_unpins_only_the_tail() -> None:
    core, _ = make()
    keys = ks(8)
    put(core, keys)
    r = core.lookup(keys)
    core.release_lease(r.lease_id, keep_first_n=3)
    assert pins(core, keys) == [1, 1, 1, 0, 0, 0, 0, 0]
    g = core.get_replicas([keys[1], keys[5]], lease_id=r.lease_id)
    assert [x.code for x in g.results] == [Code.OK, Code.LEASE_NOT_FOUND]
    core.release_lease(r.lease_id, keep_first_n=5)  # more than it holds: no change
    assert pins(core, keys) == [1, 1, 1, 0, 0, 0, 0, 0]
    before = core.stats()
    with pytest.raises(InvalidArgument):
        core.release_lease(r.lease_id, keep_first_n=-1)
    assert core.stats() == before
    core.release_lease(r.lease_id)
    assert pins(core, keys) == [0] * 8
    st = core.stats()
    assert (st.active_leases, st.leases_released, st.pool_pinned) == (0, 1, 0)


def test_keep_first_zero_leaves_an_empty_live_lease() -> None:
    core, _ = make()
    put(core, [b"a"])
    r = core.lookup([b"a"])
    core.release_lease(r.lease_id, keep_first_n=0)
    assert pins(core, [b"a"]) == [0]
    assert core.stats().active_leases == 1
    core.release_lease(r.lease_id)  # the connector's later release still works
    assert core.stats().active_leases == 0


def test_release_twice_and_unknown_ids_are_lease_not_found() -> None:
    core, _ = make()
    put(core, [b"a"])
    r = core.lookup([b"a"])
    core.release_lease(r.lease_id)
    before = core.stats()
    for call in (
        lambda: core.release_lease(r.lease_id),
        lambda: core.release_lease(999),
        lambda: core.renew_lease(999),
        lambda: core.get_replicas([b"a"], lease_id=999),
        lambda: core.release_lease(999, keep_first_n=1),
    ):
        with pytest.raises(LeaseNotFound):
            call()
    assert core.stats() == before


def test_several_leases_pin_the_same_object() -> None:
    core, _ = make()
    put(core, [b"a", b"b"])
    r1 = core.lookup([b"a", b"b"])
    r2 = core.lookup([b"a"])
    assert r1.lease_id != r2.lease_id and pins(core, [b"a", b"b"]) == [2, 1]
    core.release_lease(r1.lease_id)
    assert pins(core, [b"a", b"b"]) == [1, 0]
    assert core.evict_to(0.0).evicted == 1  # b only; a is still pinned by r2
    assert core.exists([b"a", b"b"]) == [True, False]
    core.release_lease(r2.lease_id)
    assert core.evict_to(0.0).evicted == 1


def test_get_replicas_under_a_lease_reads_only_its_keys() -> None:
    core, _ = make()
    put(core, [b"a", b"b", b"c"])
    r = core.lookup([b"a", b"b"])
    g = core.get_replicas([b"b", b"c", b"zz", b""], lease_id=r.lease_id)
    assert g.lease_id == r.lease_id and g.expires_at == r.expires_at
    assert [x.code for x in g.results] == [
        Code.OK,
        Code.LEASE_NOT_FOUND,
        Code.LEASE_NOT_FOUND,
        Code.INVALID_ARGUMENT,
    ]
    ok = g.results[0]
    assert (ok.size, ok.checksum, len(ok.locations)) == (1024, 7, 1)
    assert core.stats().active_leases == 1  # no new lease


def test_get_replicas_without_a_lease_pins_what_it_returns() -> None:
    core, clock = make()
    put(core, [b"a", b"b"])
    core.put_start([b"p"], [10], [0])
    g = core.get_replicas([b"a", b"x", b"p", b"b"], lease_ttl=12, holder="reader")
    assert [x.code for x in g.results] == [Code.OK, Code.NOT_FOUND, Code.NOT_FOUND, Code.OK]
    assert g.lease_id != 0 and g.expires_at == clock.now() + 12
    assert pins(core, [b"a", b"b"]) == [1, 1]
    again = core.get_replicas([b"a", b"b"], lease_id=g.lease_id)
    assert [x.locations for x in again.results] == [g.results[0].locations, g.results[3].locations]
    none = core.get_replicas([b"x"])
    assert (none.lease_id, none.expires_at) == (0, 0.0)
    assert none.results[0].code == Code.NOT_FOUND


def test_an_unpinned_read_answers_like_a_pinned_one_but_grants_nothing() -> None:
    core, _ = make()
    put(core, [b"a", b"b"])
    core.put_start([b"p"], [10], [0])
    pinned = core.get_replicas([b"a", b"x", b"p", b"b"])
    core.release_lease(pinned.lease_id)
    before = core.stats()
    g = core.get_replicas([b"a", b"x", b"p", b"b"], pin=False)
    assert (g.lease_id, g.expires_at) == (0, 0.0)
    assert g.results == pinned.results  # codes, sizes, checksums, locations, placements
    assert pins(core, [b"a", b"b"]) == [0, 0]
    after = core.stats()
    assert (after.active_leases, after.pool_pinned) == (before.active_leases, 0)
    # Nothing pinned: the objects stay evictable, and a forced remove is no lease failure.
    assert core.remove([b"a"]) == [Code.OK]


def test_an_unpinned_read_makes_the_object_the_most_recently_used() -> None:
    core, clock = make()
    put(core, [b"a", b"b", b"c"])
    clock.advance(1)
    core.get_replicas([b"a"], pin=False)  # a was the oldest; now b is
    assert core.inspect(b"a").last_access == clock.now()  # type: ignore[union-attr]
    assert core.evict_to(0.0, limit=1).evicted == 1
    assert core.exists([b"a", b"b", b"c"]) == [True, False, True]
    # One pinned meanwhile stays off the LRU: the unpinned read does not put it back.
    r = core.lookup([b"c"])
    core.get_replicas([b"c"], pin=False)
    assert core.evict_to(0.0).evicted == 1  # a only
    assert core.exists([b"a", b"c"]) == [False, True] and pins(core, [b"c"]) == [1]
    core.release_lease(r.lease_id)
    assert core.evict_to(0.0).evicted == 1


def test_an_unpinned_read_under_a_lease_reads_under_the_lease() -> None:
    core, _ = make()
    put(core, [b"a", b"b"])
    r = core.lookup([b"a"])
    g = core.get_replicas([b"a", b"b"], lease_id=r.lease_id, pin=False)
    assert g.lease_id == r.lease_id
    assert [x.code for x in g.results] == [Code.OK, Code.LEASE_NOT_FOUND]


def test_lease_ids_start_where_configured() -> None:
    core, _ = make(first_lease_id=(7 << 40) + 1)
    put(core, [b"a"])
    assert core.lookup([b"a"]).lease_id == (7 << 40) + 1
    assert core.lookup([b"a"]).lease_id == (7 << 40) + 2


def test_expiry_unpins_a_bounded_round_at_a_time() -> None:
    """Leases nobody released, due together, are reaped a round at a time (at most
    EXPIRE_PINS pins each): the daemon runs requests between rounds. Each is dead at
    its deadline whether or not a round has reaped it yet, and every pin comes back."""
    from kvstore.master.core.pins import EXPIRE_PINS

    core, clock = make(seg_size=64 * MiB)
    keys = ks(256)
    put(core, keys)
    n = 2 * EXPIRE_PINS // len(keys) + 3  # more than two rounds' worth
    leases = [core.lookup(keys, lease_ttl=5, holder=f"h{i}") for i in range(n)]
    assert all(r.count == len(keys) for r in leases)
    clock.advance(5)
    per_round = EXPIRE_PINS // len(keys)
    report = core.tick()
    assert (report.expired_leases, report.leases_due) == (per_round, True)
    with pytest.raises(LeaseExpired):  # not reaped yet, and dead all the same
        core.renew_lease(leases[-1].lease_id)
    assert pins(core, keys[:1]) == [n - per_round]
    rounds = [core.expire_leases() for _ in range(2)]
    assert rounds == [(per_round, True), (n - 2 * per_round, False)]
    st = core.stats()
    assert (st.active_leases, st.leases_expired, st.pool_pinned) == (0, n, 0)
    assert pins(core, keys) == [0] * len(keys)
    assert core.expire_leases() == (0, False)


def test_the_daemon_serves_between_rounds_of_expiry() -> None:
    """expire_in_rounds yields to the loop before each round: a task queued meanwhile
    (a request) runs while leases are still being reaped."""
    import asyncio

    from kvstore.master.core.pins import EXPIRE_PINS
    from kvstore.master.daemon import expire_in_rounds

    core, clock = make(seg_size=64 * MiB)
    keys = ks(256)
    put(core, keys)
    n = 3 * EXPIRE_PINS // len(keys)
    for i in range(n):
        core.lookup(keys, lease_ttl=5, holder=f"h{i}")
    clock.advance(5)
    seen: list[int] = []

    async def request() -> None:
        for _ in range(4):
            seen.append(core.stats().active_leases)
            await asyncio.sleep(0)

    async def main() -> int:
        served = asyncio.ensure_future(request())
        expired = await expire_in_rounds(core)
        await served
        return expired

    assert asyncio.run(main()) == n
    assert core.stats().active_leases == 0 and core.stats().pool_pinned == 0
    assert any(0 < left < n for left in seen), seen  # it ran between two rounds
