"""PinTable: which lease each read of a reported page goes under (pure, no store)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore_sglang.pins import PinTable


@dataclass
class FakeLease:
    id: int
    keys: list[bytes] = field(default_factory=list)
    expires_at: float = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_read_takes_the_lease_that_promised_its_keys_and_releases_it_when_read_through() -> None:
    t = PinTable(Clock())
    lease = FakeLease(1, [b"a", b"b", b"c"])
    t.add(lease, lease.keys)
    first = t.take([b"a", b"b"])
    assert first.groups == {1: (lease, [0, 1])} and first.unpinned == [] and first.done == []
    rest = t.take([b"c", b"x"])
    assert rest.groups == {1: (lease, [0])} and rest.unpinned == [1] and rest.done == [lease]
    assert len(t) == 0 and t.pinned_keys() == 0


def test_two_promises_of_one_key_are_consumed_one_per_read_oldest_first() -> None:
    t = PinTable(Clock())
    la, lb = FakeLease(1, [b"k"]), FakeLease(2, [b"k"])
    t.add(la, la.keys)
    t.add(lb, lb.keys)
    one = t.take([b"k"])
    assert one.groups == {1: (la, [0])} and one.done == [la]
    two = t.take([b"k"])  # the second request still reads under its own lease
    assert two.groups == {2: (lb, [0])} and two.done == [lb]
    assert t.take([b"k"]).unpinned == [0]


def test_expired_promises_are_dropped_and_reads_go_unpinned() -> None:
    clock = Clock()
    t = PinTable(clock)
    t.add(FakeLease(1, [b"a"], expires_at=5.0), [b"a"])
    t.add(FakeLease(2, [b"b"], expires_at=50.0), [b"b"])
    clock.now = 10.0
    taken = t.take([b"a", b"b"])
    assert taken.unpinned == [0] and list(taken.groups) == [2]
    assert len(t) == 0


def test_drain_returns_every_live_lease_once() -> None:
    t = PinTable(Clock())
    leases = [FakeLease(i, [bytes([i])]) for i in (1, 2, 3)]
    for lease in leases:
        t.add(lease, lease.keys)
    t.take([b"\x01"])
    assert sorted(lease.id for lease in t.drain()) == [2, 3]
    assert t.drain() == [] and t.take([b"\x02"]).unpinned == [0]


def test_a_lease_without_id_or_keys_is_not_remembered() -> None:
    t = PinTable(Clock())
    t.add(FakeLease(0, [b"a"]), [b"a"])
    t.add(FakeLease(7, []), [])
    assert len(t) == 0
