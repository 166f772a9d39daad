"""The one place that talks to etcd.

Everything else in kvstore uses this small facade, so the etcd client library
(etcd3aio today) can be replaced by touching one file. It offers only what the
cluster needs: plain keys, prefix reads, leases with a keepalive task, a create-if-absent
transaction (the basis of leader election) and a prefix watch.

TLS to etcd is set per process by the environment, so that every daemon, client and
admin command of a deployment picks it up the same way: KVSTORE_ETCD_CA (the CA of etcd's
certificate; setting it turns TLS on), and for etcd's --client-cert-auth also
KVSTORE_ETCD_CERT and KVSTORE_ETCD_KEY. Where etcd's auth is on (`kvstore etcd-setup`),
KVSTORE_ETCD_USER names the etcd user and KVSTORE_ETCD_PASSWORD_FILE a file holding its
password (or KVSTORE_ETCD_PASSWORD the password itself); with client certificates etcd
takes the user from the certificate's CN and neither is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from etcd3aio import Etcd3Client
from etcd3aio.errors import (
    EtcdConnectionError,
    EtcdError,
    EtcdPermissionDeniedError,
    EtcdTransientError,
    EtcdUnauthenticatedError,
)
from etcd3aio.kv import KVService, prefix_range_end

from kvstore.errors import (
    InvalidArgument,
    KVStoreError,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger(__name__)

R = TypeVar("R")

# What an unreachable or restarting etcd raises through this facade: the daemons retry
# each of these (etcd3aio's own errors wrap grpc's once its retries are used up).
ETCD_ERRORS: tuple[type[BaseException], ...] = (
    EtcdError, KVStoreError, OSError, TimeoutError, grpc.aio.AioRpcError)

RETRY_LOG = 5.0  # s between log lines while etcd cannot be reached

# gRPC reconnects a failed channel with exponential backoff up to 120 s by default: after
# an etcd outage of ten seconds, the channel would wait seconds more before trying again,
# longer than a lease's TTL, and leases that etcd restored would expire unrefreshed.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); raises InvalidArgument with a usable sentence."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"etcd address {endpoint!r} is not HOST:PORT, e.g. 127.0.0.1:2379")
    return host, int(port)


def etcd_tls() -> dict[str, bytes]:
    """etcd3aio's TLS arguments from the environment (see the module doc); {} for none."""
    paths = {"ca_cert": os.environ.get("KVSTORE_ETCD_CA", ""),
             "cert_chain": os.environ.get("KVSTORE_ETCD_CERT", ""),
             "cert_key": os.environ.get("KVSTORE_ETCD_KEY", "")}
    if not paths["ca_cert"]:
        if paths["cert_chain"] or paths["cert_key"]:
            raise InvalidArgument("KVSTORE_ETCD_CERT/KVSTORE_ETCD_KEY need KVSTORE_ETCD_CA "
                                  "(the CA of etcd's certificate)")
        return {}
    out = {}
    for name, path in paths.items():
        if path:
            try:
                with open(path, "rb") as f:
                    out[name] = f.read()
            except OSError as exc:
                raise InvalidArgument(f"cannot read {path} for etcd TLS: {exc.strerror}") from exc
    return out


# s between re-authentications: etcd's simple tokens lapse after --auth-token-ttl (300 s
# by default), so a daemon renews well inside it; a token etcd forgot (it restarted) is
# renewed by the first call it fails (Etcd._authed).
TOKEN_REFRESH = 60.0


def etcd_user() -> tuple[str, str] | None:
    """(user, password) for etcd's auth from the environment (see the module doc); None
    when no user is named."""
    user = os.environ.get("KVSTORE_ETCD_USER", "")
    if not user:
        return None
    path = os.environ.get("KVSTORE_ETCD_PASSWORD_FILE", "")
    if path:
        try:
            with open(path) as f:
                return user, f.read().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read KVSTORE_ETCD_PASSWORD_FILE {path}: "
                                  f"{exc.strerror}") from exc
    password = os.environ.get("KVSTORE_ETCD_PASSWORD", "")
    if not password:
        raise InvalidArgument(f"KVSTORE_ETCD_USER={user} needs KVSTORE_ETCD_PASSWORD_FILE (a "
                              "file with its password; `kvstore etcd-setup` writes them)")
    return user, password


