"""Membership, replica placement, node loss and the failover rebuild seam."""

from __future__ import annotations

import pytest

from kvstore.errors import Code, InvalidArgument
from kvstore.master.core import CoreConfig, EventKind, ManualClock, MasterCore

KiB = 1 << 10


def make(nodes: int = 3, seg_size: int = 100 * KiB, **cfg: object) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**cfg), clock)  # type: ignore[arg-type]
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"127.0.0.1:{15000 + i}", (i + 1) << 32, seg_size)
    return core, clock


def put(core: MasterCore, keys: list[bytes], size: int = KiB, replicas: int | None = None) -> None:
    rs = core.put_start(keys, [size] * len(keys), [7] * len(keys), replicas)
    assert [r.code for r in rs] == [Code.OK] * len(keys)
    assert core.put_end(keys) == [Code.OK] * len(keys)


def nodes_of(core: MasterCore, key: bytes) -> list[str]:
    info = core.inspect(key)
    assert info is not None
    return [loc.node_id for loc in info.locations]


def test_replicas_go_to_distinct_nodes_best_effort() -> None:
    core, _ = make(nodes=3)
    put(core, [b"one"])
    put(core, [b"two"], replicas=2)
    put(core, [b"many"], replicas=5)  # only 3 nodes
    assert len(nodes_of(core, b"one")) == 1
    assert len(set(nodes_of(core, b"two"))) == 2
    assert sorted(nodes_of(core, b"many")) == ["n0", "n1", "n2"]
    st = core.stats()
    assert st.pool_used == 6 * KiB and st.bytes_complete == 3 * KiB


def test_default_replicas_from_config() -> None:
    core, _ = make(nodes=3, default_replicas=2)
    put(core, [b"a"])
    assert len(set(nodes_of(core, b"a"))) == 2


def test_placement_prefers_the_node_with_most_free_space() -> None:
    clock = ManualClock()
    core = MasterCore(CoreConfig(), clock)
    core.mount_segment("small", "s:1", 1 << 32, 10 * KiB)
    core.mount_segment("big", "s:2", 2 << 32, 30 * KiB)
    keys = [b"k%02d" % i for i in range(30)]
    put(core, keys[:20])
    assert all(nodes_of(core, k) == ["big"] for k in keys[:20])
    put(core, keys[20:])  # now equal free space: they alternate
    st = core.stats()
    assert abs(st.nodes["small"].used - st.nodes["big"].used + 20 * KiB) <= KiB


def test_replicas_fall_back_to_fewer_when_a_node_is_full() -> None:
    clock = ManualClock()
    core = MasterCore(CoreConfig(), clock)
    core.mount_segment("a", "s:1", 1 << 32, 4 * KiB)
    core.put_start([b"p"], [4 * KiB], [0])  # fills a with a PENDING object
    core.mount_segment("b", "s:2", 2 << 32, 100 * KiB)
    [r] = core.put_start([b"x"], [KiB], [0], replicas=2)
    assert r.code == Code.OK and [loc.node_id for loc in r.locations] == ["b"]


def test_node_loss_with_a_surviving_replica_keeps_the_object_readable() -> None:
    core, _ = make(nodes=2)
    put(core, [b"a", b"b"], replicas=2)
    lease = core.lookup([b"a", b"b"])
    assert core.stats().pool_pinned == 4 * KiB
    assert core.unmount_node("n0") == []
    assert core.node_ids() == ["n1"]
    g = core.get_replicas([b"a", b"b"], lease_id=lease.lease_id)
    assert [r.code for r in g.results] == [Code.OK, Code.OK]
    assert all([loc.node_id for loc in r.locations] == ["n1"] for r in g.results)
    assert core.lookup([b"a", b"b"]).count == 2
    st = core.stats()
    # Pinned bytes are the space pinned objects hold, now one replica each.
    assert (st.pool_capacity, st.pool_used, st.pool_pinned) == (100 * KiB, 2 * KiB, 2 * KiB)
    core.release_lease(lease.lease_id)
    assert core.stats().pool_pinned == 2 * KiB  # still pinned by the second lookup
    assert core.take_events() == []


