"""put_start's batch path: a whole batch placed with a few allocator calls per segment.

The general path (writes.put_each) places new objects one at a time; when nothing in a
batch can fail, this computes the same placements with arithmetic and bulk allocations
instead, and must stay indistinguishable from it: tests/unit/test_core_batch_alloc.py
drives two cores, one with this path switched off, and compares everything.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import repeat

from kvstore.errors import Code

from .checks import all_objects, is_checksum, is_size
from .keys import all_valid, norm_keys
from .objects import PendingWrite
from .results import Location, PutStartResult, location
from .segments import OFFSET_BITS
from .state import CoreState

_new_object = object.__new__


def all_new(keys: Sequence[object], sizes: Sequence[object], checksums: Sequence[object],
            largest: int, index: dict[bytes, int]) -> bool:
    """True when every key is bytes of a valid length, distinct and not indexed, every
    size and checksum passes the object check (checks.py) and no size is above
    `largest`: what put_start's per-key checks would find of each, without a
    Python-level loop."""
    return (
        all_valid(keys)
        and all_objects(sizes, checksums, largest)
        and len(set(keys)) == len(keys)
        and index.keys().isdisjoint(keys)
    )


class BatchPut:
    def __init__(self, state: CoreState) -> None:
        self._state = state
        self._t = state.objects

    def put(  # noqa: C901 (the batch path is the single-put rules unrolled for speed; the twin test checks it)
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
        room: int = 0,
    ) -> tuple[list[PutStartResult | None], bool] | None:
        """put_start of a whole batch with a few allocator calls per segment instead of
        one per replica; None, having changed nothing, when it cannot promise exactly
        the results and state of Writes.put_each (the caller then runs that). Else
        (results, whole): `whole` False when some positions are None, keys this path
        placed nothing for, which the caller answers in order (Writes.fill_batch).

        put_each places the new objects one at a time: each on the DRAM segment with
        the most free bytes among those with an extent that fits (want > 1: the `want`
        such segments, most free first), best fit inside it. When every segment that
        would receive objects has one free extent at least as large as all it would
        receive together, no placement can fail, so nothing is evicted and nothing is
        refused: which segment each object goes to then depends only on the segments'
        free bytes, which this replays with arithmetic, and the offsets inside each
        segment are those of the same sequence of best-fit allocations
        (ExtentAllocator.allocate_run). Keys that place nothing (invalid, repeated,
        already there, too large) are left to put_one, which changes no space for them.
        Quotas (which may evict per key) always take the general path. `room`: bytes
        set aside after each value (a placeholder's record room, put_start(ahead=True)
        only, which never falls back to put_each).
        """
        state = self._state
        dram = state.dram
        t = self._t
        if not dram or t.usage is not None or not keys:
            return None
        index = t.index
        mask = state.align_mask
        # 1. Which positions create an object (all of put_one's checks pass).
        if all_new(keys, sizes, checksums, largest, index):
            # The usual batch, checked at C speed: every key new, distinct and valid.
            new_at: Sequence[int] = range(len(keys))
            new_keys = list(keys)
            new_sizes = list(sizes)
            new_checksums = list(checksums)
        else:
            new_at = []  # positions
            new_keys = []
            new_sizes = []
            new_checksums = []
            first_seen: set[bytes] = set()
            for pos, (k, size, checksum) in enumerate(zip(norm_keys(keys), sizes, checksums,
                                                          strict=True)):
                if k is not None and k not in first_seen:
                    first_seen.add(k)
                    if is_size(size) and size <= largest and is_checksum(checksum) \
                            and k not in index:
                        new_at.append(pos)
                        new_keys.append(k)
                        new_sizes.append(size)
                        new_checksums.append(checksum)
            if not new_at:
                return None
        # 2. Which segments each new object would get, and whether it surely fits.
        asizes = [(z + room + mask) & ~mask for z in new_sizes]
        nseg = len(dram)
        # flat[j * want + r]: the index in dram of new object j's replica r (None: all
        # on dram[0], the only segment).
        flat: list[int] | None = None
        if nseg == 1:
            totals = [sum(asizes)]
        else:
            totals = [0] * nseg
            flat = []
            pick = flat.append
            # Most free bytes first, ties to the earlier segment: place()'s order.
            heap = [(-seg.alloc.free_bytes, i) for i, seg in enumerate(dram)]
            heapq.heapify(heap)
            if want == 1:
                replace = heapq.heapreplace
                for a in asizes:
                    free, i = heap[0]
                    replace(heap, (free + a, i))
                    totals[i] += a
                    pick(i)
            else:
                pop = heapq.heappop
                push = heapq.heappush
                for a in asizes:
                    top = [pop(heap) for _ in range(want)]
                    for free, i in top:
                        push(heap, (free + a, i))
                        totals[i] += a
                        pick(i)
        for seg, total in zip(dram, totals, strict=True):
            if total and seg.alloc.largest_free() < total:
                return None
        # 3. Allocate, segment by segment, in the order put_each would have.
        if flat is None:
            wants = [asizes]
        else:
            wants = [[] for _ in dram]
            per_replica = asizes if want == 1 else [a for a in asizes for _ in range(want)]
            for i, a in zip(flat, per_replica, strict=True):
                wants[i].append(a)
        offsets: list[list[int]] = []
        for seg, mine in zip(dram, wants, strict=False):
            got: list[int] = []
            j = 0
            while j < len(mine):
                a = mine[j]
                run = j + 1
                while run < len(mine) and mine[run] == a:
                    run += 1
                got += seg.take_run(a, run - j)
                j = run
            offsets.append(got)
        # 4. Index the objects (slots and placements in key order, as put_each would)
        # and answer.
        make_location = location
        extras: list[tuple[int, ...]] | None = None
        spaces = asizes
        if flat is None:
            seg = dram[0]
            node_id, name, base, tier = seg.node_id, seg.name, seg.base_addr, seg.tier
            h0 = seg.seg_id << OFFSET_BITS
            offs = offsets[0]
            firsts = [h0 | o for o in offs]
            locations = [[make_location(node_id, name, base + o, z, tier)]
                         for o, z in zip(offs, new_sizes, strict=True)]
        else:
            its = [iter(o) for o in offsets]
            info = [(seg.seg_id << OFFSET_BITS, seg.node_id, seg.name, seg.base_addr, seg.tier)
                    for seg in dram]
            firsts = []
            locations = []
            if want == 1:
                for i, z in zip(flat, new_sizes, strict=True):
                    h0, node_id, name, base, tier = info[i]
                    o = next(its[i])
                    firsts.append(h0 | o)
                    locations.append([make_location(node_id, name, base + o, z, tier)])
            else:
                extras = []
                spaces = [a * want for a in asizes]
                for j, z in enumerate(new_sizes):
                    handles: list[int] = []
                    locs: list[Location] = []
                    for i in flat[j * want:(j + 1) * want]:
                        h0, node_id, name, base, tier = info[i]
                        o = next(its[i])
                        handles.append(h0 | o)
                        locs.append(make_location(node_id, name, base + o, z, tier))
                    firsts.append(handles[0])
                    extras.append(tuple(handles[1:]))
                    locations.append(locs)
        slots = t.new_many(new_keys, new_sizes, new_checksums, firsts, spaces, now)
        if extras is not None:
            extra = t.extra
            for s, rest in zip(slots, extras, strict=True):
                if rest:
                    extra[s] = rest
        if room:
            t.room.update(zip(slots, repeat(room)))
        # A PendingWrite never changes: the objects of one batch can share one.
        t.pending.update(zip(slots, repeat(PendingWrite(writer, deadline))))
        made: list[PutStartResult] = []
        ok = Code.OK
        placed = t.placed
        new_result = _new_object
        for s, locs in zip(slots, locations, strict=True):
            r = new_result(PutStartResult)  # PutStartResult(ok, locs, "", placed[s]), faster
            r.code = ok
            r.locations = locs
            r.message = ""
            r.placement = placed[s]
            made.append(r)
        added_space = sum(spaces)
        added_size = sum(new_sizes)
        if t.slots > len(state.lru.prev):
            state.grow_lrus()
        state.ledger.started(added_space, added_size)
        if len(made) == len(keys):
            return made, True  # type: ignore[return-value]  # (list is invariant)
        results: list[PutStartResult | None] = [None] * len(keys)
        for pos, r in zip(new_at, made, strict=True):
            results[pos] = r
        return results, False
