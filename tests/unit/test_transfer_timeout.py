"""The Transfer Engine gets the client's timeout: a connection to a store node that stops
answering is dropped after it (MC_TCP_*_TIMEOUT_SEC) and the batch fails soon after
(MC_TRANSFER_TIMEOUT), instead of the engine's default 30 s; a first contact (the
engine's handshake, 60 s in Mooncake) is bounded by the same timeout through a probe."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import kvstore.transfer
from kvstore.errors import Unavailable
from kvstore.transfer import LIVENESS_ENV, POOL_ENV, TIMEOUT_ENV, Transfer
from tests.unit.polling import wait_until


class FakeEngine:
    seen: list[str | None] = []
    pool: list[str | None] = []  # the connection-pool setting at each construction

    def __init__(self) -> None:
        FakeEngine.seen.append(os.environ.get(TIMEOUT_ENV))
        FakeEngine.pool.append(os.environ.get(POOL_ENV))

    def initialize(self, *args: Any) -> int:
        FakeEngine.seen.append(os.environ.get(TIMEOUT_ENV))
        return 0

    def get_rpc_port(self) -> int:
        return 12345


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvstore.transfer, "_engine_class", lambda: FakeEngine)
    monkeypatch.setattr(kvstore.transfer, "_liveness_set", {})
    for name in (TIMEOUT_ENV, POOL_ENV, *LIVENESS_ENV):
        monkeypatch.delenv(name, raising=False)
    FakeEngine.seen = []
    FakeEngine.pool = []


def test_the_timeout_reaches_the_engine_in_whole_seconds() -> None:
    Transfer(timeout=4.2)
    # connections without progress for 5 s are dropped; the batch gives up 2 s later
    assert FakeEngine.seen == ["7", "7"]
    assert TIMEOUT_ENV not in os.environ  # read at construction only
    assert [os.environ[n] for n in LIVENESS_ENV] == ["5", "5"]  # read at every wait
    Transfer(timeout=0.1)
    assert FakeEngine.seen[-1] == "3"
    assert [os.environ[n] for n in LIVENESS_ENV] == ["1", "1"]  # the smallest timeout wins
    Transfer(timeout=10)
    assert [os.environ[n] for n in LIVENESS_ENV] == ["1", "1"]


def test_no_timeout_keeps_the_engine_default() -> None:
    Transfer()
    assert FakeEngine.seen == [None, None]
    assert not any(n in os.environ for n in LIVENESS_ENV)


def test_an_operator_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "60")
    monkeypatch.setenv(LIVENESS_ENV[0], "40")
    Transfer(timeout=5)
    assert FakeEngine.seen == ["60", "60"]
    assert os.environ[TIMEOUT_ENV] == "60"
    assert os.environ[LIVENESS_ENV[0]] == "40" and os.environ[LIVENESS_ENV[1]] == "5"


def test_the_engine_reuses_connections_unless_the_operator_says_not_to(
        monkeypatch: pytest.MonkeyPatch) -> None:
    Transfer()
    assert FakeEngine.pool == ["1"]
    assert POOL_ENV not in os.environ  # read at construction only; not leaked to others
    monkeypatch.setenv(POOL_ENV, "0")
    Transfer(timeout=3)
    assert FakeEngine.pool == ["1", "0"]
    assert os.environ[POOL_ENV] == "0"


class SlowPeerEngine(FakeEngine):
    """A peer whose handshake port answers only once `answer` is set."""

    answer = threading.Event()
    probes = 0
    batches = 0

    def send_probe(self, segment: str) -> int:
        SlowPeerEngine.probes += 1
        SlowPeerEngine.answer.wait(600)  # longer than pytest lets a test run
        return 0

    def batch_transfer_sync_read(self, *args: Any) -> int:
        SlowPeerEngine.batches += 1
        return 0


def test_a_peer_that_does_not_answer_the_handshake_fails_the_batch_at_the_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvstore.transfer, "_engine_class", lambda: SlowPeerEngine)
    SlowPeerEngine.answer.clear()
    t = Transfer(timeout=0.3)
    t0 = time.monotonic()
    # The probe answers only when the test says so: a read that waited for it instead
    # of its timeout would hang here until pytest's timeout.
    with pytest.raises(Unavailable, match="did not answer"):
        t.read("10.0.0.9:1234", [1], [2], [3])
    assert time.monotonic() - t0 >= 0.3  # it gave the handshake the whole timeout
    # At once while the probe is pending: with the timeout now 10 minutes, a read that
    # waited for that probe again would hang here instead of raising.
    t.timeout = 600.0
    with pytest.raises(Unavailable, match="did not answer"):
        t.read("10.0.0.9:1234", [1], [2], [3])
    assert SlowPeerEngine.probes == 1  # and without probing again
    SlowPeerEngine.answer.set()  # the node answers again

    def reads() -> bool:
        try:
            t.read("10.0.0.9:1234", [1], [2], [3])
        except Unavailable:
            return False  # the probe's answer is not in yet
        return True

    wait_until(reads, what="a read once the node answered its probe")
    t.read("10.0.0.9:1234", [1], [2], [3])
    assert SlowPeerEngine.batches == 2 and SlowPeerEngine.probes == 1  # probed once, then known