def denied(endpoint: str, what: str) -> PermissionDenied:
    who = os.environ.get("KVSTORE_ETCD_USER", "") or "this process's etcd user"
    return PermissionDenied(
        f"etcd at {endpoint} refused to let {who} {what} (etcd auth is on and its role "
        "does not allow it); live settings change through the leader "
        "(`kvstore config set` with an admin token), records only by the daemons")


def _auth_off(exc: BaseException) -> bool:
    """Whether etcd refused a login because its auth is off (a user named anyway)."""
    details = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
    return "authentication is not enabled" in (details or "")


def auth_required(exc: grpc.RpcError) -> bool:
    """Whether etcd refused a call for want of a user (its auth is on, none was given)."""
    return exc.code() == grpc.StatusCode.INVALID_ARGUMENT and \
        "user name is empty" in (exc.details() or "")


def _refused(endpoint: str, exc: grpc.RpcError, what: str) -> KVStoreError:
    if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
        return denied(endpoint, what)
    if auth_required(exc):
        return Unauthenticated(
            f"etcd at {endpoint} has its auth on and this process names no etcd user; set "
            "KVSTORE_ETCD_USER and KVSTORE_ETCD_PASSWORD_FILE (`kvstore etcd-setup` prints "
            "them), or give a client master addresses instead of etcd")
    verb = "write to" if what.startswith("write") else "reach"
    return Unavailable(f"cannot {verb} etcd at {endpoint} ({exc.code().name}); "
                       "start etcd or pass the right --etcd HOST:PORT")


def _sync_channel(endpoint: str) -> grpc.Channel:
    tls = etcd_tls()
    if not tls:
        return grpc.insecure_channel(endpoint)
    creds = grpc.ssl_channel_credentials(tls["ca_cert"], tls.get("cert_key"), tls.get("cert_chain"))
    return grpc.secure_channel(endpoint, creds)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: str  # "put" | "delete"
    key: bytes
    value: bytes
    mod_revision: int


