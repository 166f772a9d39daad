"""The SSD tier's index and its byte cap: which keys are stored, in what order they were
last used, and how many bytes on disk they and the puts in flight take. No files, no
locks, no clock: `SsdTier` (ssd.py) calls it under its one lock and does the I/O around
it, and the tests drive it with plain method calls.

Three byte counts, one writer (this class):
- stored: the files of indexed objects, each at its exact length (`SsdEntry.disk_bytes`).
- reserved: room held by puts between `plan_put` and `finish_put`.
- used: what the cap limits: stored + reserved + files taken out of the index whose unlink
  has not finished yet. Room is counted before a put writes its first byte and released
  only after a victim's unlink, so the files present never add up to more than the cap,
  even in the middle of a put.

A key is "busy" while it is being written or unlinked; the tier makes another put or
remove of that key wait, so a put racing a remove can never leave a half file visible,
nor have its fresh file unlinked by a remove that started earlier.

Eviction is exact LRU over an OrderedDict, the same reasoning as the master's
`core/eviction.py`: O(1) per touch and O(evicted) per put, and no sampling error to
explain. Who evicts: the master decides (it counts every SSD object at a worst-case size
against this same cap); the cap here is the node's hard limit for the moments the two
views differ. docs/ssd.md, "Who evicts from the SSD tier", has the argument.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvstore.errors import StoreFull


@dataclass(frozen=True, slots=True)
class SsdEntry:
    key: bytes
    size: int  # object bytes
    checksum: int  # xxh3_64 of the object bytes
    disk_bytes: int  # exact file length (header, key, data, padding); what the cap counts
    path: str
    offset: int = 0  # where the record starts in its file (a pack's; 0 for an object file)

    @property
    def packed(self) -> bool:
        return self.path.endswith(".kvp")


@dataclass(frozen=True, slots=True)
class PutPlan:
    """What `plan_put` decided for one put: its room and the victims it must unlink first."""

    key: bytes
    need: int  # the new file's exact length
    victims: tuple[SsdEntry, ...]  # least recently used first; out of the index already
    hold: int  # bytes this put counts until its victims are unlinked: max(need, freed)


def over_cap(oldest_first: Sequence[SsdEntry], capacity_bytes: int) -> int:
    """How many of the oldest entries to drop so that the rest fit in `capacity_bytes`
    (re-indexing after a restart with a lowered cap)."""
    total = sum(entry.disk_bytes for entry in oldest_first)
    dropped = 0
    for entry in oldest_first:
        if total <= capacity_bytes:
            break
        total -= entry.disk_bytes
        dropped += 1
    return dropped


class SsdIndex:
    """Key -> entry in last-use order, and the byte accounting of the cap."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, SsdEntry] = OrderedDict()  # oldest use first
        self._busy: set[bytes] = set()
        self._used = 0
        self._stored = 0
        self._reserved = 0
        self.evictions = 0
        self.evicted_bytes = 0

    # ---------------------------------------------------------------- reading

    @property
    def used(self) -> int:
        return self._used

    @property
    def stored(self) -> int:
        return self._stored

    @property
    def reserved(self) -> int:
        return self._reserved

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> SsdEntry | None:
        """The entry of `key`, without counting a use."""
        return self._entries.get(key)

    def touch(self, key: bytes) -> SsdEntry | None:
        """The entry of `key`, now the most recently used; None if absent."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def entries(self) -> list[SsdEntry]:
        """Every entry, least recently used first."""
        return list(self._entries.values())

    def is_busy(self, key: bytes) -> bool:
        return key in self._busy

    # ---------------------------------------------------------------- changing

    def load(self, oldest_first: Iterable[SsdEntry], dropped: Sequence[SsdEntry]) -> None:
        """Fill the index at open: the files found, and those dropped over the cap (already
        unlinked; they count as evictions)."""
        for entry in oldest_first:
            self._entries[entry.key] = entry
            self._stored += entry.disk_bytes
        self._used = self._stored
        self.evictions += len(dropped)
        self.evicted_bytes += sum(entry.disk_bytes for entry in dropped)

    def plan_put(self, key: bytes, need: int) -> PutPlan:
        """Reserve `need` bytes for a put of the absent, idle `key`, taking victims from
        the cold end until it fits; the key and its victims are busy until `finish_put`
        and `victims_unlinked`.

        All or nothing: if even evicting every object would not make room (the rest is
        reserved by puts in flight, or the object is larger than the cap), raise
        StoreFull and evict nothing, since dropping objects would not help this put.
        """
        free = self.capacity_bytes - self._used
        victims: list[SsdEntry] = []
        if free < need:
            for entry in self._entries.values():
                victims.append(entry)
                free += entry.disk_bytes
                if free >= need:
                    break
        if free < need:
            raise StoreFull(
                f"SSD tier full: an object needs {need} bytes on disk but only {free} of "
                f"{self.capacity_bytes} can be freed ({self._reserved} reserved by puts in "
                "flight); retry once those puts finish, or raise the SSD capacity",
                key=key,
            )
        for victim in victims:
            del self._entries[victim.key]
            self._stored -= victim.disk_bytes
            self.evictions += 1
            self.evicted_bytes += victim.disk_bytes
        freed = sum(victim.disk_bytes for victim in victims)
        hold = max(need, freed)
        self._used += hold - freed
        self._reserved += need
        self._busy.add(key)
        self._busy.update(victim.key for victim in victims)
        return PutPlan(key=key, need=need, victims=tuple(victims), hold=hold)

    def victims_unlinked(self, plan: PutPlan) -> None:
        """The plan's victims are gone from disk: the put now counts only its own room."""
        self._used -= plan.hold - plan.need
        for victim in plan.victims:
            self._busy.discard(victim.key)

    def finish_put(self, plan: PutPlan, entry: SsdEntry | None) -> None:
        """The put of `plan` ended: `entry` is its file, now the most recent; None if the
        write failed (or its file was not kept), which releases the room."""
        self._reserved -= plan.need
        self._busy.discard(plan.key)
        if entry is None:
            self._used -= plan.need
        else:
            self._entries[plan.key] = entry
            self._stored += plan.need

    def take(self, key: bytes, entry: SsdEntry | None = None) -> SsdEntry | None:
        """Take `key` out of the index before its file is unlinked; it stays busy and
        counted in `used` until `release`. None if absent, or if `entry` is given and the
        index holds another one (the key was removed and stored afresh meanwhile)."""
        held = self._entries.get(key)
        if held is None or (entry is not None and held is not entry):
            return None
        del self._entries[key]
        self._stored -= held.disk_bytes
        self._busy.add(key)
        return held

    def release(self, taken: Iterable[SsdEntry]) -> None:
        """The files of entries `take` returned are unlinked: free their room."""
        for entry in taken:
            self._used -= entry.disk_bytes
            self._busy.discard(entry.key)
