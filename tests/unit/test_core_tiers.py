"""SSD tier in the master's core: demotion instead of loss, promotion before reads."""

from __future__ import annotations

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore, TierMove

KiB = 1024


def make(ssd: int = 1000 * KiB) -> MasterCore:
    core = MasterCore(CoreConfig(evict_high=0.9, evict_low=0.8), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 100 * KiB)
    if ssd:
        core.mount_segment("n0", "ssd:n0", 0, ssd, tier="ssd")
    core.journal = []
    return core


def fill(core: MasterCore, start: int, n: int, size: int = 10 * KiB,
         promote: Code = Code.OK) -> list[bytes]:
    keys = [f"k{i}".encode() for i in range(start, start + n)]
    res = core.put_start(keys, [size] * n, list(range(start, start + n)))
    for _ in range(5):  # BUSY: demotions are making room; finish them and ask again
        busy = [i for i, r in enumerate(res) if r.code == Code.BUSY]
        if not busy:
            break
        finish_all(core, promote=promote)
        again = core.put_start([keys[i] for i in busy], [size] * len(busy),
                               [start + i for i in busy])
        for i, r in zip(busy, again, strict=True):
            res[i] = r
    assert all(r.code == Code.OK for r in res), res
    assert core.put_end(keys) == [Code.OK] * n
    core.tick()  # the watermark check that the server runs every 100 ms
    return keys


def tiers(core: MasterCore, key: bytes) -> list[str]:
    info = core.inspect(key)
    return [] if info is None else [loc.tier for loc in info.locations]


def finish_all(core: MasterCore, code: Code = Code.OK,
               promote: Code | None = None) -> list[TierMove]:
    moves = core.take_tier_moves()
    for m in moves:
        core.finish_tier_move(m, code if m.kind == "demote" or promote is None else promote)
    return moves


def test_eviction_demotes_to_ssd_and_frees_dram_only_after_the_copy() -> None:
    core = make()
    fill(core, 0, 9)  # 90 KiB of a 100 KiB pool
    fill(core, 9, 1)  # over the high watermark: the oldest are demoted
    moves = core.take_tier_moves()
    assert [m.kind for m in moves] == ["demote"] * len(moves) and moves
    assert moves[0].key == b"k0" and moves[0].node_id == "n0"
    # Until the node confirms, the object is still in DRAM and still readable there.
    assert tiers(core, b"k0") == ["dram"]
    used_before = sum(s.used for s in core.stats().nodes["n0"].segments if s.tier == "dram")
    for m in moves:
        core.finish_tier_move(m, Code.OK)
    assert tiers(core, b"k0") == ["ssd"]
    used_after = sum(s.used for s in core.stats().nodes["n0"].segments if s.tier == "dram")
    assert used_after == used_before - len(moves) * 10 * KiB
    assert core.exists([b"k0"]) == [True]
    assert core.lookup([b"k0", b"k1"]).count == 2  # SSD replicas are hits
    assert core.tier_counters()["demotions"] == len(moves)
    changes = core.take_replica_changes()
    assert any(c.key == b"k0" and c.tier == "ssd" and c.added for c in changes)
    assert any(c.key == b"k0" and c.tier == "dram" and not c.added for c in changes)


def test_demotion_does_not_snowball_while_copies_are_in_flight() -> None:
    core = make()
    fill(core, 0, 9)
    fill(core, 9, 1)
    first = core.take_tier_moves()
    core.tick()
    core.tick()
    assert core.take_tier_moves() == []  # nothing more: the in-flight ones suffice
    assert first


def test_failed_demotion_drops_the_object_cleanly() -> None:
    core = make()
    fill(core, 0, 10)
    moves = finish_all(core, Code.STORE_FULL)
    assert moves
    for m in moves:
        assert core.inspect(m.key) is None
    assert core.tier_counters()["demotion_failures"] == len(moves)
    ssd = next(s for s in core.stats().nodes["n0"].segments if s.tier == "ssd")
    assert ssd.used == 0  # the reservation went back


def test_promotion_brings_an_ssd_object_back_and_is_shared_by_readers() -> None:
    core = make()
    fill(core, 0, 10)
    finish_all(core)
    assert tiers(core, b"k0") == ["ssd"]
    lease = core.lookup([b"k0"])  # an SSD hit starts its promotion at lookup
    started = core.take_tier_moves()
    assert len(started) == 1 and started[0].kind == "promote"
    assert core.promote([b"k0", b"k0"]) == []  # a second reader waits for the same copy
    assert core.moving(b"k0")
    core.finish_tier_move(started[0], Code.OK)
    assert tiers(core, b"k0") == ["dram"]
    r = core.get_replicas([b"k0"], lease_id=lease.lease_id).results[0]
    assert r.code == Code.OK and r.locations[0].tier == "dram"
    assert r.locations[0].addr == (1 << 32) + started[0].dram_offset


