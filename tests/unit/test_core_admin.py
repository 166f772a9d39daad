"""Operator calls of the core: draining, node list, eviction report, live settings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvstore.errors import Code, InvalidArgument, NotFound
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.core.config import LIVE_SETTINGS, live_settings, parse_setting, with_settings

KiB = 1 << 10


def make(nodes: int = 3, seg_size: int = 100 * KiB, **cfg: object) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**cfg), clock)  # type: ignore[arg-type]
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"127.0.0.1:{15000 + i}", (i + 1) << 32, seg_size)
    return core, clock


def put(core: MasterCore, keys: list[bytes], size: int = KiB, replicas: int | None = None) -> None:
    rs = core.put_start(keys, [size] * len(keys), [7] * len(keys), replicas)
    assert [r.code for r in rs] == [Code.OK] * len(keys), rs[0].message
    assert core.put_end(keys) == [Code.OK] * len(keys)


def nodes_of(core: MasterCore, key: bytes) -> list[str]:
    info = core.inspect(key)
    assert info is not None
    return sorted(loc.node_id for loc in info.locations)


def ks(n: int, prefix: bytes = b"k") -> list[bytes]:
    return [prefix + b"%04d" % i for i in range(n)]


# ------------------------------------------------------------------ draining


def test_a_draining_node_gets_no_new_placements() -> None:
    core, _ = make(nodes=3)
    core.set_draining("n1")
    assert core.draining() == ["n1"]
    keys = ks(30)
    put(core, keys, replicas=3)  # asks for 3, only 2 nodes may take them
    assert {tuple(nodes_of(core, k)) for k in keys} == {("n0", "n2")}
    assert core.stats().draining == ["n1"]
    assert core.stats().pool_capacity == 200 * KiB  # its DRAM left the pool
    core.set_draining("n1", False)
    put(core, [b"after"], replicas=3)
    assert nodes_of(core, b"after") == ["n0", "n1", "n2"]


def test_draining_an_unknown_node_is_not_found_unless_restored() -> None:
    core, _ = make(nodes=1)
    with pytest.raises(NotFound, match="no store node 'nx' is mounted"):
        core.set_draining("nx")
    core.set_draining("nx", False)  # undrain of an unknown node: no-op
    core.set_draining("n9", must_exist=False)  # a new leader restoring etcd's marks
    core.mount_segment("n9", "127.0.0.1:16000", 9 << 32, 100 * KiB)
    put(core, ks(5))
    assert all(nodes_of(core, k) == ["n0"] for k in ks(5))


def test_when_every_node_drains_a_put_says_so() -> None:
    core, _ = make(nodes=2)
    core.set_draining("n0")
    core.set_draining("n1")
    r = core.put_start([b"k"], [KiB], [1])[0]
    assert r.code == Code.STORE_FULL
    assert "draining" in r.message


def test_drain_drops_extra_replicas_and_lists_sole_copies() -> None:
    core, _ = make(nodes=2)
    core.journal = []
    both = ks(10, b"both")
    put(core, both, replicas=2)
    core.set_draining("n1")  # the next objects all land on n0 ...
    put(core, ks(4, b"n0only"))
    core.set_draining("n1", False)
    core.set_draining("n0")  # ... and these on n1
    sole = ks(6, b"sole")
    put(core, sole)
    core.set_draining("n0", False)
    core.take_replica_changes()

    r = core.drain("n1", limit=4)
    assert core.draining() == ["n1"]
    assert (r.dropped, r.dropped_bytes) == (4, 4 * KiB)
    assert len(r.sole) == 4 and all(size == KiB for _, size in r.sole)
    assert r.remaining == 16 - 4
    changes = core.take_replica_changes()
    assert len(changes) == 4 and all(c.node_id == "n1" and not c.added for c in changes)

    r = core.drain("n1", limit=100)
    assert r.dropped == 6
    assert sorted(k for k, _ in r.sole) == sorted(sole)
    assert r.remaining == 6  # the sole copies
    assert all(nodes_of(core, k) == ["n0"] for k in both)
    # what a client-side mover does: read, remove, put again (n1 is draining)
    assert core.remove(sole) == [Code.OK] * 6
    put(core, sole)
    assert all(nodes_of(core, k) == ["n0"] for k in sole)
    r = core.drain("n1")
    assert (r.dropped, r.sole, r.remaining) == (0, [], 0)
    assert core.stats().nodes["n1"].used == 0


def test_drain_leaves_pinned_and_pending_objects_alone() -> None:
    core, _ = make(nodes=2)
    core.set_draining("n0")
    put(core, [b"pinned", b"free"], replicas=1)
    assert core.put_start([b"pending"], [KiB], [1])[0].code == Code.OK
    core.set_draining("n0", False)
    put(core, [b"pinned2"], replicas=2)
    lease = core.lookup([b"pinned", b"pinned2"], lease_ttl=10)
    assert lease.count == 2

    r = core.drain("n1")
    assert [k for k, _ in r.sole] == [b"free"]
    assert (r.dropped, r.remaining, r.remaining_pinned, r.remaining_pending) == (0, 4, 2, 1)
    # the pinned readers still read from n1
    read = core.get_replicas([b"pinned", b"pinned2"], lease_id=lease.lease_id)
    assert [len(i.locations) for i in read.results] == [1, 2]

    core.release_lease(lease.lease_id)
    assert core.put_end([b"pending"]) == [Code.OK]
    r = core.drain("n1")
    assert r.dropped == 1  # pinned2 had a copy on n0
    assert sorted(k for k, _ in r.sole) == [b"free", b"pending", b"pinned"]
    assert (r.remaining_pinned, r.remaining_pending) == (0, 0)
    with pytest.raises(NotFound):
        core.drain("nope")
    with pytest.raises(InvalidArgument, match="limit"):
        core.drain("n1", limit=0)


# ------------------------------------------------------------------ node list


def test_node_list_shows_alive_draining_and_recently_gone_nodes() -> None:
    core, clock = make(nodes=3, departed_retention=60.0)
    core.set_draining("n0", must_exist=False)
    core.set_draining("n0", False)
    put(core, ks(3, b"a"), replicas=3)
    core.set_draining("n1")
    put(core, ks(2, b"solo"))  # one replica each on n0 or n2
    lost = [k for k in ks(2, b"solo") if nodes_of(core, k) == ["n2"]]
    assert core.unmount_node("n2") == lost
    clock.advance(5)
    core.unmount_node("n0", reason="left")

    by_id = {n.node_id: n for n in core.node_list()}
    assert [by_id[n].state for n in ("n0", "n1", "n2")] == ["left", "draining", "lost"]
    assert by_id["n1"].objects == 3 and by_id["n1"].gone_at == 0.0
    assert by_id["n2"].objects_lost == len(lost)
    assert by_id["n2"].segments[0].capacity == 100 * KiB
    assert by_id["n2"].segments[0].replicas == 3 + len(lost)  # as it was when it went
    assert by_id["n0"].gone_at - by_id["n2"].gone_at == 5.0

    clock.advance(56)
    core.tick()
    assert [n.node_id for n in core.node_list()] == ["n1", "n0"]  # n2 went 61 s ago
    core.mount_segment("n0", "127.0.0.1:15000", 1 << 32, 100 * KiB)  # back
    assert [(n.node_id, n.state) for n in core.node_list()] == [("n0", "alive"), ("n1", "draining")]


# ------------------------------------------------------------------ eviction report


def test_evict_to_with_a_limit_takes_steps() -> None:
    core, _ = make(nodes=1)
    put(core, ks(80))
    steps = []
    while True:
        r = core.evict_to(0.3, limit=10)
        steps.append(r.evicted)
        if r.reached or not r.evicted:
            break
    assert steps == [10, 10, 10, 10, 10]
    assert r.reached and r.used == 30 * KiB
    with pytest.raises(InvalidArgument, match="limit"):
        core.evict_to(0.5, limit=0)


def test_pinned_bytes_that_block_eviction_are_counted() -> None:
    core, clock = make(nodes=1, evict_high=0.9, evict_low=0.5)
    pinned = ks(80)
    put(core, pinned)
    lease = core.lookup(pinned, lease_ttl=100)
    assert lease.count == 80
    put(core, ks(10, b"old"))  # 90 KiB: at the high mark, not above
    put(core, ks(5, b"new"))  # above: the 10 old ones go, then only pinned and pending
    ev = core.eviction_stats()
    assert ev.blocked == 1
    assert ev.blocked_bytes == 35 * KiB  # stopped at 85 KiB, wanted 50 KiB
    assert ev.blocked_pinned_bytes == 80 * KiB
    assert ev.pool_pinned == 80 * KiB and ev.pool_used == 85 * KiB
    assert (ev.evict_high, ev.evict_low) == (0.9, 0.5)
    dram = ev.tiers[0]
    assert (dram.tier, dram.evicted, dram.evicted_bytes) == ("dram", 10, 10 * KiB)
    assert (dram.evicted_recent, dram.demoted) == (10, 0)

    core.tick()  # 85 KiB is below the high mark: that episode is over
    put(core, ks(10, b"more"))  # 95 KiB: the 5 "new" go, still short: a second episode
    for _ in range(20):  # above the high mark with nothing to evict: still that episode
        clock.advance(0.1)
        core.tick()
    assert core.eviction_stats().blocked == 2
    r = core.put_start([b"big"], [25 * KiB], [1])[0]  # never fits: 80 KiB stay pinned
    assert r.code == Code.STORE_FULL
    ev = core.eviction_stats()
    assert ev.blocked == 3 and ev.blocked_pinned_bytes == 80 * KiB
    r2 = core.evict_to(0.1)
    assert not r2.reached and r2.pinned == 80 * KiB
    assert core.eviction_stats().blocked == ev.blocked + 1

    core.tick()  # counts land in the second they are observed in (every ~100 ms)
    clock.advance(61)
    core.tick()
    ev = core.eviction_stats()
    assert ev.tiers[0].evicted_recent == 0 and ev.tiers[0].evicted > 0
    assert ev.recent_seconds == 60.0


def test_hit_keys_over_the_last_minute() -> None:
    core, clock = make(nodes=1)
    put(core, ks(4))
    core.lookup(ks(4), lease_ttl=1)  # 4 of 4
    core.lookup([b"missing", *ks(3)], lease_ttl=1)  # 0 of 4
    s = core.stats()
    assert (s.recent["lookup_keys"], s.recent["hit_keys"]) == (8, 4)
    assert s.recent_seconds == 0.0
    for _ in range(31):
        clock.advance(1)
        core.tick()
    core.lookup(ks(2), lease_ttl=1)
    s = core.stats()
    assert (s.recent["lookup_keys"], s.recent["hit_keys"]) == (10, 6)
    for _ in range(31):
        clock.advance(1)
        core.tick()
    s = core.stats()
    assert (s.recent["lookup_keys"], s.recent["hit_keys"]) == (2, 2)
    assert (s.lookup_keys, s.hit_keys) == (10, 6)


# ------------------------------------------------------------------ live settings


def test_new_watermarks_change_eviction_at_once() -> None:
    core, _ = make(nodes=1, evict_high=0.9, evict_low=0.8)
    put(core, ks(70))
    core.tick()
    assert core.stats().evictions == 0
    core.reconfigure(with_settings(core.config, {"evict_high": 0.5, "evict_low": 0.3}))
    assert core.config.evict_high == 0.5
    core.tick()
    s = core.stats()
    assert s.evictions == 40 and s.pool_used == 30 * KiB


def test_reconfigure_refuses_structural_changes() -> None:
    core, _ = make(nodes=1)
    with pytest.raises(InvalidArgument, match="only live settings"):
        core.reconfigure(replace(core.config, alignment=128))
    with pytest.raises(InvalidArgument, match="cannot change at run time"):
        with_settings(core.config, {"alignment": 128.0})
    with pytest.raises(InvalidArgument, match="evict_low < evict_high"):
        with_settings(core.config, {"evict_high": 0.5})  # evict_low is 0.8
    with pytest.raises(InvalidArgument, match="default_lease_ttl"):
        with_settings(core.config, {"max_lease_ttl": 1.0})  # default is 30
    core.reconfigure(with_settings(core.config, {"put_timeout": 5.0, "default_lease_ttl": 2.0}))
    assert live_settings(core.config)["put_timeout"] == 5.0
    assert set(live_settings(core.config)) == set(LIVE_SETTINGS)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("evict_high", "high", "must be a number"),
    ("evict_high", "1.5", r"must be in \(0, 1\]"),
    ("evict_low", "0", r"must be in \(0, 1\]"),
    ("put_timeout", "-1", "must be > 0"),
    ("max_lease_ttl", "nan", "finite"),
    ("max_lease_ttl", "inf", "finite"),
    ("alignment", "64", "not a live setting"),
])
def test_bad_setting_values_get_a_sentence(name: str, text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_setting(name, text)


def test_good_setting_values_parse() -> None:
    assert parse_setting("evict_high", "0.75") == 0.75
    assert parse_setting("put_timeout", "12") == 12.0
