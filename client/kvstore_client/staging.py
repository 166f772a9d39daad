"""The client's registered staging buffer.

Bytes travel between this buffer and store-node segments; the Transfer Engine can only
address registered memory. The buffer grows (and is re-registered) when one object is
larger than it; batches larger than it are cut into slices that fit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from kvstore.transfer import Transfer

ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Staging:
    def __init__(self, transfer: Transfer, size: int) -> None:
        self._transfer = transfer
        self._array = np.empty(0, dtype=np.uint8)
        self.size = 0
        self.addr = 0
        self.view = memoryview(b"")
        self._grow(max(size, ALIGN))

    def _grow(self, size: int) -> None:
        if self.addr:
            self._transfer.unregister(self.addr)
        self.view.release()
        self._array = np.empty(size, dtype=np.uint8)
        self.size = size
        self.addr = int(self._array.ctypes.data)
        self.view = memoryview(self._array.data).cast("B")
        self._transfer.register(self.addr, size)

    def slices(self, sizes: Sequence[int]) -> Iterator[tuple[int, int]]:
        """Index ranges [lo, hi) of `sizes` whose aligned total fits in the buffer."""
        biggest = max(sizes, default=0)
        if _aligned(biggest) > self.size:
            self._grow(1 << (_aligned(biggest) - 1).bit_length())
        lo, used, mask = 0, 0, ALIGN - 1
        if sizes and sum(sizes) + len(sizes) * mask <= self.size:  # all fit, aligned or not
            yield 0, len(sizes)
            return
        for i, n in enumerate(sizes):
            need = (n + mask) & ~mask
            if used + need > self.size:
                yield lo, i
                lo, used = i, 0
            used += need
        if lo < len(sizes):
            yield lo, len(sizes)

    def layout(self, sizes: Sequence[int]) -> list[int]:
        offsets, pos, mask = [], 0, ALIGN - 1
        for n in sizes:
            offsets.append(pos)
            pos += (n + mask) & ~mask
        return offsets

    def close(self) -> None:
        if self.addr:
            self._transfer.unregister(self.addr)
            self.addr = 0
        self.view.release()