def test_corrupt_ssd_copy_is_dropped_never_served() -> None:
    core = make()
    fill(core, 0, 10)
    finish_all(core)
    lease = core.lookup([b"k0"])
    (move,) = core.take_tier_moves()
    core.finish_tier_move(move, Code.CORRUPT)
    assert core.inspect(b"k0") is None
    assert core.get_replicas([b"k0"], lease_id=lease.lease_id).results[0].code == Code.NOT_FOUND


def test_pinned_ssd_objects_survive_ssd_pressure() -> None:
    core = make(ssd=60 * KiB)  # SSD room for ~4 objects (4 KiB file overhead each)
    fill(core, 0, 10)
    finish_all(core)
    ssd_keys = [k for k in (f"k{i}".encode() for i in range(10)) if tiers(core, k) == ["ssd"]]
    lease = core.lookup(ssd_keys[:1])
    assert lease.count == 1
    for i in range(10, 60, 5):  # keep writing: more demotions, SSD must evict
        fill(core, i, 5, promote=Code.STORE_FULL)  # keep the pinned one on SSD
        finish_all(core, promote=Code.STORE_FULL)
    assert tiers(core, ssd_keys[0]) == ["ssd"]  # pinned: never evicted from SSD
    ssd = next(s for s in core.stats().nodes["n0"].segments if s.tier == "ssd")
    assert ssd.used <= ssd.capacity
    assert core.tier_counters()["ssd_evictions"] > 0


def test_without_ssd_eviction_drops_as_before() -> None:
    core = make(ssd=0)
    fill(core, 0, 10)
    assert core.take_tier_moves() == []
    assert core.stats().evictions > 0


def test_node_loss_mid_move_releases_everything() -> None:
    core = make()
    fill(core, 0, 10)
    moves = core.take_tier_moves()
    assert moves
    core.unmount_node("n0")
    for m in moves:
        core.finish_tier_move(m, Code.OK)  # late answers are ignored
    st = core.stats()
    assert st.objects_complete == 0 and st.pool_pinned == 0


def test_adopted_ssd_objects_are_readable_after_promotion() -> None:
    core = make()
    assert core.adopt_replica(b"old", 5000, 99, "n0", 0, tier="ssd") == Code.OK
    assert tiers(core, b"old") == ["ssd"]
    (move,) = core.promote([b"old"])
    assert (move.size, move.checksum) == (5000, 99)
    core.finish_tier_move(move, Code.OK)
    assert tiers(core, b"old") == ["dram"]


def test_reads_of_ssd_objects_answer_in_progress_and_start_one_promotion() -> None:
    core = make()
    fill(core, 0, 10)
    finish_all(core)
    woken: list[int] = []
    core.on_move_queued = lambda: woken.append(1)
    lease = core.lookup([b"k0", b"k1"])  # SSD hits start their promotion at lookup
    assert lease.count == 2
    moves = core.take_tier_moves()
    assert sorted(m.key for m in moves) == [b"k0", b"k1"] and woken
    r = core.get_replicas([b"k0"], lease_id=lease.lease_id).results[0]
    assert r.code == Code.IN_PROGRESS and not r.locations
    assert core.take_tier_moves() == []  # already moving: no second SSD read
    for m in moves:
        core.finish_tier_move(m, Code.OK)
    r = core.get_replicas([b"k0"], lease_id=lease.lease_id).results[0]
    assert r.code == Code.OK and r.locations[0].tier == "dram"


def test_an_unpinned_read_of_an_ssd_object_starts_its_promotion_and_pins_nothing() -> None:
    core = make()
    fill(core, 0, 10)
    finish_all(core)
    g = core.get_replicas([b"k0"], pin=False)
    assert g.lease_id == 0 and g.results[0].code == Code.IN_PROGRESS
    moves = core.take_tier_moves()
    assert [m.key for m in moves] == [b"k0"]
    for m in moves:
        core.finish_tier_move(m, Code.OK)
    r = core.get_replicas([b"k0"], pin=False).results[0]
    assert r.code == Code.OK and r.locations[0].tier == "dram"
    info = core.inspect(b"k0")
    assert info is not None and info.pins == 0 and core.stats().active_leases == 0


