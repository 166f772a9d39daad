"""Reads: exists, lookup and get_replicas.

Only COMPLETE objects are visible. lookup and get_replicas pin what they find under a
new lease (pins.py) unless the caller reads under a lease it has, or asks for no pin;
an object found on SSD is answered IN_PROGRESS and starts its promotion (tiers.py).
get_replicas has a batch scan for the usual call (valid keys, objects in DRAM) beside
the per-key path; tests/unit/test_core_read_batch.py holds them to the same answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from kvstore.errors import Code

from .keys import all_valid, hashable, norm_key, norm_keys
from .lifecycle import COMPLETE
from .pin_cap import PinCap
from .pins import Pins
from .results import (
    GetReplicasResult,
    Location,
    LookupResult,
    ReadColumns,
    ReadResult,
)
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK
from .state import CoreState
from .tiers import Tiers

_new_tuple = tuple.__new__
WHOLE_FROM = 8  # keys from which read_columns tries `_all_found` first


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
        columns: bool = False,
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
        cols = self.read_columns(keys) if columns else None
        if cols is not None:
            table, found, slots = cols
            if not found:
                return GetReplicasResult(0, 0.0, [], table)
            lease_id, expires_at = self._pin_found(found, slots, holder, ttl, now, owner, pin)
            return GetReplicasResult(lease_id, expires_at, [], table)
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
        lease_id, expires_at = self._pin_found(found, slots, holder, ttl, now, owner, pin)
        for s in promote:
            self._tiers.queue_promotion(s)
        return GetReplicasResult(lease_id, expires_at, results)

    def _pin_found(self, found: list[bytes], slots: list[int], holder: str, ttl: float,
                   now: float, owner: str | None, pin: bool) -> tuple[int, float]:
        """The objects a lease-less read found: pinned under a new lease (its id and
        expiry), or (`pin` False) only touched."""
        if not pin:
            self._pins.touch(slots, now)
            return 0, 0.0
        lease = self._pins.grant(holder, found, slots, ttl, now, owner or "")
        return lease.lease_id, lease.expires_at

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

    def read_columns(
        self, keys: Sequence[bytes],
    ) -> tuple[ReadColumns, list[bytes], list[int]] | None:
        """read_batch's scan, its answers written straight into columns: no result or
        location object per key (what GetReplicas asked in columns costs per key). The
        same None where read_batch gives None."""
        if not all_valid(keys):
            return None
        # Column by column pays off from a few keys on; a call of one or two keys goes
        # key by key at once.
        whole = self._all_found(keys) if len(keys) >= WHOLE_FROM else None
        if whole is not None:
            return whole
        t = self._t
        get = t.index.get
        phase = t.phase
        complete = COMPLETE
        sizes = t.size
        checksums = t.checksum
        where = t.where
        placed = t.placed
        extra = t.extra
        by_id = self._state.segments.by_id
        ok, not_found = int(Code.OK), int(Code.NOT_FOUND)
        cols = ReadColumns()
        code, size_of, checksum_of = cols.codes.append, cols.sizes.append, cols.checksums.append
        placement_of, count = cols.placements.append, cols.counts.append
        at_range, at_addr, at_size = (cols.loc_ranges.append, cols.loc_addrs.append,
                                      cols.loc_sizes.append)
        ranges = cols.ranges
        range_of: dict[int, int] = {}  # segment id -> its index in `ranges`
        found: list[bytes] = []
        slots: list[int] = []
        for k in keys:
            s = get(k)
            if s is None or phase[s] != complete:
                code(not_found)
                size_of(0)
                checksum_of(0)
                placement_of(0)
                count(0)
                continue
            h = where[s]
            seg_id = h >> OFFSET_BITS
            seg = by_id[seg_id]
            if seg.tier != DRAM:
                return None
            size = sizes[s]
            code(ok)
            size_of(size)
            checksum_of(checksums[s])
            placement_of(placed[s])
            handles = (h,) if s not in extra else t.handles(s)
            count(len(handles))
            for h in handles:
                seg_id = h >> OFFSET_BITS
                index = range_of.get(seg_id)
                if index is None:
                    seg = by_id[seg_id]
                    index = range_of[seg_id] = len(ranges)
                    ranges.append((seg.node_id, seg.name, seg.tier))
                else:
                    seg = by_id[seg_id]
                at_range(index)
                at_addr(seg.base_addr + (h & OFFSET_MASK))
                at_size(size)
            found.append(k)
            slots.append(s)
        return cols, found, slots

    def _all_found(self, keys: Sequence[bytes],
                   ) -> tuple[ReadColumns, list[bytes], list[int]] | None:
        """read_columns of the usual batch, column by column: every key found COMPLETE,
        with one replica, in DRAM. None if any is not (the key-by-key scan's turn)."""
        t = self._t
        maybe = list(map(t.index.get, keys))
        if None in maybe:
            return None
        slots = cast(list[int], maybe)  # no None: checked
        phase = t.phase
        complete = COMPLETE
        extra = t.extra
        if any(phase[s] != complete for s in slots) or (
                extra and any(s in extra for s in slots)):
            return None
        where = t.where
        handles = [where[s] for s in slots]
        by_id = self._state.segments.by_id
        seg_ids = {h >> OFFSET_BITS for h in handles}
        segs = [by_id[i] for i in seg_ids]
        if any(seg.tier != DRAM for seg in segs):
            return None
        range_of = {i: n for n, i in enumerate(seg_ids)}
        base_of = {i: seg.base_addr for i, seg in zip(seg_ids, segs, strict=True)}
        sizes = t.size
        checksums = t.checksum
        placed = t.placed
        n = len(slots)
        size_list = [sizes[s] for s in slots]
        bits, mask = OFFSET_BITS, OFFSET_MASK
        cols = ReadColumns(
            [int(Code.OK)] * n, size_list, [checksums[s] for s in slots],
            [placed[s] for s in slots], [1] * n,
            [range_of[h >> bits] for h in handles],
            [base_of[h >> bits] + (h & mask) for h in handles], size_list,
            [(seg.node_id, seg.name, seg.tier) for seg in segs])
        return cols, list(keys), slots

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
        new = _new_tuple
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
                locations = [new(Location, (seg.node_id, seg.name,
                                            seg.base_addr + (h & OFFSET_MASK), size, tier))]
            result(ReadResult(ok, size, checksums[s], locations, placed[s]))
            found.append(k)
            slots.append(s)
        return results, found, slots
