"""KVSTORE_REPLY_SPIN_US: how long the sync client polls for a master's reply."""

from __future__ import annotations

import pytest

from kvstore.errors import InvalidArgument
from kvstore_client import KVStoreClient
from kvstore_client.control import REPLY_SPIN_US, FastControl, reply_spin


def test_the_default_and_an_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSTORE_REPLY_SPIN_US", raising=False)
    assert reply_spin() == REPLY_SPIN_US / 1e6 == 0.0003
    monkeypatch.setenv("KVSTORE_REPLY_SPIN_US", "0")
    assert reply_spin() == 0.0
    monkeypatch.setenv("KVSTORE_REPLY_SPIN_US", "50")
    assert reply_spin() == 50e-6
    assert FastControl("127.0.0.1:1").channel.spin == 50e-6  # what the channel is given


@pytest.mark.parametrize("bad", ["abc", "-1", "nan", "2e6"])
def test_a_bad_value_is_refused_when_the_client_is_made(monkeypatch: pytest.MonkeyPatch,
                                                        bad: str) -> None:
    monkeypatch.setenv("KVSTORE_REPLY_SPIN_US", bad)
    with pytest.raises(InvalidArgument, match="KVSTORE_REPLY_SPIN_US must be microseconds"):
        reply_spin()
    with pytest.raises(InvalidArgument, match="KVSTORE_REPLY_SPIN_US"):
        KVStoreClient(etcd="127.0.0.1:1")  # before any connection is tried
