"""The replica journal tells store nodes what they hold (for failover rebuilds)."""

from __future__ import annotations

from kvstore.master.core import CoreConfig, ManualClock, MasterCore


def _core() -> MasterCore:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n1", "seg1", 1 << 20, 1 << 20)
    core.mount_segment("n2", "seg2", 4 << 20, 1 << 20)
    core.journal = []
    return core


def test_commit_and_free_are_journaled_per_replica() -> None:
    core = _core()
    core.put_start([b"a", b"b"], [100, 200], [1, 2], replicas=2)
    assert core.take_replica_changes() == []  # PENDING objects are nobody's inventory
    core.put_end([b"a", b"b"])
    added = core.take_replica_changes()
    assert sorted((c.node_id, c.key, c.size, c.checksum, c.added) for c in added) == [
        ("n1", b"a", 100, 1, True), ("n1", b"b", 200, 2, True),
        ("n2", b"a", 100, 1, True), ("n2", b"b", 200, 2, True)]
    locs = core.get_replicas([b"a"]).results[0].locations
    offsets = {c.node_id: c.offset for c in added if c.key == b"a"}
    bases = {"n1": 1 << 20, "n2": 4 << 20}
    assert {loc.node_id: loc.addr - bases[loc.node_id] for loc in locs} == offsets
    core.remove([b"a"], force=True)
    dropped = core.take_replica_changes()
    assert sorted((c.node_id, c.key, c.added) for c in dropped) == [
        ("n1", b"a", False), ("n2", b"a", False)]
    assert core.take_replica_changes() == []


def test_revoked_and_reclaimed_pending_writes_are_not_journaled() -> None:
    core = _core()
    core.put_start([b"x", b"y"], [10, 10], [1, 1])
    core.put_revoke([b"x"])
    core.clock.advance(core.config.put_timeout + 1)  # type: ignore[attr-defined]
    core.tick()
    assert core.take_replica_changes() == []


def test_journal_is_off_by_default() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n1", "seg1", 0, 1 << 20)
    core.put_start([b"a"], [10], [1])
    core.put_end([b"a"])
    assert core.journal is None and core.take_replica_changes() == []
