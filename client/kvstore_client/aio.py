"""The asyncio client: runs the shared layer (session.py) on an event loop.

Control calls use the master's fast channel (many concurrent calls multiplexed on one
connection) or grpc.aio when its record announces none; data transfers (Transfer Engine
batches or same-host memcpy) and the leader's lookup in etcd run in a worker thread, so
the loop keeps serving other tasks meanwhile. Operations that go through the shared
staging buffer (put_many, get, get_many) take turns; zero-copy and control-only
operations run concurrently. Everything else is session.py's, shared with KVStoreClient.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from kvstore.coord.layout import MasterRecord
from kvstore.errors import Code, KVStoreError
from kvstore_client import ops, quick, steps
from kvstore_client.control import Control, open_control
from kvstore_client.drive import Pump
from kvstore_client.options import ClientOptions
from kvstore_client.session import Io, Session
from kvstore_client.state import Lease

T = TypeVar("T")


class AsyncKVStoreClient(Session):
    """`async with AsyncKVStoreClient(etcd=...) as store:` — same methods as KVStoreClient,
    as coroutines, and the same settings (keywords or `options=ClientOptions(...)`)."""

    is_async = True

    def __init__(self, etcd: str | None = None, *, options: ClientOptions | None = None,
                 **settings: Any) -> None:
        super().__init__(etcd, options, settings)
        self._state = self.options.state(self._layout)
        self._staging_turn = asyncio.Lock()

    def _open(self, record: MasterRecord, given_up: str = "") -> Control[Any]:
        return open_control(record, self.transport, given_up, self._creds, aio=True)

    async def __aenter__(self) -> AsyncKVStoreClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        await self._drive(self._connect())

    async def close(self) -> None:
        if not self._closed:
            await self._drive(self._close())

    async def _drive(self, io: Io[T]) -> T:
        """Run `io`, each op as a coroutine; an op's error (cancellation too) is thrown
        back into it, so its finally blocks wait out what it started."""
        self._check_open()
        pump: Pump[T] = Pump(io)
        while (op := pump.next()) is not None:
            try:
                pump.give(await self._do(op))
            except BaseException as exc:
                pump.fail(exc)
        return pump.result

    async def _do(self, op: Any) -> Any:
        kind, st = type(op), self._state
        if kind is ops.Call:
            return await op.control.call(op.method, op.request, op.timeout)
        if kind is ops.Answer:
            return await op.control.answer(op.handle, op.method)
        if kind is steps.Start:
            # Submitting is quick, unless a node is new (etcd, a probe).
            if st.resolved(op.plan):
                return st.start_transfers(op.plan, op.write, op.dead, op.at_once)
            return await asyncio.to_thread(st.start_transfers, op.plan, op.write, op.dead,
                                           op.at_once)
        if kind is steps.Finish:
            # The worker thread sleeps between polls, not the loop.
            return await asyncio.to_thread(st.finish_transfers, op.ticket, time.sleep)
        if kind is steps.Move:
            return await asyncio.to_thread(st.run_transfers, op.plan, op.write, time.sleep)
        if kind is ops.Quick:
            return await quick.read_one_async(st, op.control, op.key, op.dest, self.timeout,
                                              op.shard)
        if kind is ops.Sleep:
            return await asyncio.sleep(op.seconds)
        if kind is ops.Drain:
            return await asyncio.to_thread(
                lambda: [st.finish_transfers(t, time.sleep) for t in op.tickets])
        if kind is ops.Find:
            return await asyncio.to_thread(self.find_leader, op.shard)
        if kind is ops.Close:
            return await op.control.close()
        raise TypeError(f"not an op: {op!r}")

    async def _staged(self, io: Io[T]) -> T:
        async with self._staging_turn:
            return await self._drive(io)

    # -- the API (see KVStoreClient for each method's contract) ----------------------------

    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return await self._drive(self._exists(keys))

    async def remove(self, key: bytes) -> bool:
        return await self._drive(self._remove(key))

    async def remove_many(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        return await self._drive(self._remove_many(keys, force))

    async def put(self, key: bytes, value: Any) -> None:
        await self._staged(self._put(key, value))

    async def put_many(self, keys: Sequence[bytes],
                       values: Sequence[Any]) -> list[KVStoreError | None]:
        return await self._staged(self._put_many(keys, values))

    async def get(self, key: bytes) -> bytes | None:
        return await self._staged(self._get(key))

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return await self._staged(self._get_many(keys))

    async def lookup(self, keys: Sequence[bytes], ttl: float | None = None) -> Lease:
        return await self._drive(self._lookup(keys, ttl))

    async def renew(self, lease: Lease, ttl: float | None = None) -> None:
        await self._drive(self._renew(lease, ttl))

    async def release(self, lease: Lease, keep_first: int | None = None) -> None:
        await self._drive(self._release_lease(lease, keep_first))

    async def put_from(self, keys: Sequence[bytes],
                       buffers: Sequence[Any]) -> list[KVStoreError | None]:
        return await self._drive(self._put_from(keys, buffers))

    async def get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                       lease: Lease | None = None) -> list[KVStoreError | None]:
        return await self._drive(self._get_into(keys, buffers, lease))
