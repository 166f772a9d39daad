"""The client's deadlines on a ManualClock: time comes from the state's clock, and the
driver's sleeps advance it, so lease deadlines, BUSY budgets, transfer timeouts and the
freshness rules of early reads run by hand, without real sleeps (clock.py).

The in-memory master, engine and node of test_client_data_path; the real synchronous
driver's step loop in front of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstore.errors import Busy, Code, InProgress, LeaseExpired, Unavailable
from kvstore.v1 import master_pb2 as pb
from kvstore_client import puts
from kvstore_client.clock import ManualClock
from kvstore_client.datapath import EARLY_FRESH
from kvstore_client.placements import MAX_AGE
from kvstore_client.staging import Staging
from kvstore_client.state import ClientState
from tests.unit.test_client_data_path import (
    NODE,
    SEGMENT,
    KiB,
    Rig,
    _buffers,
    _put_small,
    _slices,
    _values,
    small_thresholds,
)


class ClockRig(Rig):
    """The data-path Rig on a ManualClock: the driver sleeps by advancing it."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.state = ClientState(self.transfer, Staging(self.transfer, 1 << 20),  # type: ignore[arg-type]
                                 self.local, "writer-1", 0, clock=self.clock)  # type: ignore[arg-type]
        self.client._state = self.state
        self.slept: list[float] = []

        def sleep(seconds: float) -> None:
            self.slept.append(seconds)
            self.clock.advance(seconds)

        self.client._sleep = sleep  # type: ignore[assignment]

    def asked(self, method: str) -> int:
        return self.rpcs().count(method)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[ClockRig]:
    small_thresholds(monkeypatch)
    yield ClockRig()


def test_a_lease_expires_on_the_state_clock(rig: ClockRig) -> None:
    lease = rig.state.lease(7, [b"k"], rig.clock.now() + 2.0)
    assert not lease.expired
    rig.clock.advance(2.5)
    assert lease.expired


def test_a_read_under_a_lease_the_clock_ran_past_raises(rig: ClockRig) -> None:
    n, size = 2, 8 * KiB
    keys = [f"l{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=31), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.master.leases[7] = list(keys)
    lease = rig.state.lease(7, list(keys), rig.clock.now() + 1.0)
    assert rig.client.get_into(keys, _slices(dst, n, size), lease) == [None] * n
    rig.clock.advance(1.5)  # the lease lapsed, though the master still answers
    with pytest.raises(LeaseExpired):
        rig.client.get_into(keys, _slices(dst, n, size), lease)
    assert not rig.transfer.moving


def test_a_short_lease_lapses_while_a_polled_read_sleeps(rig: ClockRig) -> None:
    n, size = 4, 8 * KiB
    keys = [f"p{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=32), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.master.ttl = 0.001
    # Polled with sleeps of at least POLL_MIN (10 µs here) in between: 200 polls are
    # past the lease on the clock.
    rig.transfer.polls = 200
    rig.slept.clear()
    with pytest.raises(LeaseExpired):
        rig.client.get_into(keys, _slices(dst, n, size))
    assert sum(rig.slept) > 0.001 and not rig.transfer.moving


def test_objects_coming_back_from_ssd_are_asked_about_until_the_lease_runs_out(
        rig: ClockRig) -> None:
    n, size = 1, 8 * KiB
    keys = [b"ssd"]
    src, dst = _buffers(rig, _values(n, size, seed=33), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None]
    rig.state.placements.forget(keys[0])  # no early read: ask first
    rig.master.ttl = 0.1
    real = rig.master.GetReplicas

    def in_progress(req: pb.GetReplicasRequest) -> pb.GetReplicasResponse:
        reply = real(req)
        for item in reply.items:
            item.code = Code.IN_PROGRESS
        return reply

    rig.master.GetReplicas = in_progress  # type: ignore[method-assign]
    rig.trace.clear()
    rig.slept.clear()
    errs = rig.client.get_into(keys, _slices(dst, n, size))
    assert [type(e) for e in errs] == [InProgress]
    # Waits from 1 ms, half again each time up to 10 ms, while the next one fits in the
    # 100 ms lease.
    expected: list[float] = []
    at, delay = 0.0, 0.001
    while at + delay < 0.1:
        expected.append(delay)
        at += delay
        delay = min(delay * 1.5, 0.01)
    assert len(expected) > 10 and sum(expected) <= 0.1
    assert rig.slept == pytest.approx(expected)
    assert rig.asked("GetReplicas") == len(expected) + 1


def test_a_busy_master_is_asked_again_until_the_budget_is_spent(rig: ClockRig) -> None:
    def busy(req: pb.PutStartRequest) -> pb.PutStartResponse:
        reply = pb.PutStartResponse(epoch=rig.master.epoch)
        for _ in req.keys:
            reply.items.add(code=Code.BUSY, message="making room (fake)")
        return reply

    rig.master.PutStart = busy  # type: ignore[method-assign]
    start = rig.clock.now()
    errs = rig.client.put_many([b"b"], [b"x" * 100])
    assert [type(e) for e in errs] == [Busy]
    assert rig.clock.now() - start >= puts.BUSY_BUDGET
    assert rig.slept[:3] == pytest.approx([0.001, 0.0015, 0.00225]) and max(rig.slept) <= 0.02


def test_a_hung_transfer_is_abandoned_once_the_clock_passes_its_deadline(
        rig: ClockRig) -> None:
    rig.transfer.batch_timeout = 0.05
    n, size = 4, 8 * KiB
    keys = [f"h{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=34), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.transfer.hang = True
    rig.slept.clear()
    errs = rig.client.get_into(keys, _slices(dst, n, size))
    assert all(isinstance(e, Unavailable) and "did not finish in time" in str(e) for e in errs)
    assert sum(rig.slept) >= 0.05


def test_early_reads_follow_the_clock(rig: ClockRig) -> None:
    keys, values, _, _ = _put_small(rig)
    assert rig.client.get_many(keys) == values
    assert "ask" in [e[0] for e in rig.trace] and rig.client.stats.early_reads == 3
    # The node has been silent longer than EARLY_FRESH: asked about first.
    rig.clock.advance(EARLY_FRESH + 0.1)
    rig.trace.clear()
    assert rig.client.get_many(keys) == values
    assert "ask" not in [e[0] for e in rig.trace] and rig.client.stats.early_reads == 3
    # It just moved bytes, but the placements learned then are older than MAX_AGE now.
    rig.clock.advance(MAX_AGE + 1.0)
    rig.state.saw_answer((SEGMENT, NODE))
    rig.trace.clear()
    assert rig.client.get_many(keys) == values
    assert "ask" not in [e[0] for e in rig.trace]
    # Learned again by that get: early once more.
    rig.trace.clear()
    assert rig.client.get_many(keys) == values
    assert "ask" in [e[0] for e in rig.trace] and rig.client.stats.early_reads == 6
