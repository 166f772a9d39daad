"""Moving objects off a store node through the client: what `kvstore drain` uses for
objects whose only replica is on the node it drains (the master never touches bytes)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from kvstore.errors import Code, KVStoreError
from kvstore_client.client import KVStoreClient

# One read-remove-put round holds this many bytes in this process at most.
_MOVE_BATCH_BYTES = 32 << 20
_MOVE_BATCH_KEYS = 256


class SoleCopyMover:
    """Copies sole replicas off a draining node (`kvstore drain`): reads them, removes
    them and puts them again, which places them on the other nodes. The client starts
    lazily: it brings up a Transfer Engine."""

    def __init__(self, etcd: str, master: str | None = None, cluster: str = "default",
                 timeout: float = 10.0, **credentials: Any) -> None:
        """`credentials`: the client's token= and tls_*= (ClientOptions). `kvstore drain`
        passes the admin's: a tenant's client token would prefix the keys it is handed,
        which already carry their tenant's prefix."""
        self._etcd, self._master, self._cluster, self._timeout = etcd, master, cluster, timeout
        self._credentials = credentials
        self._client: KVStoreClient | None = None
        self.moved = 0
        self.moved_bytes = 0
        self.gone: list[tuple[bytes, str]] = []  # (key, why)
        self.skipped = 0  # pinned or unreadable this round; retried next round

    def client(self) -> KVStoreClient:
        if self._client is None:
            self._client = KVStoreClient(self._etcd, master=self._master or None,
                                         cluster=self._cluster, timeout=self._timeout,
                                         **self._credentials)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(KVStoreError):
                self._client.close()

    def move(self, sole: Sequence[tuple[bytes, int]]) -> int:
        """Move these objects; returns how many left the node (moved or gone)."""
        done = 0
        for batch in _batches(sole):
            done += self._move_batch([k for k, _ in batch])
        return done

    def _move_batch(self, keys: list[bytes]) -> int:
        client = self.client()
        values = client.get_many(keys)
        readable = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
        self.skipped += len(keys) - len(readable)
        if not readable:
            return 0
        codes = client.remove_many([k for k, _ in readable])
        removed = [(k, v) for (k, v), c in zip(readable, codes, strict=True) if c == Code.OK]
        # IN_PROGRESS: pinned since we read it (next round); NOT_FOUND: evicted meanwhile
        self.skipped += sum(1 for c in codes if c == Code.IN_PROGRESS)
        left = sum(1 for c in codes if c == Code.NOT_FOUND)
        if not removed:
            return left
        errors = client.put_many([k for k, _ in removed], [v for _, v in removed])
        for (k, v), err in zip(removed, errors, strict=True):
            if err is None:
                self.moved += 1
                self.moved_bytes += len(v)
            else:
                self.gone.append((k, f"re-put failed: {err}"))
        return left + len(removed)


def _batches(items: Sequence[tuple[bytes, int]]) -> list[list[tuple[bytes, int]]]:
    out: list[list[tuple[bytes, int]]] = []
    cur: list[tuple[bytes, int]] = []
    nbytes = 0
    for k, n in items:
        if cur and (nbytes + n > _MOVE_BATCH_BYTES or len(cur) >= _MOVE_BATCH_KEYS):
            out.append(cur)
            cur, nbytes = [], 0
        cur.append((k, n))
        nbytes += n
    if cur:
        out.append(cur)
    return out
