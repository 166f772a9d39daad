"""The pin cap (kvstore/master/core/pin_cap.py): a client or a tenant pins at most
pin_share of the DRAM pool; a lookup beyond it reports a shorter prefix, everyone
else's puts keep being accepted, and leases still end at their TTL."""

from __future__ import annotations

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.core.config import with_settings

KiB = 1 << 10


def make(**cfg: object) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**cfg), clock)  # type: ignore[arg-type]
    core.mount_segment("n0", "seg0", 1 << 32, 100 * KiB)
    return core, clock


def ks(n: int, prefix: bytes = b"k", start: int = 0) -> list[bytes]:
    return [prefix + b"%05d" % i for i in range(start, start + n)]


def put(core: MasterCore, keys: list[bytes]) -> list[Code]:
    rs = core.put_start(keys, [KiB] * len(keys), [7] * len(keys))
    ok = [k for k, r in zip(keys, rs, strict=True) if r.code == Code.OK]
    core.put_end(ok)
    return [r.code for r in rs]


def test_a_lookup_beyond_the_cap_reports_the_prefix_that_fits() -> None:
    core, _ = make()
    put(core, ks(90))
    lk = core.lookup(ks(80), lease_ttl=300, holder="a")
    assert lk.count == 50 and lk.lease_id            # half of 100 KiB, 1 KiB each
    st = core.stats()
    assert (st.pin_capped, st.pin_capped_keys) == (1, 30)
    assert core.eviction_stats().pool_pinned == 50 * KiB
    # At the cap: the next lookup of the same client finds nothing it may pin.
    again = core.lookup(ks(5, start=60), lease_ttl=300, holder="a")
    assert (again.count, again.lease_id) == (0, 0)
    # Another client is not limited by a's pins.
    assert core.lookup(ks(30, start=60), lease_ttl=300, holder="b").count == 30


def test_a_client_that_never_releases_cannot_block_another_clients_puts() -> None:
    for share, blocked in ((0.5, False), (1.0, True)):
        core, clock = make(pin_share=share)
        put(core, ks(100))
        held = [k for k, there in zip(ks(100), core.exists(ks(100)), strict=True) if there]
        assert len(held) >= 97
        assert core.lookup(held, lease_ttl=300, holder="stuck").count == (
            50 if share == 0.5 else len(held))
        # The stuck client never releases; another keeps writing for a while.
        codes: list[Code] = []
        for i in range(20):
            clock.advance(1)
            codes += put(core, ks(5, b"w", 5 * i))
            core.tick()
        if blocked:  # without the cap everything is pinned: puts fail
            assert Code.STORE_FULL in codes
        else:
            assert codes == [Code.OK] * 100
            assert core.exists(ks(5, b"w", 95)) == [True] * 5
            assert core.stats().pin_capped == 1


def test_leases_not_renewed_still_end_at_their_ttl_and_free_the_share() -> None:
    core, clock = make()
    put(core, ks(90))
    first = core.lookup(ks(80), lease_ttl=10, holder="a")
    assert first.count == 50
    assert core.lookup(ks(80), lease_ttl=10, holder="a").count == 0
    clock.advance(10)  # not renewed: dead at its deadline, before any tick reaps it
    assert core.lookup(ks(80), lease_ttl=10, holder="a").count == 50
    core.tick()
    assert core.stats().leases_expired == 1


def test_release_and_trim_give_the_share_back() -> None:
    core, _ = make()
    put(core, ks(90))
    lk = core.lookup(ks(50), lease_ttl=300, holder="a")
    core.release_lease(lk.lease_id, keep_first_n=10)
    assert core.lookup(ks(80), lease_ttl=300, holder="a").count == 40
    core.release_lease(lk.lease_id)
    assert core.lookup(ks(80), lease_ttl=300, holder="a").count == 10


def test_a_tenant_is_capped_across_its_clients() -> None:
    core, _ = make(pin_share=0.4)
    put(core, ks(90))
    assert core.lookup(ks(30), lease_ttl=300, holder="a", owner="team").count == 30
    assert core.lookup(ks(30, start=30), lease_ttl=300, holder="b", owner="team").count == 10
    assert core.lookup(ks(30, start=30), lease_ttl=300, holder="c", owner="other").count == 30


def test_the_share_is_live_and_an_anonymous_caller_is_not_capped() -> None:
    core, _ = make()
    put(core, ks(90))
    core.reconfigure(with_settings(core.config, {"pin_share": 0.25}))
    assert core.lookup(ks(80), lease_ttl=300, holder="a").count == 25
    assert core.lookup(ks(80), lease_ttl=300).count == 80  # no holder, no tenant
    assert core.stats().hit_keys == 25 + 80


def test_records_of_released_leases_do_not_pile_up() -> None:
    core, _ = make()
    put(core, ks(10))
    for i in range(20000):
        lk = core.lookup(ks(3), lease_ttl=300, holder=f"c{i % 7}")
        core.release_lease(lk.lease_id)
    assert core._pin_cap._records <= 1024 + 8   # swept as it goes, not one per lease
    assert core.lookup(ks(10), lease_ttl=300, holder="c0").count == 10
