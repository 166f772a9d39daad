"""put_commit: a writer's PENDING placeholder renamed to its real key and committed with
the real checksum in one call (core.py MasterCore.put_commit, objects.py
ObjectTable.rename), and the PutCommit RPC that carries it (service.py)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.errors import MAX_KEY_BYTES, Code, InvalidArgument, KVStoreError
from kvstore.master.core import (
    CoreConfig,
    CoreStats,
    EventKind,
    Location,
    ManualClock,
    MasterCore,
    ObjectInfo,
    PutStartResult,
)
from kvstore.master.core.writes import AHEAD_SHARE
from kvstore.master.metrics import MasterMetrics
from kvstore.master.service import MasterService
from kvstore.security.access import AccessList, Authenticator, new_token, token_hash
from kvstore.v1 import master_pb2 as pb

KiB = 1 << 10
W = "writer-1"
OK, NOT_FOUND, EXISTS, IN_PROGRESS, BAD = (Code.OK, Code.NOT_FOUND, Code.ALREADY_EXISTS,
                                          Code.IN_PROGRESS, Code.INVALID_ARGUMENT)


def make(nodes: int = 1, seg: int = 1 << 20, **config: Any) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**config), clock)
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"seg{i}", (i + 1) << 32, seg)
    return core, clock


def start(core: MasterCore, keys: Sequence[bytes], size: int = KiB, checksum: int = 0,
          writer: str = W, replicas: int | None = None) -> list[PutStartResult]:
    rs = core.put_start(list(keys), [size] * len(keys), [checksum] * len(keys),
                        replicas=replicas, writer=writer)
    assert [r.code for r in rs] == [OK] * len(keys), rs
    return rs


def put(core: MasterCore, keys: Sequence[bytes], size: int = KiB, checksum: int = 7) -> None:
    start(core, keys, size, checksum, writer="")
    assert core.put_end(list(keys)) == [OK] * len(keys)


def commit(core: MasterCore, pairs: Sequence[tuple[bytes, bytes]], size: int = KiB,
           checksum: int = 99, writer: str = W) -> list[Code]:
    return core.put_commit([p for p, _ in pairs], [k for _, k in pairs], [size] * len(pairs),
                           [checksum] * len(pairs), writer)


def info(core: MasterCore, key: bytes) -> ObjectInfo:
    i = core.inspect(key)
    assert i is not None, key
    return i


def counts(st_: CoreStats) -> tuple[int, ...]:
    return (st_.objects_pending, st_.objects_complete, st_.bytes_pending, st_.bytes_complete,
            st_.pool_used, st_.pool_pending, st_.pool_pinned)


def unchanged_pending(core: MasterCore, placeholder: bytes, locations: list[Location],
                      writer: str = W, checksum: int = 0) -> None:
    """The placeholder is still the writer's PENDING object, where it was."""
    i = info(core, placeholder)
    assert (i.state, i.writer, i.checksum, i.locations) == ("pending", writer, checksum, locations)
    assert core.exists([placeholder]) == [False]


# ---------------------------------------------------------------- happy path


def test_commit_renames_and_commits_like_put_end_would() -> None:
    core, clock = make(nodes=3)
    twin, twin_clock = make(nodes=3)
    size, checksum = 3 * KiB + 5, 0xDEAD_BEEF_0123_4567
    r = start(core, [b"ph-0"], size, replicas=2)[0]
    t = start(twin, [b"key"], size, checksum, replicas=2)[0]
    assert r.locations == t.locations and r.placement == t.placement
    assert counts(core.stats()) == counts(twin.stats())
    st0 = core.stats()
    assert (st0.objects_pending, st0.bytes_pending, st0.objects_complete) == (1, size, 0)
    clock.advance(2.5)
    twin_clock.advance(2.5)

    assert core.put_commit([b"ph-0"], [b"key"], [size], [checksum], W) == [OK]
    assert twin.put_end([b"key"], W) == [OK]

    assert core.exists([b"key", b"ph-0"]) == [True, False]
    assert core.inspect(b"ph-0") is None
    assert core.keys() == [b"key"]
    i = info(core, b"key")
    assert (i.key, i.state, i.size, i.checksum, i.writer, i.pins) == (
        b"key", "complete", size, checksum, "", 0)
    assert i.locations == r.locations
    assert i.last_access == clock.now()  # recency starts at the commit, as put_end's
    assert i == info(twin, b"key")
    got = core.get_replicas([b"key"])
    rr = got.results[0]
    assert (rr.code, rr.size, rr.checksum) == (OK, size, checksum)
    assert rr.locations == r.locations and rr.placement == r.placement
    twin.get_replicas([b"key"])
    # Everything the stats count moved from pending to complete exactly as put_end's.
    assert core.stats() == twin.stats()
    st1 = core.stats()
    assert (st1.objects_pending, st1.bytes_pending, st1.pool_pending) == (0, 0, 0)
    assert (st1.objects_complete, st1.bytes_complete) == (1, size)


