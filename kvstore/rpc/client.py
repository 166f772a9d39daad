"""The fast channel's blocking client: one socket, one call in flight, no threads.

A call is one `sendall` of the request frame and `recv`s until its reply frame is
whole (usually one). One-way requests (a lease release nobody waits for) are not
answered; they are queued with MSG_MORE, so the kernel sends them together with the
next request, or on its own within ~200 ms (Linux's cork limit) if none comes, or when
the channel closes: a get costs one wake-up of the master, not two.

With `spin`, a caller about to sleep in recv for a reply first polls the socket (a
zero-timeout select, which lets go of the GIL) for up to that many seconds: on a VM the
wake-up of a thread asleep in recv, on a vCPU that may have been halted meanwhile, costs
tens of µs, more than a fast master takes to answer. One small call measured on 2 vCPUs,
6 rounds of 500 each way, alternating: 44-114 µs p50 asleep (four rounds of six near 90),
48-59 µs polling. A caller whose engine transfers are moving meanwhile asks for a reply
with `spin=False`: the polling would take the CPU the engine's threads need to move the
bytes (see the client's driver).

The poll pays only when the reply comes within it: one that comes later is waited for
asleep anyway, so its wake-up is paid as well and every µs polled was CPU taken from the
master (which, on a small host, is what it waits for). So the channel polls only for
requests of a kind whose replies lately came within about the spin (`SPIN_SLACK` times
it) of the caller's beginning to wait (`SPIN_HIT_MIN` of them, on a running average
over about `1 / SPIN_LEARN` replies; one already there counts as prompt): a kind is the
method and the request's size to a power of two, since a PutCommit of one object comes
back in tens of µs and one of 64 in a millisecond on a loaded master. A kind that
stopped polling is measured asleep (the wake-up included), and polls again once its
replies come soon again.

Any failure of the connection (refused, reset, closed, timed out) closes the socket and
raises OSError; the next call connects again. What to do about it (retry, look up the
leader again) is the caller's business.

Except one: a channel whose TLS setting is not the server's raises WrongLayer, which no
retry can fix. A TLS ClientHello sent to a plaintext master is taken for the start of a
large frame and never answered, so the handshake would only time out: a TLS channel
that was told the master may be plaintext (`plaintext_check`, when its etcd record does
not announce TLS), and any TLS channel whose handshake fails, asks on a separate
connection whether a plaintext master answers there (a frame naming no method, which a
master answers with an error frame and runs nothing for; no token is sent). A plaintext
request sent to a TLS master makes it close the connection: a plaintext channel whose
first exchange on a connection ends that way sends a ClientHello to see if TLS answers.

With `tls`, the socket is wrapped (and the master's certificate checked) as it connects;
with `token`, the first frame on every new connection is `Authenticate`, answered before
any other request is sent, so a refused token fails the call that connected, with the
master's sentence.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from kvstore.addresses import split_address
from kvstore.errors import error_for
from kvstore.rpc.framing import (
    HEADER,
    HEADER_SIZE,
    MAX_FRAME,
    ONE_WAY,
    REPLY_ERROR,
    REPLY_OK,
    encode,
)
from kvstore.rpc.methods import BY_ID, METHODS
from kvstore.security.tls import speaks_tls
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb

_RECV = 1 << 16
_MORE = getattr(socket, "MSG_MORE", 0)  # elsewhere than Linux: sent at once
PROBE_TIMEOUT = 1.0  # s a probe for the other layer (TLS or plaintext) waits for an answer
PROBE_TAG = next(t for t in range(0xFFFF, 0, -1) if t not in BY_ID)  # names no method
PROBE_ID = 1


class ProtocolViolation(ConnectionError):
    """The peer sent bytes that are not the reply we wait for."""


class WrongLayer(ConnectionError):
    """The server speaks the other layer: plaintext to this TLS channel (`peer_tls`
    False), or TLS to this plaintext one (True). Retrying cannot fix it."""

    def __init__(self, address: str, peer_tls: bool) -> None:
        super().__init__(f"{address} {'serves TLS' if peer_tls else 'answers in plaintext'}")
        self.address = address
        self.peer_tls = peer_tls


def answers_plaintext(address: str, timeout: float) -> bool:
    """Whether a plaintext fast-channel server answers at `address` (see the module doc)."""
    try:
        with socket.create_connection(split_address(address), timeout=timeout) as sock:
            sock.sendall(HEADER.pack(0, PROBE_ID, PROBE_TAG))
            data = b""
            while len(data) < HEADER_SIZE:
                chunk = sock.recv(HEADER_SIZE - len(data))
                if not chunk:
                    return False
                data += chunk
    except (OSError, ValueError):
        return False
    _, request_id, tag = HEADER.unpack(data)
    return request_id == PROBE_ID and tag in (REPLY_OK, REPLY_ERROR)


def reply_message(response: type[Message], tag: int, body: bytes) -> Message:
    """A reply frame's message, or the typed error of a REPLY_ERROR frame."""
    if tag == REPLY_OK:
        return response.FromString(body)
    error = cpb.Error.FromString(body)
    raise error_for(error.code, error.message)


