"""A store node's DRAM segment: one mapped region the Transfer Engine reads and writes.

The memory comes from a memfd, not an anonymous mapping: it dies with the process (a
kill -9 leaks nothing, unlike a /dev/shm file), yet a client on the same host can map the
very same pages through `/proc/<pid>/fd/<fd>` and copy directly instead of going through
TCP (the same-host fast path).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os

from kvstore.errors import InvalidArgument


class DramSegment:
    def __init__(self, size: int, name: str = "kvstore-segment", prefault: bool = False) -> None:
        if size <= 0:
            raise InvalidArgument(f"segment size must be positive, got {size}")
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(self.fd)
            raise InvalidArgument(f"cannot allocate a {size}-byte DRAM segment ({exc}); "
                                  "lower --dram") from exc
        self.view = memoryview(self._map)
        self.base_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        if prefault:
            # Touch every page now so the first writes do not pay page faults.
            for off in range(0, size, mmap.PAGESIZE):
                self._map[off] = 0

    @property
    def shm_path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        self.view.release()
        # A ctypes view may still refer to the map; the process exit frees it then.
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self.fd)


def boot_id() -> str:
    """This kernel boot's id: same-host clients compare it before mapping a segment."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""
