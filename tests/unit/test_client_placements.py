"""The client's memory of where objects sat (placements.py)."""

from __future__ import annotations

import time

import pytest

from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore_client.placements import Placements


def learn(p: Placements, key: bytes, placement: int = 7, now: float | None = None) -> None:
    p.learn(key, 3, placement, 100, 42, "seg", "node", 4096, now)


def test_recall_needs_every_key_known() -> None:
    p = Placements()
    learn(p, b"a")
    learn(p, b"b", 8)
    seen = p.recall([b"b", b"a"])
    assert seen is not None and [s.placement for s in seen] == [8, 7]
    assert p.recall([b"a", b"c"]) is None  # one unknown: ask first, read nothing early


def test_bounded_oldest_learned_first_out() -> None:
    p = Placements(capacity=3)
    for k in (b"a", b"b", b"c"):
        learn(p, k)
    learn(p, b"a", 9)  # re-learned: now the newest
    learn(p, b"d")
    assert len(p) == 3
    assert p.recall([b"b"]) is None
    assert p.recall([b"a", b"c", b"d"]) is not None


def test_entries_older_than_max_age_are_not_trusted() -> None:
    p = Placements(max_age=60.0)
    learn(p, b"old", now=time.monotonic() - 61)
    learn(p, b"new")
    assert p.recall([b"old"]) is None and p.recall([b"new"]) is not None


def test_forget_and_zero_capacity() -> None:
    p = Placements()
    learn(p, b"a")
    p.forget(b"a")
    p.forget(b"never")
    assert p.recall([b"a"]) is None
    off = Placements(0)
    learn(off, b"a")
    assert len(off) == 0 and off.recall([b"a"]) is None
    with pytest.raises(ValueError):
        Placements(-1)


def test_learned_from_a_read_item_and_matched_against_later_ones() -> None:
    p = Placements()
    item = pb.ReadItem(size=100, checksum=42, placement=5, locations=[
        cpb.Location(node_id="n", segment="s", addr=8192, size=100, tier="dram")])
    p.learn_item(b"k", 2, item)
    p.learn_item(b"none", 2, pb.ReadItem(size=1, checksum=1))  # no placement: ignored
    (seen,) = p.recall([b"k"]) or []
    assert (seen.segment, seen.node_id, seen.addr) == ("s", "n", 8192)
    assert seen.matches(2, item)
    assert not seen.matches(3, item)  # another leader's placement 5 is another thing
    moved = pb.ReadItem(size=100, checksum=42, placement=6)
    assert not seen.matches(2, moved)
    assert p.recall([b"none"]) is None


def test_a_batch_is_learned_as_one_by_one() -> None:
    from kvstore_client.placements import Seen

    now = time.monotonic()
    p = Placements(capacity=3)
    learn(p, b"a")
    p.learn_many([(k, Seen(3, n, 100, 42, "seg", "node", 4096, now))
                  for k, n in ((b"b", 8), (b"c", 9), (b"none", 0), (b"d", 10))])
    assert p.recall([b"a"]) is None  # the oldest learned went out
    assert p.recall([b"none"]) is None  # no placement: not learned
    seen = p.recall([b"b", b"c", b"d"])
    assert seen is not None and [s.placement for s in seen] == [8, 9, 10]
    Placements(capacity=0).learn_many([(b"x", Seen(3, 1, 1, 1, "s", "n", 1, now))])


def test_staging_slices_fit_the_buffer() -> None:
    from kvstore_client.staging import Staging

    class NoEngine:
        def register(self, addr: int, n: int) -> None:
            pass

        def unregister(self, addr: int) -> None:
            pass

    stg = Staging(NoEngine(), 1024)  # type: ignore[arg-type]
    assert list(stg.slices([])) == []
    assert list(stg.slices([100] * 8)) == [(0, 8)]  # 8 x 128 aligned: all fit
    assert list(stg.slices([100] * 9)) == [(0, 8), (8, 9)]
    assert list(stg.slices([1000, 1, 1000])) == [(0, 1), (1, 2), (2, 3)]
    assert stg.layout([100, 1, 64]) == [0, 128, 192]
    stg.close()


def test_a_full_memory_drops_its_oldest_eighth_at_once() -> None:
    p = Placements(capacity=16)
    for i in range(16):
        learn(p, b"%d" % i)
    learn(p, b"new")
    assert len(p) == 15  # 2 oldest out, the new one in
    assert p.recall([b"0"]) is None and p.recall([b"1"]) is None
    assert p.recall([b"2", b"15", b"new"]) is not None