def test_a_batch_commits_each_pair_and_a_retry_is_told_so() -> None:
    core, _ = make()
    rs = start(core, [b"p0", b"p1", b"p2"], 100)
    assert core.put_commit([b"p0", b"p1", b"p2"], [b"k0", b"k1", b"k2"], [100] * 3,
                           [10, 11, 12], W) == [OK] * 3
    for j in range(3):
        i = info(core, b"k%d" % j)
        assert (i.checksum, i.locations, i.state) == (10 + j, rs[j].locations, "complete")
    # put_end / put_revoke of the committed key: the usual answers for a COMPLETE one.
    assert core.put_end([b"k0"], W) == [EXISTS]
    assert core.put_revoke([b"k0"], W) == [EXISTS]
    # The placeholder names are free again: a new put_start under one allocates afresh.
    again = start(core, [b"p0"], 100)[0]
    assert again.locations != rs[0].locations
    assert core.exists([b"k0", b"k1", b"k2"]) == [True] * 3
    st_ = core.stats()
    assert (st_.objects_pending, st_.objects_complete, st_.bytes_complete) == (1, 3, 300)


def test_committed_object_is_not_reclaimed_at_put_timeout() -> None:
    core, clock = make(put_timeout=5.0)
    start(core, [b"ph", b"other"])
    assert commit(core, [(b"ph", b"k")]) == [OK]
    clock.advance(10)
    report = core.tick()
    assert report.reclaimed == 1  # only `other`
    assert core.exists([b"k"]) == [True]
    st_ = core.stats()
    assert (st_.objects_pending, st_.objects_complete, st_.reclaimed_pending) == (0, 1, 1)
    assert (st_.bytes_pending, st_.bytes_complete, st_.pool_pending) == (0, KiB, 0)


# ---------------------------------------------------------------- per-pair codes


def test_already_exists_keeps_the_placeholder_for_another_key() -> None:
    core, _ = make()
    put(core, [b"k"], KiB, checksum=5)
    before = info(core, b"k")
    r = start(core, [b"ph"])[0]
    assert commit(core, [(b"ph", b"k")], checksum=6) == [EXISTS]
    assert info(core, b"k") == before  # the stored object is untouched
    unchanged_pending(core, b"ph", r.locations)
    st_ = core.stats()
    assert (st_.objects_pending, st_.objects_complete, st_.bytes_pending) == (1, 1, KiB)
    assert commit(core, [(b"ph", b"k2")], checksum=6) == [OK]
    assert info(core, b"k2").locations == r.locations
    assert info(core, b"k2").checksum == 6


def test_in_progress_when_key_pending_or_writer_wrong_or_anonymous() -> None:
    core, _ = make()
    start(core, [b"k"], writer="someone-else")  # k is being written by another put
    start(core, [b"k2"], writer=W)  # ... or by this same writer, as a plain put
    r = start(core, [b"ph"])[0]
    anon = start(core, [b"anon-ph"], writer="")[0]
    assert commit(core, [(b"ph", b"k"), (b"ph", b"k2")]) == [IN_PROGRESS, IN_PROGRESS]
    assert commit(core, [(b"ph", b"x")], writer="intruder") == [IN_PROGRESS]
    assert commit(core, [(b"ph", b"x")], writer="") == [IN_PROGRESS]
    # A placeholder needs a named writer: one started anonymously is nobody's to commit.
    assert commit(core, [(b"anon-ph", b"x")], writer="") == [IN_PROGRESS]
    assert commit(core, [(b"anon-ph", b"x")], writer=W) == [IN_PROGRESS]
    unchanged_pending(core, b"ph", r.locations)
    unchanged_pending(core, b"anon-ph", anon.locations, writer="")
    assert info(core, b"k").state == "pending" and info(core, b"k").writer == "someone-else"
    assert core.inspect(b"x") is None
    assert core.stats().objects_pending == 4 and core.stats().objects_complete == 0
    assert commit(core, [(b"ph", b"x")]) == [OK]  # still the writer's


def test_not_found_never_started_revoked_or_already_committed() -> None:
    core, _ = make()
    put(core, [b"done"])
    start(core, [b"p0", b"p1", b"p2"])
    assert core.put_revoke([b"p1"], W) == [OK]
    assert commit(core, [(b"never", b"a"), (b"p1", b"b"), (b"done", b"c")]) == [NOT_FOUND] * 3
    # The same placeholder twice in one batch: the second finds it gone.
    assert commit(core, [(b"p0", b"d"), (b"p0", b"e")], checksum=4) == [OK, NOT_FOUND]
    assert commit(core, [(b"p0", b"f")]) == [NOT_FOUND]  # and in a later call
    assert core.exists([b"a", b"b", b"c", b"d", b"e", b"f", b"done"]) == [
        False, False, False, True, False, False, True]
    assert info(core, b"d").checksum == 4
    assert info(core, b"p2").state == "pending"


