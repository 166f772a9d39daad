"""The fast channel's asyncio client: many concurrent calls on one connection.

Each call takes a fresh request id, writes its frame and waits on a future kept in the
connection's `pending` table; replies may come back in any order and complete the
future with their id. A call that times out gives up its future (a late reply is
dropped); a lost connection fails every pending call with ConnectionError, and the next
call connects again. TLS and the token work as in the blocking client (kvstore.rpc.client):
a new connection authenticates, and waits for the answer, before any call uses it; a
TLS setting that is not the server's raises WrongLayer at once, found out the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from google.protobuf.message import Message

from kvstore.rpc.client import (
    PROBE_TIMEOUT,
    Link,
    Step,
    WrongLayer,
    answers_plaintext,
    reply_message,
)
from kvstore.rpc.framing import (
    ONE_WAY,
    FrameDecoder,
    FrameError,
    encode,
)
from kvstore.rpc.methods import METHODS
from kvstore.security.tls import speaks_tls_async
from kvstore.v1 import master_pb2 as pb

Reply = tuple[int, bytes]  # (tag, payload)


class _Connection(asyncio.Protocol):
    def __init__(self, address: str, max_frame: int) -> None:
        self.address = address
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        self.transport: asyncio.Transport | None = None
        self.replied = False  # a frame came on this connection
        self._decoder = FrameDecoder(max_frame)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionResetError(
                    f"the connection to {self.address} was lost ({exc or 'closed'})"))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameError:
            if self.transport is not None:
                self.transport.abort()
            return
        for request_id, tag, payload in frames:
            self.replied = True
            fut = self.pending.pop(request_id, None)
            if fut is not None and not fut.done():
                fut.set_result((tag, payload))

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()


class AsyncFastChannel(Link):
    """An asyncio connection to one master's fast port, shared by concurrent calls."""

    def __init__(self, address: str, **settings: Any) -> None:
        super().__init__(address, **settings)
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.open

    async def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None

    async def _connection(self, timeout: float) -> _Connection:
        conn = self._conn
        if conn is not None and conn.open:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # concurrent first calls share one connection
            conn = self._conn
            if conn is not None and conn.open:
                return conn
            steps = self.connecting()
            step = next(steps)
            throw: BaseException | None
            while True:  # Link.connecting's steps, each awaited
                try:
                    outcome = await self._take(step, timeout)
                except BaseException as exc:
                    throw, outcome = exc, None
                else:
                    throw = None
                try:
                    step = steps.send(outcome) if throw is None else steps.throw(throw)
                except StopIteration as done:
                    self._conn = done.value
                    return done.value

    async def _take(self, step: Step, timeout: float) -> Any:
        """One step of `connecting`, on the loop (the probes in a worker thread)."""
        what, conn = step
        if what == "open":
            loop = asyncio.get_running_loop()
            _, fresh = await asyncio.wait_for(loop.create_connection(
                lambda: _Connection(self.address, self.max_frame), self._host, self._port,
                ssl=self.tls, server_hostname=self._server_hostname if self.tls else None),
                min(timeout, self.connect_timeout))
            return fresh
        if what == "authenticate":
            return await self.answer(self._send(
                conn, "Authenticate", pb.AuthenticateRequest(token=self.token), timeout))
        if what == "drop":
            return conn.transport and conn.transport.close()
        if what == "tls?":
            return await speaks_tls_async(self.address, PROBE_TIMEOUT)
        return await asyncio.to_thread(answers_plaintext, self.address,
                                       min(timeout, PROBE_TIMEOUT))

    async def call(self, method: str, request: Message, timeout: float) -> Message:
        """Like FastChannel.call; other calls proceed on the same connection meanwhile."""
        return await self.answer(self._send(await self._connection(timeout), method, request,
                                            timeout))

    def ask(self, method: str, request: Message, timeout: float) -> Asked:
        """Send on the open connection and return at once (ConnectionResetError when
        there is none: the caller makes the whole `call`); `answer` awaits the reply."""
        conn = self._conn
        if conn is None or not conn.open:
            raise ConnectionResetError(f"no open connection to {self.address}")
        return self._send(conn, method, request, timeout)

    def _send(self, conn: _Connection, method: str, request: Message,
              timeout: float) -> Asked:
        spec = METHODS[method]
        transport = conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError(f"the connection to {self.address} was lost")
        loop = asyncio.get_running_loop()
        request_id = self._request_id()
        fut: asyncio.Future[Reply] = loop.create_future()
        conn.pending[request_id] = fut
        timer = loop.call_later(timeout, _expire, fut)
        transport.write(encode(request_id, spec.id, request.SerializeToString()))
        return Asked(conn, request_id, fut, timer, spec.response)

    async def answer(self, asked: Asked) -> Message:
        """The reply to what `ask` sent (the errors of `call`)."""
        try:
            tag, body = await asked.reply
        except ConnectionError as exc:
            # Closed before a single reply: a TLS server given a plaintext request does so.
            if self.tls is None and not asked.conn.replied and \
                    await speaks_tls_async(self.address, PROBE_TIMEOUT):
                raise WrongLayer(self.address, peer_tls=True) from exc
            raise
        finally:
            asked.timer.cancel()
            asked.conn.pending.pop(asked.request_id, None)
        return reply_message(asked.response, tag, body)

    def send_oneway(self, method: str, request: Message, timeout: float = 0.0) -> bool:
        """Queue a one-way request on the open connection; False if there is none."""
        conn = self._conn
        if conn is None or not conn.open or conn.transport is None:
            return False
        conn.transport.write(encode(ONE_WAY, METHODS[method].id, request.SerializeToString()))
        return True


@dataclass(slots=True)
class Asked:
    """A request sent by `AsyncFastChannel.ask` whose reply is not awaited yet."""

    conn: _Connection
    request_id: int
    reply: asyncio.Future[Reply]
    timer: asyncio.TimerHandle
    response: type[Message]


def _expire(fut: asyncio.Future[Reply]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError("timed out"))
