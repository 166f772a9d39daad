"""Finding the leader and calling it: what the sync and async clients share.

A client talks to the leader through one *control* object with one verb,
`call(method, request, timeout) -> reply` (and its two halves, `ask` and `answer`, for
a caller with something to do while the master works): `FastControl` over the fast channel
(kvstore.rpc, the default when the leader's etcd record announces one) or
`GrpcControl` over gRPC (the public contract; also what a master too old to answer
WhoLeads gets when named with `master=`).
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

import asyncio
import contextlib
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import grpc
import grpc.aio

from kvstore.addresses import split_address
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, InvalidArgument, NotLeader, Unavailable, error_for
from kvstore.rpc.aio_client import AsyncFastChannel
from kvstore.rpc.client import PROBE_TIMEOUT, FastChannel, WrongLayer
from kvstore.security.credentials import Credentials
from kvstore.security.tls import speaks_tls
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore_client.discovery import find_leader, find_shards

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


def discover_record(etcd: str, layout: Layout, fixed: str | None, timeout: float,
                    creds: Credentials | None = None, shard: int = 0) -> MasterRecord:
    """The leader's record of shard `shard` (see kvstore_client.discovery)."""
    return find_leader(etcd, layout, fixed, timeout, creds, shard)


def discover_shards(etcd: str, layout: Layout, fixed: str | None, timeout: float,
                    creds: Credentials | None = None) -> int:
    """The cluster's shard count (see kvstore_client.discovery)."""
    return find_shards(etcd, layout, fixed, timeout, creds)


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
    if isinstance(control, FastControl) and \
            control.channel.connect_failures >= FAST_GIVE_UP and control.address != given_up:
        log.warning("cannot connect to the master's fast channel at %s (%d attempts): that "
                    "master is gone (stopped, or failing over: a new leader is announced within "
                    "the etcd lease TTL) or, if it still runs, the port is closed to clients; "
                    "using gRPC until a new leader is announced",
                    control.address, control.channel.connect_failures)
        return control.address
    return given_up


# -- the channels -----------------------------------------------------------------------
# One interface, two kinds: a blocking control returns each reply (R is the reply), an
# asyncio one an awaitable of it. `ask` and `release` never block in either: a blocking
# fast channel may connect in `ask` (the caller blocks anyway), an asyncio one sends on
# an open connection only (else Retry: the caller then makes the whole call).

R_co = TypeVar("R_co", covariant=True)


class Control(Protocol[R_co]):
    """What the client's shared layer (session.py) needs of a control channel."""

    transport: str
    address: str

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> R_co:
        """The reply (Retry: worth another attempt; else a typed KVStoreError). `spin`
        False: engine transfers are moving, wait asleep (the blocking fast channel's)."""

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        """Send and go on; the value goes to `answer` (Retry if it could not be sent)."""

    def answer(self, asked: Any, method: str, spin: bool = True) -> R_co:
        """The reply to what `ask` sent, with `call`'s errors."""

    def release(self, lease_id: int, timeout: float, keep_first: int = 0) -> None:
        """Release a lease without waiting (a lost release expires by its TTL); with
        `keep_first`, all but its first `keep_first` keys."""

    def close(self) -> R_co:
        """Close the channel (an awaitable of None for an asyncio one)."""


@dataclass(slots=True)
class Probe:
    """A gRPC failure that a TLS probe may turn into TlsMismatch (else it is `retry`)."""

    retry: Retry


