"""The leader's inventory deltas to a store node, over the fast channel's frames.

A write's reply waits for its store nodes to record it (kvstore.master.durability), so
the `Apply` round trip is on every put's path. Over gRPC's asyncio stack it costs a
thread hand-off at each end and each direction; this channel is a plain asyncio stream
carrying the same `ApplyRequest` and `ApplyResponse` messages in the fast channel's
frames (framing.py), one request at a time per connection. The gRPC `Apply` stays, for
a master that does not know this channel (docs/durability.md has the figures).

The leader sends its rows in columns (TAG_APPLY_COLUMNS, delta_columns.py) to a node
that reads them; a node that answers that frame with INVALID_ARGUMENT (one that
predates it, or reads another version) gets `ApplyRequest`s from then on.

A connection opens with an AUTH frame when the master holds a token (the node admits
only node and admin tokens, as its gRPC service does); with TLS, the stream is wrapped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from kvstore.addresses import join_address, split_address
from kvstore.errors import Code, InvalidArgument, KVStoreError, Unauthenticated, error_for
from kvstore.rpc import delta_columns
from kvstore.rpc.delta_columns import Columns, Row
from kvstore.rpc.framing import (
    HEADER,
    HEADER_SIZE,
    MAX_FRAME,
    REPLY_ERROR,
    REPLY_OK,
    FrameDecoder,
    FrameError,
    error_frame,
)
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import store_pb2 as spb

log = logging.getLogger(__name__)

TAG_AUTH = 1  # payload: the token (UTF-8)
TAG_APPLY = 2  # payload: an ApplyRequest
TAG_APPLY_COLUMNS = 3  # payload: delta_columns.encode's

Apply = Callable[[spb.ApplyRequest], Awaitable[spb.ApplyResponse]]
ApplyColumns = Callable[[Columns], Awaitable[spb.ApplyResponse]]
Admit = Callable[[str], None]  # raises KVStoreError unless the token may send deltas


class _NodeSide(asyncio.Protocol):
    def __init__(self, server: DeltaServer) -> None:
        self._server = server
        self._decoder = FrameDecoder(MAX_FRAME)
        self._transport: asyncio.Transport | None = None
        self._admitted = server.admit is None
        self._queue: asyncio.Queue[tuple[int, int, bytes]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._worker = asyncio.ensure_future(self._work())

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._worker is not None:
            self._worker.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameError:
            if self._transport is not None:
                self._transport.close()
            return
        for frame in frames:
            self._queue.put_nowait(frame)

    async def _work(self) -> None:
        # One at a time, in order: an Apply that drops a key must land before the next
        # one's add of the same key.
        while True:
            request_id, tag, payload = await self._queue.get()
            reply = await self._answer(request_id, tag, payload)
            if self._transport is None:
                return
            self._transport.write(reply)

    async def _answer(self, request_id: int, tag: int, payload: bytes) -> bytes:
        if tag == TAG_AUTH:
            admit = self._server.admit
            try:
                if admit is not None:
                    admit(payload.decode(errors="replace"))
            except KVStoreError as exc:
                return error_frame(request_id, exc.code, exc.message)
            self._admitted = True
            return HEADER.pack(0, request_id, REPLY_OK)
        if not self._admitted:
            return error_frame(request_id, Code.UNAUTHENTICATED,
                          "this store node requires a node or admin token")
        columns = self._server.apply_columns
        if tag != TAG_APPLY and (tag != TAG_APPLY_COLUMNS or columns is None):
            return error_frame(request_id, Code.INVALID_ARGUMENT, f"unknown delta frame tag {tag}")
        try:
            if tag == TAG_APPLY_COLUMNS:
                assert columns is not None
                answer = await columns(delta_columns.decode(payload))
            else:
                answer = await self._server.apply(spb.ApplyRequest.FromString(payload))
            reply = answer.SerializeToString()
        except KVStoreError as exc:  # a frame it cannot read (MalformedDeltas)
            return error_frame(request_id, exc.code, exc.message)
        except Exception as exc:  # a bad frame or a bug must not stop the node
            log.exception("delta channel: Apply failed")
            return error_frame(request_id, Code.INTERNAL, f"Apply failed on the node ({exc})")
        return HEADER.pack(len(reply), request_id, REPLY_OK) + reply


class DeltaServer:
    """The node's end: `apply` is its Apply handler, `apply_columns` the same for rows in
    columns (None: the frame is refused as unknown); `admit` checks a token (None:
    open)."""

    def __init__(self, apply: Apply, admit: Admit | None = None,
                 tls: ssl.SSLContext | None = None,
                 apply_columns: ApplyColumns | None = None) -> None:
        self.apply = apply
        self.apply_columns = apply_columns
        self.admit = admit
        self.tls = tls
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _NodeSide(self), host, 0, ssl=self.tls,
                                                ssl_handshake_timeout=5.0 if self.tls else None)
        sock: Any = self._server.sockets[0]
        return join_address(host, sock.getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None


class DeltaClient:
    """The leader's end, to one node: `apply` sends one request and waits for its reply.
    Any failure closes the connection (the next call connects again) and raises."""

    def __init__(self, address: str, tls: ssl.SSLContext | None = None,
                 server_hostname: str = "", token: str = "") -> None:
        self.address = address
        self._tls = tls
        self._hostname = server_hostname or None
        self._token = token
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._next_id = 0
        self.columns = True  # until the node refuses the columnar frame

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._streams is None:
            host, port = split_address(self.address)
            self._streams = await asyncio.open_connection(
                host, port, ssl=self._tls, server_hostname=self._hostname if self._tls else None)
            if self._token:
                await self._call(TAG_AUTH, self._token.encode())
        return self._streams

    async def _call(self, tag: int, payload: bytes) -> bytes:
        assert self._streams is not None
        reader, writer = self._streams
        self._next_id = self._next_id % 0xFFFFFFFF + 1
        writer.write(HEADER.pack(len(payload), self._next_id, tag) + payload)
        await writer.drain()
        head = await reader.readexactly(HEADER_SIZE)
        length, rid, rtag = HEADER.unpack(head)
        if rid != self._next_id or length > MAX_FRAME:
            raise ConnectionError(f"store node {self.address} answered out of order")
        body = await reader.readexactly(length)
        if rtag == REPLY_ERROR:
            error = cpb.Error.FromString(body)
            exc = error_for(error.code, error.message)
            if isinstance(exc, Unauthenticated) or error.code == Code.PERMISSION_DENIED:
                self._drop()
            raise exc
        return body

    async def apply(self, request: spb.ApplyRequest, timeout: float) -> spb.ApplyResponse:
        try:
            async with asyncio.timeout(timeout):
                await self._connect()
                body = await self._call(TAG_APPLY, request.SerializeToString())
        except BaseException:
            self._drop()
            raise
        return spb.ApplyResponse.FromString(body)

    async def apply_rows(self, epoch: int, shard: int, rows: list[Row],
                         timeout: float) -> spb.ApplyResponse:
        """`rows` in columns, or as an ApplyRequest to a node that refused columns."""
        if not self.columns:
            return await self.apply(apply_request(epoch, rows, shard), timeout)
        try:
            async with asyncio.timeout(timeout):
                await self._connect()
                body = await self._call(TAG_APPLY_COLUMNS,
                                        delta_columns.encode(epoch, shard, rows))
        except InvalidArgument as exc:  # it answered: the connection is still good
            log.warning("store node %s does not read columnar deltas (%s); sending it "
                        "ApplyRequests", self.address, exc.message)
            self.columns = False
            return await self.apply(apply_request(epoch, rows, shard), timeout)
        except BaseException:
            self._drop()
            raise
        return spb.ApplyResponse.FromString(body)

    def _drop(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def close(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            streams[1].close()
            with contextlib.suppress(Exception):
                await streams[1].wait_closed()


def apply_request(epoch: int, rows: list[Row], shard: int = 0) -> spb.ApplyRequest:
    """The ApplyRequest carrying `rows`, in order, for shard `shard`'s inventory on the
    node (gRPC, and nodes that predate columns). add() and attribute stores, each default
    left unset: with upb, about 3x faster than Change(replica=Replica(...))."""
    request = spb.ApplyRequest(epoch=epoch, shard=shard)
    add = request.changes.add
    for key, offset, size, checksum, flags in rows:
        tier, pending, record, drop = delta_columns.fields(flags)
        r = (add(drop=True) if drop else add()).replica
        r.key = key
        if offset:
            r.offset = offset
        if size:
            r.size = size
        if checksum:
            r.checksum = checksum
        r.tier = tier
        if pending:
            r.pending = True
        if record:
            r.record = True
    return request
