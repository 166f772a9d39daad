"""The two Linux calls the SSD tier needs that Python's `os` module lacks: syncfs(2) and
sync_file_range(2), reached through libc with ctypes.

Kept apart so that the only code that knows about ctypes, argument types and errno is
these few lines, and a test can replace `syncfs` on this module to stand in for a slow or
failing device.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


_LIBC = _load_libc()
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait
_FALLOC_FL_KEEP_SIZE = 1  # <linux/falloc.h>
_FALLOC_FL_PUNCH_HOLE = 2
if _LIBC is not None:
    with contextlib.suppress(AttributeError):  # not Linux: os.sync(), no writeback hint
        _LIBC.syncfs.argtypes = [ctypes.c_int]
        _LIBC.syncfs.restype = ctypes.c_int
    with contextlib.suppress(AttributeError):
        _LIBC.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                          ctypes.c_uint]
        _LIBC.sync_file_range.restype = ctypes.c_int
    with contextlib.suppress(AttributeError):
        _LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _LIBC.fallocate.restype = ctypes.c_int


def syncfs(fd: int) -> None:
    """Flush the filesystem holding `fd` to the device; OSError if writeback failed.

    syncfs(2) reports writeback errors since `fd` was opened (Linux >= 5.8). Without
    libc's syncfs, os.sync() flushes every filesystem but reports nothing.
    """
    if _LIBC is None or not hasattr(_LIBC, "syncfs"):
        os.sync()
        return
    if _LIBC.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


def start_writeback(fd: int) -> None:
    """Start writing the file's dirty pages to the device now, without waiting (a hint:
    the tier's group-commit flush is what waits and what makes them durable)."""
    if _LIBC is not None and hasattr(_LIBC, "sync_file_range"):
        _LIBC.sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free the blocks of [offset, offset + length) of the file, keeping its size: they
    read back as zeros. False where the filesystem (or libc) cannot; the caller then
    writes zeros over the range, which frees nothing but leaves no record behind."""
    if _LIBC is None or not hasattr(_LIBC, "fallocate"):
        return False
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    return bool(_LIBC.fallocate(fd, mode, offset, length) == 0)