def test_not_found_after_reclaim_by_tick() -> None:
    core, clock = make(put_timeout=5.0)
    start(core, [b"ph"])
    clock.advance(4.9)
    assert core.tick().reclaimed == 0
    clock.advance(0.2)
    report = core.tick()
    assert report.reclaimed == 1
    assert [e.kind for e in core.take_events()] == [EventKind.RECLAIMED]
    assert commit(core, [(b"ph", b"k")]) == [NOT_FOUND]
    assert core.exists([b"k"]) == [False] and core.keys() == []
    assert counts(core.stats())[:4] == (0, 0, 0, 0)


def test_invalid_arguments_leave_the_placeholder_pending() -> None:
    core, _ = make()
    r = start(core, [b"ph"], 100)[0]
    long_key = b"x" * (MAX_KEY_BYTES + 1)
    before = core.stats()
    codes = core.put_commit(
        [b"ph", b"ph", b"ph", b"ph", b"ph", b"", long_key],
        [b"k", b"k", b"", long_key, b"k", b"k", b"k"],
        [101, 99, 100, 100, 100, 100, 100],
        [1, 1, 1, 1, -1, 1, 1], W)
    assert codes == [BAD] * 7
    assert core.put_commit([b"ph"], [b"k"], [100], [1 << 64], W) == [BAD]
    assert core.stats() == before
    unchanged_pending(core, b"ph", r.locations)
    assert core.inspect(b"k") is None
    # The largest u64 and the longest key are fine.
    big = b"y" * MAX_KEY_BYTES
    assert core.put_commit([b"ph"], [big], [100], [(1 << 64) - 1], W) == [OK]
    assert info(core, big).checksum == (1 << 64) - 1


def test_malformed_calls_raise_and_change_nothing() -> None:
    core, _ = make(max_batch=2)
    start(core, [b"p0", b"p1"])
    before = core.stats()
    with pytest.raises(InvalidArgument):
        core.put_commit([b"p0", b"p1"], [b"k0"], [KiB], [1], W)
    with pytest.raises(InvalidArgument):
        core.put_commit([b"p0"], [b"k0"], [KiB, KiB], [1], W)
    with pytest.raises(InvalidArgument):
        core.put_commit([b"p0"], [b"k0"], [KiB], [1, 2], W)
    with pytest.raises(InvalidArgument):
        core.put_commit([b"p0", b"p1"], [b"k0", b"k1"], [KiB, KiB], [1], W)
    with pytest.raises(InvalidArgument):  # larger than max_batch
        core.put_commit([b"p0"] * 3, [b"a", b"b", b"c"], [KiB] * 3, [1] * 3, W)
    assert core.stats() == before
    assert core.keys() == [b"p0", b"p1"]
    assert core.put_commit([], [], [], [], W) == []
    assert commit(core, [(b"p0", b"k0"), (b"p1", b"k1")]) == [OK, OK]


def test_a_non_integer_checksum_is_a_per_key_error_not_a_half_applied_batch() -> None:
    core, _ = make()
    start(core, [b"p0", b"p1"])
    before = core.stats()
    try:
        codes: list[Code] | None = core.put_commit([b"p0", b"p1"], [b"k0", b"k1"], [KiB, KiB],
                                                   [5, 1.5], W)  # type: ignore[list-item]
    except InvalidArgument:
        codes = None
    if codes is None:  # Rule 3: a call that raises has changed nothing
        assert core.stats() == before and core.keys() == [b"p0", b"p1"]
    else:
        assert codes == [OK, BAD]
        unchanged_pending(core, b"p1", info(core, b"p1").locations)
        st_ = core.stats()
        assert (st_.objects_pending, st_.bytes_pending, st_.bytes_complete) == (1, KiB, KiB)


def test_same_key_twice_in_a_batch_first_wins() -> None:
    core, _ = make()
    r0, r1 = start(core, [b"p0", b"p1"])
    assert core.put_commit([b"p0", b"p1"], [b"k", b"k"], [KiB, KiB], [1, 2], W) == [OK, EXISTS]
    i = info(core, b"k")
    assert (i.checksum, i.locations) == (1, r0.locations)
    unchanged_pending(core, b"p1", r1.locations)
    st_ = core.stats()
    assert (st_.objects_pending, st_.objects_complete) == (1, 1)


