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
    StoreFull,
    Unavailable,
)
from kvstore_client.client import ClientStats, KVStoreClient

__all__ = [
    "AlreadyExists",
    "ClientStats",
    "Code",
    "CorruptObject",
    "InProgress",
    "InvalidArgument",
    "KVStoreClient",
    "KVStoreError",
    "LeaseExpired",
    "LeaseNotFound",
    "NotFound",
    "NotLeader",
    "StoreFull",
    "Unavailable",
]
