"""The connector's one link to the store: an AsyncKVStoreClient on a private thread.

vLLM calls the connector from its scheduler loop and from the model's forward pass;
neither may wait on the network longer than it must. Each connector side therefore
owns one event loop in a daemon thread, running one `AsyncKVStoreClient`:

- `submit(op)` schedules `op(client)` there and returns a concurrent Future at once
  (loads and saves: the forward goes on while bytes move);
- `call(op, timeout)` does the same and waits (the scheduler's lookup).

The client is created and connected lazily, and re-connected after failures. When the
store cannot be reached, the link is *down* for `retry_interval` seconds
(`kvstore_client.outage`, the rule every adapter follows): every operation fails at once
with `Unavailable` instead of waiting on timeouts again, so a dead store costs misses,
never a stalled engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from kvstore.errors import InvalidArgument, KVStoreError, Unavailable
from kvstore_client import AsyncKVStoreClient
from kvstore_client.outage import Outage
from kvstore_vllm.settings import Settings

log = logging.getLogger("vllm.kvstore_vllm")

T = TypeVar("T")
Op = Callable[[AsyncKVStoreClient], Awaitable[T]]


class StoreLink:
    def __init__(self, settings: Settings, name: str, buffer_size: int = 1 << 16) -> None:
        self.settings = settings
        self.name = name
        self._buffer_size = buffer_size
        self._client: AsyncKVStoreClient | None = None
        self._connected = False
        self._outage = Outage(settings.retry_interval)
        self._registered: list[Any] = []  # buffers to (re-)register with a new client
        self._connect_lock = asyncio.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"kvstore-{name}",
                                        daemon=True)
        self._thread.start()
        self._closed = False

    # -- state ----------------------------------------------------------------------------

    @property
    def down(self) -> bool:
        return self._outage.down

    def mark_down(self, reason: str) -> None:
        self._connected = False
        if self._outage.fail(reason):  # one warning per outage
            log.warning("kvstore (%s side) unreachable: %s; treating it as empty (no hits, "
                        "no saves) and retrying in %.0f s", self.name, reason,
                        self.settings.retry_interval)

    # -- running operations ---------------------------------------------------------------

    def submit(self, op: Op[T]) -> concurrent.futures.Future[T]:
        if self._closed:
            raise Unavailable("the connector's store link is closed")
        return asyncio.run_coroutine_threadsafe(self._run(op), self._loop)

    def call(self, op: Op[T], timeout: float | None = None) -> T:
        if self.down:
            # Checked here too, not only on the link's loop: that loop may still be busy
            # with the call that found the store down (creating the client, its Transfer
            # Engine, takes a while), and waiting for it would stall the scheduler.
            raise Unavailable(f"kvstore is treated as down for a few seconds ({self._outage.reason})")
        fut = self.submit(op)
        try:
            return fut.result(timeout if timeout is not None else self.settings.timeout * 2 + 1)
        except concurrent.futures.TimeoutError as exc:
            fut.cancel()
            self.mark_down("a control call did not finish in time")
            raise Unavailable("the kvstore call did not finish in time") from exc

    def register(self, buffer: Any) -> None:
        """Register memory with the client, now and with any client created later.

        Runs on the link's thread, like client creation, so no buffer is ever missed.
        """
        async def op() -> None:
            self._registered.append(buffer)
            if self._client is not None:
                self._client.register(buffer)

        asyncio.run_coroutine_threadsafe(op(), self._loop).result(60.0)

    def warm_up(self) -> None:
        """Create the client and connect in the background (engine start-up), so the
        first request does not pay for it."""
        async def noop(client: AsyncKVStoreClient) -> None:
            return None

        fut = self.submit(noop)
        fut.add_done_callback(lambda f: f.exception())  # failures are logged by mark_down

    async def _run(self, op: Op[T]) -> T:
        if self.down:
            raise Unavailable(f"kvstore is treated as down for a few seconds ({self._outage.reason})")
        try:
            client = await self._ensure_client()
            return await op(client)
        except Unavailable as exc:
            self.mark_down(str(exc))
            raise

    def _token(self) -> str | None:
        path = self.settings.token_file
        if not path:
            return None
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read the kvstore token_file {path}: {exc.strerror}") from exc

    async def _ensure_client(self) -> AsyncKVStoreClient:
        if self._client is None:
            s = self.settings
            try:
                client = AsyncKVStoreClient(
                    etcd=s.etcd, master=s.master or None, cluster=s.cluster, timeout=s.timeout,
                    buffer_size=self._buffer_size, host=s.host, protocol=s.protocol,
                    device=s.device, same_host=s.same_host, token=self._token(),
                    tls_ca=s.tls_ca or None, tls_server_name=s.tls_server_name or None)
            except KVStoreError:
                raise
            except Exception as exc:  # the Transfer Engine failed to load or start
                raise Unavailable(f"the kvstore client could not start: {exc}") from exc
            for buf in self._registered:
                client.register(buf)
            self._client = client
        async with self._connect_lock:
            if not self._connected:
                await self._connect(self._client)
        return self._client

    async def _connect(self, client: AsyncKVStoreClient) -> None:
        if not self._connected:
            try:
                await client.connect()
            except KVStoreError:
                raise
            except Exception as exc:  # etcd unreachable and the like
                raise Unavailable(f"cannot reach the kvstore master: {exc}") from exc
            self._connected = True
            again = " again" if self._outage.answered() else ""
            log.info("kvstore (%s side) connected%s to master %s", self.name, again,
                     client.master_address)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if self._client is not None:
                await self._client.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5.0)
        except Exception as exc:  # closing is best effort; the process is going away
            log.debug("closing the kvstore client: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
