"""The SSD tier's index and cap accounting, and its group-commit bookkeeping, without a
file or a thread: plain method calls, as the tier makes them under its lock."""

from __future__ import annotations

import threading

import pytest

from kvstore.errors import Internal, StoreFull
from kvstore.store.ssd_commit import GroupCommit
from kvstore.store.ssd_index import SsdEntry, SsdIndex, over_cap

BLOCK = 4096


def entry(key: bytes, blocks: int = 1) -> SsdEntry:
    return SsdEntry(key=key, size=10, checksum=0, disk_bytes=blocks * BLOCK, path=key.decode())


def store(index: SsdIndex, key: bytes, blocks: int = 1) -> list[bytes]:
    """A whole put: plan, unlink the victims, write; the victims' keys."""
    plan = index.plan_put(key, blocks * BLOCK)
    index.victims_unlinked(plan)
    index.finish_put(plan, entry(key, blocks))
    return [v.key for v in plan.victims]


def test_puts_evict_least_recently_used_first() -> None:
    index = SsdIndex(4 * BLOCK)
    for key in (b"a", b"b", b"c", b"d"):
        assert store(index, key) == []
    assert index.touch(b"a") is not None
    assert index.get(b"b") is not None  # no use: b stays the oldest
    assert store(index, b"e") == [b"b"]
    assert store(index, b"big", blocks=2) == [b"c", b"d"]
    assert [e.key for e in index.entries()] == [b"a", b"e", b"big"]
    assert (index.used, index.stored, index.reserved) == (4 * BLOCK, 4 * BLOCK, 0)
    assert (index.evictions, index.evicted_bytes) == (3, 3 * BLOCK)


def test_room_is_counted_from_the_plan_until_the_victims_are_unlinked() -> None:
    index = SsdIndex(4 * BLOCK)
    for key in (b"a", b"b", b"c", b"d"):
        store(index, key)
    plan = index.plan_put(b"x", BLOCK)
    assert [v.key for v in plan.victims] == [b"a"]
    # a's file is still on disk: the cap still counts it, and a is busy.
    assert index.used == 4 * BLOCK and index.reserved == BLOCK
    assert index.is_busy(b"a") and index.is_busy(b"x") and b"a" not in index
    with pytest.raises(StoreFull, match="reserved by puts in flight"):
        index.plan_put(b"y", 4 * BLOCK)
    index.victims_unlinked(plan)
    assert not index.is_busy(b"a") and index.is_busy(b"x")
    index.finish_put(plan, None)  # the write failed: its room is released
    assert (index.used, index.stored, index.reserved) == (3 * BLOCK, 3 * BLOCK, 0)
    assert not index.is_busy(b"x") and b"x" not in index


def test_store_full_evicts_nothing() -> None:
    index = SsdIndex(4 * BLOCK)
    store(index, b"a")
    with pytest.raises(StoreFull, match="SSD tier full"):
        index.plan_put(b"huge", 5 * BLOCK)
    assert [e.key for e in index.entries()] == [b"a"]
    assert index.evictions == 0 and index.used == BLOCK and not index.is_busy(b"huge")


def test_take_and_release() -> None:
    index = SsdIndex(4 * BLOCK)
    store(index, b"a")
    stale = index.get(b"a")
    assert stale is not None
    assert index.take(b"a", entry(b"a")) is None  # another entry of the same key: kept
    taken = index.take(b"a", stale)
    assert taken is stale and index.is_busy(b"a") and index.used == BLOCK
    assert index.stored == 0 and index.take(b"a") is None
    index.release([stale])
    assert index.used == 0 and not index.is_busy(b"a")


def test_over_cap_drops_the_oldest_until_the_rest_fit() -> None:
    found = [entry(b"old", 2), entry(b"mid"), entry(b"new")]
    assert over_cap(found, 4 * BLOCK) == 0
    assert over_cap(found, 3 * BLOCK) == 1
    assert over_cap(found, BLOCK) == 2
    assert over_cap(found, 0) == 3
    index = SsdIndex(BLOCK)
    index.load(found[2:], found[:2])
    assert [e.key for e in index.entries()] == [b"new"]
    assert (index.used, index.evictions, index.evicted_bytes) == (BLOCK, 2, 3 * BLOCK)


# ------------------------------------------------------------------ group commit


def test_a_flush_covers_the_writes_before_it_and_only_those() -> None:
    cond = threading.Condition(threading.Lock())
    commit = GroupCommit(cond)
    assert commit.begin() is None  # nothing written: nothing to flush
    with cond:
        commit.wrote_locked(b"a")
        commit.wrote_locked(b"b")
    upto = commit.begin()
    assert upto == 2
    with cond:
        commit.wrote_locked(b"c")  # lands during the flush
        commit.succeeded_locked(upto, 0.5)
        assert commit.pending_locked() == 1
    assert commit.begin() == 3  # c needs a flush of its own
    commit.abandon()  # interrupted: nothing advanced
    with cond:
        assert commit.pending_locked() == 1
        commit.forget_locked(b"c")  # removed before any flush
        assert commit.pending_locked() == 0
    assert (commit.syncs, commit.seconds) == (1, 0.5)


def test_a_failed_flush_gives_up_every_unflushed_write() -> None:
    cond = threading.Condition(threading.Lock())
    commit = GroupCommit(cond)
    with cond:
        commit.wrote_locked(b"a")
    upto = commit.begin()
    assert upto is not None
    with cond:
        commit.wrote_locked(b"b")
        assert sorted(commit.failed_locked("the device failed", 0.1)) == [b"a", b"b"]
        assert commit.pending_locked() == 0 and commit.broken == "the device failed"
    with pytest.raises(Internal, match="the device failed"):
        commit.begin()
