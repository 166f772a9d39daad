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
found out at a write, not at start. `prefault_steps` does it a GiB at a time, so that a
daemon reserving hundreds of GiB (minutes) can report progress and stop in between.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
from collections.abc import Iterator

from kvstore.errors import InvalidArgument

# Bytes reserved and mapped per step of `DramSegment.prefault_steps` (~0.5 s each).
PREFAULT_STEP = 1 << 30


class DramSegment:
    def __init__(self, size: int, name: str = "kvstore-segment", prefault: bool = True) -> None:
        """`prefault`: reserve and map the whole segment now (see the module doc); else
        its pages come at first write, or through `prefault_steps`."""
        if size <= 0:
            raise InvalidArgument(f"segment size must be positive, got {size}")
        self.size = size
        self.prefaulted = False  # every page reserved and in the page table
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(self.fd)
            raise _no_memory(size, exc) from exc
        self.view = memoryview(self._map)
        self.base_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        if prefault:
            for _ in self.prefault_steps():
                pass

    def prefault_steps(self, step: int = PREFAULT_STEP) -> Iterator[int]:
        """Reserve every page of the segment (fallocate on the memfd) and enter it into
        the page table (MADV_POPULATE_WRITE), `step` bytes at a time: yields the bytes
        done after each step. Sets `prefaulted` at the end; it stays False on a kernel
        before 5.14 (no MADV_POPULATE_WRITE: the pages are reserved, and map at first
        write). A host without the memory raises InvalidArgument, and the segment is
        closed."""
        if step <= 0 or step % mmap.PAGESIZE:
            raise ValueError(f"the step must be a positive multiple of the page size, got {step}")
        populate = True
        done = 0
        while done < self.size:
            n = min(step, self.size - done)
            try:
                _reserve(self.fd, done, n)
                if populate:
                    populate = _populate(self._map, done, n)
            except OSError as exc:
                self.close()
                raise _no_memory(self.size, exc) from exc
            done += n
            yield done
        self.prefaulted = populate

    @property
    def shm_path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        if self.fd < 0:
            return  # closed already (a failed prefault closes it)
        self.view.release()
        # A ctypes view may still refer to the map; the process exit frees it then.
        with contextlib.suppress(BufferError):
            self._map.close()
        fd, self.fd = self.fd, -1
        os.close(fd)


# Linux 5.14+; Python 3.11's mmap module does not name it yet.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _no_memory(size: int, exc: OSError) -> InvalidArgument:
    return InvalidArgument(f"cannot allocate a {size}-byte DRAM segment ({exc.strerror}); "
                           "lower --dram or free memory on this host")


def _reserve(fd: int, offset: int, length: int) -> None:
    """Allocate these pages of the memfd now (raises OSError when the host cannot)."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        # No fallocate on this kernel's shared memory: pages come at first touch instead.


def _populate(mapping: mmap.mmap, offset: int, length: int) -> bool:
    """Enter these pages into this process's page table, as if written; False where the
    kernel is too old for MADV_POPULATE_WRITE (the pages then fault in at first write,
    already allocated by _reserve)."""
    try:
        mapping.madvise(MADV_POPULATE_WRITE, offset, length)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    return True


