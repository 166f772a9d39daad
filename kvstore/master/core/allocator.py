"""Free-space bookkeeping for one segment: which byte ranges are free, nothing else.

The allocator keeps only the *free* extents. It has no record per allocation: the object
index already knows each replica's offset and size and hands both back on free, so a
million objects cost the allocator nothing beyond the free extents between them.

Best fit over two sorted views of the same extents — by (length, offset) to find the
smallest extent that fits, by offset to coalesce a freed range with its neighbours — so
allocate, free and reserve are O(log extents). Best fit keeps the large extents whole for
large objects; ties go to the lowest offset, which packs objects toward the front.
"""

from __future__ import annotations

from sortedcontainers import SortedDict, SortedList

from kvstore.errors import Internal


class ExtentAllocator:
    """Aligned allocation of [offset, offset + length) ranges inside
    [start, start + capacity): `start` is where a master shard's part of a node's segment
    begins (offsets stay relative to the segment, so the node reads them as they are)."""

    __slots__ = ("_align_mask", "_by_offset", "_by_size", "alignment", "capacity", "free_bytes",
                 "start")

    def __init__(self, size: int, alignment: int, start: int = 0) -> None:
        self.alignment = alignment
        self._align_mask = alignment - 1
        # A tail shorter than one alignment unit can never hold an aligned object.
        self.capacity = size & ~self._align_mask
        self.free_bytes = self.capacity
        self._by_offset: SortedDict = SortedDict()
        self._by_size: SortedList = SortedList()
        self.start = start
        if self.capacity:
            self._add(start, self.capacity)

    # -- queries -------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self.capacity - self.free_bytes

    def largest_free(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    def extents(self) -> int:
        return len(self._by_offset)

    def round_up(self, size: int) -> int:
        return (size + self._align_mask) & ~self._align_mask

    # -- verbs ---------------------------------------------------------------------

    def allocate(self, size: int) -> int:
        """Offset of a new range of `size` bytes (rounded up), or -1 if none fits."""
        need = (size + self._align_mask) & ~self._align_mask
        by_size = self._by_size
        i = by_size.bisect_left((need, -1))
        if i == len(by_size):
            return -1
        length, start = by_size.pop(i)
        del self._by_offset[start]
        if length > need:
            self._add(start + need, length - need)
        self.free_bytes -= need
        return start

    def allocate_run(self, size: int, count: int) -> list[int]:
        """The offsets `count` calls of allocate(size) would return, in order (-1 for
        each that would not fit), with one extent update per extent used instead of one
        per range.

        Exact, not an approximation: best fit carves each range from the front of the
        smallest extent that fits, and what is left of that extent is then smaller than
        every other extent that fits, so the next calls carve from it too until it is
        too short; only then does best fit move on to the next smallest extent.
        """
        need = (size + self._align_mask) & ~self._align_mask
        if need <= 0 or count <= 0:
            return [self.allocate(size) for _ in range(count)]
        by_size = self._by_size
        out: list[int] = []
        while count:
            i = by_size.bisect_left((need, -1))
            if i == len(by_size):
                out.extend([-1] * count)
                break
            length, start = by_size.pop(i)
            del self._by_offset[start]
            k = min(count, length // need)
            taken = k * need
            out.extend(range(start, start + taken, need))
            if length > taken:
                self._add(start + taken, length - taken)
            self.free_bytes -= taken
            count -= k
        return out

    def free_many(self, ranges: list[tuple[int, int]]) -> None:
        """free() for every (offset, size) in `ranges`, ranges that touch freed as one.

        The free extents are always fully coalesced, so they depend only on which bytes
        are free, not on the order or grouping of the frees that freed them: merging
        adjacent ranges first leaves exactly the state one free() per range would.
        """
        m = self._align_mask
        spans = sorted([(o & ~m, (o + z + m) & ~m) for o, z in ranges])
        if not spans:
            return
        start, end = spans[0]
        for s, e in spans[1:]:
            if s > end:
                self._free_span(start, end)
                start, end = s, e
            elif s == end:
                end = e
            else:
                raise Internal(f"double free of [{s}, {e}): overlaps [{start}, {end}) freed with it")
        self._free_span(start, end)

    def free(self, offset: int, size: int) -> None:
        """Return a range obtained from allocate() or reserve() with the same size."""
        self._free_span(offset & ~self._align_mask,
                        (offset + size + self._align_mask) & ~self._align_mask)

    def _free_span(self, start: int, end: int) -> None:
        freed = end - start
        by_offset = self._by_offset
        i = by_offset.bisect_right(start)
        if i:
            p_start = by_offset.keys()[i - 1]
            p_end = p_start + by_offset[p_start]
            if p_end > start:
                raise Internal(f"double free of [{start}, {end}): overlaps free [{p_start}, {p_end})")
            if p_end == start:
                self._remove(p_start, p_end - p_start)
                start = p_start
                i -= 1
        if i < len(by_offset):
            n_start = by_offset.keys()[i]
            if n_start < end:
                raise Internal(f"double free of [{start}, {end}): overlaps free extent at {n_start}")
            if n_start == end:
                end = n_start + by_offset[n_start]
                self._remove(n_start, end - n_start)
        self.free_bytes += freed
        self._add(start, end - start)

    def reserve(self, offset: int, size: int) -> bool:
        """Mark a given range used (rebuilding from a store node's inventory).

        False when any byte of it is outside the segment or already used.
        """
        start = offset & ~self._align_mask
        end = (offset + size + self._align_mask) & ~self._align_mask
        if start < self.start or size <= 0 or end > self.start + self.capacity:
            return False
        by_offset = self._by_offset
        i = by_offset.bisect_right(start)
        if not i:
            return False
        f_start = by_offset.keys()[i - 1]
        f_end = f_start + by_offset[f_start]
        if f_end < end:
            return False
        self._remove(f_start, f_end - f_start)
        if f_start < start:
            self._add(f_start, start - f_start)
        if end < f_end:
            self._add(end, f_end - end)
        self.free_bytes -= end - start
        return True

    # -- internals -----------------------------------------------------------------

    def _add(self, start: int, length: int) -> None:
        self._by_offset[start] = length
        self._by_size.add((length, start))

    def _remove(self, start: int, length: int) -> None:
        del self._by_offset[start]
        self._by_size.remove((length, start))
