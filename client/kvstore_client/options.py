"""`ClientOptions`: how a client is made, one set of settings for both clients.

`KVStoreClient(etcd=..., timeout=...)` and `AsyncKVStoreClient(...)` take these as
keyword arguments (or a whole `options=ClientOptions(...)`, which keywords then
override); an unknown keyword is a TypeError naming the known ones.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from kvstore.coord.layout import Layout
from kvstore.security.credentials import Credentials
from kvstore_client.control import Transport, check_transport
from kvstore_client.state import DEFAULT_PLACEMENTS, DEFAULT_RESERVE, DEFAULT_TIMEOUT, ClientState


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Where the master is, how bytes move, and what a client keeps.

    `etcd` finds the leader (its record says which channel to use); `master` instead
    names masters ("h1:50051,h2:50051" or a DNS name), asked who leads, so that the
    client needs no access to etcd (kvstore_client.discovery). `timeout` bounds each
    call, retries included (a put waits that long for a store node to mount), and each
    transfer batch. `replicas`: copies per object (0: the master's default).
    `buffer_size`: the staging buffer for put_many/get_many (it grows for a larger
    object). `host`, `protocol`, `device`: the Transfer Engine's. `same_host`: copy with
    memcpy into a store node on this host. `transport`: "fast" or "grpc" (default:
    $KVSTORE_TRANSPORT, else fast). `token`, `tls_*`: credentials (see the README's
    security section). `placement_memory`: objects whose placement is remembered for
    early reads (0: none); `reserve_bytes`: space started ahead for one-call puts (0:
    none); see docs/client-internals.md.
    """

    etcd: str = "127.0.0.1:2379"
    master: str | None = None
    cluster: str = "default"
    timeout: float = DEFAULT_TIMEOUT
    replicas: int = 0
    buffer_size: int = 64 << 20
    host: str = "127.0.0.1"
    protocol: str = "tcp"
    device: str = ""
    same_host: bool = True
    transport: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    placement_memory: int = DEFAULT_PLACEMENTS
    reserve_bytes: int = DEFAULT_RESERVE

    @classmethod
    def of(cls, options: ClientOptions | None, etcd: str | None,
           settings: dict[str, Any]) -> ClientOptions:
        """A client constructor's arguments as options: `options` (or the defaults),
        with `etcd` and each keyword setting over it."""
        base = options if options is not None else cls()
        if etcd is not None:
            settings = {"etcd": etcd, **settings}
        if not settings:
            return base
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}; a client "
                            f"takes {', '.join(f.name for f in dataclasses.fields(cls))}")
        return dataclasses.replace(base, **settings)

    def credentials(self) -> Credentials:
        return Credentials.resolve(
            cluster=f"{self.master or self.etcd}/{self.cluster}", token=self.token,
            tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key,
            tls_server_name=self.tls_server_name)

    def transport_name(self) -> Transport:
        """The control transport to use: checked ("fast" or "grpc")."""
        return check_transport(self.transport or os.environ.get("KVSTORE_TRANSPORT", "fast"))

    def state(self, layout: Layout) -> ClientState:
        """A new client's data side (its Transfer Engine, staging buffer, local maps)."""
        return ClientState.build(None if self.master else self.etcd, layout, self.buffer_size,
                                 self.host, self.protocol, self.device, self.same_host,
                                 self.replicas, timeout=self.timeout,
                                 placement_memory=self.placement_memory,
                                 reserve_bytes=self.reserve_bytes)
