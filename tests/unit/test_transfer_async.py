"""Transfer.start/status, the non-blocking transfers the client polls: one engine batch
per transfer, the reachability probe before the first one to a node (and again after a
failure), and ids that are forgotten once they are over."""

from __future__ import annotations

from typing import Any

import pytest

import kvstore.transfer
from kvstore.errors import Unavailable
from kvstore.transfer import BATCH_SLACK, LIVENESS_ENV, TIMEOUT_ENV, Transfer


class FakeEngine:
    def __init__(self) -> None:
        self.probes: list[str] = []
        self.probe_rc = 0
        self.submitted: list[tuple[str, str, list[int], list[int], list[int]]] = []
        self.states: dict[int, list[int]] = {}  # id -> statuses still to report
        self.next_id = 100

    def initialize(self, *args: Any) -> int:
        return 0

    def get_rpc_port(self) -> int:
        return 12345

    def send_probe(self, segment: str) -> int:
        self.probes.append(segment)
        return self.probe_rc

    def _submit(self, op: str, segment: str, local: list[int], remote: list[int],
                lengths: list[int]) -> int:
        self.submitted.append((op, segment, local, remote, lengths))
        self.next_id += 1
        self.states[self.next_id] = [0, 0, 1]
        return self.next_id

    def batch_transfer_async_write(self, *args: Any) -> int:
        return self._submit("write", *args)

    def batch_transfer_async_read(self, *args: Any) -> int:
        return self._submit("read", *args)

    def transfer_check_status(self, tid: int) -> int:
        return self.states[tid].pop(0)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    fake = FakeEngine()
    monkeypatch.setattr(kvstore.transfer, "_engine_class", lambda: lambda: fake)
    monkeypatch.setattr(kvstore.transfer, "_liveness_set", {})
    for name in (TIMEOUT_ENV, *LIVENESS_ENV):
        monkeypatch.delenv(name, raising=False)
    return fake


def test_polled_batches_give_up_when_the_blocking_ones_do(engine: FakeEngine,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # after the liveness deadline has dropped a dead connection (see kvstore.transfer)
    assert Transfer(timeout=4.2).batch_timeout == 5 + BATCH_SLACK
    assert Transfer().batch_timeout == 30
    monkeypatch.setenv(TIMEOUT_ENV, "60")  # the operator's setting wins
    assert Transfer(timeout=4.2).batch_timeout == 60


def test_each_transfer_is_one_engine_batch_polled_until_done(engine: FakeEngine) -> None:
    t = Transfer(timeout=5)
    a = t.start("node:1", 0x1000, 0x9000, 4096, write=True)
    b = t.start("node:1", 0x2000, 0xA000, 512, write=False)
    assert engine.submitted == [("write", "node:1", [0x1000], [0x9000], [4096]),
                                ("read", "node:1", [0x2000], [0xA000], [512])]
    assert engine.probes == ["node:1"]  # probed once, before the first transfer
    assert [t.status(a), t.status(a), t.status(a)] == [0, 0, 1]
    assert t.status(b) == 0
    engine.states[b] = [-2, -1]  # the transport's own timeout is not an answer yet
    assert [t.status(b), t.status(b)] == [0, -1]
    assert not t._moving


def test_a_failed_transfer_makes_the_next_one_probe_again(engine: FakeEngine) -> None:
    t = Transfer(timeout=5)
    tid = t.start("node:1", 1, 2, 3, write=True)
    engine.states[tid] = [-1]
    assert t.status(tid) == -1
    assert not t.ready("node:1")
    engine.probe_rc = -1  # the node no longer answers its handshake port
    with pytest.raises(Unavailable, match="refused the Transfer Engine handshake"):
        t.start("node:1", 1, 2, 3, write=True)
    assert engine.probes == ["node:1", "node:1"]
    assert len(engine.submitted) == 1  # nothing was submitted to it


def test_a_refused_submission_is_unavailable(engine: FakeEngine,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    t = Transfer()  # no timeout: no probe
    monkeypatch.setattr(engine, "batch_transfer_async_read", lambda *a: -1)
    with pytest.raises(Unavailable, match="failed at submission"):
        t.start("node:2", 1, 2, 3, write=False)
    assert engine.probes == [] and t.ready("node:2")