def test_placeholder_named_as_its_own_key_changes_nothing_inconsistent() -> None:
    """Not documented either way; whatever the code answers, the books must agree."""
    core, _ = make()
    start(core, [b"same"])
    code = commit(core, [(b"same", b"same")], checksum=3)[0]
    i = info(core, b"same")
    st_ = core.stats()
    if code == OK:
        assert (i.state, i.checksum) == ("complete", 3)
        assert (st_.objects_pending, st_.objects_complete, st_.bytes_complete) == (0, 1, KiB)
    else:
        assert (i.state, i.checksum, i.writer) == ("pending", 0, W)
        assert (st_.objects_pending, st_.objects_complete, st_.bytes_pending) == (1, 0, KiB)


# ---------------------------------------------------------------- like any other object


def test_committed_objects_are_evicted_in_commit_order() -> None:
    # 64 KiB of DRAM, 4 KiB objects: 16 fit; watermarks 90 % -> 80 %.
    core, clock = make(seg=64 * KiB, evict_high=0.9, evict_low=0.8)
    ph = [b"ph%d" % i for i in range(14)]
    start(core, ph, 4 * KiB)
    # Commit in reverse start order: recency is the commit's, not the put_start's.
    for i in reversed(range(14)):
        clock.advance(1)
        assert core.put_commit([ph[i]], [b"k%d" % i], [4 * KiB], [i], W) == [OK]
    assert core.stats().objects_complete == 14
    # One more 4 KiB: 60 KiB > 0.9 * 64 KiB, so eviction frees down to <= 0.8 * 64 KiB,
    # taking the three committed first (k13, k12, k11) and nothing newer.
    start(core, [b"new"], 4 * KiB)
    evicted = [e for e in core.take_events() if e.kind == EventKind.EVICTED]
    assert [k for e in evicted for k in e.keys] == [b"k13", b"k12", b"k11"]
    assert core.exists([b"k%d" % i for i in range(14)]) == [True] * 11 + [False] * 3
    st_ = core.stats()
    assert (st_.evictions, st_.evicted_bytes) == (3, 12 * KiB)
    assert (st_.objects_complete, st_.bytes_complete, st_.objects_pending) == (11, 44 * KiB, 1)
    # Admin eviction follows the same order: 48 KiB used (44 complete, 4 pending) down to
    # half the pool takes the next four committed (k10 .. k7); the PENDING one stays.
    report = core.evict_to(0.5)
    assert (report.evicted, report.used, report.reached) == (4, 32 * KiB, True)
    assert core.exists([b"k%d" % i for i in range(14)]) == [True] * 7 + [False] * 7
    assert info(core, b"new").state == "pending"


def test_evict_to_takes_committed_objects_oldest_first() -> None:
    core, clock = make(seg=64 * KiB)
    ph = [b"ph%d" % i for i in range(8)]
    start(core, ph, 4 * KiB)
    for i in (3, 1, 0, 2, 7, 5, 4, 6):
        clock.advance(1)
        assert core.put_commit([ph[i]], [b"k%d" % i], [4 * KiB], [i], W) == [OK]
    report = core.evict_to(16 * KiB / (64 * KiB))  # keep 4 of 8
    assert (report.evicted, report.evicted_bytes, report.reached) == (4, 16 * KiB, True)
    assert core.exists([b"k%d" % i for i in range(8)]) == [
        False, False, False, False, True, True, True, True]


def test_remove_and_leases_work_on_committed_objects() -> None:
    core, _ = make(seg=64 * KiB)
    start(core, [b"p0", b"p1"], 4 * KiB)
    assert core.put_commit([b"p0", b"p1"], [b"a", b"b"], [4 * KiB] * 2, [1, 2], W) == [OK, OK]
    lease = core.lookup([b"a"])
    assert lease.count == 1
    assert info(core, b"a").pins == 1
    assert core.stats().pool_pinned == 4 * KiB
    assert core.remove([b"a"]) == [IN_PROGRESS]  # pinned
    report = core.evict_to(0.0)  # evicts b, never the pinned a
    assert report.evicted == 1 and not report.reached
    assert core.exists([b"a", b"b"]) == [True, False]
    core.release_lease(lease.lease_id)
    assert core.remove([b"a"]) == [OK]
    assert core.exists([b"a"]) == [False] and core.keys() == []
    st_ = core.stats()
    assert counts(st_) == (0, 0, 0, 0, 0, 0, 0)


