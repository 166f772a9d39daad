"""The lease table: who pins what, until when.

The verbs follow etcd's lessor: grant, renew, release (revoke), trim (detach the tail),
expire (deliver what the expiry heap says is due). A lease only *records* which objects
it pins, as object tokens in lookup order; pins.py turns grants and releases into pin
counts, so this module knows nothing of objects, eviction or space.

A lease past its deadline is dead to every verb even before `expire` reaps it: a reader
whose lease ran out must reload, whether or not the master's tick has come round yet.
Leases reaped by `expire` are remembered for a while, so a late renew gets "expired"
rather than "unknown".
"""

from __future__ import annotations

import heapq
from collections import deque

from kvstore.errors import LeaseExpired, LeaseNotFound

_REMEMBER_EXPIRED = 65536


class Lease:
    __slots__ = ("_members", "expires_at", "granted_at", "holder", "keys", "lease_id", "owner",
                 "tokens")

    def __init__(
        self,
        lease_id: int,
        holder: str,
        keys: list[bytes],
        tokens: list[int],
        granted_at: float,
        expires_at: float,
        owner: str = "",
    ) -> None:
        self.lease_id = lease_id
        self.holder = holder
        self.owner = owner  # the tenant that took it: only it may renew, read or release
        self.keys = keys  # pinned keys in lookup order, one entry per pin
        self.tokens = tokens  # the object token pinned for keys[i]
        self.granted_at = granted_at
        self.expires_at = expires_at
        self._members: dict[bytes, int] | None = None

    def token_for(self, key: bytes) -> int:
        """The token this lease pinned under `key`, or 0 when it pins no such key."""
        members = self._members
        if members is None:
            members = self._members = dict(zip(self.keys, self.tokens, strict=True))
        return members.get(key, 0)


class LeaseTable:
    __slots__ = ("_expired_ids", "_expired_order", "_heap", "_leases", "_next_id")

    def __init__(self, first_id: int = 1) -> None:
        self._leases: dict[int, Lease] = {}
        # (expires_at, lease_id); renewals push a new entry and leave the old one to be
        # skipped when it surfaces, which is cheaper than finding it.
        self._heap: list[tuple[float, int]] = []
        self._next_id = first_id
        self._expired_ids: set[int] = set()
        self._expired_order: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, holder: str, keys: list[bytes], tokens: list[int], ttl: float, now: float,
              owner: str = "") -> Lease:
        lease = Lease(self._next_id, holder, keys, tokens, now, now + ttl, owner)
        self._next_id += 1
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._heap, (lease.expires_at, lease.lease_id))
        self._compact()
        return lease

    def get(self, lease_id: int, now: float, owner: str | None = None) -> Lease:
        """The live lease, or LeaseNotFound / LeaseExpired. With `owner`, another
        tenant's lease is reported as unknown: ids are guessable, leases are not shared."""
        lease = self._leases.get(lease_id)
        if lease is not None and owner is not None and lease.owner != owner:
            lease = None
        if lease is None:
            if lease_id in self._expired_ids:
                raise LeaseExpired(f"lease {lease_id} expired; its objects may be gone, look them up again")
            raise LeaseNotFound(
                f"lease {lease_id} is unknown (released, or granted by another master); "
                "look the keys up again"
            )
        if now >= lease.expires_at:
            raise LeaseExpired(
                f"lease {lease_id} expired {now - lease.expires_at:.3f} s ago; its objects "
                "may be gone, look them up again"
            )
        return lease

    def renew(self, lease_id: int, ttl: float, now: float, owner: str | None = None) -> float:
        lease = self.get(lease_id, now, owner)
        lease.expires_at = now + ttl
        heapq.heappush(self._heap, (lease.expires_at, lease_id))
        self._compact()
        return lease.expires_at

    def release(self, lease_id: int, now: float, owner: str | None = None) -> Lease:
        lease = self.get(lease_id, now, owner)
        del self._leases[lease_id]
        self._compact()
        return lease

    def trim(self, lease_id: int, keep: int, now: float, owner: str | None = None) -> list[int]:
        """Keep the first `keep` pins; return the tokens of the pins dropped."""
        lease = self.get(lease_id, now, owner)
        dropped = lease.tokens[keep:]
        del lease.tokens[keep:]
        del lease.keys[keep:]
        lease._members = None
        return dropped

    def expire(self, now: float, pins: int | None = None) -> list[Lease]:
        """Remove and return every lease whose deadline has passed, earliest first; with
        `pins`, stop once those returned pin that many keys (one lease at least), so that
        the caller's work per round is bounded (`due` says whether more are waiting)."""
        heap = self._heap
        leases = self._leases
        out: list[Lease] = []
        n = 0
        while heap and heap[0][0] <= now:
            if pins is not None and n >= pins:
                break
            at, lease_id = heapq.heappop(heap)
            lease = leases.get(lease_id)
            if lease is None or lease.expires_at != at:
                continue  # released, or renewed since this entry was pushed
            del leases[lease_id]
            out.append(lease)
            n += len(lease.tokens)
            self._remember(lease_id)
        return out

    def due(self, now: float) -> bool:
        """Whether `expire(now)` may find a lease past its deadline (the earliest entry of
        the heap is due; it may turn out released or renewed)."""
        heap = self._heap
        return bool(heap) and heap[0][0] <= now

    def _remember(self, lease_id: int) -> None:
        self._expired_ids.add(lease_id)
        self._expired_order.append(lease_id)
        if len(self._expired_order) > _REMEMBER_EXPIRED:
            self._expired_ids.discard(self._expired_order.popleft())

    def _compact(self) -> None:
        # Renewed and released leases leave stale heap entries; rebuild before they
        # dominate, which costs O(1) amortised per verb.
        if len(self._heap) > 2 * len(self._leases) + 1024:
            self._heap = [(lease.expires_at, i) for i, lease in self._leases.items()]
            heapq.heapify(self._heap)
