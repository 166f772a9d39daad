"""The asyncio client: runs the flows of `flows.py` on an event loop.

Control calls use the master's fast channel (many concurrent calls multiplexed on one
connection) or grpc.aio when its record announces none; data transfers (Transfer Engine batches or same-host
memcpy) run in a worker thread so the loop keeps serving other tasks meanwhile.
Operations that go through the shared staging buffer (put_many, get_many) take turns;
zero-copy and control-only operations run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from kvstore.coord.layout import Layout
from kvstore.errors import Code, KVStoreError, NotFound
from kvstore.v1 import master_pb2 as pb
from kvstore_client import flows
from kvstore_client.control import (
    AsyncControl,
    Retry,
    backoff,
    check_reply,
    discover_record,
    open_async_control,
    target,
    timed_out,
    unreachable_fast,
)
from kvstore_client.datapath import Target, Ticket
from kvstore_client.drive import Pump, handle
from kvstore_client.options import ClientOptions
from kvstore_client.state import Lease
from kvstore_client.stats import ClientStats
from kvstore_client.steps import (
    Answer,
    Ask,
    Finish,
    Flow,
    Later,
    Move,
    Release,
    Rpc,
    Settle,
    Start,
    Wait,
)

T = TypeVar("T")


class AsyncKVStoreClient:
    """`async with AsyncKVStoreClient(etcd=...) as store:` — same methods as KVStoreClient,
    as coroutines, and the same settings (keywords or `options=ClientOptions(...)`)."""

    def __init__(self, etcd: str | None = None, *, options: ClientOptions | None = None,
                 **settings: Any) -> None:
        self.options = opts = ClientOptions.of(options, etcd, settings)
        self.etcd = opts.etcd
        self._creds = opts.credentials()
        self.timeout = opts.timeout
        self.transport = opts.transport_name()
        self._layout = Layout(opts.cluster)
        self._fixed_master = opts.master
        self._control: AsyncControl | None = None
        self._fast_given_up = ""  # a fast address that would not take connections
        self.master_address = ""  # where control calls go (the fast or the gRPC address)
        self._state = opts.state(self._layout)
        self._staging_turn = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def stats(self) -> ClientStats:
        return self._state.stats

    async def __aenter__(self) -> AsyncKVStoreClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        record = await asyncio.to_thread(discover_record, self.etcd, self._layout,
                                         self._fixed_master, self.timeout, self._creds)
        control = self._control
        self._fast_given_up = unreachable_fast(control, self._fast_given_up)
        want = target(record, self.transport, self._fast_given_up)
        if control is None or (control.transport, control.address) != want:
            if control is not None:
                await control.close()
            self._control = open_async_control(record, self.transport, self._fast_given_up,
                                  self._creds)
            self.master_address = self._control.address

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=1.0)
        reservations = self._state.reservations
        if self._control is not None and reservations is not None:
            left = reservations.drain()
            if left:
                # A master that does not answer soon reclaims them after its put timeout.
                with contextlib.suppress(Retry, KVStoreError):
                    await self._control.call("PutRevoke", pb.KeysRequest(
                        keys=left, writer=self._state.writer_id), min(1.0, self.timeout))
        if self._control is not None:
            await self._control.close()
            self._control = None
        self._state.close()

    async def _call(self, method: str, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if self._control is None:
            await self.connect()
        last = "no attempt"
        for attempt in range(1 << 30):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            assert self._control is not None
            try:
                reply = await self._control.call(method, request, remaining)
            except Retry as exc:
                last = str(exc)
            else:
                if self._state.current(reply):
                    return check_reply(reply)
                last = f"{self.master_address} is not the leader"
                self.stats.failovers += 1
            await asyncio.sleep(backoff(attempt, deadline - loop.time()))
            await self._reconnect_quietly()
        raise timed_out(method, self.timeout, last)

    async def _reconnect_quietly(self) -> None:
        with contextlib.suppress(KVStoreError):
            await self.connect()

    def _send_later(self, step: Later) -> None:
        """A Later step: the call runs as a task of its own; `then` gets its reply, or
        None if it failed."""

        async def call() -> None:
            reply = None
            with contextlib.suppress(KVStoreError):
                reply = await self._call(step.method, step.request)
            step.then(reply)

        task = asyncio.create_task(call())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _release_later(self, lease_id: int) -> None:
        if self._control is not None and self._control.release_oneway(lease_id):
            return  # a one-way frame, already on its way

        async def release() -> None:
            with contextlib.suppress(KVStoreError):
                await self._call("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease_id))

        task = asyncio.create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _run(self, flow: Flow[T]) -> T:
        steps = _Steps(self)
        pump = Pump(flow)
        try:
            while (step := pump.next()) is not None:
                try:
                    pump.give(await handle(steps, step))
                except KVStoreError as exc:
                    pump.fail(exc)
            return pump.result
        finally:
            await steps.wind_up()

    async def _run_staged(self, flow: Flow[T]) -> T:
        async with self._staging_turn:
            return await self._run(flow)

    # -- the API (see KVStoreClient for each method's contract) ----------------------------

    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return await self._run(flows.exists(keys))

    async def remove(self, key: bytes) -> bool:
        return (await self.remove_many([key]))[0] == Code.OK

    async def remove_many(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        return await self._run(flows.remove_many(self._state, keys, force))

    async def put(self, key: bytes, value: Any) -> None:
        err = (await self.put_many([key], [value]))[0]
        if err is not None:
            raise err

    async def put_many(self, keys: Sequence[bytes],
                       values: Sequence[Any]) -> list[KVStoreError | None]:
        return await self._run_staged(flows.put_many(self._state, keys, values))

    async def get(self, key: bytes) -> bytes | None:
        out = (await self._run_staged(flows.get_many(self._state, [key])))[0]
        if isinstance(out, NotFound):
            return None
        if isinstance(out, KVStoreError):
            raise out
        return out

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out = await self._run_staged(flows.get_many(self._state, keys))
        return [None if isinstance(o, KVStoreError) else o for o in out]

    async def lookup(self, keys: Sequence[bytes], ttl: float | None = None) -> Lease:
        lease = await self._run(flows.lookup(self._state, keys, ttl))
        lease._client = self
        return lease

    async def renew(self, lease: Lease, ttl: float | None = None) -> None:
        await self._run(flows.renew(self._state, lease, ttl))

    async def release(self, lease: Lease, keep_first: int | None = None) -> None:
        await self._run(flows.release(lease, keep_first))

    def register(self, buffer: Any) -> None:
        self._state.register(buffer)

    def unregister(self, buffer: Any) -> None:
        self._state.unregister(buffer)

    async def put_from(self, keys: Sequence[bytes],
                       buffers: Sequence[Any]) -> list[KVStoreError | None]:
        return await self._run(flows.put_from(self._state, keys, buffers))

    async def get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                       lease: Lease | None = None) -> list[KVStoreError | None]:
        return await self._run(flows.get_into(self._state, keys, buffers, lease))


class _Steps:
    """The coroutine handlers of one run of a flow (drive.StepHandlers): control calls on
    the loop, transfers in a worker thread; and what the run started, for `wind_up`."""

    __slots__ = ("_client", "asked", "started")

    def __init__(self, client: AsyncKVStoreClient) -> None:
        self._client = client
        self.started: list[Ticket] = []
        self.asked: list[asyncio.Future[Any]] = []

    async def rpc(self, step: Rpc) -> Any:
        return await self._client._call(step.method, step.request)

    async def ask(self, step: Ask) -> asyncio.Future[Any]:
        # The call runs as a task of its own while the flow goes on.
        call = asyncio.ensure_future(self._client._call(step.method, step.request))
        self.asked.append(call)
        return call

    async def answer(self, step: Answer) -> Any:
        return await step.asked

    async def later(self, step: Later) -> None:
        self._client._send_later(step)

    async def settle(self, step: Settle) -> None:
        pass  # a Later's reply is handed over by its own task

    async def start(self, step: Start) -> Ticket:
        state = self._client._state
        # Submitting is quick, unless a node is new (etcd, a probe).
        if state.resolved(step.plan):
            ticket = state.start_transfers(step.plan, step.write, step.dead, step.at_once)
        else:
            ticket = await asyncio.to_thread(state.start_transfers, step.plan, step.write,
                                             step.dead, step.at_once)
        self.started.append(ticket)
        return ticket

    async def finish(self, step: Finish) -> dict[Target, KVStoreError]:
        # The worker thread sleeps between polls, not the loop.
        return await asyncio.to_thread(self._client._state.finish_transfers, step.ticket,
                                       time.sleep)

    async def move(self, step: Move) -> dict[Target, KVStoreError]:
        return await asyncio.to_thread(self._client._state.run_transfers, step.plan,
                                       step.write, time.sleep)

    async def release(self, step: Release) -> None:
        self._client._release_later(step.lease_id)

    async def wait(self, step: Wait) -> None:
        await asyncio.sleep(step.seconds)

    async def wind_up(self) -> None:
        """Whatever ended the flow (cancellation too), nothing it started may still be
        moving bytes: wait for it in a worker thread. Cancel the calls it asked and never
        read the answer of."""
        state = self._client._state
        left = [t for t in self.started if not t.done]
        if left:
            await asyncio.to_thread(lambda: [state.finish_transfers(t, time.sleep)
                                             for t in left])
        for call in self.asked:  # a flow that ended before reading its answer
            if not call.done():
                call.cancel()
            elif not call.cancelled():
                call.exception()  # retrieved: no "never retrieved" warning
