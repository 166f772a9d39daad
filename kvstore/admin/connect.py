"""How admin commands reach the cluster: the leader through etcd, or one --master.

Admin calls go over gRPC (the public contract), one channel per command. A reply from a
standby (NOT_LEADER) sends the command back to etcd for the leader once, unless the
user pinned a master with --master.
"""

from __future__ import annotations

import argparse
from typing import Any

import grpc

from kvstore.coord.etcd import read_items_sync, read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, TlsMismatch, Unavailable, error_for
from kvstore.security.credentials import Credentials
from kvstore.security.tls import speaks_tls
from kvstore.v1 import master_pb2_grpc as pbg

# A ListKeys reply of 10,000 keys of up to 1 KiB is larger than gRPC's 4 MiB default.
_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
# What gRPC's details say when a TLS handshake met a plaintext server.
_NOT_TLS = "WRONG_VERSION_NUMBER"
_PROBE_TIMEOUT = 2.0  # s: asking a plaintext-refusing master whether it speaks TLS


def add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd", default="127.0.0.1:2379", help="etcd HOST:PORT (default %(default)s)")
    p.add_argument("--cluster", default="default", help="cluster name (etcd key prefix)")
    p.add_argument("--master", default="",
                   help="talk to this master HOST:PORT instead of finding the leader in etcd")
    p.add_argument("--shard", type=int, default=None, metavar="K",
                   help="a sharded cluster: ask only shard K's leader (default: every "
                        "shard's, shown as one cluster)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--token", default=None,
                   help="admin token (default: $KVSTORE_ADMIN_TOKEN, else the credentials file "
                        "`kvstore up` writes)")
    p.add_argument("--tls-ca", default=None,
                   help="CA of the master's certificate (default: $KVSTORE_TLS_CA, the "
                        "credentials file, or the system's roots)")
    p.add_argument("--tls-server-name", default=None,
                   help="name to check the master's certificate for (default: its address)")


class Admin:
    """A connection to the leader (of one shard: `shard` of `shards`) for one admin
    command. Use as a context manager."""

    def __init__(self, args: argparse.Namespace, shard: int = 0, shards: int = 1) -> None:
        self.etcd: str = args.etcd
        self.shard = shard
        self.layout = Layout(args.cluster, shard, shards)
        self.fixed: str = getattr(args, "master", "") or ""
        self.timeout: float = getattr(args, "timeout", 10.0)
        self.address = ""
        self.creds = Credentials.resolve(
            cluster=f"{self.fixed or self.etcd}/{args.cluster}", role="admin",
            token=getattr(args, "token", None), tls_ca=getattr(args, "tls_ca", None),
            tls_server_name=getattr(args, "tls_server_name", None))
        self._tls = False
        self._channel: grpc.Channel | None = None
        self._stub: pbg.MasterStub | None = None

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._stub = None

    # -- discovery ------------------------------------------------------------------

    def leader_record(self) -> MasterRecord | None:
        raw = read_key_sync(self.etcd, self.layout.leader, timeout=min(self.timeout, 3.0))
        return MasterRecord.decode(raw) if raw is not None else None

    def masters(self) -> list[MasterRecord]:
        """Every master registered in etcd (leader and standbys)."""
        out = []
        for _key, raw in read_items_sync(self.etcd, self.layout.masters, timeout=min(self.timeout, 3.0)):
            try:
                out.append(MasterRecord.decode(raw))
            except (ValueError, TypeError):
                continue
        return sorted(out, key=lambda m: m.master_id)

    def _leader_address(self) -> str:
        if self.fixed:
            return self.fixed
        record = self.leader_record()
        if record is None:
            which = f", shard {self.shard}" if self.layout.shards > 1 else ""
            raise Unavailable(f"no kvstore master is registered in etcd at {self.etcd} "
                              f"(cluster {self.layout.root.decode()!r}{which}); is a master "
                              "running?")
        self._tls = record.tls
        return record.address

    def _connect(self) -> pbg.MasterStub:
        if self._stub is None:
            self.address = self._leader_address()
            self._channel = self.creds.grpc_channel(self.address, self._tls, _OPTIONS)
            self._stub = pbg.MasterStub(self._channel)
        return self._stub

    def _wrong_layer(self, exc: grpc.RpcError) -> TlsMismatch | None:
        """The client library's sentence for TLS against a plaintext master, or the
        reverse (Credentials.mismatch), instead of "did not answer"."""
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        if self.creds.wants_tls(self._tls):
            if _NOT_TLS in (exc.details() or ""):
                return self.creds.mismatch(self.address, False)
            return None
        if speaks_tls(self.address, min(self.timeout, _PROBE_TIMEOUT)):
            return self.creds.mismatch(self.address, True)
        return None

    # -- calls ----------------------------------------------------------------------

    def call(self, method: str, request: Any) -> Any:
        """One RPC to the leader; raises the typed error the reply carries."""
        for attempt in range(2):
            stub = self._connect()
            try:
                reply = getattr(stub, method)(request, timeout=self.timeout,
                                              metadata=self.creds.metadata())
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    raise Unavailable(f"the master at {self.address} does not know {method}; "
                                      "upgrade it to this kvstore version") from exc
                mismatch = self._wrong_layer(exc)
                if mismatch is not None:
                    raise mismatch from exc
                raise Unavailable(f"the master at {self.address} did not answer {method} "
                                  f"({code.name}); is it running?") from exc
            if reply.error.code == Code.NOT_LEADER and not self.fixed and attempt == 0:
                self.close()  # the leader moved: look it up again
                continue
            if reply.error.code:
                raise error_for(reply.error.code, reply.error.message)
            return reply
        raise AssertionError("unreachable")
