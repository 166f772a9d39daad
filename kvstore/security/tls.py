"""TLS material for the control plane: gRPC credentials and ssl contexts from PEM files.

A server needs a certificate and its key (and, for mutual TLS, the CA its clients'
certificates are signed by). A client needs the CA that signed the server's certificate
(or the system's roots) and, for mutual TLS, its own certificate and key.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from kvstore.errors import InvalidArgument


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the {what} {path}: {exc.strerror}") from exc


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: str  # PEM certificate chain
    key: str  # PEM private key
    client_ca: str = ""  # set: require client certificates signed by this CA (mutual TLS)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        pair = (_read(self.key, "TLS key"), _read(self.cert, "TLS certificate"))
        if self.client_ca:
            return grpc.ssl_server_credentials([pair], _read(self.client_ca, "client CA"), True)
        return grpc.ssl_server_credentials([pair])

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.client_ca:
                ctx.load_verify_locations(self.client_ca)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgument(f"cannot load the TLS certificate {self.cert} / key "
                                  f"{self.key}: {exc}") from exc
        return ctx


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca: str = ""  # "": the system's trusted roots
    cert: str = ""  # mutual TLS only
    key: str = ""
    server_name: str = ""  # check the server's certificate for this name, not the address's host

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            _read(self.ca, "TLS CA") if self.ca else None,
            _read(self.key, "TLS key") if self.key else None,
            _read(self.cert, "TLS certificate") if self.cert else None,
        )

    def grpc_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def secure_channel(self, address: str, options: list[tuple[str, Any]] | None = None, *,
                       aio: bool = False, interceptors: list[Any] | None = None) -> Any:
        """A gRPC channel (blocking, or grpc.aio with `aio`) that checks the server as
        configured here."""
        opts = list(options or []) + self.grpc_options()
        if aio:
            return grpc.aio.secure_channel(address, self.grpc_credentials(), options=opts,
                                           interceptors=interceptors)
        return grpc.secure_channel(address, self.grpc_credentials(), options=opts)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            if self.cert:
                ctx.load_cert_chain(self.cert, self.key or None)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgument(f"cannot load the client certificate {self.cert}: {exc}") from exc
        return ctx

    def hostname(self, host: str) -> str:
        return self.server_name or host


# -- telling a TLS server from a plaintext one -----------------------------------------


def _client_hello() -> bytes:
    """The first flight of a TLS handshake (certificates are not checked: the answer is
    only looked at, never trusted)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO())
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the ServerHello
        obj.do_handshake()
    return out.read()


def looks_like_tls(data: bytes) -> bool:
    """Whether `data` starts a TLS record: a handshake (22) or an alert (21) record, TLS
    major version 3. A plaintext kvstore or HTTP/2 server never sends that."""
    return len(data) >= 2 and data[0] in (21, 22) and data[1] == 3


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def speaks_tls(address: str, timeout: float) -> bool:
    """Whether the server at `address` answers a TLS ClientHello with TLS. Used only
    after a plaintext connection failed, to say why; False when unsure."""
    try:
        with socket.create_connection(_split(address), timeout=timeout) as sock:
            sock.sendall(_client_hello())
            data = sock.recv(8)
            if len(data) == 1:
                data += sock.recv(1)
    except (OSError, ValueError):
        return False
    return looks_like_tls(data)


async def speaks_tls_async(address: str, timeout: float) -> bool:
    """`speaks_tls` for an event loop: the same probe, in a worker thread."""
    return await asyncio.to_thread(speaks_tls, address, timeout)
