"""Reads: exists, lookup and get_replicas.

Only COMPLETE objects are visible. lookup and get_replicas pin what they find under a
new lease (pins.py) unless the caller reads under a lease it has, or asks for no pin;
an object found on SSD is answered IN_PROGRESS and starts its promotion (tiers.py).
get_replicas has a batch scan for the usual call (valid keys, objects in DRAM) beside
the per-key path; tests/unit/test_core_read_batch.py holds them to the same answers.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import Code

from .keys import all_valid, hashable, norm_key, norm_keys
from .lifecycle import COMPLETE
from .pin_cap import PinCap
from .pins import Pins
from .results import (
    GetReplicasResult,
    Location,
    LookupResult,
    ReadResult,
    _set_addr,
    _set_node_id,
    _set_segment,
    _set_size,
    _set_tier,
)
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK
from .state import CoreState
from .tiers import Tiers

_new_object = object.__new__


class Reads:
    def __init__(self, state: CoreState, pins: Pins, tiers: Tiers) -> None:
        self._state = state
        self._t = state.objects
        self._pins = pins
        self._tiers = tiers
        self.pin_cap: PinCap | None = None  # the facade sets it

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """MasterCore.exists."""
        self._state.check_batch(len(keys))
        get = self._t.index.get
        phase = self._t.phase
        complete = COMPLETE
        out: list[bool] = []
        append = out.append
        # A bytes key needs no length check here: the index holds only usable keys. An
        # unusable key of another type normalises to None, which is not there either.
        for key in keys:
            s = get(key if type(key) is bytes else norm_key(key))  # type: ignore[arg-type]
            append(s is not None and phase[s] == complete)
        return out

    def lookup(self, keys: Sequence[bytes], lease_ttl: float | None, holder: str,
               owner: str) -> LookupResult:
        """MasterCore.lookup."""
        state = self._state
        state.check_batch(len(keys))
        ttl = state.ttl(lease_ttl)
        t = self._t
        get = t.index.get
        phase = t.phase
        complete = COMPLETE
        slots: list[int] = []
        hit = slots.append
        try:
            for key in keys:
                s = get(key)
                if s is None or phase[s] != complete:
                    break
                hit(s)
        except TypeError:
            # An unhashable key (bytearray, list ...): retry with normalised keys.
            return self.lookup(hashable(keys), lease_ttl, holder, owner)
        count = len(slots)
        c = state.counts
        c.lookups += 1
        c.lookup_keys += len(keys)
        c.hit_keys += count
        if not count:
            return LookupResult(0, 0, 0.0)
        now = state.clock.now()
        cap = self.pin_cap
        if cap is not None:
            count = cap.allow(holder, owner, slots, now)
            if count < len(slots):
                c.hit_keys -= len(slots) - count  # hits are what the lookup reports
                del slots[count:]
                if not count:
                    return LookupResult(0, 0, 0.0)
        lease = self._pins.grant(holder, list(keys[:count]), slots, ttl, now, owner)
        if cap is not None:
            cap.granted(lease.lease_id, holder, owner, slots)
        if state.tiered:
            # Hits on SSD start their way back to DRAM now, so the load finds them there.
            by_id = state.segments.by_id
            for s in slots:
                if by_id[t.where[s] >> OFFSET_BITS].tier != DRAM:
                    self._tiers.queue_promotion(s)
        return LookupResult(count, lease.lease_id, lease.expires_at)

    def get_replicas(
        self,
        keys: Sequence[bytes],
        lease_id: int | None,
        lease_ttl: float | None,
        holder: str,
        owner: str | None,
        pin: bool,
    ) -> GetReplicasResult:
        """MasterCore.get_replicas."""
        state = self._state
        state.check_batch(len(keys))
        ttl = state.ttl(lease_ttl)
        now = state.clock.now()
        t = self._t
        results: list[ReadResult] = []
        if lease_id:
            lease = state.leases.get(lease_id, now, owner)
            touched = t.touched
            read = self.read_result
            for k in norm_keys(keys):
                if k is None:
                    results.append(ReadResult(Code.INVALID_ARGUMENT))
                    continue
                token = lease.token_for(k)
                if not token:
                    results.append(ReadResult(Code.LEASE_NOT_FOUND))
                    continue
                s = t.slot_of(token)
                if not s:
                    results.append(ReadResult(Code.NOT_FOUND))
                    continue
                touched[s] = now
                results.append(read(s))
            return GetReplicasResult(lease.lease_id, lease.expires_at, results)
        batch = self.read_batch(keys)
        # SSD objects found, whose promotions start once the batch is pinned: a promotion
        # may demote to make room, and the demotion evict from SSD, which must not take
        # an object this batch has found and not yet pinned.
        promote: list[int] = []
        if batch is not None:
            results, found, slots = batch
        else:
            found = []
            for key in keys:
                k = norm_key(key)
                if k is None:
                    results.append(ReadResult(Code.INVALID_ARGUMENT))
                    continue
                slot = t.index.get(k)
                if slot is None or t.phase[slot] != COMPLETE:
                    results.append(ReadResult(Code.NOT_FOUND))
                    continue
                found.append(k)
                results.append(self.read_result(slot, promote))
            index = t.index
            slots = [index[k] for k in found] if found else []
        if not found:
            return GetReplicasResult(0, 0.0, results)
        if not pin:
            self._pins.touch(slots, now)
            lease_id, expires_at = 0, 0.0
        else:
            lease = self._pins.grant(holder, found, slots, ttl, now, owner or "")
            lease_id, expires_at = lease.lease_id, lease.expires_at
        for s in promote:
            self._tiers.queue_promotion(s)
        return GetReplicasResult(lease_id, expires_at, results)

    def read_result(self, s: int, promote: list[int] | None = None) -> ReadResult:
        """Where to read object s. On SSD: IN_PROGRESS, and its promotion starts now, or
        (`promote`) is added there for the caller to start."""
        t = self._t
        state = self._state
        size = t.size[s]
        h = t.where[s]
        seg = state.segments.by_id[h >> OFFSET_BITS]
        if seg.tier != DRAM:
            # Not readable over the Transfer Engine from a file: bring it into DRAM
            # first; the reader asks again shortly (the object is pinned meanwhile).
            if promote is None:
                self._tiers.queue_promotion(s)
            else:
                promote.append(s)
            return ReadResult(Code.IN_PROGRESS, size, t.checksum[s])
        locations = [Location(seg.node_id, seg.name, seg.base_addr + (h & OFFSET_MASK), size, seg.tier)]
        if s in t.extra:
            locations = state.locations(s)
        return ReadResult(Code.OK, size, t.checksum[s], locations, t.placed[s])

    def read_batch(
        self, keys: Sequence[bytes],
    ) -> tuple[list[ReadResult], list[bytes], list[int]] | None:
        """get_replicas's scan without a lease, when every key is bytes of a valid length
        and every object found sits in DRAM: the results (each what read_result or
        NOT_FOUND would give), the keys found and their slots, in order; nothing is
        changed. None (the per-key path's turn) otherwise: an invalid key, or an object
        on SSD, whose promotion must be queued at its place in the scan."""
        if not all_valid(keys):
            return None
        t = self._t
        state = self._state
        get = t.index.get
        phase = t.phase
        complete = COMPLETE
        sizes = t.size
        checksums = t.checksum
        where = t.where
        placed = t.placed
        extra = t.extra
        by_id = state.segments.by_id
        new = _new_object
        ok = Code.OK
        not_found = Code.NOT_FOUND
        results: list[ReadResult] = []
        result = results.append
        found: list[bytes] = []
        slots: list[int] = []
        for k in keys:
            s = get(k)
            if s is None or phase[s] != complete:
                result(ReadResult(not_found))
                continue
            h = where[s]
            seg = by_id[h >> OFFSET_BITS]
            tier = seg.tier
            if tier != DRAM:
                return None
            size = sizes[s]
            if s in extra:
                locations = state.locations(s)
            else:
                # location(), inlined: one call less per key on the hottest read.
                loc = new(Location)
                _set_node_id(loc, seg.node_id)
                _set_segment(loc, seg.name)
                _set_addr(loc, seg.base_addr + (h & OFFSET_MASK))
                _set_size(loc, size)
                _set_tier(loc, tier)
                locations = [loc]
            result(ReadResult(ok, size, checksums[s], locations, placed[s]))
            found.append(k)
            slots.append(s)
        return results, found, slots