def test_full_dram_with_ssd_room_makes_writers_wait_instead_of_dropping() -> None:
    core = make()
    fill(core, 0, 8)  # 80 KiB: under the high watermark, nothing demoted yet
    assert core.take_tier_moves() == []
    res = core.put_start([b"big"], [30 * KiB], [1])  # does not fit in the 20 KiB left
    assert res[0].code == Code.BUSY and "moving to SSD" in res[0].message
    assert core.stats().evictions == 0  # nothing was dropped
    finish_all(core)
    assert core.put_start([b"big"], [30 * KiB], [1])[0].code == Code.OK
    assert all(core.exists([f"k{i}".encode() for i in range(8)]))


def test_object_removed_mid_demotion_has_its_ssd_file_dropped() -> None:
    """The node finishes a demotion of an object removed meanwhile: its file must be
    dropped, or it stays on disk (and would come back after a restart) for ever."""
    core = make()
    fill(core, 0, 10)
    moves = core.take_tier_moves()
    assert moves
    gone = moves[0]
    assert core.remove([gone.key], force=True) == [Code.OK]
    core.take_replica_changes()
    for m in moves:
        core.finish_tier_move(m, Code.OK)
    drops = [c for c in core.take_replica_changes() if c.key == gone.key]
    assert [(c.tier, c.offset, c.added, c.node_id) for c in drops] == \
        [("ssd", gone.ssd_offset, False, "n0")]
    # a failed demotion wrote nothing to drop
    core2 = make()
    fill(core2, 0, 10)
    moves2 = core2.take_tier_moves()
    core2.remove([moves2[0].key], force=True)
    core2.take_replica_changes()
    core2.finish_tier_move(moves2[0], Code.STORE_FULL)
    assert [c for c in core2.take_replica_changes() if c.key == moves2[0].key] == []


def test_a_promotions_dram_destination_waits_for_the_nodes_answer() -> None:
    """An object removed while the node copies it back into DRAM: the node still writes
    the destination, so nothing else is placed there before the node answers."""
    core = make()
    fill(core, 0, 10)
    finish_all(core)
    core.lookup([b"k0"])
    (move,) = core.take_tier_moves()
    dest = (1 << 32) + move.dram_offset
    assert core.remove([b"k0"], force=True) == [Code.OK]
    [r] = core.put_start([b"new"], [10 * KiB], [1])
    assert r.code == Code.OK and r.locations[0].addr != dest
    used = core.stats().pool_used
    core.finish_tier_move(move, Code.OK)
    assert core.stats().pool_used == used - 10 * KiB  # the destination is free again


def test_a_replica_adopted_while_its_object_demotes_is_counted_with_the_demotion() -> None:
    # The demotion frees every DRAM replica when it ends, the adopted one too: the DRAM
    # "about to be freed" must come back to 0, not below it (pool_used would then count
    # DRAM nobody holds).
    core = make()
    core.mount_segment("n1", "seg1", 2 << 32, 100 * KiB)
    core.set_draining("n1", True)  # placements stay on n0
    fill(core, 0, 1)
    state = core._state
    assert core._tiers.start_demotion(state.objects.index[b"k0"])
    assert state.ledger.demoting == 10 * KiB
    assert core.adopt_replica(b"k0", 10 * KiB, 0, "n1", 0) == Code.OK
    assert state.ledger.demoting == 20 * KiB
    finish_all(core)
    assert tiers(core, b"k0") == ["ssd"]
    assert state.ledger.demoting == 0
    assert core.stats().pool_used == 0


def test_a_read_of_an_ssd_object_pins_it_before_its_promotion_makes_room() -> None:
    # DRAM and SSD full: promoting `a` demotes a DRAM object, whose SSD room comes from
    # evicting the oldest SSD object, `a` itself unless the read has pinned it first
    # (the read used to fail with a KeyError, after `a` was gone).
    core = MasterCore(CoreConfig(evict_high=1.0, evict_low=0.9), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 30 * KiB)
    core.mount_segment("n0", "ssd:n0", 0, 32 * KiB, tier="ssd")  # room for two files
    keys = [b"a", b"b", b"c", b"d", b"f"]
    for k in keys:
        assert core.put_start([k], [10 * KiB], [1])[0].code == Code.OK
        assert core.put_end([k]) == [Code.OK]
        if k == b"b":
            state = core._state
            for old in (b"a", b"b"):
                assert core._tiers.start_demotion(state.objects.index[old])
            finish_all(core)
    assert tiers(core, b"a") == tiers(core, b"b") == ["ssd"]
    assert core.stats().pool_used == 30 * KiB
    got = core.get_replicas([b"a"])
    assert got.results[0].code == Code.IN_PROGRESS and got.lease_id
    info = core.inspect(b"a")
    assert info is not None and info.pins == 1 and tiers(core, b"a") == ["ssd"]
    core.release_lease(got.lease_id)