def test_node_loss_of_the_last_replica_drops_the_object() -> None:
    core, _ = make(nodes=2)
    put(core, [b"a"], replicas=1)
    [node] = nodes_of(core, b"a")
    put(core, [b"b"], replicas=2)
    lease = core.lookup([b"a", b"b"])
    assert core.unmount_node(node) == [b"a"]
    assert core.exists([b"a", b"b"]) == [False, True]
    assert core.lookup([b"a", b"b"]).count == 0
    g = core.get_replicas([b"a", b"b"], lease_id=lease.lease_id)
    assert [r.code for r in g.results] == [Code.NOT_FOUND, Code.OK]
    [ev] = core.take_events()
    assert (ev.kind, ev.keys, ev.bytes, ev.node_id) == (EventKind.NODE_LOST, [b"a"], KiB, node)
    core.release_lease(lease.lease_id)
    st = core.stats()
    assert (st.pool_pinned, st.objects_complete, st.bytes_complete) == (0, 1, KiB)
    assert core.unmount_node(node) == []  # unknown now: nothing to do


def test_node_loss_drops_pending_objects_with_a_replica_there() -> None:
    core, _ = make(nodes=2)
    [r] = core.put_start([b"p"], [KiB], [0], replicas=2)
    assert len(r.locations) == 2
    assert core.unmount_node("n0") == [b"p"]
    assert core.put_end([b"p"]) == [Code.NOT_FOUND]
    st = core.stats()
    assert (st.pool_used, st.pool_pending, st.objects_pending) == (0, 0, 0)


def _span(node: str, locations: list) -> tuple[int, int]:
    [loc] = [x for x in locations if x.node_id == node]
    return loc.addr, loc.addr + loc.size


def _fill_around(core: MasterCore, node: str, held: tuple[int, int], n: int = 3) -> None:
    """Put n 1 KiB objects (the rest of `node`'s space): none may overlap `held`."""
    for i in range(n):
        [q] = core.put_start([b"q%d" % i], [KiB], [0], replicas=1, writer="v")
        assert q.code == Code.OK
        a, b = _span(node, q.locations)
        assert b <= held[0] or a >= held[1], "a held range was placed again"


def test_a_dropped_pending_objects_other_ranges_wait_for_its_writer() -> None:
    # The writer of a PENDING object still copies into its surviving replica after the
    # object was dropped with its other node: that range is not placed again before
    # the writer's put_end, or the next object's acknowledged bytes get overwritten.
    core, _ = make(nodes=2, seg_size=4 * KiB)
    [p] = core.put_start([b"p"], [KiB], [0], replicas=2, writer="w")
    held = _span("n1", p.locations)
    assert core.unmount_node("n0") == [b"p"]
    _fill_around(core, "n1", held)  # n1's other three KiB
    [full] = core.put_start([b"r"], [KiB], [0], replicas=1, writer="v")
    assert full.code == Code.STORE_FULL
    assert core.stats().pool_used == 4 * KiB
    assert core.put_end([b"p"], writer="w") == [Code.NOT_FOUND]  # the writer is done
    assert core.stats().pool_used == 3 * KiB
    [r] = core.put_start([b"r"], [KiB], [0], replicas=1, writer="v")
    assert _span("n1", r.locations) == held


def test_held_ranges_go_back_at_the_put_timeout_without_the_writers_call() -> None:
    core, clock = make(nodes=2, put_timeout=30.0)
    core.put_start([b"p"], [KiB], [0], replicas=2, writer="w")
    core.unmount_node("n0")
    clock.advance(29.0)
    core.tick()
    assert core.stats().pool_used == KiB
    clock.advance(2.0)
    core.tick()
    assert core.stats().pool_used == 0


def test_a_forced_remove_of_a_pending_object_holds_its_ranges_for_the_writer() -> None:
    core, _ = make(nodes=1)
    [p] = core.put_start([b"p"], [KiB], [0], replicas=1, writer="w")
    assert core.remove([b"p"], force=True) == [Code.OK]
    [q] = core.put_start([b"q"], [KiB], [0], replicas=1, writer="v")
    assert _span("n0", q.locations) != _span("n0", p.locations)
    assert core.stats().pool_used == 2 * KiB
    assert core.put_end([b"p"], writer="w") == [Code.NOT_FOUND]
    assert core.stats().pool_used == KiB


