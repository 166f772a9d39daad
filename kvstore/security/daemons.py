"""The daemons' side of security: serve gRPC with TLS, check tokens, call peers with one.

One `DaemonSecurity` per process, built from its command-line flags:
- `--tls-cert/--tls-key`: serve TLS (gRPC and the master's fast channel);
- `--tls-client-ca`: also require client certificates signed by that CA (mutual TLS);
- `--tls-ca`: the CA that signed the *peers'* certificates (master <-> store nodes);
- `--tls-server-name`: check peers' certificates for this name instead of their address
  (one DNS name in every daemon's certificate instead of IP SANs);
- `--auth-file`: the access file (tokens, roles, tenants), who may call this daemon;
- `--token-file`: the node token this daemon presents when it calls a peer.
A daemon listening beyond loopback without TLS and an access file refuses to start
unless `--insecure` says that is intended.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from kvstore.addresses import split_address
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.security.access import AccessList, Authenticator, Role
from kvstore.security.tls import ClientTls, ServerTls


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class DaemonSecurity:
    server_tls: ServerTls | None = None
    peer_tls: ClientTls | None = None  # how to check (and, for mTLS, present to) peers
    access: AccessList | None = None
    token: str = ""  # presented to peers
    insecure: bool = False

    @classmethod
    def from_flags(cls, *, tls_cert: str = "", tls_key: str = "", tls_ca: str = "",
                   tls_client_ca: str = "", auth_file: str = "", token_file: str = "",
                   insecure: bool = False, tls_server_name: str = "") -> DaemonSecurity:
        if bool(tls_cert) != bool(tls_key):
            raise InvalidArgument("--tls-cert and --tls-key go together: give both, or neither")
        if tls_client_ca and not tls_cert:
            raise InvalidArgument("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        server = ServerTls(tls_cert, tls_key, tls_client_ca) if tls_cert else None
        if server is not None:
            server.ssl_context()  # a bad certificate or key fails here, at start
        peer = (ClientTls(tls_ca, tls_cert, tls_key, tls_server_name)
                if (tls_ca or tls_cert or tls_server_name) else None)
        token = ""
        if token_file:
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise InvalidArgument(f"cannot read --token-file {token_file}: {exc.strerror}") from exc
            if not token:
                raise InvalidArgument(f"--token-file {token_file} is empty")
        access = AccessList.load(auth_file) if auth_file else None
        return cls(server, peer, access, token, insecure)

    @property
    def tls(self) -> bool:
        return self.server_tls is not None

    def check_exposure(self, *listens: str) -> None:
        """Refuse an open daemon on a non-loopback address unless --insecure."""
        if self.insecure or (self.server_tls is not None and self.access is not None):
            return
        for listen in listens:
            if not listen:
                continue
            host = split_address(listen)[0]
            if not is_loopback(host):
                missing = " and ".join(w for w, ok in (("TLS (--tls-cert/--tls-key)", self.tls),
                                                       ("tokens (--auth-file)", self.access))
                                       if not ok)
                raise InvalidArgument(
                    f"refusing to listen on {listen} without {missing}: anyone who can reach "
                    "it could read and write the cache. Configure them (see the README's "
                    "Security section) or pass --insecure on a network you trust")

    def add_port(self, server: grpc.aio.Server, listen: str) -> int:
        if self.server_tls is None:
            return server.add_insecure_port(listen)
        return server.add_secure_port(listen, self.server_tls.grpc_credentials())

    def peer_tls_for(self, tls: bool) -> ClientTls | None:
        """How to reach a peer whose record says `tls`: TLS if it serves TLS, and always
        when this daemon was given TLS material (an etcd entry must not talk it into
        sending its token in the clear); None: plaintext."""
        if tls or self.peer_tls is not None:
            return self.peer_tls or ClientTls()  # no --tls-ca: the system's roots
        return None

    def channel(self, address: str, tls: bool,
                options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
        """An asyncio channel to a peer daemon, with our token on every call. TLS if the
        peer's etcd record says it serves TLS, and always when this daemon was given TLS
        material: an etcd entry must not talk it into sending its token in the clear."""
        interceptors = [TokenInterceptor(self.token)] if self.token else None
        peer = self.peer_tls_for(tls)
        if peer is not None:
            return peer.secure_channel(address, options, aio=True,
                                       interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=options,
                                         interceptors=interceptors)

    def node_interceptors(self, auth: Authenticator) -> list[grpc.aio.ServerInterceptor]:
        """For a store node's server: only node and admin tokens may call."""
        if auth.access is None:
            return []
        return [RoleInterceptor(auth, {Role.NODE, Role.ADMIN})]


class TokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    async def intercept_unary_unary(self, continuation: Callable[..., Any],
                                    client_call_details: Any, request: Any) -> Any:
        md = list(client_call_details.metadata or [])
        md.append(self._md)
        details = client_call_details._replace(metadata=md)
        return await continuation(details, request)


class RoleInterceptor(grpc.aio.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED or PERMISSION_DENIED, calls without a token of one
    of `roles`; the refusal names what is wrong, never the valid tokens."""

    def __init__(self, auth: Authenticator, roles: set[Role]) -> None:
        self._auth = auth
        self._roles = roles

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: Any) -> Any:
        try:
            principal = self._auth.from_metadata(handler_call_details.invocation_metadata)
        except KVStoreError as exc:
            return _deny(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        if principal.role not in self._roles:
            return _deny(grpc.StatusCode.PERMISSION_DENIED,
                         f"token {principal.name!r} has role {principal.role.value}; store nodes "
                         "take calls from the master (node role) and operators (admin role) only")
        return await continuation(handler_call_details)


def _deny(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(abort)
