"""The fast channel's server: an asyncio Protocol in the master process.

Each connection decodes frames as bytes arrive and runs each request at once, on the
event loop thread, through the same `handle(method, request) -> reply` the gRPC servicer
uses (leadership check, epoch, metrics, error mapping included). The replies to all the
requests of one chunk go out in one write, so a client that pipelines requests costs
one send per chunk. A peer that sends an oversized frame is disconnected; nothing a peer
sends can stop the master. When the peer does not read its replies, the connection
stops reading requests until the kernel buffers drain.

When the master requires tokens, a connection starts unauthenticated: every call but
`Authenticate` is refused until one succeeds, and then the connection carries that
token's principal (tenant, role) for the rest of its life. With TLS, the asyncio
transport does the handshake before the first byte reaches `data_received`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from google.protobuf.message import DecodeError, Message

from kvstore.addresses import join_address, split_address
from kvstore.errors import Code, KVStoreError, Unauthenticated
from kvstore.rpc.framing import (
    HEADER,
    MAX_FRAME,
    ONE_WAY,
    REPLY_OK,
    FrameDecoder,
    FrameError,
    error_frame,
)
from kvstore.rpc.methods import BY_ID, Method
from kvstore.security.access import OPEN, Principal

log = logging.getLogger(__name__)

Handler = Callable[[str, Message, "Principal | KVStoreError"], Message]
Authenticate = Callable[[str], Principal]  # token -> principal, or raises Unauthenticated
# (method, reply) -> None if the reply may go at once, else what to await before it goes
# (the master's writes wait for the store nodes to record them: see MasterService.settle).
Settle = Callable[[str, Message], "asyncio.Future[None] | None"]

_NOT_YET = Unauthenticated(
    "this master requires a token: the connection must call Authenticate first (the "
    "client library does so when given token= or KVSTORE_TOKEN)")


class _Connection(asyncio.Protocol):
    __slots__ = ("_decoder", "_handle", "_held", "_server", "_transport", "caller", "peer")

    def __init__(self, server: FastServer) -> None:
        self._server = server
        self._handle = server.handle
        self._decoder = FrameDecoder(server.max_frame)
        self._transport: asyncio.Transport | None = None
        self.peer = "?"
        self.caller: Principal | KVStoreError = OPEN if server.authenticate is None else _NOT_YET
        # Replies behind one that waits (see Settle), in order: a client reads a
        # connection's replies in the order it asked.
        self._held: deque[bytes | tuple[asyncio.Future[None], int, Message]] = deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.peer = str(transport.get_extra_info("peername"))
        self._server._connections.add(self)
        self._server.accepted += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._transport = None

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            log.warning("fast channel: dropping the connection from %s: %s", self.peer, exc)
            transport.close()
            return
        out: list[bytes] = []
        held = self._held
        for request_id, tag, payload in frames:
            reply = self._dispatch(request_id, tag, payload)
            if reply is None:
                continue
            if isinstance(reply, bytes) and not held:
                out.append(reply)
                continue
            if out:
                transport.write(b"".join(out))
                out = []
            held.append(reply)
            if not isinstance(reply, bytes):
                reply[0].add_done_callback(self._settled)
        if out:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        if held:
            self._settled()

    def _settled(self, _: object = None) -> None:
        """Send the held replies from the front, up to the first still waiting."""
        held = self._held
        out: list[bytes] = []
        while held:
            head = held[0]
            if isinstance(head, bytes):
                out.append(head)
            else:
                wait, request_id, answer = head
                if not wait.done():
                    break
                if wait.cancelled() or wait.exception() is not None:
                    log.error("fast channel: settling a reply failed: %r",
                              None if wait.cancelled() else wait.exception())
                    out.append(error_frame(request_id, Code.INTERNAL, "the master failed "
                                            "to record the change; see its log"))
                else:
                    frame = answer.SerializeToString()
                    out.append(HEADER.pack(len(frame), request_id, REPLY_OK) + frame)
            held.popleft()
        if out and self._transport is not None:
            self._transport.write(b"".join(out))

    def _dispatch(self, request_id: int, tag: int,
                  payload: bytes) -> bytes | tuple[asyncio.Future[None], int, Message] | None:
        method: Method | None = BY_ID.get(tag)
        if method is None:
            code, message = Code.INVALID_ARGUMENT, (
                f"method id {tag} names no RPC of this master (is the client newer than the "
                "master?)")
        else:
            try:
                request = method.request.FromString(payload)
            except DecodeError:
                code, message = Code.INVALID_ARGUMENT, (
                    f"{method.name}: the payload is not a {method.request.DESCRIPTOR.full_name}")
            else:
                try:
                    answer = self._handle(method.name, request, self.caller)
                    if method.name == "Authenticate" and not answer.error.code:
                        assert self._server.authenticate is not None
                        self.caller = self._server.authenticate(request.token)
                    settle = self._server.settle
                    wait = None if settle is None else settle(method.name, answer)
                    if request_id == ONE_WAY:  # nobody reads the reply: just let it run
                        return None  # (one that waits settles by itself)
                    if wait is not None:
                        return wait, request_id, answer
                    reply = answer.SerializeToString()
                except Exception:  # handle() maps every error; a bug must not kill the loop
                    log.exception("fast channel: %s failed", method.name)
                    code, message = Code.INTERNAL, f"the master failed to handle {method.name}"
                else:
                    return HEADER.pack(len(reply), request_id, REPLY_OK) + reply
        if request_id == ONE_WAY:
            return None
        return error_frame(request_id, code, message)


class FastServer:
    """Serves `handle` on a TCP port until `close`."""

    def __init__(self, handle: Handler, *, max_frame: int = MAX_FRAME,
                 authenticate: Authenticate | None = None,
                 tls: ssl.SSLContext | None = None, settle: Settle | None = None) -> None:
        self.handle = handle
        self.settle = settle
        self.authenticate = authenticate  # None: no tokens, every connection is OPEN
        self.tls = tls
        self.max_frame = max_frame
        self.address = ""
        self.accepted = 0  # connections accepted since start
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self, listen: str) -> str:
        """Listen on HOST:PORT (port 0: a free one); returns the address it listens on."""
        host, port = split_address(listen)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port,
                                                reuse_address=True, ssl=self.tls,
                                                ssl_handshake_timeout=5.0 if self.tls else None)
        sock: Any = self._server.sockets[0]
        bound_port = sock.getsockname()[1]
        self.address = join_address(host, bound_port)
        return self.address

    def drop_connections(self) -> None:
        """Close every open connection; clients reconnect (and authenticate again)."""
        for conn in list(self._connections):
            conn.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