@dataclass(slots=True)
class Asked:
    """A request sent by `FastChannel.ask` whose reply is not read yet."""

    response: type[Message]
    request_id: int
    deadline: float
    sock: socket.socket
    kind: int = -1  # the method and the request's size class (see SpinGuide); -1: none


# How the channel decides to poll for a reply (see the module doc): a kind polls while
# its running share of replies that came within the spin is at least SPIN_HIT_MIN; each
# reply moves the share by SPIN_LEARN towards 1 (it came in time) or 0 (it did not).
SPIN_HIT_MIN = 0.5
SPIN_LEARN = 0.125
# A reply counts as prompt up to this many spins after the caller began to wait: a kind
# whose replies come about at the spin's end (a single put's PutCommit on a busy host)
# keeps polling, as before, and only one answered well after it sleeps at once.
SPIN_SLACK = 2.0


class SpinGuide:
    """Per kind of request, the running share of replies that came within the spin."""

    __slots__ = ("_hits", "prompt", "spin")

    def __init__(self, spin: float) -> None:
        self.spin = spin
        self.prompt = spin * SPIN_SLACK  # a reply within this counts as one in time
        self._hits: dict[int, float] = {}

    @staticmethod
    def kind(method_id: int, size: int) -> int:
        return method_id << 6 | size.bit_length()

    def polls(self, kind: int) -> bool:
        """Whether a reply of this kind is worth polling for (unknown kinds are)."""
        return self._hits.get(kind, 1.0) >= SPIN_HIT_MIN

    def saw(self, kind: int, waited: float) -> None:
        """A reply of `kind` came `waited` seconds after the caller began to wait."""
        hits = self._hits.get(kind, 1.0)
        self._hits[kind] = hits + ((waited <= self.prompt) - hits) * SPIN_LEARN


Step = tuple[str, Any]  # one step of Link.connecting: (what, the connection or None)


class Link:
    """What both fast channels are before any I/O: the settings and counters, request
    ids, and the connect sequence (`connecting`), which each channel runs its own way."""

    def __init__(self, address: str, *, max_frame: int = MAX_FRAME,
                 connect_timeout: float = 2.0, tls: ssl.SSLContext | None = None,
                 server_hostname: str = "", token: str = "",
                 plaintext_check: bool = False) -> None:
        self.address = address
        self.tls = tls
        self.plaintext_check = plaintext_check  # see the module doc
        self.token = token
        self.max_frame = max_frame
        self.connect_timeout = connect_timeout  # at most; a call's own timeout may be less
        self.connects = 0  # connections opened so far
        self.connect_failures = 0  # attempts that failed since the last connection opened
        self._host, self._port = split_address(address)
        self._server_hostname = server_hostname or self._host
        self._next_id = 0

    def _request_id(self) -> int:
        self._next_id = self._next_id % 0xFFFFFFFF + 1  # 1 .. 2**32-1; 0 is one-way
        return self._next_id

    def connecting(self) -> Generator[Step, Any, Any]:
        """A new connection, as steps for the channel to take and send back the outcome
        of: ("plaintext?", None) whether a plaintext server answers (a TLS channel's
        probe), ("tls?", None) whether a TLS one does, ("open", None) the connection
        (TCP, and the TLS handshake), ("authenticate", conn) the master's
        AuthenticateResponse, ("drop", conn) close it. Returns the connection."""
        if self.plaintext_check and self.tls is not None and (yield ("plaintext?", None)):
            self.connect_failures += 1
            raise WrongLayer(self.address, peer_tls=False)
        try:
            conn = yield ("open", None)
        except ssl.SSLCertVerificationError:
            self.connect_failures += 1
            raise  # a TLS server, with a certificate we do not trust
        except OSError as exc:  # refused, reset, SSLError, EOF, the handshake timing out
            self.connect_failures += 1
            if self.tls is not None and (yield ("plaintext?", None)):
                raise WrongLayer(self.address, peer_tls=False) from exc
            raise
        if self.token:
            try:
                reply = yield ("authenticate", conn)
            except BaseException as exc:
                yield ("drop", conn)
                self.connect_failures += 1
                # A TLS server given a plaintext request closes the connection.
                if self.tls is None and isinstance(exc, ConnectionError) and \
                        not isinstance(exc, WrongLayer) and (yield ("tls?", None)):
                    raise WrongLayer(self.address, peer_tls=True) from exc
                raise
            if reply.error.code:
                yield ("drop", conn)
                raise error_for(reply.error.code, reply.error.message)
        self.connects += 1
        self.connect_failures = 0
        return conn


