"""The Transfer Engine gets the client's timeout (MC_TRANSFER_TIMEOUT, read when it is
constructed): a store node that stops answering fails a transfer at the client's timeout
instead of the engine's default 30 s."""

from __future__ import annotations

import os
from typing import Any

import pytest

import kvstore.transfer
from kvstore.transfer import TIMEOUT_ENV, Transfer


class FakeEngine:
    seen: list[str | None] = []

    def __init__(self) -> None:
        FakeEngine.seen.append(os.environ.get(TIMEOUT_ENV))

    def initialize(self, *args: Any) -> int:
        FakeEngine.seen.append(os.environ.get(TIMEOUT_ENV))
        return 0

    def get_rpc_port(self) -> int:
        return 12345


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvstore.transfer, "_engine_class", lambda: FakeEngine)
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    FakeEngine.seen = []


def test_the_timeout_reaches_the_engine_in_whole_seconds_and_leaves_no_trace() -> None:
    Transfer(timeout=4.2)
    assert FakeEngine.seen == ["5", "5"]
    assert TIMEOUT_ENV not in os.environ
    Transfer(timeout=0.1)
    assert FakeEngine.seen[-1] == "1"


def test_no_timeout_keeps_the_engine_default() -> None:
    Transfer()
    assert FakeEngine.seen == [None, None]


def test_an_operator_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "60")
    Transfer(timeout=5)
    assert FakeEngine.seen == ["60", "60"]
    assert os.environ[TIMEOUT_ENV] == "60"
