"""A lease knows which kind of client made it: the right `with` releases it, the wrong
one is refused with a sentence (before, a plain `with` on an asyncio client's lease made
a coroutine nobody awaited, and the lease was never released)."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from kvstore.errors import KVStoreError
from kvstore_client import AsyncKVStoreClient, KVStoreClient
from kvstore_client.misuse import WrongLeaseContext
from kvstore_client.state import Lease


class SyncClient:
    is_async = KVStoreClient.is_async

    def __init__(self) -> None:
        self.released: list[int] = []

    def release(self, lease: Lease) -> None:
        self.released.append(lease.id)


class AsyncClient:
    is_async = AsyncKVStoreClient.is_async

    def __init__(self) -> None:
        self.released: list[int] = []

    async def release(self, lease: Lease) -> None:
        self.released.append(lease.id)


def test_a_blocking_clients_lease_takes_a_plain_with() -> None:
    client = SyncClient()
    lease = Lease(7, [b"a", b"b"], 1e18, _client=client)
    with lease as held:
        assert held is lease
    assert client.released == [7]

    async def wrong() -> None:
        async with Lease(8, [b"a"], 1e18, _client=client):
            pass

    with pytest.raises(WrongLeaseContext, match="use a plain `with`") as err:
        asyncio.run(wrong())
    assert isinstance(err.value, KVStoreError) and client.released == [7]


def test_an_asyncio_clients_lease_takes_async_with() -> None:
    client = AsyncClient()

    async def right() -> None:
        async with Lease(7, [b"a"], 1e18, _client=client) as held:
            assert held.id == 7

    asyncio.run(right())
    assert client.released == [7]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine never awaited would warn
        with pytest.raises(WrongLeaseContext, match="use `async with`"), \
                Lease(8, [b"a"], 1e18, _client=client):
            pass
    assert client.released == [7]


def test_a_lease_of_no_client_takes_either() -> None:
    lease = Lease(0, [], 1e18)
    with lease:
        pass

    async def block() -> None:
        async with lease:
            pass

    asyncio.run(block())
