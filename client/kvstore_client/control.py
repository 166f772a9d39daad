"""Finding the leader and calling it: what the sync and async clients share.

A client talks to the leader through one *control* object with one verb,
`call(method, request, timeout) -> reply` (and its two halves, `ask` and `answer`, for
a caller with something to do while the master works): `FastControl` over the fast channel
(kvstore.rpc, the default when the leader's etcd record announces one) or
`GrpcControl` over gRPC (the public contract; also what a fixed `master=` address gets).
Both raise `Retry` for failures worth another attempt (the master unreachable, slow or
failing over) and a typed KVStoreError for anything else, so the clients' retry and
leader-following loop is one piece of code for either transport.

A fast address that refuses or drops FAST_GIVE_UP connection attempts in a row (a
firewall that only lets the gRPC port through, say) is given up for that leader: the
client carries on over gRPC, says so once in the log, and tries the fast channel again
when a new leader is announced.

Security: the control objects take the client's `Credentials`. TLS is used when the
leader's record says it serves TLS, or when the client was given a CA (so an etcd
entry cannot talk a client that expects TLS into plaintext); the token goes in every
gRPC call's metadata, and in one `Authenticate` per fast connection. A master that
speaks the other layer (plaintext to our TLS, TLS to our plaintext) is not retried: the
call fails at once with TlsMismatch, whose sentence says where the client's CA came from
(`Credentials.mismatch`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from typing import Any, Literal

import grpc
import grpc.aio

from kvstore.addresses import split_address
from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, InvalidArgument, Unavailable, error_for
from kvstore.rpc.aio_client import AsyncFastChannel
from kvstore.rpc.client import PROBE_TIMEOUT, FastChannel, WrongLayer
from kvstore.security.credentials import Credentials
from kvstore.security.tls import speaks_tls, speaks_tls_async
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
RETRIABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
FAST_GIVE_UP = 3  # failed connection attempts in a row before a fast address is given up

log = logging.getLogger(__name__)
TRANSPORTS = ("fast", "grpc")
Transport = Literal["fast", "grpc"]


def check_transport(transport: str) -> Transport:
    if transport not in TRANSPORTS:
        raise InvalidArgument(f"transport must be 'fast' or 'grpc', got {transport!r}")
    return transport  # type: ignore[return-value]


def backoff(attempt: int, remaining: float) -> float:
    """Bounded exponential backoff between retries of one control call."""
    return max(0.0, min(0.05 * 2**attempt, 1.0, remaining))


def from_stale_leader(reply: Any, epoch: int) -> bool:
    """A reply from a deposed leader (or a standby) is never used: look the leader up again."""
    return bool(reply.error.code == Code.NOT_LEADER or reply.epoch < epoch)


def timed_out(method: str, timeout: float, last: str) -> Unavailable:
    return Unavailable(f"{method} could not complete within {timeout:.1f} s ({last}); the "
                       "master may be failing over or down")


def discover_record(etcd: str, layout: Layout, fixed: str | None, timeout: float) -> MasterRecord:
    """The leader's record (a gRPC-only one for the fixed address the user gave)."""
    if fixed:
        return MasterRecord(master_id="", address=fixed, pid=0)
    raw = read_key_sync(etcd, layout.leader, timeout=min(timeout, 3.0))
    if raw is None:
        raise Unavailable(
            f"no kvstore master is registered in etcd at {etcd}; start one with "
            f"`kvstore master --etcd {etcd}` (or `kvstore up` for a dev cluster)"
        )
    return MasterRecord.decode(raw)


def discover(etcd: str, layout: Layout, fixed: str | None, timeout: float) -> str:
    """The leader's gRPC address (or the fixed one the user gave)."""
    return discover_record(etcd, layout, fixed, timeout).address


def check_reply(reply: Any) -> Any:
    """Raise the typed error a reply carries."""
    if reply.error.code:
        raise error_for(reply.error.code, reply.error.message)
    return reply


def unanswered(method: str, address: str, code: str) -> Unavailable:
    return Unavailable(f"the kvstore master at {address} did not answer {method} ({code}); "
                       "is it running?")


class Retry(Exception):
    """A control call failed in a way that another attempt (maybe at a new leader) may fix."""


def uses_tls(record: MasterRecord, creds: Credentials) -> bool:
    return creds.wants_tls(record.tls)


def tls_refused(address: str, exc: ssl.SSLError) -> Unavailable:
    return Unavailable(
        f"cannot verify the master's TLS certificate at {address} ({exc.reason or exc}); "
        "give the client the CA that signed it (tls_ca= or KVSTORE_TLS_CA), or the name in "
        "the certificate (tls_server_name=)")


def _fast_args(address: str, tls: bool, creds: Credentials,
               announced: bool | None) -> dict[str, Any]:
    return {"tls": creds.tls.ssl_context() if tls else None,
            "server_hostname": creds.tls.hostname(split_address(address)[0]),
            "token": creds.token,
            # TLS only because of a CA the client holds: the master may well be plaintext.
            "plaintext_check": tls and announced is False}