def test_a_node_back_over_the_same_memory_keeps_the_held_ranges_held() -> None:
    # A network cut longer than the node's etcd lease: the node is lost, mounts again
    # over the same memory, and the copies the cut stalled land after it heals.
    core, _ = make(nodes=1, seg_size=4 * KiB)
    [p] = core.put_start([b"p"], [KiB], [0], replicas=1, writer="w")
    held = _span("n0", p.locations)
    assert core.unmount_node("n0") == [b"p"]
    core.mount_segment("n0", "127.0.0.1:15000", 1 << 32, 4 * KiB)
    _fill_around(core, "n0", held)
    assert core.put_end([b"p"], writer="w") == [Code.NOT_FOUND]
    assert core.stats().pool_used == 3 * KiB
    # Other memory (a restarted process mapped elsewhere): nothing to hold there.
    core2, _ = make(nodes=1, seg_size=4 * KiB)
    core2.put_start([b"p"], [KiB], [0], replicas=1, writer="w")
    core2.unmount_node("n0")
    core2.mount_segment("n0", "127.0.0.1:15001", 9 << 32, 4 * KiB)
    assert core2.stats().pool_used == 0


def test_a_revoke_frees_at_once() -> None:
    core, _ = make(nodes=1)
    core.put_start([b"p"], [KiB], [0], replicas=1, writer="w")
    assert core.put_revoke([b"p"], writer="w") == [Code.OK]
    assert core.stats().pool_used == 0


def test_mount_is_idempotent_and_a_new_geometry_replaces_the_node() -> None:
    core, _ = make(nodes=2)
    put(core, [b"a"], replicas=2)
    core.mount_segment("n0", "127.0.0.1:15000", 1 << 32, 100 * KiB)  # same: no-op
    assert core.stats().pool_used == 2 * KiB
    core.mount_segment("n0", "127.0.0.1:15000", 9 << 32, 200 * KiB)  # restarted
    assert nodes_of(core, b"a") == ["n1"]
    st = core.stats()
    assert st.pool_capacity == 300 * KiB and st.nodes["n0"].used == 0
    assert core.node_ids() == ["n0", "n1"]


def test_mount_validates() -> None:
    core, _ = make(nodes=0)
    for args in (("", "s", 0, KiB), ("n", "s", -1, KiB), ("n", "s", 0, 0), ("n", "s", 0, 1 << 50)):
        with pytest.raises(InvalidArgument):
            core.mount_segment(*args)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        core.mount_segment("n", "s", 0, KiB, tier="tape")


def test_ssd_segments_are_not_part_of_the_dram_pool() -> None:
    core, _ = make(nodes=1)
    core.mount_segment("n0", "/ssd/n0", 0, 1000 * KiB, tier="ssd")
    put(core, [b"a"])
    st = core.stats()
    assert st.pool_capacity == 100 * KiB
    assert [s.tier for s in st.nodes["n0"].segments] == ["dram", "ssd"]
    assert st.nodes["n0"].capacity == 1100 * KiB
    assert nodes_of(core, b"a") == ["n0"]
    # An object lives in one tier: an SSD copy reported for a DRAM object adds nothing.
    assert core.adopt_replica(b"a", KiB, 7, "n0", 0, tier="ssd") == Code.OK
    info = core.inspect(b"a")
    assert info is not None and [loc.tier for loc in info.locations] == ["dram"]
    assert core.stats().pool_used == KiB


def test_adopt_replica_rebuilds_the_index() -> None:
    core, _ = make(nodes=2)
    base = 1 << 32
    assert core.adopt_replica(b"a", 1000, 11, "n0", 0) == Code.OK
    assert core.adopt_replica(b"b", 1000, 22, "n0", 1024) == Code.OK
    assert core.adopt_replica(b"a", 1000, 11, "n0", 0) == Code.OK  # replayed twice
    assert core.adopt_replica(b"a", 1000, 11, "n1", 4096) == Code.OK  # second replica
    # Conflicts and nonsense.
    assert core.adopt_replica(b"c", 1000, 1, "n0", 512) == Code.INVALID_ARGUMENT  # overlap
    assert core.adopt_replica(b"a", 999, 11, "n0", 8192) == Code.INVALID_ARGUMENT  # size
    assert core.adopt_replica(b"a", 1000, 12, "n0", 8192) == Code.INVALID_ARGUMENT  # sum
    assert core.adopt_replica(b"a", 1000, 11, "n0", 8192) == Code.INVALID_ARGUMENT  # 2nd on n0
    assert core.adopt_replica(b"d", 1000, 1, "n0", 100 * KiB - 10) == Code.INVALID_ARGUMENT
    assert core.adopt_replica(b"d", 0, 1, "n0", 0) == Code.INVALID_ARGUMENT
    assert core.adopt_replica(b"", 10, 1, "n0", 0) == Code.INVALID_ARGUMENT
    assert core.adopt_replica(b"d", 10, 1, "nX", 0) == Code.NOT_FOUND
    core.put_start([b"p"], [10], [0])
    assert core.adopt_replica(b"p", 10, 0, "n1", 0) == Code.IN_PROGRESS

    r = core.lookup([b"a", b"b"])
    assert r.count == 2
    g = core.get_replicas([b"a", b"b"], lease_id=r.lease_id)
    assert [(loc.node_id, loc.addr) for loc in g.results[0].locations] == [
        ("n0", base),
        ("n1", (2 << 32) + 4096),
    ]
    assert (g.results[1].checksum, g.results[1].locations[0].addr) == (22, base + 1024)
    st = core.stats()
    assert st.pool_used == 3 * KiB + 64  # a x2, b (1000 -> 1024 bytes), p (10 -> 64)
    assert st.pool_pinned == 3 * KiB
    # New allocations avoid the adopted ranges: n1 has more free space, and its best
    # fit is the hole between p and the adopted replica of a.
    [x] = core.put_start([b"x"], [KiB], [0])
    assert (x.locations[0].node_id, x.locations[0].addr) == ("n1", (2 << 32) + 64)


