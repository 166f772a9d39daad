"""What a store node holds, as told by the leader: the node's half of the object index.

The master decides placement and the clients write the bytes, so the node itself cannot
know which ranges of its segment hold committed objects. The leader tells it, in batched
`Apply` deltas: an *intent* when it places a put (PutStart), the commit, and each free.
The inventory is what a newly elected leader reads back to rebuild its index; entries
that a lost delta left stale are harmless, since every read is checked against the
checksum recorded here and at the master.

An intent (`Held.pending`) counts as held only while the bytes at its range verify
against its checksum (`verify_pending`): its put's OK waited for the intent but not for
the commit (docs/durability.md, section 1), so the bytes are the commit's proof.

A node serves every master shard (docs/scaling.md): each shard's leader keeps its own
inventory and epoch here (`ShardInventories`), since shard 3's epoch says nothing about
shard 5's and each shard's leader reads back only its own entries.
"""

from __future__ import annotations

import threading
from typing import NamedTuple


class Held(NamedTuple):
    """One replica this node holds for a shard's leader. A NamedTuple, not a frozen
    dataclass: every delta row builds one (an intent and a commit per put), and a
    NamedTuple builds in about a third of the time (docs/perf-notes.md)."""

    offset: int
    size: int
    checksum: int
    pending: int = 0  # an intent: the epoch of the leader that sent it (0: committed)
    # A placeholder's intent: no checksum yet, the put record after its bytes names the
    # key and checksum (kvstore/put_record.py).
    record: bool = False


class Inventory:
    def __init__(self) -> None:
        self._dram: dict[bytes, Held] = {}
        self._lock = threading.Lock()
        self.epoch = 0

    def admit_epoch(self, epoch: int) -> bool:
        """Accept a caller's epoch unless a newer leader has already spoken to us."""
        with self._lock:
            if epoch < self.epoch:
                return False
            self.epoch = epoch
            return True

    def apply(self, add: list[tuple[bytes, Held]], drop: list[tuple[bytes, int]]) -> None:
        """One `Apply` delta: the replicas committed here (`add`) and freed from here
        (`drop`) since the last one, each list in the leader's order.

        The two lists come separately, so how they interleave is lost, and a key can be in
        both: an object committed and then removed or evicted within one leader tick is
        added *and* dropped. Its add must count before its drop, or the entry stays for
        good (every put-then-remove leaked one; see `_sequence`). A drop frees a given
        replica, named by its offset: it never removes a newer copy of the key."""
        drops: dict[bytes, list[int]] = {}
        for key, offset in drop:
            drops.setdefault(key, []).append(offset)
        both: dict[bytes, list[Held]] = {}
        with self._lock:
            dram = self._dram
            for key, held in add:
                if key in drops:
                    both.setdefault(key, []).append(held)
                else:
                    dram[key] = held
            for key, offsets in drops.items():
                added = both.get(key)
                events: list[Held | int] = (list(offsets) if added is None
                                            else _sequence(dram.get(key), added, offsets))
                for event in events:
                    if isinstance(event, Held):
                        dram[key] = event
                    else:
                        now = dram.get(key)
                        if now is not None and now.offset == event:
                            del dram[key]

    def replay(self, changes: list[tuple[bytes, Held | int]]) -> None:
        """Changes in the leader's order: a Held adds (or replaces) the key's replica, an
        int drops the key's replica at that offset (never a newer copy elsewhere)."""
        with self._lock:
            dram = self._dram
            for key, change in changes:
                if isinstance(change, Held):
                    dram[key] = change
                else:
                    now = dram.get(key)
                    if now is not None and now.offset == change:
                        del dram[key]

    def pending(self) -> list[tuple[bytes, Held]]:
        with self._lock:
            return [(k, h) for k, h in self._dram.items() if h.pending]

    def settle_pending(self, verified: list[tuple[bytes, Held]],
                       torn: list[tuple[bytes, Held]], epoch: int,
                       recorded: dict[bytes, tuple[bytes, Held]] | None = None) -> None:
        """After a leader of `epoch` read the inventory: intents of older leaders whose
        bytes verified become plain entries (that leader is gone, this one adopts them),
        those whose bytes did not are forgotten (no leader can commit them any more).
        `recorded`: placeholders' intents whose put record verified, with the key and
        entry it names: the entry replaces the placeholder's. An entry changed meanwhile
        is left as it is."""
        with self._lock:
            dram = self._dram
            for ph, (key, entry) in (recorded or {}).items():
                held = dram.get(ph)
                if held is not None and held.pending < epoch:
                    del dram[ph]
                    dram[key] = entry
            for key, held in verified:
                if held.pending < epoch and dram.get(key) is held:
                    dram[key] = Held(held.offset, held.size, held.checksum)
            for key, held in torn:
                if held.pending < epoch and dram.get(key) is held:
                    del dram[key]

    def clear(self) -> None:
        with self._lock:
            self._dram.clear()

    def dram(self) -> list[tuple[bytes, Held]]:
        with self._lock:
            return list(self._dram.items())

    def __len__(self) -> int:
        return len(self._dram)


class ShardInventories:
    """One `Inventory` per master shard, made when a shard's leader first speaks.

    Shard 0 always exists: with one shard (the default) it is the node's only inventory,
    exactly as before shards. Keys are disjoint between shards, so the node's DRAM
    objects are the union of the shards' entries."""

    def __init__(self, first: Inventory | None = None) -> None:
        self._shards: dict[int, Inventory] = {0: first if first is not None else Inventory()}
        self._lock = threading.Lock()

    def of(self, shard: int) -> Inventory:
        inv = self._shards.get(shard)
        if inv is None:
            with self._lock:
                inv = self._shards.setdefault(shard, Inventory())
        return inv

    def shards(self) -> dict[int, Inventory]:
        with self._lock:
            return dict(self._shards)

    def epochs(self) -> dict[int, int]:
        return {k: inv.epoch for k, inv in self.shards().items()}

    def dram(self) -> list[tuple[bytes, Held]]:
        """Every shard's entries (what the node's DRAM holds, for metrics and the
        SIGTERM flush)."""
        return [e for inv in self.shards().values() for e in inv.dram()]

    def __len__(self) -> int:
        return sum(len(inv) for inv in self.shards().values())


def _sequence(current: Held | None, adds: list[Held], drops: list[int]) -> list[Held | int]:
    """The order in which one key's adds and drops of one delta happened.

    A node holds at most one replica of a key (replicas go to distinct nodes), so the
    leader's events for a key on a node alternate: add, drop, add, ... Which comes first
    follows from the counts (one more add: it started with an add; one more drop: with a
    drop) and, when they are equal, from what the node holds: a drop of the replica held
    now came first (freed, then written again: the key stays), otherwise the add did
    (written, then freed within the tick: the key goes)."""
    if len(adds) != len(drops):
        drop_first = len(drops) > len(adds)
    else:
        drop_first = current is not None and current.offset == drops[0]
    first: list[Held] | list[int] = drops if drop_first else adds
    second: list[Held] | list[int] = adds if drop_first else drops
    out: list[Held | int] = []
    for i in range(max(len(first), len(second))):
        if i < len(first):
            out.append(first[i])
        if i < len(second):
            out.append(second[i])
    return out