class Etcd:
    """Async etcd facade. Call `connect()` (or use `async with`) before anything else."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0) -> None:
        parse_endpoint(endpoint)
        self.endpoint = endpoint
        self.timeout = timeout
        tls = etcd_tls()
        self._client = Etcd3Client([endpoint], rpc_max_attempts=2, ca_cert=tls.get("ca_cert"),
                                   cert_key=tls.get("cert_key"), cert_chain=tls.get("cert_chain"))
        # etcd3aio builds its channel from these when connect() runs; it has no argument
        # for them.
        manager = getattr(self._client, "_manager", None)
        if manager is not None and isinstance(getattr(manager, "grpc_options", None), list):
            manager.grpc_options.extend(RECONNECT_OPTIONS)
        self._connected = False
        self._user = etcd_user()
        self._refresher: asyncio.Task[None] | None = None
        self._warned_auth_off = False

    async def __aenter__(self) -> Etcd:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        await self._client.connect()
        self._connected = True
        try:
            if self._user is not None:
                await self._authenticate()
            await self._kv.get(b"/kvstore/", timeout=self.timeout, max_attempts=1)
        except EtcdPermissionDeniedError:
            pass  # etcd answered: this user's role just may not read that key
        except KVStoreError:
            await self.close()
            raise
        except Exception as exc:  # timeouts, DNS failures
            await self.close()
            raise self._unreachable(exc) from exc
        if self._user is not None:
            self._refresher = asyncio.create_task(self._refresh_token(), name="etcd-token")

    def _unreachable(self, exc: BaseException) -> Unavailable:
        return Unavailable(f"cannot reach etcd at {self.endpoint} ({_reason(exc)}); "
                           "start etcd or pass the right --etcd HOST:PORT")

    async def connect_until(self, stop: asyncio.Event, who: str) -> bool:
        """Connect, however long etcd is away (a daemon never exits for that); False if
        `stop` was set first. A line in the log every RETRY_LOG seconds. A bad argument
        (InvalidArgument) is not an outage: it is raised."""
        loop = asyncio.get_running_loop()
        last_log = -RETRY_LOG
        while not stop.is_set():
            try:
                await self.connect()
                return True
            except InvalidArgument:
                raise
            except ETCD_ERRORS as exc:
                if loop.time() - last_log >= RETRY_LOG:
                    log.warning("%s: %s; retrying until it answers", who,
                                exc.message if isinstance(exc, KVStoreError) else exc)
                    last_log = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        return False

    async def _authenticate(self) -> None:
        assert self._user is not None and self._client.auth is not None
        # Log in without the old token: etcd refuses a call (Authenticate too) that
        # carries one it does not know.
        self._client.auth.set_token(None)
        try:
            resp = await self._client.auth.authenticate(*self._user, timeout=self.timeout)
        except (EtcdConnectionError, EtcdTransientError, TimeoutError):
            raise
        except (EtcdError, grpc.aio.AioRpcError) as exc:
            if _auth_off(exc):
                if not self._warned_auth_off:
                    self._warned_auth_off = True
                    log.warning("etcd at %s has its auth off: not logging in as %s (run "
                                "`kvstore etcd-setup` to turn it on)", self.endpoint,
                                self._user[0])
                return
            raise Unavailable(f"etcd at {self.endpoint} refused user {self._user[0]!r} "
                              f"({exc}); check KVSTORE_ETCD_USER and its password "
                              "file") from exc
        self._client.set_token(resp.token)

    async def _authed(self, call: Callable[[], Awaitable[R]]) -> R:
        """`call()`; where etcd says our token is not valid (it restarted and forgot every
        token, or the token lapsed), log in again and make it once more."""
        try:
            return await call()
        except EtcdUnauthenticatedError:
            if self._user is None:
                raise
            await self._authenticate()
            return await call()

    async def _refresh_token(self) -> None:
        """Renew the token every TOKEN_REFRESH s; a failed try is retried each second
        (etcd restarted and forgot every token: the daemon must not wait long)."""
        pause = TOKEN_REFRESH
        while True:
            await asyncio.sleep(pause)
            try:
                await self._authenticate()
                pause = TOKEN_REFRESH
            except ETCD_ERRORS as exc:
                log.warning("etcd: cannot renew the auth token (%s); retrying", _reason(exc))
                pause = 1.0

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        if self._connected:
            self._connected = False
            with contextlib.suppress(Exception):
                await self._client.close()

    @property
    def _kv(self) -> KVService:
        kv = self._client.kv
        if kv is None:
            raise Unavailable("etcd client is closed")
        return kv

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        resp = await self._authed(lambda: self._kv.put(key, value, lease=lease,
                                                      timeout=self.timeout))
        return int(resp.header.revision)

    async def get(self, key: bytes) -> bytes | None:
        resp = await self._authed(lambda: self._kv.get(key, timeout=self.timeout))
        return bytes(resp.kvs[0].value) if resp.kvs else None

    async def get_with_revision(self, key: bytes) -> tuple[bytes, int] | None:
        """Value and create_revision of `key` (the election uses the latter as epoch)."""
        resp = await self._authed(lambda: self._kv.get(key, timeout=self.timeout))
        if not resp.kvs:
            return None
        return bytes(resp.kvs[0].value), int(resp.kvs[0].create_revision)

    async def get_prefix(self, prefix: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
        """All (key, value) under `prefix`, and the store revision they were read at."""
        resp = await self._authed(lambda: self._kv.get(prefix, prefix_range_end(prefix),
                                                      timeout=self.timeout))
        return [(bytes(kv.key), bytes(kv.value)) for kv in resp.kvs], int(resp.header.revision)

    async def delete(self, key: bytes) -> None:
        await self._authed(lambda: self._kv.delete(key, timeout=self.timeout))

    async def write(self, puts: dict[bytes, bytes], deletes: Sequence[bytes] = ()) -> int:
        """Put and delete keys in one transaction (all or nothing); its revision."""
        kv = self._kv
        ops = [KVService.txn_op_put(k, v) for k, v in puts.items()]
        ops += [KVService.txn_op_delete(k) for k in deletes]
        resp = await self._authed(lambda: kv.txn([], ops, [], timeout=self.timeout))
        return int(resp.header.revision)

    async def create_if_absent(self, key: bytes, value: bytes, lease: int) -> int | None:
        """Put `key` only if it does not exist. Returns its create revision, or None."""
        kv = self._kv
        resp = await self._authed(lambda: kv.txn(
            [KVService.txn_compare_create_revision(key, 0)],
            [KVService.txn_op_put(key, value, lease=lease)],
            [],
            timeout=self.timeout,
        ))
        if not resp.succeeded:
            return None
        return int(resp.header.revision)

    async def grant(self, ttl: int) -> int:
        lease = self._client.lease
        if lease is None:
            raise Unavailable("etcd client is closed")
        resp = await self._authed(lambda: lease.grant(ttl, timeout=self.timeout))
        return int(resp.ID)

    async def revoke(self, lease_id: int) -> None:
        lease = self._client.lease
        if lease is not None:
            with contextlib.suppress(Exception):
                await lease.revoke(lease_id, timeout=self.timeout)

    async def refresh(self, lease_id: int, timeout: float | None = None) -> int:
        """One keepalive round trip; returns the TTL etcd reports (<= 0: the lease is gone)."""
        lease = self._client.lease
        if lease is None:
            raise Unavailable("etcd client is closed")
        call = lease.keep_alive(lease_id)
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                async for resp in call:
                    return int(resp.TTL)
        finally:
            call.cancel()
        return 0

    async def keep_alive(self, lease_id: int, ttl: int, on_lost: Callable[[], None],
                         on_refresh: Callable[[float], None] | None = None,
                         confirm_loss: bool = False) -> None:
        """Refresh `lease_id` every ttl/3 s until cancelled; call `on_lost` once if it dies.

        Runs as its own task so that it never waits behind bulk work on the same loop
        for longer than one scheduling slice. A refresh that fails transiently is retried
        until the lease's own deadline has passed: only then is the lease really gone.
        `on_refresh(deadline)` gets a conservative local deadline (loop time) after each
        refresh: counted from when the refresh was sent, so it ends before etcd's does.

        With `confirm_loss`, an unreachable etcd never ends the lease: refreshes go on
        until etcd answers, and `on_lost` runs only when it says the lease is gone. etcd
        restores leases when it restarts, so a store node that outlived an etcd outage
        still holds what the master (and its next leader) thinks it holds.
        """
        loop = asyncio.get_running_loop()
        interval = max(ttl / 3.0, 0.2)
        deadline = loop.time() + ttl
        while True:
            await asyncio.sleep(interval)
            sent = loop.time()
            try:
                # Each try is bounded by the interval: when etcd comes back after an
                # outage it restores the lease with one TTL to run, and a try still
                # waiting on the old connection must not use that up.
                remaining = await self.refresh(lease_id, min(self.timeout, max(interval, 0.5)))
            except ETCD_ERRORS as exc:
                log.warning("etcd lease %x keepalive failed: %s", lease_id, _reason(exc))
                if loop.time() >= deadline and not confirm_loss:
                    on_lost()
                    return
                continue
            if remaining <= 0:
                on_lost()
                return
            deadline = sent + remaining
            if on_refresh is not None:
                on_refresh(deadline)

    async def watch_prefix(self, prefix: bytes, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events under `prefix` from `start_revision`; reconnects on transient errors."""
        watch = self._client.watch
        if watch is None:
            raise Unavailable("etcd client is closed")
        async for resp in watch.watch(
            prefix, prefix_range_end(prefix), start_revision=start_revision
        ):
            for ev in resp.events:
                kind = "delete" if ev.type == 1 else "put"
                yield WatchEvent(kind, bytes(ev.kv.key), bytes(ev.kv.value), int(ev.kv.mod_revision))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def _sync_metadata(channel: grpc.Channel, endpoint: str,
                   timeout: float) -> tuple[tuple[str, str], ...] | None:
    """The token metadata for one synchronous call (an Authenticate first), or None."""
    from etcd3aio._protobuf import AuthenticateRequest, AuthStub

    user = etcd_user()
    if user is None:
        return None
    try:
        resp = AuthStub(channel).Authenticate(
            AuthenticateRequest(name=user[0], password=user[1]), timeout=timeout)
    except grpc.RpcError as exc:
        if _auth_off(exc):
            return None  # a user named for an etcd whose auth is off: nothing to present
        raise Unavailable(f"etcd at {endpoint} refused user {user[0]!r} ({exc.details()}); "
                          "check KVSTORE_ETCD_USER and its password file") from exc
    return (("token", resp.token),)


