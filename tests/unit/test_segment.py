"""The store node's DRAM segment: reserved and mapped at start unless told otherwise."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from kvstore.errors import InvalidArgument
from kvstore.store import segment as seg_mod
from kvstore.store.segment import DramSegment

SIZE = 8 << 20


def _resident_kib(base: int) -> int:
    """Rss of the mapping that starts at `base`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                inside = int(head.split("-")[0], 16) == base
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError(f"no mapping starts at {base:#x}")


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def test_a_prefaulted_segment_is_resident_before_any_write() -> None:
    s = DramSegment(SIZE)
    try:
        # MADV_POPULATE_WRITE came with Linux 5.14; before it the pages are only allocated.
        assert s.prefaulted == (_kernel() >= (5, 14))
        if s.prefaulted:
            assert _resident_kib(s.base_addr) == SIZE >> 10
        # And its pages are the memfd's, shared with a same-host client's mapping.
        assert os.fstat(s.fd).st_blocks * 512 >= SIZE
    finally:
        s.close()


def test_without_prefault_pages_come_at_first_write() -> None:
    s = DramSegment(SIZE, prefault=False)
    try:
        assert not s.prefaulted
        assert _resident_kib(s.base_addr) == 0
        assert os.fstat(s.fd).st_blocks == 0
        s.view[SIZE // 2] = 1
        assert 0 < _resident_kib(s.base_addr) < SIZE >> 10
    finally:
        s.close()


def test_a_host_without_the_memory_gets_a_typed_error_and_no_leaked_fd(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = os.memfd_create

    def memfd(name: str, flags: int = 0) -> int:
        made.append(real(name, flags))
        return made[-1]

    def no_memory(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(seg_mod.os, "memfd_create", memfd)
    monkeypatch.setattr(seg_mod.os, "posix_fallocate", no_memory)
    with pytest.raises(InvalidArgument, match="lower --dram or free memory"):
        DramSegment(SIZE)
    with pytest.raises(OSError):
        os.fstat(made[0])  # closed


def test_a_kernel_without_populate_still_reserves(monkeypatch: pytest.MonkeyPatch) -> None:
    # An advice value no kernel knows answers EINVAL, as MADV_POPULATE_WRITE does before 5.14.
    monkeypatch.setattr(seg_mod, "MADV_POPULATE_WRITE", 9999)
    s = DramSegment(SIZE)
    try:
        assert not s.prefaulted
        assert os.fstat(s.fd).st_blocks * 512 >= SIZE  # allocated all the same
        s.view[0:4] = b"abcd"
        assert bytes(s.view[0:4]) == b"abcd"
    finally:
        s.close()


def test_shared_memory_without_fallocate_falls_back_to_pages_at_first_touch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(fd: int, offset: int, length: int) -> Any:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(seg_mod.os, "posix_fallocate", unsupported)
    s = DramSegment(SIZE)
    try:
        assert s.prefaulted == (_kernel() >= (5, 14))  # populating allocates the pages itself
        if s.prefaulted:
            assert _resident_kib(s.base_addr) == SIZE >> 10
    finally:
        s.close()


def test_prefault_in_steps_reports_progress_and_reserves_step_by_step() -> None:
    s = DramSegment(SIZE, prefault=False)
    try:
        steps = s.prefault_steps(step=2 << 20)
        assert next(steps) == 2 << 20
        # One step in: that much allocated (and mapped), not the rest.
        assert 2 << 20 <= os.fstat(s.fd).st_blocks * 512 < SIZE
        if _kernel() >= (5, 14):
            assert _resident_kib(s.base_addr) == 2 << 10
        assert not s.prefaulted
        assert list(steps) == [4 << 20, 6 << 20, 8 << 20]
        assert s.prefaulted == (_kernel() >= (5, 14))
        assert os.fstat(s.fd).st_blocks * 512 >= SIZE
    finally:
        s.close()
        s.close()  # twice is harmless


def test_the_last_step_takes_what_is_left() -> None:
    s = DramSegment(SIZE + 4096, prefault=False)
    try:
        assert list(s.prefault_steps(step=3 << 20)) == [3 << 20, 6 << 20, SIZE + 4096]
        assert os.fstat(s.fd).st_blocks * 512 >= SIZE + 4096
    finally:
        s.close()


def test_prefault_steps_must_be_whole_pages() -> None:
    s = DramSegment(SIZE, prefault=False)
    try:
        for bad in (0, -4096, 4096 + 1):
            with pytest.raises(ValueError, match="multiple of the page size"):
                next(s.prefault_steps(step=bad))
    finally:
        s.close()
