"""kvstore client library: `KVStoreClient` and the typed errors it raises."""

from kvstore.errors import (
    AlreadyExists,
    Code,
    CorruptObject,
    InProgress,
    InvalidArgument,
    KVStoreError,
    LeaseExpired,
    LeaseNotFound,
    NotFound,
    NotLeader,
    PermissionDenied,
    QuotaExceeded,
    StoreFull,
    Unauthenticated,
    Unavailable,
)
from kvstore_client.aio import AsyncKVStoreClient
from kvstore_client.client import KVStoreClient
from kvstore_client.misuse import ClientClosed, WrongLeaseContext
from kvstore_client.options import ClientOptions
from kvstore_client.state import Lease
from kvstore_client.stats import ClientStats

__all__ = [
    "AlreadyExists",
    "AsyncKVStoreClient",
    "ClientClosed",
    "ClientOptions",
    "ClientStats",
    "Code",
    "CorruptObject",
    "InProgress",
    "InvalidArgument",
    "KVStoreClient",
    "KVStoreError",
    "Lease",
    "LeaseExpired",
    "LeaseNotFound",
    "NotFound",
    "NotLeader",
    "PermissionDenied",
    "QuotaExceeded",
    "StoreFull",
    "Unauthenticated",
    "Unavailable",
    "WrongLeaseContext",
]
