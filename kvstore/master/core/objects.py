"""The object index: key -> object, and every object's record, stored as columns.

An object lives in a *slot*: a small integer that indexes parallel typed arrays (size,
checksum, first replica, DRAM footprint, pin count, generation, placement, two
timestamps). The index maps each key to its slot.

Why columns and not one slotted Python object per record: a `__slots__` record with its
own int and float objects costs ~240 bytes per object before the key; as array columns
the same fields cost ~70 bytes, and the whole core ~145 bytes per object on top of the
key's own ~100 (bench/master_memory.py, 1M objects). The master holds every object of
the cluster in memory, so this decides how many objects one master can index.

A slot is reused after its object goes, so anything that must refer to one particular
object across calls (a lease) holds a *token*: slot and generation together. The
generation of a slot changes every time it is freed, so a token of a removed object
never matches the object that later takes its slot.

The *placement* of an object names its current set of replica ranges: a table-wide
counter, stamped when the object is created and whenever its ranges change
(`set_handles`). A reader that saw placement P at locations L and later sees P again
knows the object sat at L, unchanged, all along; no other set of ranges of any object
gets P until the 32-bit counter wraps (4 billion placements later), which is why a
client trusts such a memory only for seconds (see the client's placement cache).

A slot's *phase* (GONE, PENDING, COMPLETE: lifecycle.py, which holds the whole
lifecycle) is written here only: PENDING by new(), COMPLETE by complete(), GONE by
free(). The pin count of a COMPLETE object (pins: leases, and a tier move's own pin)
is written by pins.py only, which sets it to 0 when the object becomes COMPLETE; in
another phase it means nothing. Slot 0 is never used so that 0 can serve as a
sentinel (the LRU list's head).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from itertools import count, islice, repeat

from .lifecycle import COMPLETE, GONE, PENDING

SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1
_GEN_MASK = 0xFFFFFFFF


class PendingWrite:
    """What only a PENDING object needs: who is writing it and until when."""

    __slots__ = ("deadline", "writer")

    def __init__(self, writer: str, deadline: float) -> None:
        self.writer = writer
        self.deadline = deadline


def tenant_prefix(key: bytes) -> bytes:
    """`b"team-a/"` for b"team-a/block-7": the master stores a tenant's keys this way."""
    i = key.find(b"/")
    return key[:i + 1] if i > 0 else b""


