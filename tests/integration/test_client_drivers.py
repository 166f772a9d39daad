"""What both drivers of the one client (session.py) do alike: the lease's `with`, a
closed client, the quick single get. Each test runs over KVStoreClient and
AsyncKVStoreClient against a real cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvstore.errors import KVStoreError
from kvstore_client import AsyncKVStoreClient, KVStoreClient
from kvstore_client.misuse import ClientClosed, WrongLeaseContext
from tests.conftest import Cluster
from tests.unit.polling import wait_until


class Driven:
    """A client of either kind, called the same way: `do(client.method, *args)`."""

    def __init__(self, kind: str, cluster: Cluster) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        if kind == "sync":
            self.client: Any = KVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20)
        else:
            self.client = AsyncKVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20)
            self.loop.run_until_complete(self.client.connect())

    def do(self, method: Callable[..., Any], *args: Any) -> Any:
        got = method(*args)
        return self.loop.run_until_complete(got) if self.kind == "async" else got

    def enter(self, lease: Any, asynchronous: bool) -> None:
        """Leave a `with` (or `async with`) block on `lease` at once."""
        if not asynchronous:
            with lease:
                pass
            return

        async def block() -> None:
            async with lease:
                pass
        self.loop.run_until_complete(block())

    def close(self) -> None:
        self.do(self.client.close)
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def driven(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Driven]:
    d = Driven(request.param, cluster)
    yield d
    if not d.client._closed:
        d.close()
    elif not d.loop.is_closed():
        d.loop.close()


def test_a_lease_takes_its_clients_kind_of_with(driven: Driven, cluster: Cluster) -> None:
    c = driven.client
    keys = [f"lk-{driven.kind}-{i}".encode() for i in range(3)]
    assert driven.do(c.put_many, keys, [k * 10 for k in keys]) == [None] * 3
    lease = driven.do(c.lookup, keys)
    assert lease.count == 3 and lease.id
    wrong = driven.kind == "sync"  # a sync lease in `async with`, an async one in `with`
    with pytest.raises(WrongLeaseContext) as err:
        driven.enter(lease, asynchronous=wrong)
    assert isinstance(err.value, KVStoreError)
    assert ("use `async with`" if driven.kind == "async" else "use a plain `with`") \
        in str(err.value)
    assert lease.id and cluster.status().active_leases == 1  # nothing was released
    driven.enter(lease, asynchronous=not wrong)
    wait_until(lambda: cluster.status().active_leases == 0, what="the lease released")
    # What it pinned stays readable after the block; it pins nothing any more.
    assert lease.keys == keys and lease.count == 3 and lease.id == 0


def test_a_closed_client_says_so(driven: Driven) -> None:
    c = driven.client
    assert driven.do(c.put, b"closed-k", b"v") is None
    assert driven.do(c.get, b"closed-k") == b"v"
    driven.do(c.close)
    for method, args in ((c.put, (b"closed-k", b"v")), (c.get, (b"closed-k",)),
                         (c.get_many, ([b"closed-k"],)), (c.exists, ([b"closed-k"],))):
        with pytest.raises(ClientClosed, match="this client is closed"):
            driven.do(method, *args)
    with pytest.raises(ClientClosed):
        c.register(bytearray(4096))
    driven.do(c.close)  # a second close is no error
    driven.loop.close()


def test_a_single_get_of_a_known_object_is_quick(driven: Driven,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    c = driven.client
    keys = [f"qk-{driven.kind}-{i}".encode() for i in range(4)]
    values = [bytes([i]) * 3000 for i in range(4)]
    assert driven.do(c.put_many, keys, values) == [None] * 4
    flows_run: list[object] = []
    real_run = c._run

    def counted(flow: object) -> object:
        flows_run.append(flow)
        return real_run(flow)

    monkeypatch.setattr(c, "_run", counted)
    assert [driven.do(c.get, k) for k in keys] == values
    # The placements the puts learnt, read while asked, in straight-line code (quick.py).
    assert flows_run == [] and c.stats.early_reads == 4
    assert driven.do(c.get, b"qk-missing") is None
    assert len(flows_run) == 1  # an unknown key: the flow