class FastChannel(Link):
    """A blocking connection to one master's fast port. Not thread-safe."""

    def __init__(self, address: str, *, spin: float = 0.0, **settings: Any) -> None:
        super().__init__(address, **settings)
        self.spin = spin  # seconds to poll for a reply before sleeping in recv
        self.guide = SpinGuide(spin)  # which kinds of reply are worth polling for
        self._replied = False  # a reply came on the current connection
        self._sock: socket.socket | None = None
        self._rest = b""  # bytes read past a reply: the start of the next one (asked already)
        self._send_flags = 0 if self.tls else _MORE  # SSL sockets take no send flags

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        self._rest = b""
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()

    def _tls_server(self, exc: BaseException) -> bool:
        """After a plaintext connection ended before any reply: is a TLS server there?"""
        return (self.tls is None and not self._replied and isinstance(exc, ConnectionError)
                and not isinstance(exc, WrongLayer) and speaks_tls(self.address, PROBE_TIMEOUT))

    def _connection(self, timeout: float) -> socket.socket:
        if self._sock is None:
            self._replied = False
            steps, outcome, error = self.connecting(), None, None
            while True:
                try:
                    step = steps.send(outcome) if error is None else steps.throw(error)
                except StopIteration as done:
                    self._sock = done.value
                    break
                outcome, error = None, None
                try:
                    outcome = self._take(step, timeout)
                except BaseException as exc:
                    error = exc
        return self._sock

    def _take(self, step: Step, timeout: float) -> Any:
        """One step of `connecting`, blocking."""
        what, sock = step
        if what == "open":
            sock = socket.create_connection((self._host, self._port),
                                            timeout=min(timeout, self.connect_timeout))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is None:
                return sock
            try:
                return self.tls.wrap_socket(sock, server_hostname=self._server_hostname)
            except BaseException:
                sock.close()
                raise
        if what == "authenticate":
            payload = pb.AuthenticateRequest(token=self.token).SerializeToString()
            request_id = self._request_id()
            sock.settimeout(timeout)
            sock.sendall(encode(request_id, METHODS["Authenticate"].id, payload))
            tag, body = self._reply(sock, request_id, time.monotonic() + timeout)
            self._replied = True
            return reply_message(pb.AuthenticateResponse, tag, body)
        if what == "drop":
            return sock.close()
        if what == "tls?":
            return speaks_tls(self.address, PROBE_TIMEOUT)
        return answers_plaintext(self.address, min(timeout, PROBE_TIMEOUT))

    def call(self, method: str, request: Message, timeout: float, spin: bool = True) -> Message:
        """Send `request` to `method` and return its reply message.

        Raises OSError (TimeoutError included) when the connection fails or `timeout`
        seconds pass, and the typed KVStoreError of a REPLY_ERROR frame.
        """
        return self.answer(self.ask(method, request, timeout), spin)

    def ask(self, method: str, request: Message, timeout: float) -> Asked:
        """The first half of `call`: send the request and return at once, so the caller
        can do something else while the master works; `answer` waits for the reply.
        Several may be asked before any is answered, but they must be answered in the
        order asked (the master answers a connection's requests in order; a reply out of
        turn is a ProtocolViolation and drops the connection). One-way requests may be
        sent in between."""
        spec = METHODS[method]
        payload = request.SerializeToString()
        request_id = self._request_id()
        deadline = time.monotonic() + timeout
        try:
            sock = self._connection(timeout)
            sock.settimeout(timeout)
            sock.sendall(encode(request_id, spec.id, payload))
        except BaseException:
            self.close()
            raise
        return Asked(spec.response, request_id, deadline, sock,
                     SpinGuide.kind(spec.id, len(payload)))

    def answer(self, asked: Asked, spin: bool = True) -> Message:
        """The reply to what `ask` sent (same errors as `call`); with `spin` False, waited
        for asleep at once, never polled for (see the module doc)."""
        if asked.sock is not self._sock:
            raise ConnectionResetError(f"the connection to {self.address} closed before "
                                       "the reply came")
        guide, kind = self.guide, asked.kind
        learn = self.spin > 0 and kind >= 0
        start = time.monotonic() if learn else 0.0
        try:
            tag, body = self._reply(asked.sock, asked.request_id, asked.deadline,
                                    spin and learn and guide.polls(kind))
        except BaseException as exc:
            self.close()  # a half-read reply would poison the next call
            if self._tls_server(exc):
                raise WrongLayer(self.address, peer_tls=True) from exc
            raise
        self._replied = True
        if learn:
            guide.saw(kind, time.monotonic() - start)
        return reply_message(asked.response, tag, body)

    def ready(self, asked: Asked) -> bool:
        """Whether `answer(asked)` can start reading at once: bytes of a reply are here
        (or the connection is gone, which it reports at once). Never blocks: a poll with
        a zero timeout, for a caller that spins on something else meanwhile."""
        sock = asked.sock
        return bool(self._rest) or sock is not self._sock or _readable(sock)

    def send_oneway(self, method: str, request: Message, timeout: float) -> bool:
        """Queue a request nobody waits for (see the module doc); False if it could not be."""
        spec = METHODS[method]
        payload = request.SerializeToString()
        try:
            sock = self._connection(timeout)
            sock.settimeout(timeout)
            sock.sendall(HEADER.pack(len(payload), ONE_WAY, spec.id) + payload, self._send_flags)
        except OSError:
            self.close()
            return False
        return True

    def _reply(self, sock: socket.socket, request_id: int, deadline: float,
               spin: bool = True) -> tuple[int, bytes]:
        data, self._rest = self._rest, b""
        while len(data) < HEADER_SIZE:
            data += self._more(sock, deadline, spin)
        length, rid, tag = HEADER.unpack_from(data)
        if rid != request_id or tag not in (REPLY_OK, REPLY_ERROR) or length > self.max_frame:
            raise ProtocolViolation(
                f"{self.address} sent a frame (id {rid}, tag {tag}, {length} bytes) that is not "
                f"the reply to request {request_id}")
        end = HEADER_SIZE + length
        if len(data) < end:
            buf = bytearray(end)
            buf[:len(data)] = data
            view = memoryview(buf)
            got = len(data)
            while got < end:
                sock.settimeout(self._left(deadline))
                n = sock.recv_into(view[got:])
                if n == 0:
                    raise ConnectionResetError(f"{self.address} closed the connection")
                got += n
            return tag, bytes(buf[HEADER_SIZE:])
        if len(data) > end:
            # The start of the reply to a request asked after this one: kept for its answer
            # (an unasked-for one shows as a wrong request id there).
            self._rest = data[end:]
            return tag, data[HEADER_SIZE:end]
        return tag, data[HEADER_SIZE:]

    def _more(self, sock: socket.socket, deadline: float, spin: bool = True) -> bytes:
        if spin and self.spin > 0:
            _poll(sock, min(deadline, time.monotonic() + self.spin))
        sock.settimeout(self._left(deadline))
        chunk = sock.recv(_RECV)
        if not chunk:
            raise ConnectionResetError(f"{self.address} closed the connection")
        return chunk

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