def test_journal_records_the_real_key_never_the_placeholder() -> None:
    core, _ = make(nodes=2)
    core.journal = []
    r = start(core, [b"ph"], 100, replicas=2)[0]
    assert core.take_replica_changes() == []  # PENDING: nobody's inventory yet
    assert commit(core, [(b"ph", b"real")], size=100, checksum=42) == [OK]
    added = core.take_replica_changes()
    assert sorted((c.node_id, c.key, c.size, c.checksum, c.added) for c in added) == [
        ("n0", b"real", 100, 42, True), ("n1", b"real", 100, 42, True)]
    bases = {"n0": 1 << 32, "n1": 2 << 32}
    assert {c.node_id: c.offset for c in added} == {
        loc.node_id: loc.addr - bases[loc.node_id] for loc in r.locations}
    # Refused commits journal nothing.
    start(core, [b"ph2"], 100)
    assert commit(core, [(b"ph2", b"real")], size=100) == [EXISTS]
    assert commit(core, [(b"ph2", b"x")], size=101) == [BAD]
    assert core.take_replica_changes() == []
    assert core.remove([b"real"]) == [OK]
    dropped = core.take_replica_changes()
    assert sorted((c.node_id, c.key, c.added) for c in dropped) == [
        ("n0", b"real", False), ("n1", b"real", False)]
    assert all(c.key != b"ph" for c in added + dropped)


# ---------------------------------------------------------------- tenants and quotas


def test_rename_inside_a_tenant_keeps_its_usage() -> None:
    core, _ = make()
    core.set_quotas({b"a/": 10 * KiB})
    start(core, [b"a/ph0", b"a/ph1"], 2 * KiB)
    assert core.tenant_usage() == {b"a/": (4 * KiB, 10 * KiB)}
    assert commit(core, [(b"a/ph0", b"a/k0")], size=2 * KiB) == [OK]
    assert core.tenant_usage() == {b"a/": (4 * KiB, 10 * KiB)}
    assert core.stats().tenants == {"a": (4 * KiB, 10 * KiB)}
    assert core.remove([b"a/k0"]) == [OK]
    assert core.tenant_usage() == {b"a/": (2 * KiB, 10 * KiB)}
    assert core.put_revoke([b"a/ph1"], W) == [OK]
    assert core.tenant_usage() == {b"a/": (0, 10 * KiB)}


def test_rename_across_tenants_with_a_quota_is_refused() -> None:
    core, _ = make()
    core.set_quotas({b"a/": 10 * KiB, b"b/": 10 * KiB})
    ra, rc, rn = (start(core, [k])[0] for k in (b"a/ph", b"c/ph", b"ph"))
    before = core.stats()
    usage = core.tenant_usage()
    assert commit(core, [(b"a/ph", b"b/k"),   # both have a quota
                         (b"a/ph", b"c/k"),   # the placeholder's tenant has one
                         (b"c/ph", b"a/k"),   # the key's tenant has one
                         (b"ph", b"b/k")]) == [BAD] * 4  # no tenant -> quota tenant
    assert core.stats() == before and core.tenant_usage() == usage
    unchanged_pending(core, b"a/ph", ra.locations)
    unchanged_pending(core, b"c/ph", rc.locations)
    unchanged_pending(core, b"ph", rn.locations)
    assert core.exists([b"b/k", b"c/k", b"a/k"]) == [False] * 3
    # Between tenants without a quota, while others have one: fine.
    assert commit(core, [(b"c/ph", b"d/k"), (b"ph", b"e/k")]) == [OK, OK]
    assert core.tenant_usage() == usage
    assert commit(core, [(b"a/ph", b"a/k")]) == [OK]
    assert core.tenant_usage() == {b"a/": (KiB, 10 * KiB), b"b/": (0, 10 * KiB)}


def test_rename_across_tenants_without_quotas_is_fine_and_counted_later() -> None:
    core, _ = make()
    start(core, [b"a/ph"], 3 * KiB)
    assert commit(core, [(b"a/ph", b"b/k")], size=3 * KiB) == [OK]
    assert core.exists([b"b/k"]) == [True]
    # Usage computed afresh follows the index: the bytes are b's now.
    core.set_quotas({b"a/": 10 * KiB, b"b/": 10 * KiB})
    assert core.tenant_usage() == {b"a/": (0, 10 * KiB), b"b/": (3 * KiB, 10 * KiB)}


# ---------------------------------------------------------------- node loss


def test_placeholder_on_a_lost_node_is_not_found() -> None:
    core, _ = make(nodes=3)
    r1 = start(core, [b"one"], replicas=1)[0]
    r2 = start(core, [b"two"], replicas=2)[0]
    lost = r1.locations[0].node_id
    gone = core.unmount_node(lost)
    assert b"one" in gone
    expect_two = NOT_FOUND if lost in {loc.node_id for loc in r2.locations} else OK
    assert commit(core, [(b"one", b"k1"), (b"two", b"k2")]) == [NOT_FOUND, expect_two]
    assert core.exists([b"k1"]) == [False]
    # A PENDING object with a replica on the lost node is gone whole, placeholder or not.
    core2, _ = make(nodes=2)
    r = start(core2, [b"ph"], replicas=2)[0]
    assert {loc.node_id for loc in r.locations} == {"n0", "n1"}
    core2.unmount_node("n1")
    assert commit(core2, [(b"ph", b"k")]) == [NOT_FOUND]
    assert core2.keys() == [] and counts(core2.stats())[:4] == (0, 0, 0, 0)