def _range_sync(endpoint: str, key: bytes, range_end: bytes, timeout: float) -> Any:
    """One etcd Range call without an event loop (the synchronous client and the CLI)."""
    from etcd3aio._protobuf import KVStub, RangeRequest

    parse_endpoint(endpoint)
    with _sync_channel(endpoint) as channel:
        metadata = _sync_metadata(channel, endpoint, timeout)
        try:
            return KVStub(channel).Range(RangeRequest(key=key, range_end=range_end),
                                         timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise _refused(endpoint, exc, f"read {key.decode(errors='replace')}") from exc


def read_key_sync(endpoint: str, key: bytes, timeout: float = 3.0) -> bytes | None:
    """Read one key without an event loop (the synchronous client's discovery)."""
    resp = _range_sync(endpoint, key, b"", timeout)
    return bytes(resp.kvs[0].value) if resp.kvs else None


def read_items_sync(endpoint: str, prefix: bytes, timeout: float = 3.0) -> list[tuple[bytes, bytes]]:
    """(key, value) of every key under `prefix`, without an event loop."""
    resp = _range_sync(endpoint, prefix, prefix_range_end(prefix), timeout)
    return [(bytes(kv.key), bytes(kv.value)) for kv in resp.kvs]


def read_prefix_sync(endpoint: str, prefix: bytes, timeout: float = 3.0) -> list[bytes]:
    """Values of every key under `prefix`, without an event loop."""
    return [value for _, value in read_items_sync(endpoint, prefix, timeout)]


def write_keys_sync(endpoint: str, puts: dict[bytes, bytes], deletes: Sequence[bytes] = (),
                    timeout: float = 3.0) -> int:
    """Put and delete keys in one etcd transaction (all or nothing), without an event
    loop; returns the revision it made."""
    from etcd3aio._protobuf import DeleteRangeRequest, KVStub, PutRequest, RequestOp, TxnRequest

    parse_endpoint(endpoint)
    ops = [RequestOp(request_put=PutRequest(key=k, value=v)) for k, v in puts.items()]
    ops += [RequestOp(request_delete_range=DeleteRangeRequest(key=k)) for k in deletes]
    with _sync_channel(endpoint) as channel:
        metadata = _sync_metadata(channel, endpoint, timeout)
        try:
            resp = KVStub(channel).Txn(TxnRequest(success=ops), timeout=timeout,
                                       metadata=metadata)
        except grpc.RpcError as exc:
            names = ", ".join(k.decode(errors="replace") for k in [*puts, *deletes])
            raise _refused(endpoint, exc, f"write {names}") from exc
    return int(resp.header.revision)