def _readable(sock: socket.socket) -> bool:
    """Whether a recv would return at once (bytes, or the end of the connection)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True  # decrypted bytes wait in the TLS layer, not in the socket
    try:
        return bool(select.select((sock,), (), (), 0)[0])
    except (OSError, ValueError):
        return True  # closed under us: the recv reports it


def _poll(sock: socket.socket, until: float) -> None:
    """Poll until `sock` is readable or the clock passes `until`."""
    monotonic = time.monotonic
    while not _readable(sock) and monotonic() < until:
        pass


class FastStub:
    """gRPC-stub call syntax over a FastChannel: `stub.Lookup(request, timeout=5)`.

    For tools and benchmarks written against `master_pb2_grpc.MasterStub`; failures are
    the channel's (OSError, KVStoreError), not grpc.RpcError, and nothing is retried.
    """

    def __init__(self, channel: FastChannel, timeout: float = 30.0) -> None:
        self.channel = channel
        for name in METHODS:
            setattr(self, name, self._method(name, timeout))

    def _method(self, name: str, default_timeout: float) -> Callable[..., Message]:
        call = self.channel.call

        def invoke(request: Message, timeout: float | None = None) -> Message:
            return call(name, request, default_timeout if timeout is None else timeout)
        invoke.__name__ = name
        return invoke

    def __getattr__(self, name: str) -> Any:  # typing: methods are set per instance
        raise AttributeError(f"the Master service has no RPC {name!r}")