# ---------------------------------------------------------------- service


class Leader:
    is_leader = True
    epoch = 5
    leader_address = "127.0.0.1:1"
    leader_for = 1.0


def _service() -> tuple[MasterService, MasterCore, dict[str, Any]]:
    tokens = {name: new_token() for name in ("a", "b", "node", "adm")}
    acl = AccessList.parse({
        "tenants": {"ta": {}, "tb": {}},
        "tokens": [
            {"name": "a", "role": "client", "tenant": "ta", "sha256": token_hash(tokens["a"])},
            {"name": "b", "role": "client", "tenant": "tb", "sha256": token_hash(tokens["b"])},
            {"name": "node", "role": "node", "sha256": token_hash(tokens["node"])},
            {"name": "adm", "role": "admin", "sha256": token_hash(tokens["adm"])},
        ],
    })
    core, _ = make()
    auth = Authenticator(acl)
    svc = MasterService(core, Leader(), MasterMetrics(), auth)
    return svc, core, {k: auth.principal(v) for k, v in tokens.items()}


def test_service_commits_under_the_callers_tenant() -> None:
    svc, core, who = _service()
    started = svc.handle("PutStart", pb.PutStartRequest(keys=[b"ph0", b"ph1"], sizes=[10, 20],
                                                         checksums=[0, 0], writer=W), who["a"])
    assert [i.code for i in started.items] == [0, 0]
    assert core.keys() == [b"ta/ph0", b"ta/ph1"]
    reply = svc.handle("PutCommit", pb.PutCommitRequest(
        placeholders=[b"ph0"], keys=[b"k0"], sizes=[10], checksums=[77], writer=W), who["a"])
    assert (reply.error.code, reply.epoch, list(reply.codes)) == (0, 5, [OK])
    assert core.exists([b"ta/k0", b"ta/ph0", b"k0"]) == [True, False, False]
    i = info(core, b"ta/k0")
    assert (i.checksum, i.size) == (77, 10)
    assert [(loc.addr, loc.size) for loc in i.locations] == [
        (loc.addr, loc.size) for loc in started.items[0].locations]
    assert list(svc.handle("Exists", pb.KeysRequest(keys=[b"k0"]), who["a"]).exists) == [True]
    assert list(svc.handle("Exists", pb.KeysRequest(keys=[b"k0"]), who["b"]).exists) == [False]
    read = svc.handle("GetReplicas", pb.GetReplicasRequest(keys=[b"k0"]), who["a"])
    assert (read.items[0].code, read.items[0].checksum) == (0, 77)


def test_service_another_tenant_cannot_commit_a_placeholder() -> None:
    svc, core, who = _service()
    svc.handle("PutStart", pb.PutStartRequest(keys=[b"ph"], sizes=[10], checksums=[0],
                                              writer=W), who["a"])
    before = core.stats()
    for key in (b"k", b"ta/k"):
        reply = svc.handle("PutCommit", pb.PutCommitRequest(
            placeholders=[b"ph"], keys=[key], sizes=[10], checksums=[1], writer=W), who["b"])
        assert reply.error.code == 0
        assert len(reply.codes) == 1 and reply.codes[0] in (NOT_FOUND, IN_PROGRESS)
    # Naming the placeholder with the other tenant's prefix does not reach it either.
    reply = svc.handle("PutCommit", pb.PutCommitRequest(
        placeholders=[b"ta/ph"], keys=[b"k"], sizes=[10], checksums=[1], writer=W), who["b"])
    assert len(reply.codes) == 1 and reply.codes[0] in (NOT_FOUND, IN_PROGRESS)
    assert core.stats() == before
    assert core.keys() == [b"ta/ph"] and info(core, b"ta/ph").state == "pending"
    assert core.exists([b"tb/k", b"ta/k", b"tb/ta/k"]) == [False] * 3


def test_service_refuses_put_commit_to_a_node_token() -> None:
    svc, core, who = _service()
    svc.handle("PutStart", pb.PutStartRequest(keys=[b"ta/ph"], sizes=[10], checksums=[0],
                                              writer=W), who["adm"])  # admin: no prefix
    before = core.stats()
    reply = svc.handle("PutCommit", pb.PutCommitRequest(
        placeholders=[b"ta/ph"], keys=[b"ta/k"], sizes=[10], checksums=[1], writer=W),
        who["node"])
    assert reply.error.code == Code.PERMISSION_DENIED and "PutCommit" in reply.error.message
    assert list(reply.codes) == []
    assert core.stats() == before and core.keys() == [b"ta/ph"]
    # The admin may, and sees the keys as the core stores them.
    reply = svc.handle("PutCommit", pb.PutCommitRequest(
        placeholders=[b"ta/ph"], keys=[b"ta/k"], sizes=[10], checksums=[1], writer=W),
        who["adm"])
    assert list(reply.codes) == [OK] and core.exists([b"ta/k"]) == [True]