def test_stats_per_node_pinned_counts() -> None:
    core, _ = make(nodes=2)
    put(core, [b"a", b"b", b"c"], replicas=2)
    put(core, [b"d"], replicas=1)
    core.lookup([b"a", b"b"])
    st = core.stats()
    for node in ("n0", "n1"):
        n = st.nodes[node]
        assert (n.pinned_objects, n.pinned_bytes) == (2, 2 * KiB)
    assert st.nodes["n0"].objects + st.nodes["n1"].objects == 7
    assert st.pool_pinned == 4 * KiB


def test_an_unsettled_revoke_frees_the_key_and_holds_the_space_until_the_put_timeout() -> None:
    # The writer gave up on transfers the engine may still complete: the key may be put
    # again at once, but not into the space the late bytes may land in.
    core, clock = make(nodes=1, seg_size=2 * KiB, put_timeout=30.0)
    [p] = core.put_start([b"p"], [KiB], [0], replicas=1, writer="w")
    assert core.put_revoke([b"p"], writer="w", unsettled=True) == [Code.OK]
    [again] = core.put_start([b"p"], [KiB], [0], replicas=1, writer="w")
    assert again.code == Code.OK
    assert _span("n0", again.locations) != _span("n0", p.locations)
    assert core.put_end([b"p"], writer="w") == [Code.OK]
    # put_end of the new write is no word on the old one's transfers: still held (the
    # next put evicts rather than take it).
    [q] = core.put_start([b"q"], [KiB], [0], replicas=1, writer="v")
    assert q.code == Code.OK and _span("n0", q.locations) == _span("n0", again.locations)
    assert core.put_end([b"q"], writer="v") == [Code.OK]
    clock.advance(31.0)
    core.tick()
    [r] = core.put_start([b"r"], [KiB], [0], replicas=1, writer="v")
    assert r.code == Code.OK and _span("n0", r.locations) == _span("n0", p.locations)


def test_a_node_replaying_its_inventory_gets_no_placements_until_it_is_done() -> None:
    # A node mounted again still holds objects the leader has not adopted yet: a new
    # object placed over one of them would have that entry refused and the object lost.
    core, _ = make(nodes=2)
    core.set_adopting("n0", True)
    for i in range(6):
        put(core, [b"a%d" % i])
        assert nodes_of(core, b"a%d" % i) == ["n1"]
    assert core.adopt_replica(b"old", KiB, 7, "n0", 0, "dram") == Code.OK
    core.set_adopting("n0", False)
    placed = set()
    for i in range(6):
        put(core, [b"b%d" % i])
        placed.update(nodes_of(core, b"b%d" % i))
    assert "n0" in placed


def test_a_range_held_when_its_node_goes_is_held_again_when_it_comes_back() -> None:
    # Held first on a mounted node (the object went with another node), then that node
    # is cut off too and comes back over the same memory: still held for the writer.
    core, _ = make(nodes=2, seg_size=4 * KiB)
    [p] = core.put_start([b"p"], [KiB], [0], replicas=2, writer="w")
    held = _span("n1", p.locations)
    core.unmount_node("n0")
    core.unmount_node("n1")
    core.mount_segment("n1", "127.0.0.1:15001", 2 << 32, 4 * KiB)
    _fill_around(core, "n1", held)
    assert core.put_end([b"p"], writer="w") == [Code.NOT_FOUND]
    assert core.stats().pool_used == 3 * KiB
