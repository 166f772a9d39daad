"""What a store node holds, as told by the leader: the node's half of the object index.

The master decides placement and the clients write the bytes, so the node itself cannot
know which ranges of its segment hold committed objects. The leader tells it, in batched
`Apply` deltas after each commit and free. The inventory is what a newly elected leader
reads back to rebuild its index; entries that a lost delta left stale are harmless, since
every read is checked against the checksum recorded here and at the master.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Held:
    offset: int
    size: int
    checksum: int


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
        with self._lock:
            for key, offset in drop:
                held = self._dram.get(key)
                if held is not None and held.offset == offset:
                    del self._dram[key]
            for key, held in add:
                self._dram[key] = held

    def clear(self) -> None:
        with self._lock:
            self._dram.clear()

    def dram(self) -> list[tuple[bytes, Held]]:
        with self._lock:
            return list(self._dram.items())

    def __len__(self) -> int:
        return len(self._dram)
