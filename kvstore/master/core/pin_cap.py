"""The pin cap: no one client, and no one tenant, keeps more than pin_share of the DRAM
pool pinned.

A lookup pins what it reports until the lease is released or its TTL runs out; that
promise is what makes a lookup -> read safe under eviction, so the pins stay. What
they must not do is starve everyone else: a client that looks up a lot and releases
late (a crashed scheduler loop, a bug) could otherwise pin most of DRAM, and every
put would then fail STORE_FULL. So a lookup that would take its holder (the client's
writer id) or its owner (the authenticated tenant) past the cap reports the longest
prefix that stays within it: a shorter hit, never an error (the caller recomputes the
rest, as for any miss). Leases keep their TTL, so a client that stops renewing frees
its share when its leases end, as before.

The bytes counted are those each lease pinned when granted (an object pinned by two
leases counts for both: a bound on what one client holds, not on the pool). They are
recorded per lease and checked lazily: a lookup that fits under the recorded total
costs one comparison per bucket; one that does not first drops the released, expired
and trimmed leases from its buckets, then measures again. Records of released leases
are swept in amortised O(1) per grant, so a client that behaves pays nothing.
"""

from __future__ import annotations

from kvstore.errors import LeaseExpired, LeaseNotFound

from .objects import SLOT_BITS, SLOT_MASK
from .state import CoreState

_SWEEP_SLACK = 1024


class PinCap:
    def __init__(self, state: CoreState) -> None:
        self._state = state
        # bucket ("client:<holder>" / "tenant:<owner>") -> lease id -> (bytes, pins)
        self._leases: dict[str, dict[int, tuple[int, int]]] = {}
        self._held: dict[str, int] = {}
        self._records = 0
        self.capped = 0        # lookups shortened
        self.capped_keys = 0   # keys those lookups did not report

    @staticmethod
    def buckets(holder: str, owner: str) -> list[str]:
        out = []
        if holder:
            out.append("client:" + holder)
        if owner:
            out.append("tenant:" + owner)
        return out

    def cap(self) -> float:
        state = self._state
        return state.config.pin_share * state.pool_capacity

    def held(self, bucket: str) -> int:
        return self._held.get(bucket, 0)

    def allow(self, holder: str, owner: str, slots: list[int], now: float) -> int:
        """How many of `slots` (a lookup's prefix, in order) this caller may pin."""
        buckets = self.buckets(holder, owner)
        if not buckets or not slots:
            return len(slots)
        space = self._state.objects.space
        need = sum([space[s] for s in slots])
        cap = self.cap()
        room = cap
        for b in buckets:
            held = self._held.get(b, 0)
            if held + need > cap:
                held = self._prune(b, now)
            room = min(room, cap - held)
        if need <= room:
            return len(slots)
        n = 0
        total = 0
        for s in slots:
            total += space[s]
            if total > room:
                break
            n += 1
        self.capped += 1
        self.capped_keys += len(slots) - n
        return n

    def granted(self, lease_id: int, holder: str, owner: str, slots: list[int]) -> None:
        """Record a lease just granted over `slots`."""
        buckets = self.buckets(holder, owner)
        if not buckets:
            return
        space = self._state.objects.space
        nbytes = sum([space[s] for s in slots])
        for b in buckets:
            self._leases.setdefault(b, {})[lease_id] = (nbytes, len(slots))
            self._held[b] = self._held.get(b, 0) + nbytes
        self._records += len(buckets)
        if self._records > 4 * len(self._state.leases) + _SWEEP_SLACK:
            self._sweep()

    def _prune(self, bucket: str, now: float) -> int:
        """Drop the bucket's records of leases no longer live, re-measure the trimmed
        ones; returns what the bucket holds."""
        records = self._leases.get(bucket)
        if not records:
            self._held.pop(bucket, None)
            return 0
        leases = self._state.leases
        t = self._state.objects
        keep: dict[int, tuple[int, int]] = {}
        total = 0
        for lease_id, (nbytes, pins) in records.items():
            try:
                lease = leases.get(lease_id, now)
            except (LeaseNotFound, LeaseExpired):
                continue
            if len(lease.tokens) != pins:  # trimmed (keep_first_n) since it was granted
                gen = t.gen
                space = t.space
                pins = len(lease.tokens)
                nbytes = sum([space[tok & SLOT_MASK] for tok in lease.tokens
                              if gen[tok & SLOT_MASK] == tok >> SLOT_BITS])
            keep[lease_id] = (nbytes, pins)
            total += nbytes
        self._records -= len(records) - len(keep)
        if keep:
            self._leases[bucket] = keep
            self._held[bucket] = total
        else:
            del self._leases[bucket]
            self._held.pop(bucket, None)
        return total

    def _sweep(self) -> None:
        """Forget released leases in every bucket (amortised over the grants)."""
        now = self._state.clock.now()
        for bucket in list(self._leases):
            self._prune(bucket, now)