class ObjectTable:
    __slots__ = (
        "_free_slots",
        "checksum",
        "created",
        "extra",
        "gen",
        "index",
        "key_of",
        "pending",
        "phase",
        "pins",
        "placed",
        "placements",
        "room",
        "size",
        "space",
        "touched",
        "usage",
        "where",
    )

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.key_of: list[bytes | None] = [None]
        self.size = array("q", [0])
        self.checksum = array("Q", [0])
        self.where = array("Q", [0])  # handle of the first replica
        self.space = array("q", [0])  # DRAM bytes held across all replicas
        self.phase = array("b", [GONE])
        self.pins = array("i", [0])
        self.gen = array("I", [0])
        self.placed = array("I", [0])
        self.placements = 0  # the last placement stamped; 0 never names one
        self.created = array("d", [0.0])
        self.touched = array("d", [0.0])
        # Replicas beyond the first, only for the objects that have them.
        self.extra: dict[int, tuple[int, ...]] = {}
        # Bytes each DRAM replica holds after the value (a put record's room, see
        # kvstore/put_record.py), only for the objects that have them.
        self.room: dict[int, int] = {}
        # PENDING objects in start order: deadlines are start + put_timeout, so the
        # oldest come first and reclaiming stops at the first one still in time.
        self.pending: dict[int, PendingWrite] = {}
        self._free_slots: list[int] = []
        # Bytes per tenant key prefix (b"team-a/"), kept only for tenants with a quota;
        # None when no tenant has one, so the common path pays nothing.
        self.usage: dict[bytes, int] | None = None

    def __len__(self) -> int:
        return len(self.index)

    @property
    def slots(self) -> int:
        """Slots ever allocated, the length every per-slot column must have."""
        return len(self.key_of)

    def new(
        self,
        key: bytes,
        size: int,
        checksum: int,
        handles: Iterable[int],
        space: int,
        now: float,
    ) -> int:
        """Index a new object, PENDING until the caller says otherwise."""
        first, *rest = handles
        if self._free_slots:
            s = self._free_slots.pop()
            self.key_of[s] = key
            self.size[s] = size
            self.checksum[s] = checksum
            self.where[s] = first
            self.space[s] = space
            self.phase[s] = PENDING
            self.placed[s] = self._next_placement()
            self.created[s] = now
            self.touched[s] = now
        else:
            s = len(self.key_of)
            if s > SLOT_MASK:
                raise OverflowError("object slots exhausted")
            self.key_of.append(key)
            self.size.append(size)
            self.checksum.append(checksum)
            self.where.append(first)
            self.space.append(space)
            self.phase.append(PENDING)
            self.pins.append(0)
            self.gen.append(0)
            self.placed.append(self._next_placement())
            self.created.append(now)
            self.touched.append(now)
        if rest:
            self.extra[s] = tuple(rest)
        self.index[key] = s
        usage = self.usage
        if usage is not None:
            p = tenant_prefix(key)
            if p in usage:
                usage[p] += size
        return s

    def new_many(
        self,
        keys: list[bytes],
        sizes: list[int],
        checksums: list[int],
        firsts: list[int],
        spaces: list[int],
        now: float,
    ) -> list[int]:
        """new(key, size, checksum, (first,), space, now) for each object in turn (one
        replica each; set `extra` afterwards for more): the same slots and placements,
        with the column appends done in bulk. Returns the slots."""
        n = len(keys)
        all_keys, all_sizes = keys, sizes
        free = self._free_slots
        reuse = min(n, len(free))
        out: list[int] = []
        p = self.placements
        placed = self.placed
        if reuse:
            taken = free[-reuse:]
            del free[-reuse:]
            taken.reverse()  # the order pop() would hand them out
            first = taken[0]
            if reuse > 1 and p + reuse <= _GEN_MASK and (
                    taken == list(range(first, first + reuse))
                    or taken == list(range(first, first - reuse, -1))):
                # A run of neighbouring slots (a batch freed together, the usual case):
                # one slice store per column instead of one store per slot and column.
                ks = keys[:reuse]
                zs, cs, ws, sps = sizes[:reuse], checksums[:reuse], firsts[:reuse], spaces[:reuse]
                ps = list(range(p + 1, p + reuse + 1))
                p += reuse
                if taken[1] < first:  # descending: slot first - i gets object i
                    lo = first - reuse + 1
                    ks.reverse()
                    for col in (zs, cs, ws, sps, ps):
                        col.reverse()
                else:
                    lo = first
                hi = lo + reuse
                self.key_of[lo:hi] = ks
                self.size[lo:hi] = array("q", zs)
                self.checksum[lo:hi] = array("Q", cs)
                self.where[lo:hi] = array("Q", ws)
                self.space[lo:hi] = array("q", sps)
                self.phase[lo:hi] = array("b", [PENDING]) * reuse
                self.placed[lo:hi] = array("I", ps)
                stamp = array("d", [now]) * reuse
                self.created[lo:hi] = stamp
                self.touched[lo:hi] = stamp
                out = taken
            else:
                key_of = self.key_of
                size = self.size
                checksum = self.checksum
                where = self.where
                space = self.space
                phase = self.phase
                created = self.created
                touched = self.touched
                for i, s in enumerate(taken):
                    key_of[s] = keys[i]
                    size[s] = sizes[i]
                    checksum[s] = checksums[i]
                    where[s] = firsts[i]
                    space[s] = spaces[i]
                    phase[s] = PENDING
                    p = p % _GEN_MASK + 1
                    placed[s] = p
                    created[s] = now
                    touched[s] = now
                out = taken
        m = n - reuse
        if m:
            s0 = len(self.key_of)
            if s0 + m - 1 > SLOT_MASK:
                raise OverflowError("object slots exhausted")
            if reuse:
                keys, sizes, checksums = keys[reuse:], sizes[reuse:], checksums[reuse:]
                firsts, spaces = firsts[reuse:], spaces[reuse:]
            self.key_of.extend(keys)
            self.size.extend(sizes)
            self.checksum.extend(checksums)
            self.where.extend(firsts)
            self.space.extend(spaces)
            self.phase.extend(repeat(PENDING, m))
            self.pins.extend(repeat(0, m))
            self.gen.extend(repeat(0, m))
            if p + m <= _GEN_MASK:
                placed.extend(range(p + 1, p + m + 1))
                p += m
            else:
                for _ in range(m):
                    p = p % _GEN_MASK + 1
                    placed.append(p)
            self.created.extend(repeat(now, m))
            self.touched.extend(repeat(now, m))
            # count(), not range(): same ints, but tracemalloc (bench/master_memory.py)
            # sees 28 bytes for each of these, as for new()'s len(), not range's 32.
            out.extend(islice(count(s0), m))
        self.placements = p
        self.index.update(zip(all_keys, out, strict=True))
        usage = self.usage
        if usage is not None:
            for key, z in zip(all_keys, all_sizes, strict=True):
                pref = tenant_prefix(key)
                if pref in usage:
                    usage[pref] += z
        return out

    def extent(self, s: int) -> int:
        """The bytes each of object s's DRAM replicas took from its allocator: the value
        and the record room after it."""
        return self.size[s] + self.room.get(s, 0)

    def rename(self, s: int, key: bytes) -> None:
        """Index the object in slot s under `key` instead (not indexed yet); its bytes
        move to the new key's tenant in the usage counts."""
        old = self.key_of[s]
        assert old is not None and key not in self.index
        del self.index[old]
        self.index[key] = s
        self.key_of[s] = key
        usage = self.usage
        if usage is not None:
            was, now = tenant_prefix(old), tenant_prefix(key)
            if was != now:
                size = self.size[s]
                if was in usage:
                    usage[was] -= size
                if now in usage:
                    usage[now] += size

    def free(self, s: int) -> None:
        key = self.key_of[s]
        assert key is not None
        del self.index[key]
        usage = self.usage
        if usage is not None:
            p = tenant_prefix(key)
            if p in usage:
                usage[p] -= self.size[s]
        self.key_of[s] = None
        self.phase[s] = GONE
        self.gen[s] = (self.gen[s] + 1) & _GEN_MASK
        self.extra.pop(s, None)
        self.room.pop(s, None)
        self.pending.pop(s, None)
        self._free_slots.append(s)

    def complete(self, slots: list[int]) -> None:
        """PENDING slots become COMPLETE (Pins.commit, Pins.adopt: the callers that set
        their pins)."""
        phase = self.phase
        for s in slots:
            phase[s] = COMPLETE

    def handles(self, s: int) -> tuple[int, ...]:
        rest = self.extra.get(s)
        return (self.where[s], *rest) if rest else (self.where[s],)

    def _next_placement(self) -> int:
        p = self.placements % _GEN_MASK + 1  # 1 .. 2**32-1
        self.placements = p
        return p

    def set_handles(self, s: int, handles: tuple[int, ...]) -> None:
        self.placed[s] = self._next_placement()
        self.where[s] = handles[0]
        if len(handles) > 1:
            self.extra[s] = handles[1:]
        else:
            self.extra.pop(s, None)

    def slot_of(self, token: int) -> int:
        """The slot a token names, or 0 when that object is gone."""
        s = token & SLOT_MASK
        if self.gen[s] != token >> SLOT_BITS or self.phase[s] == GONE:
            return 0
        return s
