"""The one error hierarchy shared by the master, the store nodes and the client.

Every failure a user can see is one of these types. Each carries a stable `code` (the
same integer travels in gRPC replies as `kvstore.v1.Code`) and a sentence a person can
act on. Per-key failures inside a batch are reported as codes next to each key, never by
failing the whole batch.
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    """Wire codes; the numbers are fixed by `proto/kvstore/v1/common.proto`."""

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    IN_PROGRESS = 3
    STORE_FULL = 4
    LEASE_EXPIRED = 5
    LEASE_NOT_FOUND = 6
    INVALID_ARGUMENT = 7
    UNAVAILABLE = 8
    CORRUPT = 9
    NOT_LEADER = 10
    INTERNAL = 11
    BUSY = 12
    UNAUTHENTICATED = 13
    PERMISSION_DENIED = 14
    QUOTA_EXCEEDED = 15
    WRONG_SHARD = 16


class KVStoreError(Exception):
    """Base of every kvstore error. `str(err)` is a sentence meant for a person."""

    code: Code = Code.INTERNAL

    def __init__(self, message: str, *, key: bytes | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


class NotFound(KVStoreError):
    code = Code.NOT_FOUND


class AlreadyExists(KVStoreError):
    code = Code.ALREADY_EXISTS


class InProgress(KVStoreError):
    """Another writer holds this key PENDING; retry after it commits or times out."""

    code = Code.IN_PROGRESS


class StoreFull(KVStoreError):
    code = Code.STORE_FULL


class LeaseExpired(KVStoreError):
    code = Code.LEASE_EXPIRED


class LeaseNotFound(LeaseExpired):
    """Unknown lease id. A subclass of LeaseExpired: to a reader both mean "reload"."""

    code = Code.LEASE_NOT_FOUND


class InvalidArgument(KVStoreError):
    code = Code.INVALID_ARGUMENT


class Unavailable(KVStoreError):
    code = Code.UNAVAILABLE


class CorruptObject(KVStoreError):
    code = Code.CORRUPT


class NotLeader(Unavailable):
    code = Code.NOT_LEADER


class Internal(KVStoreError):
    code = Code.INTERNAL


class Busy(Unavailable):
    """Transient: the store is making room (moving objects to SSD); retry shortly."""

    code = Code.BUSY


class TlsMismatch(Unavailable):
    """The client speaks TLS to a plaintext master, or plaintext to a TLS one: retrying
    cannot help, the client's credentials (or the master's flags) must change. Raised by
    the client only; never on the wire."""


class Unsettled(Unavailable):
    """A write to a store node that ended without the engine's answer (abandoned at the
    client's timeout, or failed after its bytes were sent): some of them may still land.
    The client revokes such a put as unsettled, so that the master holds its space until
    the put timeout instead of placing another object there. Putting it again is safe.
    Raised by the client only; never on the wire."""


class Unauthenticated(KVStoreError):
    """No token, or one the server does not know: check the client's token."""

    code = Code.UNAUTHENTICATED


class PermissionDenied(KVStoreError):
    """The token is known but its role may not make this call."""

    code = Code.PERMISSION_DENIED


class QuotaExceeded(StoreFull):
    """The tenant's quota is taken by objects that cannot be evicted (pinned, pending)."""

    code = Code.QUOTA_EXCEEDED


class WrongShard(InvalidArgument):
    """A key sent to a master shard it does not hash to: the caller's shard count is not
    the cluster's (a client of another cluster, or a bug in the caller's routing)."""

    code = Code.WRONG_SHARD


_BY_CODE: dict[Code, type[KVStoreError]] = {
    Code.NOT_FOUND: NotFound,
    Code.ALREADY_EXISTS: AlreadyExists,
    Code.IN_PROGRESS: InProgress,
    Code.STORE_FULL: StoreFull,
    Code.LEASE_EXPIRED: LeaseExpired,
    Code.LEASE_NOT_FOUND: LeaseNotFound,
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.UNAVAILABLE: Unavailable,
    Code.CORRUPT: CorruptObject,
    Code.NOT_LEADER: NotLeader,
    Code.INTERNAL: Internal,
    Code.BUSY: Busy,
    Code.UNAUTHENTICATED: Unauthenticated,
    Code.PERMISSION_DENIED: PermissionDenied,
    Code.QUOTA_EXCEEDED: QuotaExceeded,
    Code.WRONG_SHARD: WrongShard,
}


def error_for(code: int, message: str, *, key: bytes | None = None) -> KVStoreError:
    """Rebuild the typed error for a wire code (unknown codes become `Internal`)."""
    try:
        cls = _BY_CODE[Code(code)]
    except (ValueError, KeyError):
        cls = Internal
    return cls(message, key=key)


# Limits every layer enforces, so that a bad key fails at the first hop with one sentence.
MAX_KEY_BYTES = 1024


def check_key(key: bytes) -> None:
    """Raise InvalidArgument unless `key` is a usable object key."""
    if not isinstance(key, (bytes, bytearray)):
        raise InvalidArgument(f"keys must be bytes, got {type(key).__name__}")
    if len(key) == 0:
        raise InvalidArgument("empty key: give every object a non-empty key")
    if len(key) > MAX_KEY_BYTES:
        raise InvalidArgument(
            f"key of {len(key)} bytes is longer than the {MAX_KEY_BYTES}-byte limit; "
            "hash long keys before storing them",
            key=bytes(key[:64]),
        )
