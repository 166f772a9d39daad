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

With a sharded control plane every shard's leader keeps its own entries here (each
tagged with its shard: a key belongs to one shard only, so they never collide) under its
own epoch: shard 3's newer epoch says nothing about shard 5's leader.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Held:
    offset: int
    size: int
    checksum: int
    pending: int = 0  # an intent: the epoch of the leader that sent it (0: committed)
    # A placeholder's intent: no checksum yet, the put record after its bytes names the
    # key and checksum (kvstore/put_record.py).
    record: bool = False
    shard: int = 0  # the master shard whose entry it is (docs/scaling.md)


class Inventory:
    def __init__(self) -> None:
        self._dram: dict[bytes, Held] = {}
        self._lock = threading.Lock()
        self._epochs: dict[int, int] = {}  # shard -> the newest epoch its leaders sent

    @property
    def epoch(self) -> int:
        """Shard 0's epoch (the only one in a cluster of one shard)."""
        return self._epochs.get(0, 0)

    def epoch_of(self, shard: int) -> int:
        return self._epochs.get(shard, 0)

    def admit_epoch(self, epoch: int, shard: int = 0) -> bool:
        """Accept a caller's epoch unless a newer leader of the same shard has already
        spoken to us."""
        with self._lock:
            if epoch < self._epochs.get(shard, 0):
                return False
            self._epochs[shard] = epoch
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

    def pending(self, shard: int | None = None) -> list[tuple[bytes, Held]]:
        """The intents (of one shard's leaders, if given)."""
        with self._lock:
            return [(k, h) for k, h in self._dram.items()
                    if h.pending and (shard is None or h.shard == shard)]

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
                    dram[key] = Held(held.offset, held.size, held.checksum, shard=held.shard)
            for key, held in torn:
                if held.pending < epoch and dram.get(key) is held:
                    del dram[key]

    def clear(self) -> None:
        with self._lock:
            self._dram.clear()

    def dram(self, shard: int | None = None) -> list[tuple[bytes, Held]]:
        """Every entry (of one shard, if given)."""
        with self._lock:
            if shard is None:
                return list(self._dram.items())
            return [(k, h) for k, h in self._dram.items() if h.shard == shard]

    def __len__(self) -> int:
        return len(self._dram)


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
