"""kvstore_client.discovery without a cluster: how master= is read, and the sentence when
no master answers (the cluster side is tests/integration/test_etcd_auth.py)."""

from __future__ import annotations

import socket

import pytest

from kvstore.coord.layout import Layout
from kvstore.errors import Unavailable
from kvstore_client.discovery import find_leader, master_addresses


def test_master_addresses_are_read_in_order_without_blanks_or_repeats() -> None:
    assert master_addresses(" h1:50051, h2:50051,,h1:50051 ") == ["h1:50051", "h2:50051"]
    assert master_addresses("kvstore-master.kvstore.svc:50051") == [
        "kvstore-master.kvstore.svc:50051"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_master_answering_names_each_one_and_never_reads_etcd() -> None:
    masters = [f"127.0.0.1:{_closed_port()}" for _ in range(2)]
    with pytest.raises(Unavailable) as exc:
        # etcd's address is a closed port too: it must not be what the error is about.
        find_leader(f"127.0.0.1:{_closed_port()}", Layout(), ",".join(masters), timeout=1.0)
    assert all(f"{m}: UNAVAILABLE" in exc.value.message for m in masters)
    assert "no master named a leader" in exc.value.message