def test_service_reports_mismatched_lists_as_invalid_argument() -> None:
    svc, core, who = _service()
    svc.handle("PutStart", pb.PutStartRequest(keys=[b"ph"], sizes=[10], checksums=[0],
                                              writer=W), who["a"])
    before = core.stats()
    reply = svc.handle("PutCommit", pb.PutCommitRequest(
        placeholders=[b"ph"], keys=[b"k", b"k2"], sizes=[10], checksums=[1], writer=W), who["a"])
    assert reply.error.code == Code.INVALID_ARGUMENT and list(reply.codes) == []
    assert core.stats() == before


# ---------------------------------------------------------------- differential


def _same(a: MasterCore, b: MasterCore, real_keys: list[bytes]) -> None:
    sa, sb = a.stats(), b.stats()
    assert counts(sa) == counts(sb)
    assert (sa.evictions, sa.evicted_bytes, sa.reclaimed_pending, sa.put_failures) == (
        sb.evictions, sb.evicted_bytes, sb.reclaimed_pending, sb.put_failures)
    assert a.exists(real_keys) == b.exists(real_keys)
    for k in real_keys:
        ia = a.inspect(k)
        if ia is not None and ia.state == "complete":
            assert ia == info(b, k)


def _release(core: MasterCore, lease_id: int) -> str:
    try:
        core.release_lease(lease_id)
    except KVStoreError as exc:  # expired meanwhile
        return type(exc).__name__
    return "released"


_op = st.one_of(
    st.tuples(st.just("start"), st.integers(0, 7), st.integers(1, 6)),
    st.tuples(st.just("commit"), st.lists(st.integers(0, 7), min_size=1, max_size=4)),
    st.tuples(st.just("revoke"), st.integers(0, 7)),
    st.tuples(st.just("remove"), st.integers(0, 7)),
    st.tuples(st.just("lookup"), st.integers(0, 7)),
    st.tuples(st.just("release"), st.integers(0, 3)),
    st.tuples(st.just("time"), st.sampled_from([0.5, 3.0, 11.0])),
    st.tuples(st.just("evict"), st.sampled_from([0.0, 0.25, 0.5])),
)


def _run_twins(ops: Sequence[tuple[Any, ...]]) -> int:
    """Twin cores, identical clocks: A puts real keys (put_start, put_end); B starts
    placeholders and commits them (put_start, put_commit). Same space, same counts, same
    answers, same locations for every real key, after every step. Returns the number of
    pairs committed."""
    a, ca = make(nodes=2, seg=16 * KiB, put_timeout=10.0)
    b, cb = make(nodes=2, seg=16 * KiB, put_timeout=10.0)
    real = [b"key-%d" % i for i in range(8)]
    # In flight, per real key: (placeholder on B, size, checksum).
    flying: dict[int, tuple[bytes, int, int]] = {}
    leases: list[tuple[int, int]] = []
    serial = commits = 0
    for op in ops:
        kind = op[0]
        if kind == "start":
            i, units = op[1], op[2]
            if a.inspect(real[i]) is not None:
                continue  # B's placeholder could not answer what A's put_start does
            serial += 1
            size, checksum = units * KiB - serial % 7, 1000 + serial
            ph = b"ph-%d" % serial
            ra = a.put_start([real[i]], [size], [checksum], writer=W)[0]
            rb = b.put_start([ph], [size], [0], writer=W)[0]
            assert (ra.code, ra.locations, ra.placement) == (rb.code, rb.locations, rb.placement)
            if ra.code == OK:
                flying[i] = (ph, size, checksum)
        elif kind == "commit":
            if not flying:
                continue
            now_flying = sorted(flying)
            batch = list(dict.fromkeys(now_flying[j % len(now_flying)] for j in op[1]))
            commits += len(batch)
            got_a = a.put_end([real[i] for i in batch], W)
            got_b = b.put_commit([flying[i][0] for i in batch], [real[i] for i in batch],
                                 [flying[i][1] for i in batch], [flying[i][2] for i in batch], W)
            assert got_a == got_b
            for i in batch:
                del flying[i]
        elif kind == "revoke":
            if flying:
                i = sorted(flying)[op[1] % len(flying)]
                assert a.put_revoke([real[i]], W) == b.put_revoke([flying.pop(i)[0]], W)
        elif kind == "remove":
            if op[1] not in flying:  # A's PENDING key is IN_PROGRESS, B has none
                assert a.remove([real[op[1]]]) == b.remove([real[op[1]]])
        elif kind == "lookup":
            la, lb = a.lookup([real[op[1]]]), b.lookup([real[op[1]]])
            assert la.count == lb.count
            if la.count:
                leases.append((la.lease_id, lb.lease_id))
        elif kind == "release":
            if leases:
                la_id, lb_id = leases.pop(op[1] % len(leases))
                assert _release(a, la_id) == _release(b, lb_id)
        elif kind == "evict":
            assert a.evict_to(op[1]) == b.evict_to(op[1])
        else:
            ca.advance(op[1])
            cb.advance(op[1])
            ta, tb = a.tick(), b.tick()
            assert ta == tb
            for i in [i for i, (ph, _, _) in flying.items() if b.inspect(ph) is None]:
                assert a.inspect(real[i]) is None  # reclaimed on both
                del flying[i]
        _same(a, b, real)
    return commits


