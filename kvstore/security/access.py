"""Tokens, roles and tenants: the access file a master and its store nodes load.

The file is JSON and holds no secret: a token appears only as its SHA-256, so the file
can be read by operators and shipped with the deployment's configuration, while the
token itself lives with the one client that presents it.

    {
      "tenants": {"team-a": {"quota_bytes": 10737418240}, "team-b": {}},
      "tokens": [
        {"name": "vllm-a", "role": "client", "tenant": "team-a", "sha256": "9f86..."},
        {"name": "ops",    "role": "admin",  "sha256": "..."},
        {"name": "nodes",  "role": "node",   "sha256": "..."}
      ]
    }

A client token works inside its tenant only: its keys are stored as `tenant/key`, so it
can neither name nor learn of another tenant's keys. Node tokens let store nodes mount at
the master, and the master call its store nodes. Admin tokens may make every call and see
every key, with its tenant prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from kvstore.errors import InvalidArgument, PermissionDenied, Unauthenticated


class Role(StrEnum):
    CLIENT = "client"
    NODE = "node"
    ADMIN = "admin"


# Which master RPCs each role may call; admin may call all of them.
CLIENT_RPCS = frozenset({
    "PutStart", "PutEnd", "PutRevoke", "PutCommit", "Remove", "Exists", "Lookup", "GetReplicas",
    "RenewLease", "ReleaseLease", "Authenticate",
})
NODE_RPCS = frozenset({"MountSegment", "UnmountSegment", "Authenticate"})

# Tenant names become key prefixes, so they must never contain the separator.
TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SEPARATOR = b"/"


def key_prefix(tenant: str) -> bytes:
    """What the master puts before a tenant's keys (`tenant/`); b"" for no tenant."""
    return tenant.encode() + SEPARATOR if tenant else b""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call comes from, once its token was checked."""

    name: str
    role: Role
    tenant: str = ""
    prefix: bytes = b""  # what the master puts before a client's keys ("" for admin/node)

    def may_call(self, method: str) -> bool:
        if self.role is Role.ADMIN:
            return True
        return method in (CLIENT_RPCS if self.role is Role.CLIENT else NODE_RPCS)

    def check(self, method: str) -> None:
        if not self.may_call(method):
            raise PermissionDenied(
                f"token {self.name!r} has role {self.role.value}, which may not call {method}; "
                "use a token with the admin role for operator calls")


# When the master runs without an access file every caller is this: the store is open,
# as it was before tokens existed (only allowed on loopback unless --insecure).
OPEN = Principal("anonymous", Role.ADMIN)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    quota_bytes: int = 0  # 0: no quota


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token: 256 bits, URL-safe."""
    return "kvs_" + secrets.token_urlsafe(32)


@dataclass
class AccessList:
    """Token hashes -> principals, and the tenants with their quotas."""

    principals: dict[str, Principal] = field(default_factory=dict)  # sha256 hex -> who
    tenants: dict[str, Tenant] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> AccessList:
        try:
            raw = json.loads(Path(path).read_text())
        except OSError as exc:
            raise InvalidArgument(f"cannot read the access file {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise InvalidArgument(f"the access file {path} is not valid JSON: {exc}") from exc
        return cls.parse(raw, str(path))

    @classmethod
    def parse(cls, raw: Any, source: str = "<access>") -> AccessList:
        def bad(what: str) -> InvalidArgument:
            return InvalidArgument(f"access file {source}: {what}")

        if not isinstance(raw, dict):
            raise bad("the top level must be an object with `tenants` and `tokens`")
        tenants: dict[str, Tenant] = {}
        for name, spec in (raw.get("tenants") or {}).items():
            if not TENANT_RE.match(name):
                raise bad(f"tenant name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
            quota = (spec or {}).get("quota_bytes", 0)
            if not isinstance(quota, int) or quota < 0:
                raise bad(f"tenant {name!r}: quota_bytes must be a whole number >= 0, got {quota!r}")
            tenants[name] = Tenant(name, quota)
        principals: dict[str, Principal] = {}
        for i, entry in enumerate(raw.get("tokens") or []):
            if not isinstance(entry, dict):
                raise bad(f"tokens[{i}] must be an object")
            name = str(entry.get("name") or f"tokens[{i}]")
            try:
                role = Role(entry.get("role", ""))
            except ValueError:
                raise bad(f"token {name!r}: role must be client, node or admin, "
                          f"got {entry.get('role')!r}") from None
            digest = str(entry.get("sha256", "")).lower()
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise bad(f"token {name!r}: sha256 must be the 64 hex digits of the token's "
                          "SHA-256 (`kvstore token new` prints it)")
            tenant = str(entry.get("tenant", ""))
            if role is Role.CLIENT:
                if tenant not in tenants:
                    raise bad(f"token {name!r}: a client token needs a tenant listed under "
                              f"`tenants`, got {tenant!r}")
                principals[digest] = Principal(name, role, tenant, key_prefix(tenant))
            else:
                if tenant:
                    raise bad(f"token {name!r}: only client tokens belong to a tenant")
                principals[digest] = Principal(name, role)
        return cls(principals, tenants, source)

    def authenticate(self, token: str) -> Principal:
        if not token:
            raise Unauthenticated("this store requires a token: pass token= to the client "
                                  "(or set KVSTORE_TOKEN)")
        digest = token_hash(token)
        # Constant-time comparison against each known hash: how many leading characters
        # match must not show in the time a refusal takes.
        found: Principal | None = None
        for known, principal in self.principals.items():
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise Unauthenticated("the token is not valid for this store (unknown or revoked); "
                                  "ask its operator for a new one")
        return found

    def quotas(self) -> dict[bytes, int]:
        """Key prefix -> quota in bytes, for the tenants that have one."""
        return {key_prefix(t.name): t.quota_bytes
                for t in self.tenants.values() if t.quota_bytes}


class Authenticator:
    """The per-process token check, with a cache so that a call costs one dict lookup."""

    def __init__(self, access: AccessList | None) -> None:
        self.access = access
        self._cache: dict[str, Principal] = {}

    @property
    def required(self) -> bool:
        return self.access is not None

    def principal(self, token: str) -> Principal:
        if self.access is None:
            return OPEN
        p = self._cache.get(token)
        if p is None:
            p = self.access.authenticate(token)
            if len(self._cache) > 10_000:  # someone cycling tokens: keep memory bounded
                self._cache.clear()
            self._cache[token] = p
        return p

    def forget(self) -> None:
        """Drop cached tokens (after the access file changed)."""
        self._cache.clear()

    def reload(self) -> AccessList:
        """Read the access file again and check tokens against it from now on. Raises
        InvalidArgument (the old file stays in force) when there is none, or it is bad."""
        if self.access is None or not self.access.source:
            raise InvalidArgument("no --auth-file to reload")
        fresh = AccessList.load(self.access.source)
        self.access = fresh
        self.forget()
        return fresh

    def from_metadata(self, metadata: Any) -> Principal:
        """The principal of a gRPC call from its `authorization: Bearer ...` metadata."""
        if self.access is None:
            return OPEN
        token = ""
        for k, v in metadata or ():
            if k == "authorization":
                token = v.removeprefix("Bearer ").strip() if isinstance(v, str) else ""
                break
        return self.principal(token)
