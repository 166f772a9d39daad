"""Registered host memory the put records of one-call puts are written from.

A one-call put appends a put record (kvstore/put_record.py) to each value it writes into
a placeholder. The value may sit anywhere registered (the caller's buffer, GPU memory),
so the records travel from an area of their own: a few chunks registered once, at the
first use, each lent to one put until its transfers are over. Puts of the asyncio client
overlap, hence chunks rather than one buffer; a put that finds none free (or more
records than a chunk holds) writes no records, and its commit waits for the store
nodes as before.
"""

from __future__ import annotations

import numpy as np

from kvstore.transfer import Transfer

CHUNKS = 8
CHUNK_BYTES = 8 << 10  # one put's records (puts.RECORDS_UP_TO at most) of the longest keys


class RecordArea:
    __slots__ = ("_array", "_free", "_transfer", "addr", "view")

    def __init__(self, transfer: Transfer) -> None:
        self._transfer = transfer
        self._array: np.ndarray | None = None
        self._free: list[int] = []
        self.addr = 0
        self.view = memoryview(b"")

    def take(self, nbytes: int) -> int | None:
        """The offset of a free chunk for `nbytes` of records, or None."""
        if nbytes > CHUNK_BYTES:
            return None
        if self._array is None:
            self._array = np.zeros(CHUNKS * CHUNK_BYTES, dtype=np.uint8)
            self.addr = int(self._array.ctypes.data)
            self.view = memoryview(self._array.data).cast("B")
            self._transfer.register(self.addr, CHUNKS * CHUNK_BYTES)
            self._free = [i * CHUNK_BYTES for i in reversed(range(CHUNKS))]
        return self._free.pop() if self._free else None

    def give(self, offset: int) -> None:
        self._free.append(offset)

    def close(self) -> None:
        if self.addr:
            self._transfer.unregister(self.addr)
            self.addr = 0
        self.view.release()
        self._array = None