def _random_op(rnd: random.Random) -> tuple[Any, ...]:
    kind = rnd.choices(["start", "commit", "revoke", "remove", "lookup", "release", "time",
                        "evict"], weights=[8, 5, 1, 2, 2, 1, 1, 1])[0]
    if kind == "start":
        return kind, rnd.randrange(8), rnd.randint(1, 6)
    if kind == "commit":
        return kind, [rnd.randrange(8) for _ in range(rnd.randint(1, 4))]
    if kind in ("revoke", "remove", "lookup", "release"):
        return kind, rnd.randrange(8)
    if kind == "time":
        return kind, rnd.choice([0.5, 3.0, 11.0])
    return kind, rnd.choice([0.0, 0.25, 0.5])


@pytest.mark.parametrize("seed", range(12))
def test_commit_matches_put_start_put_end_seeded(seed: int) -> None:
    rnd = random.Random(seed)
    assert _run_twins([_random_op(rnd) for _ in range(250)]) > 20


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=5, max_size=60))
def test_commit_matches_put_start_put_end(ops: list[tuple[Any, ...]]) -> None:
    _run_twins(ops)


# -- space started ahead (put_start(ahead=True)) ------------------------------------------


def ahead(core: MasterCore, keys: Sequence[bytes], size: int = KiB,
          replicas: int | None = None) -> list[PutStartResult]:
    return core.put_start(list(keys), [size] * len(keys), [0] * len(keys), replicas=replicas,
                          writer=W, ahead=True)


def test_space_ahead_comes_from_free_space_and_commits_like_any_put() -> None:
    core, _ = make(nodes=2)
    rs = ahead(core, [b"p0", b"p1"], replicas=2)
    assert [r.code for r in rs] == [OK, OK] and all(len(r.locations) == 2 for r in rs)
    assert commit(core, [(b"p0", b"k0"), (b"p1", b"k1")]) == [OK, OK]
    assert core.exists([b"k0", b"k1"]) == [True, True]


def test_space_ahead_never_evicts_and_is_all_or_nothing() -> None:
    core, _ = make(seg=64 * KiB, evict_high=0.99, evict_low=0.5)
    put(core, [f"old{i}".encode() for i in range(12)], size=4 * KiB)  # 48 of 64 KiB
    before = counts(core.stats())
    evictions = core.eviction_stats()
    # 5 x 4 KiB: more than is free without an eviction (and than AHEAD_SHARE): none.
    rs = ahead(core, [f"p{i}".encode() for i in range(5)], size=4 * KiB)
    assert {r.code for r in rs} == {Code.STORE_FULL} and "ahead" in rs[0].message
    assert counts(core.stats()) == before and core.eviction_stats() == evictions
    assert core.exists([f"old{i}".encode() for i in range(12)]) == [True] * 12
    # A plain put of the same size does evict to make room.
    put(core, [b"new"], size=20 * KiB)
    assert core.exists([f"old{i}".encode() for i in range(12)]).count(False) > 0


def test_space_ahead_stays_under_its_share_of_the_pool() -> None:
    core, _ = make(seg=1 << 20)
    share = int(AHEAD_SHARE * (1 << 20))
    n = share // (16 * KiB)
    assert {r.code for r in ahead(core, [f"a{i}".encode() for i in range(n)], size=16 * KiB)} \
        == {OK}
    # PENDING space of any kind counts: one more placeholder is refused, free space or not.
    assert ahead(core, [b"one-more"], size=16 * KiB)[0].code == Code.STORE_FULL
    assert core.stats().objects_pending == n


def test_space_ahead_is_refused_where_quotas_apply() -> None:
    core, _ = make()
    core.set_quotas({b"ta/": 1 << 20})
    assert {r.code for r in ahead(core, [b"ta/p0", b"p1"])} == {Code.STORE_FULL}
    assert core.stats().objects_pending == 0
