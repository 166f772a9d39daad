"""A store node's DRAM segment: one mapped region the Transfer Engine reads and writes.

The memory comes from a memfd, not an anonymous mapping: it dies with the process (a
kill -9 leaks nothing, unlike a /dev/shm file), yet a client on the same host can map the
very same pages through `/proc/<pid>/fd/<fd>` and copy directly instead of going through
TCP (the same-host fast path).

By default the whole segment is reserved and mapped when the node starts (`prefault`):
every page is allocated (fallocate on the memfd) and entered into the page table
(MADV_POPULATE_WRITE), about half a second per GiB. Without it, the first write to each
page pays a page fault inside the Transfer Engine's receive, which halved the throughput
of batch puts into fresh memory on the bench machine (1 MiB x32: 0.83 against 1.65 GB/s),
and memory the node promised to the master was not really there: a host short of memory
found out at a write, not at start.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os

from kvstore.errors import InvalidArgument


class DramSegment:
    def __init__(self, size: int, name: str = "kvstore-segment", prefault: bool = True) -> None:
        if size <= 0:
            raise InvalidArgument(f"segment size must be positive, got {size}")
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        mapping: mmap.mmap | None = None
        try:
            os.ftruncate(self.fd, size)
            if prefault:
                _reserve(self.fd, size)
            mapping = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.prefaulted = prefault and _populate(mapping, size)
        except OSError as exc:
            if mapping is not None:
                mapping.close()
            os.close(self.fd)
            raise InvalidArgument(f"cannot allocate a {size}-byte DRAM segment ({exc.strerror}); "
                                  "lower --dram or free memory on this host") from exc
        self._map = mapping
        self.view = memoryview(self._map)
        self.base_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    @property
    def shm_path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        self.view.release()
        # A ctypes view may still refer to the map; the process exit frees it then.
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self.fd)


# Linux 5.14+; Python 3.11's mmap module does not name it yet.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _reserve(fd: int, size: int) -> None:
    """Allocate every page of the memfd now (raises OSError when the host cannot)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        # No fallocate on this kernel's shared memory: pages come at first touch instead.


def _populate(mapping: mmap.mmap, size: int) -> bool:
    """Enter every page into this process's page table, as if written; False where the
    kernel is too old for MADV_POPULATE_WRITE (the pages then fault in at first write,
    already allocated by _reserve)."""
    try:
        mapping.madvise(MADV_POPULATE_WRITE, 0, size)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    return True


def boot_id() -> str:
    """This kernel boot's id: same-host clients compare it before mapping a segment."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""
