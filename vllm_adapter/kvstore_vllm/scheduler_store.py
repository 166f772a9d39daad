"""The scheduler side's store calls, over a StoreLink.

A lookup waits (vLLM needs the hit count now). Releases do not: they run on the link's
thread, one after the other in the order they were asked for, while the scheduler goes
on; a lost release only means the lease runs out its TTL.

A removal of corrupt objects waits, after the releases asked for before it (the lease
pinning an object keeps it from being removed). It is rare, and it must be done before
vLLM schedules the recompute: the workers skip saving a block the store still holds, so
a removal that landed after their check would leave the block missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from kvstore.errors import Code, KVStoreError
from kvstore_client import AsyncKVStoreClient, Lease
from kvstore_vllm.link import StoreLink

log = logging.getLogger("vllm.kvstore_vllm")


class LinkStore:
    def __init__(self, link: StoreLink) -> None:
        self.link = link
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._last: concurrent.futures.Future[None] | None = None

    def lookup(self, keys: Sequence[bytes], ttl: float) -> Lease:
        return self.link.call(lambda c: c.lookup(keys, ttl))

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return self.link.call(lambda c: c.exists(keys))

    def release(self, lease: Lease, keep_first: int | None = None) -> None:
        async def op(client: AsyncKVStoreClient) -> None:
            await client.release(lease, keep_first)

        self._background(op)

    def remove(self, keys: Sequence[bytes]) -> int:
        prev = self._last

        async def op(client: AsyncKVStoreClient) -> int:
            await _after(prev)
            return sum(code == Code.OK for code in await client.remove_many(keys))

        return self.link.call(op)

    def _background(self, op: Callable[[AsyncKVStoreClient], Awaitable[None]]) -> None:
        prev = self._last

        async def in_order(client: AsyncKVStoreClient) -> None:
            await _after(prev)
            await op(client)

        try:
            fut = self.link.submit(in_order)
        except KVStoreError as exc:
            log.debug("kvstore background call not sent: %s", exc)
            return
        self._last = fut
        self._pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: concurrent.futures.Future[None]) -> None:
        self._pending.discard(fut)
        with contextlib.suppress(concurrent.futures.CancelledError):
            exc = fut.exception()
            if exc is not None:
                log.debug("kvstore background call failed: %s", exc)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait for the background releases (tests and shutdown)."""
        concurrent.futures.wait(list(self._pending), timeout=timeout)


async def _after(prev: concurrent.futures.Future[None] | None) -> None:
    """Wait for an earlier background call, whatever its outcome."""
    if prev is not None and not prev.done():
        with contextlib.suppress(Exception):
            await asyncio.wrap_future(prev)
