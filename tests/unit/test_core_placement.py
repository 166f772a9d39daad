"""Placements: the name of an object's current set of replica ranges.

A client that remembers (key, placement, location) may read that location while it asks
the master, and trust the bytes only if the answer names the same placement. So a
placement must change whenever any range of the object is taken or given up, and must
never come back for the same key at the same address once the object has left it.
"""

from __future__ import annotations

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore

KiB = 1024


def tiered() -> MasterCore:
    """100 KiB of DRAM over 1000 KiB of SSD on one node."""
    core = MasterCore(CoreConfig(evict_high=0.9, evict_low=0.8), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 100 * KiB)
    core.mount_segment("n0", "ssd:n0", 0, 1000 * KiB, tier="ssd")
    return core


def put(core: MasterCore, key: bytes, size: int = 10 * KiB) -> int:
    """Write one object (waiting out BUSY while demotions make room); its placement."""
    for _ in range(5):
        (r,) = core.put_start([key], [size], [1])
        if r.code != Code.BUSY:
            break
        for m in core.take_tier_moves():
            core.finish_tier_move(m, Code.OK)
    assert r.code == Code.OK, r
    assert core.put_end([key]) == [Code.OK]
    core.tick()
    return r.placement


def read(core: MasterCore, key: bytes) -> tuple[int, list[int]]:
    got = core.get_replicas([key])
    core.release_lease(got.lease_id)
    r = got.results[0]
    assert r.code == Code.OK, r
    return r.placement, [loc.addr for loc in r.locations]


def two_nodes() -> MasterCore:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    core.mount_segment("n1", "seg1", 1 << 33, 1 << 20)
    return core


def test_put_start_and_reads_name_the_same_placement() -> None:
    core = two_nodes()
    (started,) = core.put_start([b"a"], [100], [7])
    assert started.code == Code.OK and started.placement > 0
    assert core.put_end([b"a"]) == [Code.OK]
    placement, addrs = read(core, b"a")
    assert placement == started.placement
    assert addrs == [loc.addr for loc in started.locations]
    assert read(core, b"a") == (placement, addrs)  # reading changes nothing


def test_each_object_gets_its_own_placement() -> None:
    core = two_nodes()
    res = core.put_start([b"a", b"b", b"c"], [100, 100, 100], [1, 2, 3])
    assert len({r.placement for r in res}) == 3


def test_a_retried_put_start_answers_the_same_placement() -> None:
    core = two_nodes()
    (first,) = core.put_start([b"a"], [100], [7], writer="w")
    (again,) = core.put_start([b"a"], [100], [7], writer="w")
    assert again.code == Code.OK and again.placement == first.placement


def test_removed_and_written_again_at_the_same_address_is_a_new_placement() -> None:
    core = two_nodes()
    core.put_start([b"a"], [100], [7])
    core.put_end([b"a"])
    before = read(core, b"a")
    assert core.remove([b"a"]) == [Code.OK]
    core.put_start([b"a"], [100], [7])
    core.put_end([b"a"])
    after = read(core, b"a")
    assert after[1] == before[1]  # best fit put it back where it was...
    assert after[0] != before[0]  # ...but a reader that remembers the old one can tell


def test_replicas_added_or_dropped_change_the_placement() -> None:
    core = two_nodes()
    core.put_start([b"a"], [100], [7], replicas=2)
    core.put_end([b"a"])
    p2, addrs = read(core, b"a")
    assert len(addrs) == 2
    core.unmount_node("n1")  # one replica lost with its node
    p1, left = read(core, b"a")
    assert len(left) == 1 and p1 != p2


def test_demoted_and_promoted_back_is_a_new_placement_each_time() -> None:
    # The hazard the placement exists for: the object leaves its DRAM range (which
    # another object may then take) and comes back, maybe to exactly the same range.
    core = tiered()
    first = put(core, b"k0")
    for i in range(1, 11):
        put(core, f"k{i}".encode())
    for m in core.take_tier_moves():
        core.finish_tier_move(m, Code.OK)  # the oldest are demoted to SSD
    info = core.inspect(b"k0")
    assert info is not None and [loc.tier for loc in info.locations] == ["ssd"]
    lease = core.lookup([b"k0"])
    on_ssd = core.get_replicas([b"k0"], lease_id=lease.lease_id).results[0]
    assert on_ssd.code == Code.IN_PROGRESS  # not readable there: no placement handed out
    (promote,) = core.take_tier_moves()
    core.finish_tier_move(promote, Code.OK)
    back = core.get_replicas([b"k0"], lease_id=lease.lease_id).results[0]
    assert back.code == Code.OK and back.locations[0].tier == "dram"
    assert back.placement not in (0, first)


def test_placements_never_repeat_while_the_counter_runs() -> None:
    core = two_nodes()
    seen: set[int] = set()
    for round_ in range(50):
        keys = [f"k{round_}-{i}".encode() for i in range(20)]
        res = core.put_start(keys, [64] * 20, list(range(20)))
        core.put_end(keys)
        for r in res:
            assert r.placement not in seen
            seen.add(r.placement)
        core.remove(keys)