# BoringSSL's and OpenSSL's word for a handshake answered by something that is not TLS.
NOT_TLS = "WRONG_VERSION_NUMBER"


def grpc_wrong_layer(exc: Any, address: str, tls: bool) -> bool | None:
    """From a failed gRPC call: whether the server speaks the other layer. None: it does
    not, or it cannot be told. The plaintext case asks with a ClientHello (speaks_tls)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    if tls:
        return False if NOT_TLS in (exc.details() or "") else None
    return True if speaks_tls(address, PROBE_TIMEOUT) else None


REPLY_SPIN_US = 300  # the default; KVSTORE_REPLY_SPIN_US overrides it (0: never poll)


def reply_spin() -> float:
    """Seconds the sync client polls for a master's reply before sleeping in recv (see
    kvstore.rpc.client). Polling won on the benchmark's small host (figures:
    docs/client-internals.md); a host short of cores for the caller and a master on it
    may want less."""
    raw = os.environ.get("KVSTORE_REPLY_SPIN_US", "")
    if not raw:
        return REPLY_SPIN_US / 1e6
    try:
        us = float(raw)
    except ValueError:
        us = -1.0
    if not 0 <= us <= 1e6:  # also refuses NaN
        raise InvalidArgument(f"KVSTORE_REPLY_SPIN_US must be microseconds from 0 to "
                              f"1000000, got {raw!r}")
    return us / 1e6


def _why(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return exc.strerror or str(exc) or type(exc).__name__


def target(record: MasterRecord, transport: Transport, given_up: str = "") -> tuple[str, str]:
    """(transport, address) a client should use for this leader record."""
    if transport == "fast" and record.fast and record.fast != given_up:
        return "fast", record.fast
    return "grpc", record.address


def unreachable_fast(control: Any, given_up: str) -> str:
    """The fast address to give up now (see the module doc), else `given_up` unchanged."""
    if isinstance(control, FastControl | AsyncFastControl) and \
            control.channel.connect_failures >= FAST_GIVE_UP and control.address != given_up:
        log.warning("cannot connect to the master's fast channel at %s (%d attempts): that "
                    "master is gone (stopped, or failing over: a new leader is announced within "
                    "the etcd lease TTL) or, if it still runs, the port is closed to clients; "
                    "using gRPC until a new leader is announced",
                    control.address, control.channel.connect_failures)
        return control.address
    return given_up


# -- blocking ---------------------------------------------------------------------------


class GrpcControl:
    transport = "grpc"

    def __init__(self, address: str, tls: bool = False, creds: Credentials | None = None) -> None:
        creds = creds or Credentials()
        self.address = address
        self._creds, self._tls = creds, tls
        self._probed = False  # asked once whether a TLS server is there (see _failure)
        self._channel: grpc.Channel = creds.grpc_channel(address, tls, GRPC_OPTIONS)
        self._md = creds.metadata()
        self._stub = pbg.MasterStub(self._channel)
        # grpc cancels a call whose future is garbage-collected: hold each until done.
        self._releasing: set[Any] = set()

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> Any:
        # `spin` is the fast channel's (see FastControl); grpc waits on its own threads.
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self._md)
        except grpc.RpcError as exc:
            raise self._failure(method, exc) from exc

    def _failure(self, method: str, exc: grpc.RpcError) -> Exception:
        """Retry for what another attempt may fix, else the typed error."""
        code = exc.code().name
        if code not in RETRIABLE:
            return unanswered(method, self.address, code)
        if self._tls or not self._probed:
            self._probed = not self._tls
            peer_tls = grpc_wrong_layer(exc, self.address, self._tls)
            if peer_tls is not None:
                return self._creds.mismatch(self.address, peer_tls)
        return Retry(f"{self.address}: {code}")

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        """Start a call and return at once (grpc runs it on a thread of its own); the
        value goes to `answer`."""
        try:
            return getattr(self._stub, method).future(request, timeout=timeout,
                                                      metadata=self._md)
        except grpc.RpcError as exc:
            raise Retry(f"{self.address}: {exc}") from exc

    def answer(self, asked: Any, method: str, spin: bool = True) -> Any:
        try:
            return asked.result()
        except grpc.RpcError as exc:
            raise self._failure(method, exc) from exc

    @staticmethod
    def ready(asked: Any) -> bool:
        """Whether `answer` would return (or raise) without waiting."""
        return bool(asked.done())

    def release(self, lease_id: int, timeout: float) -> None:
        """Release without waiting; grpc runs the call on a thread of its own."""
        with contextlib.suppress(grpc.RpcError):
            future = self._stub.ReleaseLease.future(pb.ReleaseLeaseRequest(lease_id=lease_id),
                                                    timeout=timeout, metadata=self._md)
            self._releasing.add(future)
            future.add_done_callback(self._releasing.discard)

    def close(self) -> None:
        self._channel.close()


class FastControl:
    transport = "fast"

    def __init__(self, address: str, tls: bool = False, creds: Credentials | None = None,
                 announced: bool | None = None) -> None:
        self.address = address
        self._creds = creds or Credentials()
        self.channel = FastChannel(address, spin=reply_spin(),
                                   **_fast_args(address, tls, self._creds, announced))

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> Any:
        return self.answer(self.ask(method, request, timeout), method, spin)

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        """Send the request and return at once; the value goes to `answer`."""
        try:
            return self.channel.ask(method, request, timeout)
        except ssl.SSLCertVerificationError as exc:
            raise tls_refused(self.address, exc) from exc
        except WrongLayer as exc:
            raise self._creds.mismatch(self.address, exc.peer_tls) from exc
        except OSError as exc:
            raise Retry(f"{self.address}: {_why(exc)}") from exc

    def answer(self, asked: Any, method: str, spin: bool = True) -> Any:
        """The reply; with `spin` False (engine transfers are moving), never polled for."""
        try:
            return self.channel.answer(asked, spin)
        except WrongLayer as exc:
            raise self._creds.mismatch(self.address, exc.peer_tls) from exc
        except OSError as exc:
            raise Retry(f"{self.address}: {_why(exc)}") from exc

    def ready(self, asked: Any) -> bool:
        """Whether the reply has begun to arrive (`answer` then waits little if at all)."""
        return self.channel.ready(asked)

    def release(self, lease_id: int, timeout: float) -> None:
        """A one-way frame: sent now, never answered (a lost one expires by its TTL)."""
        self.channel.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease_id),
                                 timeout)

    def close(self) -> None:
        self.channel.close()


Control = GrpcControl | FastControl


def open_control(record: MasterRecord, transport: Transport, given_up: str = "",
                 creds: Credentials | None = None) -> Control:
    creds = creds or Credentials()
    kind, address = target(record, transport, given_up)
    tls = uses_tls(record, creds)
    return (FastControl(address, tls, creds, announced=record.tls) if kind == "fast"
            else GrpcControl(address, tls, creds))


# -- asyncio ----------------------------------------------------------------------------


class AsyncGrpcControl:
    transport = "grpc"

    def __init__(self, address: str, tls: bool = False, creds: Credentials | None = None) -> None:
        creds = creds or Credentials()
        self.address = address
        self._creds, self._tls = creds, tls
        self._probed = False  # as GrpcControl's
        self._channel: grpc.aio.Channel = creds.grpc_channel(address, tls, GRPC_OPTIONS, aio=True)
        self._md = creds.metadata()
        self._stub = pbg.MasterStub(self._channel)

    async def call(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=timeout, metadata=self._md)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            if code not in RETRIABLE:
                raise unanswered(method, self.address, code) from exc
            if self._tls or not self._probed:
                self._probed = not self._tls
                peer_tls = await self._wrong_layer(exc)
                if peer_tls is not None:
                    raise self._creds.mismatch(self.address, peer_tls) from exc
            raise Retry(f"{self.address}: {code}") from exc

    async def _wrong_layer(self, exc: grpc.aio.AioRpcError) -> bool | None:
        """grpc_wrong_layer without blocking the loop."""
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        if self._tls:
            return False if NOT_TLS in (exc.details() or "") else None
        return True if await speaks_tls_async(self.address, PROBE_TIMEOUT) else None

    def release_oneway(self, lease_id: int) -> bool:
        return False  # gRPC has no one-way call: the client sends a normal one

    async def close(self) -> None:
        await self._channel.close()


class AsyncFastControl:
    transport = "fast"

    def __init__(self, address: str, tls: bool = False, creds: Credentials | None = None,
                 announced: bool | None = None) -> None:
        self.address = address
        self._creds = creds or Credentials()
        self.channel = AsyncFastChannel(address, **_fast_args(address, tls, self._creds,
                                                              announced))

    async def call(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return await self.channel.call(method, request, timeout)
        except ssl.SSLCertVerificationError as exc:
            raise tls_refused(self.address, exc) from exc
        except WrongLayer as exc:
            raise self._creds.mismatch(self.address, exc.peer_tls) from exc
        except OSError as exc:
            raise Retry(f"{self.address}: {_why(exc)}") from exc

    def release_oneway(self, lease_id: int) -> bool:
        """Queue a one-way release on the open connection; False when there is none."""
        return self.channel.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease_id))

    async def close(self) -> None:
        await self.channel.close()


AsyncControl = AsyncGrpcControl | AsyncFastControl


def open_async_control(record: MasterRecord, transport: Transport, given_up: str = "",
                       creds: Credentials | None = None) -> AsyncControl:
    creds = creds or Credentials()
    kind, address = target(record, transport, given_up)
    tls = uses_tls(record, creds)
    return (AsyncFastControl(address, tls, creds, announced=record.tls) if kind == "fast"
            else AsyncGrpcControl(address, tls, creds))