class GrpcControl:
    """Control over gRPC, blocking or (`aio`) grpc.aio: the stub's calls are the same."""

    transport = "grpc"
    _aio = False

    def __init__(self, address: str, tls: bool = False, creds: Credentials | None = None) -> None:
        creds = creds or Credentials()
        self.address = address
        self._creds, self._tls = creds, tls
        self._probed = False  # asked once whether a TLS server is there (see _failure)
        self._channel: Any = creds.grpc_channel(address, tls, GRPC_OPTIONS, aio=self._aio)
        self._md = creds.metadata()
        self._stub = pbg.MasterStub(self._channel)
        # grpc cancels a call whose future is garbage-collected: hold each until done.
        self._releasing: set[Any] = set()

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> Any:
        # `spin` is the fast channel's; grpc waits on its own threads.
        return self.answer(self.ask(method, request, timeout), method)

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        """Start a call and return at once (grpc runs it on a thread of its own, or as a
        task of the loop); the value goes to `answer`."""
        stub = getattr(self._stub, method)
        if self._aio:
            return _held(self._answered(stub(request, timeout=timeout, metadata=self._md),
                                        method))
        try:
            return stub.future(request, timeout=timeout, metadata=self._md)
        except grpc.RpcError as exc:
            raise Retry(f"{self.address}: {exc}") from exc

    def answer(self, asked: Any, method: str, spin: bool = True) -> Any:
        if self._aio:
            return asked
        try:
            return asked.result()
        except grpc.RpcError as exc:
            failure = self._failure(method, exc)
            raise (self._probed_failure(failure) if isinstance(failure, Probe)
                   else failure) from exc

    async def _answered(self, call: Any, method: str) -> Any:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            failure = self._failure(method, exc)
            if isinstance(failure, Probe):
                # The probe blocks: it runs in a worker thread, not on the loop.
                failure = await asyncio.to_thread(self._probed_failure, failure)
            raise failure from exc

    def _failure(self, method: str, exc: Any) -> Exception | Probe:
        """Retry for what another attempt may fix, the typed error, or a Probe: a
        plaintext channel's UNAVAILABLE, which a ClientHello tells apart (speaks_tls)."""
        code = exc.code().name
        if code not in RETRIABLE:
            return unanswered(method, self.address, code)
        retry = Retry(f"{self.address}: {code}")
        if (self._tls or not self._probed) and exc.code() == grpc.StatusCode.UNAVAILABLE:
            self._probed = not self._tls
            if not self._tls:
                return Probe(retry)
            if NOT_TLS in (exc.details() or ""):
                return self._creds.mismatch(self.address, False)
        return retry

    def _probed_failure(self, probe: Probe) -> Exception:
        if speaks_tls(self.address, PROBE_TIMEOUT):
            return self._creds.mismatch(self.address, True)
        return probe.retry

    @staticmethod
    def ready(asked: Any) -> bool:
        """Whether `answer` would return (or raise) without waiting."""
        return bool(asked.done())

    def release(self, lease_id: int, timeout: float, keep_first: int = 0) -> None:
        """Release without waiting; grpc runs the call on its own."""
        with contextlib.suppress(grpc.RpcError):
            req = _release_request(lease_id, keep_first)
            call = self._stub.ReleaseLease if self._aio else self._stub.ReleaseLease.future
            future = call(req, timeout=timeout, metadata=self._md)
            self._releasing.add(future)
            future.add_done_callback(self._releasing.discard)

    def close(self) -> Any:
        return self._channel.close()


