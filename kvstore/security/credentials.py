"""What a client presents: its token and how it checks the master's certificate.

Looked up in this order, first found wins, field by field:
1. the arguments given to the client (`token=`, `tls_ca=`, ...);
2. the environment: KVSTORE_TOKEN (KVSTORE_ADMIN_TOKEN for the admin CLI),
   KVSTORE_TLS_CA, KVSTORE_TLS_CERT, KVSTORE_TLS_KEY, KVSTORE_TLS_SERVER_NAME;
3. the credentials file: $KVSTORE_CREDENTIALS, else ~/.config/kvstore/credentials.json,
   which `kvstore up` writes for its development cluster. It holds one entry per cluster,
   named "ETCD/CLUSTER" (e.g. "127.0.0.1:2379/default"), so that credentials meant for one
   cluster are never offered to another.
Whether to use TLS at all is not a client setting: the master says so in its etcd record,
so a client can never be talked into sending its token in the clear to a TLS master.
A CA from any of the three also makes the client use TLS (see `wants_tls`); when that
meets a plaintext master (a stale entry after `kvstore up --insecure`, say), or plaintext
meets a TLS one, the client fails at once with `mismatch()`'s sentence, which says where
the CA came from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from kvstore.errors import InvalidArgument, TlsMismatch
from kvstore.security.tls import ClientTls

ENV = {
    "token": "KVSTORE_TOKEN",
    "tls_ca": "KVSTORE_TLS_CA",
    "tls_cert": "KVSTORE_TLS_CERT",
    "tls_key": "KVSTORE_TLS_KEY",
    "tls_server_name": "KVSTORE_TLS_SERVER_NAME",
}


def credentials_path() -> Path:
    explicit = os.environ.get("KVSTORE_CREDENTIALS")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "kvstore" / "credentials.json"


@dataclass(frozen=True, slots=True)
class Credentials:
    token: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    # Where tls_ca came from ("argument", "environment", "file"; "": nowhere), and the
    # credentials file and entry looked in: for the sentence of `mismatch`.
    tls_ca_from: str = field(default="", compare=False)
    file: str = field(default="", compare=False)
    entry: str = field(default="", compare=False)
    # (field, where it came from) for the files given: for the sentence of a missing one
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def tls(self) -> ClientTls:
        """How to check the master; raises InvalidArgument, naming the file and where it
        was named, if a file it needs is not there (an untyped FileNotFoundError at the
        first connection otherwise)."""
        given = dict(self.sources)
        for name in _FILES:
            value = getattr(self, name)
            if value:
                _check_file(value, name, given.get(name, "argument"), self.file, self.entry)
        return ClientTls(self.tls_ca, self.tls_cert, self.tls_key, self.tls_server_name)

    def wants_tls(self, announced: bool) -> bool:
        """TLS if the server announces it, and always once a CA was given: an etcd entry
        must not talk a client that expects TLS into sending its token in the clear."""
        return announced or bool(self.tls_ca)

    def grpc_channel(self, address: str, announced_tls: bool, options: list[tuple[str, Any]],
                     *, aio: bool = False) -> Any:
        """A gRPC channel to a master: TLS when `wants_tls`, else plaintext."""
        if self.wants_tls(announced_tls):
            return self.tls.secure_channel(address, options, aio=aio)
        return (grpc.aio if aio else grpc).insecure_channel(address, options=options)

    def mismatch(self, address: str, peer_tls: bool) -> TlsMismatch:
        """The error for a master at `address` that serves TLS (`peer_tls`) while this
        client spoke plaintext, or the reverse."""
        if peer_tls:
            return TlsMismatch(
                f"the kvstore master at {address} serves TLS, but this client connected in "
                "plaintext: its etcd record does not announce TLS and the client has no CA; "
                f"give it the cluster's CA (tls_ca=, KVSTORE_TLS_CA, or \"tls_ca\" in the "
                f"entry {self.entry!r} of the credentials file {self.file})")
        why = {
            "argument": ("it was given tls_ca=", "drop tls_ca= for a cluster without TLS"),
            "environment": ("KVSTORE_TLS_CA is set", "unset KVSTORE_TLS_CA for a cluster "
                            "without TLS"),
            "file": (f"the credentials file {self.file} gives it a CA (entry {self.entry!r})",
                     "if that cluster now runs without TLS (`kvstore up --insecure`), remove "
                     f"the entry {self.entry!r} from {self.file}"),
        }.get(self.tls_ca_from)
        if why is None:
            why = ("the master's etcd record announces TLS", "the record is stale or the "
                   "master was restarted without --tls-cert: restart it with the same flags")
        return TlsMismatch(f"the kvstore master at {address} answers in plaintext, but this "
                           f"client connects with TLS because {why[0]}; {why[1]}")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    @classmethod
    def resolve(cls, *, cluster: str = "", role: str = "client", **given: str | None) -> Credentials:
        """Arguments, then the environment, then the credentials file's entry for
        `cluster` ("ETCD/CLUSTER", see above). `role` picks the entry's token: "client"
        reads `token`, "admin" `admin_token`."""
        unknown = set(given) - set(ENV)
        if unknown:
            raise TypeError(f"unknown credential fields {sorted(unknown)}")
        path = credentials_path()
        entry = _read_file(path).get(cluster) if cluster else None
        stored: dict[str, Any] = entry if isinstance(entry, dict) else {}
        out: dict[str, str] = {"file": str(path), "entry": cluster}
        sources: dict[str, str] = {}
        for name, env in ENV.items():
            value, source = given.get(name), "argument"
            if value is None:
                value, source = os.environ.get(
                    "KVSTORE_ADMIN_TOKEN" if (name, role) == ("token", "admin") else env), \
                    "environment"
            if value is None:
                key = "admin_token" if (name == "token" and role == "admin") else name
                value, source = str(stored.get(key) or ""), "file"
            out[name] = value
            if name == "tls_ca" and value:
                out["tls_ca_from"] = source
            if name in _FILES and value:
                sources[name] = source
        return cls(**out, sources=tuple(sources.items()))


_FILES = {"tls_ca": "CA", "tls_cert": "client certificate", "tls_key": "client key"}


def _check_file(value: str, name: str, source: str, path: str, cluster: str) -> None:
    if Path(value).is_file():
        return
    what = _FILES[name]
    where = {
        "argument": f"{name}=",
        "environment": f"${ENV[name]}",
    }.get(source, f"\"{name}\" in the entry {cluster!r} of the credentials file {path}")
    hint = ""
    if source == "file" and not Path(value).is_absolute():
        hint = (" (a path relative to the directory `kvstore up` ran in, by an older "
                "kvstore; run `kvstore up` again, which writes absolute paths, or make it absolute)")
    elif source == "file":
        hint = " (was the dev cluster's data directory removed? run `kvstore up` again)"
    raise InvalidArgument(f"the {what} file {value} named by {where} does not exist{hint}")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_text()
    except OSError:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"the credentials file {path} is not valid JSON ({exc}); fix or "
                              "delete it") from exc
    return data if isinstance(data, dict) else {}
