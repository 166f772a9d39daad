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