class FastControl:
    """Control over the fast channel: kvstore.rpc's blocking FastChannel, or (`aio`) its
    AsyncFastChannel, whose calls share one connection."""

    transport = "fast"
    _aio = False

    def __init__(self, address: str, tls: bool = False, creds: Credentials | None = None,
                 announced: bool | None = None) -> None:
        self.address = address
        self._creds = creds or Credentials()
        args = _fast_args(address, tls, self._creds, announced)
        self.channel: Any = AsyncFastChannel(address, **args) if self._aio else \
            FastChannel(address, spin=reply_spin(), **args)
        self._releasing: set[Any] = set()

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> Any:
        if self._aio:
            return self._called(method, request, timeout)
        return self.answer(self.ask(method, request, timeout), method, spin)

    async def _called(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return await self.channel.call(method, request, timeout)
        except OSError as exc:
            raise self._failure(exc) from exc

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        """Send the request and return at once; the value goes to `answer`."""
        try:
            if self._aio:
                return _held(self._answered(self.channel.ask(method, request, timeout)))
            return self.channel.ask(method, request, timeout)
        except NotLeader as exc:  # the connection's Authenticate met a standby
            raise Retry(f"{self.address}: {exc.message}") from exc
        except OSError as exc:
            raise self._failure(exc) from exc

    def answer(self, asked: Any, method: str, spin: bool = True) -> Any:
        """The reply; with `spin` False (engine transfers are moving), never polled for."""
        if self._aio:
            return asked
        try:
            return self.channel.answer(asked, spin)
        except NotLeader as exc:  # a resend's new connection met a standby
            raise Retry(f"{self.address}: {exc.message}") from exc
        except OSError as exc:
            raise self._failure(exc) from exc

    async def _answered(self, asked: Any) -> Any:
        try:
            return await self.channel.answer(asked)
        except NotLeader as exc:  # the connection's Authenticate met a standby
            raise Retry(f"{self.address}: {exc.message}") from exc
        except OSError as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: OSError) -> Exception:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return tls_refused(self.address, exc)
        if isinstance(exc, WrongLayer):
            return self._creds.mismatch(self.address, exc.peer_tls)
        return Retry(f"{self.address}: {_why(exc)}")

    def ready(self, asked: Any) -> bool:
        """Whether the reply has begun to arrive (`answer` then waits little if at all)."""
        return bool(self.channel.ready(asked))

    def release(self, lease_id: int, timeout: float, keep_first: int = 0) -> None:
        """A one-way frame: sent now, never answered (a lost one expires by its TTL). An
        asyncio channel not connected yet sends a whole call, as a task of its own."""
        req = _release_request(lease_id, keep_first)
        if self.channel.send_oneway("ReleaseLease", req, timeout) or not self._aio:
            return
        task = asyncio.ensure_future(self._called("ReleaseLease", req, timeout))
        self._releasing.add(task)
        task.add_done_callback(_quietly(self._releasing))

    def close(self) -> Any:
        return self.channel.close()


def _release_request(lease_id: int, keep_first: int) -> pb.ReleaseLeaseRequest:
    req = pb.ReleaseLeaseRequest(lease_id=lease_id)
    if keep_first:  # set at all, even 0, it would trim rather than release
        req.keep_first_n = keep_first
    return req


def _quietly(held: set[Any]) -> Any:
    def done(task: Any) -> None:
        held.discard(task)
        _retrieved(task)
    return done


def _retrieved(task: Any) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: nobody may wait for it (no "never retrieved" warning)


def _held(answer: Any) -> Any:
    """An asyncio ask's reply, as a task that runs now: `answer` returns it for the
    driver to await, and one never awaited (its flow ended first) warns of nothing."""
    task = asyncio.ensure_future(answer)
    task.add_done_callback(_retrieved)
    return task


class AsyncGrpcControl(GrpcControl):
    """GrpcControl over grpc.aio: `call`, `answer` and `close` return awaitables."""

    _aio = True


class AsyncFastControl(FastControl):
    """FastControl over AsyncFastChannel, whose calls share one connection: `call`,
    `answer` and `close` return awaitables."""

    _aio = True


def open_control(record: MasterRecord, transport: Transport, given_up: str = "",
                 creds: Credentials | None = None, aio: bool = False) -> Control[Any]:
    """The control channel for this leader record: blocking, or asyncio with `aio`."""
    creds = creds or Credentials()
    kind, address = target(record, transport, given_up)
    tls = uses_tls(record, creds)
    if kind == "fast":
        return (AsyncFastControl if aio else FastControl)(address, tls, creds,
                                                          announced=record.tls)
    return (AsyncGrpcControl if aio else GrpcControl)(address, tls, creds)
