"""How the data path waits for engine transfers it polls (DataPath._finish): how often it
asks the engine and how long it sleeps in between, on a ManualClock.

The engine is a fake whose transfers end at a given time on that clock; every status
poll costs POLL_COST of it (a poll is not free, which is what bounds a spin), and a
sleep advances it by what was asked. So the schedule is exact and deterministic: no real
sleeps, no wall-clock bounds.
"""

from __future__ import annotations

import itertools

import pytest

from kvstore.errors import KVStoreError, Unsettled
from kvstore_client import datapath
from kvstore_client.clock import ManualClock
from kvstore_client.datapath import (
    POLL_MAX,
    POLL_MIN,
    POLL_RATE,
    DataPath,
    Target,
    Xfer,
    next_nap,
)
from kvstore_client.stats import ClientStats

KiB = 1 << 10
TARGET = ("127.0.0.1:1", "node-a")
POLL_COST = 2e-6  # seconds of the manual clock one status poll takes


class TimedTransfer:
    """Transfers that end `takes` seconds after they were started, on `clock`."""

    timeout = None
    batch_timeout = 30.0

    def __init__(self, clock: ManualClock, takes: float, fail: bool = False) -> None:
        self.clock = clock
        self.takes = takes
        self.fail = fail
        self.ids = itertools.count(1)
        self.ends: dict[int, float] = {}
        self.polls = 0

    def ready(self, segment: str) -> bool:
        return True

    def start(self, segment: str, local: int, remote: int, length: int, write: bool) -> int:
        tid = next(self.ids)
        self.ends[tid] = self.clock.now() + self.takes
        return tid

    def status(self, tid: int) -> int:
        self.polls += 1
        self.clock.advance(POLL_COST)
        if self.clock.now() < self.ends[tid]:
            return 0
        del self.ends[tid]
        return -1 if self.fail else 1


class NoLocal:
    def get(self, segment: str, node_id: str) -> None:
        return None


class Rig:
    def __init__(self, takes: float, fail: bool = False) -> None:
        self.clock = ManualClock()
        self.transfer = TimedTransfer(self.clock, takes, fail)
        self.path = DataPath(self.transfer, NoLocal(), ClientStats(),  # type: ignore[arg-type]
                             clock=self.clock)
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)

    def write(self, n: int, size: int, at_once: bool) -> dict[Target, KVStoreError]:
        plan = {TARGET: [Xfer(0x1000 + i * size, 0x9000 + i * size, size) for i in range(n)]}
        ticket = self.path.start_transfers(plan, write=True, at_once=at_once)
        return self.path.finish_transfers(ticket, self.sleep)


def test_the_first_sleep_is_sized_from_the_bytes_left() -> None:
    assert next_nap(0.0, 1 << 30, landed=False) == POLL_MAX  # long: capped
    assert next_nap(0.0, 1, landed=False) == POLL_MIN  # short: floored
    left = int(100e-6 * POLL_RATE)
    assert next_nap(0.0, left, landed=False) == pytest.approx(100e-6)


def test_each_poll_that_finds_nothing_landed_doubles_the_sleep_up_to_the_cap() -> None:
    naps = [0.0]
    for _ in range(12):
        naps.append(next_nap(naps[-1], 1, landed=False))
    assert naps[1] == POLL_MIN
    assert all(b == min(POLL_MAX, 2 * a) for a, b in itertools.pairwise(naps[1:]))
    assert naps[-1] == POLL_MAX


def test_a_poll_that_lands_pieces_goes_back_to_the_pace_of_what_is_left() -> None:
    left = int(50e-6 * POLL_RATE)
    assert next_nap(1e-3, left, landed=True) == pytest.approx(50e-6)
    assert next_nap(1e-3, left, landed=False) == 2e-3


def test_a_batch_submitted_at_once_spins_only_about_its_bytes_time() -> None:
    # 64 x 4 KiB, contiguous: one piece. It takes 5 ms (a loaded host): spun for the
    # bytes' time at POLL_RATE (SPIN_MIN at least), then polled asleep with doubling
    # sleeps.
    rig = Rig(takes=5e-3)
    assert rig.write(64, 4 * KiB, at_once=True) == {}
    spin = min(datapath.SPIN_MAX, max(datapath.SPIN_MIN, 64 * 4 * KiB / POLL_RATE))
    spun = rig.transfer.polls - len(rig.slept)  # one piece: one poll after each sleep
    assert spun == pytest.approx(spin / POLL_COST, abs=1)
    assert all(b == min(POLL_MAX, 2 * a) for a, b in itertools.pairwise(rig.slept))
    # The old schedule (spin to the end) polled 2500 times here.
    assert rig.transfer.polls < spin / POLL_COST + 40
    assert not rig.transfer.ends  # nothing still moving when it returns


def test_a_single_put_landing_within_the_spin_floor_never_sleeps() -> None:
    """A 64 KiB put over the engine on an idle host: a sleep's timer slack would cost
    more than the transfer."""
    rig = Rig(takes=0.8 * datapath.SPIN_MIN)
    assert rig.write(1, 64 * KiB, at_once=True) == {}
    assert rig.slept == [] and not rig.transfer.ends


def test_a_quick_batch_submitted_at_once_never_sleeps() -> None:
    rig = Rig(takes=10e-6)  # lands within the spin
    assert rig.write(64, 4 * KiB, at_once=True) == {}
    assert rig.slept == [] and not rig.transfer.ends


def test_a_polled_batch_sleeps_from_its_first_poll_on() -> None:
    # Larger than SYNC_MAX: submitted in pieces when finished is asked for, no spin.
    rig = Rig(takes=20e-3)
    assert rig.write(4, 512 * KiB, at_once=False) == {}
    assert rig.slept[0] == pytest.approx(4 * 512 * KiB / POLL_RATE)
    # About log2(POLL_MAX / first sleep) rounds to reach the cap, then one per POLL_MAX.
    assert len(rig.slept) <= 8 + 20e-3 / POLL_MAX


def test_a_failed_write_is_reported_unsettled_once_it_ends() -> None:
    rig = Rig(takes=1e-3, fail=True)
    failed = rig.write(64, 4 * KiB, at_once=True)
    assert isinstance(failed[TARGET], Unsettled) and not rig.transfer.ends


def test_a_hung_batch_is_given_up_at_its_deadline_with_sleeps_capped() -> None:
    rig = Rig(takes=1e9)
    rig.transfer.batch_timeout = 0.05
    failed = rig.write(64, 4 * KiB, at_once=True)
    assert isinstance(failed[TARGET], Unsettled)
    assert "did not finish in time" in str(failed[TARGET])
    assert max(rig.slept) == POLL_MAX and len(rig.slept) <= 8 + 0.05 / POLL_MAX
