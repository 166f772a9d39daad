"""The SSD tier of a store node: a directory of self-describing object files under a byte cap.

What lives here: the index of the files (key -> size, checksum, bytes on disk, pins, LRU
order), the capacity accounting, eviction by the cap, and the file I/O. The byte layout of
one file lives in `ssd_format.py`. The tier never talks to the master: the node asks it
for `entries()` (the inventory after a restart) and `drain_evicted()` (keys the cap
dropped) and reports them.

Calls block on file I/O; the node calls them from a thread pool. One lock guards the
index and the counters; reads, writes and unlinks run outside it. A key that is being
written or unlinked is "busy": another put or remove of the same key waits for it, so a
put racing a remove can never leave a half file visible, nor have its fresh file unlinked
by a remove that started earlier.

Bytes on disk. Every file is padded to a multiple of 4 KiB (`ssd_format.BLOCK`), and the
tier accounts each file at its exact length. On a 4 KiB-block filesystem (ext4, xfs) that
length is also the space the data occupies (`st_blocks * 512`), so the cap holds for both
measures. Not counted: the 256 shard directories and the lock file (a few KiB each,
created once), and filesystem metadata such as extent blocks. The room for a put is
reserved before its first byte is written, and victims of the cap are unlinked before
that write starts, so the files present never add up to more than the cap, even in the
middle of a put.

Durability (`fsync=True`). A put writes the whole file under a temporary name in the
object's own shard directory, fsyncs the file, renames it to its final name, then fsyncs
the directory.
- fsync before rename: without it the filesystem may persist the rename before the data
  blocks (xfs does; ext4 with delayed allocation may), and after a crash the final name
  would point at a zero-filled or short file. Reindexing would catch that (header and
  data checksums) and drop it, but the object would be lost; with the fsync a name that
  exists always names complete data.
- fsync of the directory after rename: the rename is a change to the directory; until the
  directory is flushed a crash may forget it, and an acknowledged put would vanish.
- Unlinks are not fsynced: an unlink lost in a crash brings back a complete, valid object,
  which reindexing accepts (it is a cache, and the cap is re-applied at open).
With `fsync=False` a crash may leave torn files; `open()` detects and deletes them.

Group commit (`put(..., sync=False)` then `sync()`): what the store node's Move handler
runs for every demotion. A put with `sync=False` writes the file, starts its writeback at
once (sync_file_range(SYNC_FILE_RANGE_WRITE), so the device works while the next files
are written) and renames it, with no fsync. `sync()` then makes every such put that
returned before the call durable, data and names, with one syncfs(2) of the tier's
filesystem (file data, inodes, the renames in the shard directories, and a device cache
flush, in one journal commit). The caller acknowledges nothing before `sync()` returns.
- Concurrent callers share flushes: one thread runs syncfs while the others wait; a
  caller whose puts the running flush already covers returns when it ends, the others
  join the next one. N batches in flight cost about one flush each, not N per object.
- A crash before the flush may leave a final name over missing or torn data, or forget
  the rename. Nothing in the batch was acknowledged, and `open()` checks every file
  (header sum, key, exact length, data checksum) and deletes bad ones, so no torn file is
  ever indexed; reads verify the data checksum again.
- Errors: syncfs reports writeback errors of the filesystem since the tier's own
  directory descriptor was opened (Linux >= 5.8; older kernels report none, so there the
  guarantee is only as good as the device's). On a failed flush the tier cannot tell
  which pages reached the device, so it deletes every object written since the last good
  flush, fails the waiting `sync()` calls, and refuses further puts (Unavailable) until
  it is reopened: a restart re-verifies every file.
- Objects written but not yet flushed are in the index (readable, listed by `entries()`):
  the bytes in the page cache are right, and if the node crashes, its restart re-indexes
  only what reached the disk intact.
- syncfs flushes the whole filesystem, other writers' dirty data too: give the tier its
  own filesystem in production.

Restart. `open()` scans the directory: leftover temporary files are deleted; every object
file is checked (header sum, key against the file name, exact length, and, unless
`verify_data=False`, the data checksum: a full verify reads every stored byte once, about
capacity / read bandwidth, e.g. ~9 minutes for 1 TiB at 2 GB/s); bad files are deleted and
counted. Survivors are ordered by file mtime (a read touches the mtime, so this is
last-use order) and, if they exceed a cap lowered since the last run, the oldest are
dropped. A directory is held by one tier at a time (`flock` on `LOCK`).

Eviction is exact LRU over an OrderedDict: O(1) per touch, O(evicted + pinned entries
skipped at the cold end) per put. Pinned entries are skipped, never evicted by the cap;
pins are short (a promotion or a leased read in progress) so few sit at the cold end. An
explicit `remove` ignores pins: removal is the master's decision, and it checks its own
leases.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import xxhash

from kvstore.errors import (
    CorruptObject,
    Internal,
    InvalidArgument,
    NotFound,
    StoreFull,
    Unavailable,
    check_key,
)
from kvstore.store import ssd_format as fmt

log = logging.getLogger(__name__)

LOCK_FILE = "LOCK"
_VERIFY_CHUNK = 4 << 20
_Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class SsdEntry:
    key: bytes
    size: int  # object bytes
    checksum: int  # xxh3_64 of the object bytes
    disk_bytes: int  # exact file length (header, key, data, padding); what the cap counts
    path: str


@dataclass(frozen=True, slots=True)
class ReindexReport:
    recovered: int  # valid objects now in the index
    bytes: int  # their bytes on disk
    corrupt: int  # files with a bad header, key, length or checksum: deleted
    corrupt_bytes: int
    temp_removed: int  # leftover temporary files of interrupted puts: deleted
    evicted_over_cap: int  # valid objects dropped because the cap was lowered
    evicted_bytes: int
    ignored: int  # files that are not ours: left alone, not counted
    seconds: float


@dataclass(frozen=True, slots=True)
class SsdStats:
    capacity_bytes: int
    used_bytes: int  # counted against the cap: stored + reserved by puts in flight
    stored_bytes: int  # files of indexed objects
    objects: int
    pinned_objects: int
    writes: int
    write_bytes: int  # object bytes written
    reads: int
    read_bytes: int
    evictions: int
    evicted_bytes: int
    corrupt_dropped: int
    write_seconds: float
    read_seconds: float
    syncs: int = 0  # group-commit flushes (syncfs calls)
    sync_seconds: float = 0.0
    unsynced_objects: int = 0  # written with sync=False, not yet flushed


class _Slot:
    __slots__ = ("entry", "pins")

    def __init__(self, entry: SsdEntry) -> None:
        self.entry = entry
        self.pins = 0


class SsdTier:
    """One SSD directory with a byte cap. Create, then `open()`; `close()` when done."""

    def __init__(self, directory: str | Path, capacity_bytes: int, fsync: bool = True) -> None:
        if capacity_bytes <= 0:
            raise InvalidArgument(f"SSD capacity must be positive, got {capacity_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self._cond = threading.Condition(threading.Lock())
        self._index: OrderedDict[bytes, _Slot] = OrderedDict()  # oldest use first
        self._busy: set[bytes] = set()  # keys being written or unlinked
        self._used = 0  # stored + reservations + victims not yet unlinked
        self._stored = 0
        self._reserved = 0
        self._evicted: list[bytes] = []
        self._lock_fd: int | None = None
        self._opened = False
        self._closed = False
        self._temp_ids = itertools.count()
        self._writes = 0
        self._write_bytes = 0
        self._write_seconds = 0.0
        self._reads = 0
        self._read_bytes = 0
        self._read_seconds = 0.0
        self._evictions = 0
        self._evicted_bytes = 0
        self._corrupt_dropped = 0
        # Group commit: puts with sync=False are numbered as they land; sync() flushes
        # up to the newest number and records it. One flush runs at a time.
        self._unsynced: dict[bytes, int] = {}  # key -> number of its unflushed write
        self._write_seq = 0
        self._synced_seq = 0
        self._syncing = False
        self._broken: str | None = None  # why puts are refused (a flush failed)
        self._sync_fd: int | None = None  # kept open: syncfs reports errors since its open
        self._syncs = 0
        self._sync_seconds = 0.0

    # ---------------------------------------------------------------- life cycle

    def open(self, verify_data: bool = True) -> ReindexReport:
        """Take the directory and re-index what a previous run left in it."""
        with self._cond:
            if self._opened or self._closed:
                raise InvalidArgument("an SsdTier is opened once; create a new one to reopen")
        started = time.perf_counter()
        self._lock_fd = self._take_dir_lock()
        try:
            self._sync_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            report = self._reindex(verify_data, started)
        except BaseException:
            fd, self._sync_fd = self._sync_fd, None
            if fd is not None:
                os.close(fd)
            self._release_dir_lock()
            raise
        log.info(
            "ssd tier %s: %d objects (%d bytes) recovered, %d corrupt and %d temp files "
            "deleted, %d dropped over the cap, in %.2f s",
            self.directory,
            report.recovered,
            report.bytes,
            report.corrupt,
            report.temp_removed,
            report.evicted_over_cap,
            report.seconds,
        )
        return report

    def close(self) -> None:
        """Release the directory. The files stay; a new tier can `open()` them."""
        with self._cond:
            self._closed = True
            self._opened = False
            fd, self._sync_fd = self._sync_fd, None
        if fd is not None:
            os.close(fd)
        self._release_dir_lock()

    def __enter__(self) -> SsdTier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---------------------------------------------------------------- objects

    def sync(self) -> None:
        """Make every `put(..., sync=False)` that returned before this call durable.

        Group commit (see the module doc): concurrent calls share one syncfs. Raises
        Internal if the flush failed; the objects it covered are then deleted and the
        tier refuses puts until reopened.
        """
        self._require_open()
        with self._cond:
            target = self._write_seq
            while True:
                if self._synced_seq >= target:
                    return
                if self._broken is not None:
                    raise Internal(self._broken)
                if not self._syncing:
                    break
                self._cond.wait()
            self._syncing = True
            upto = self._write_seq
        started = time.perf_counter()
        error: OSError | None = None
        try:
            _syncfs(self._sync_fd_or_raise())
        except OSError as err:
            error = err
        except BaseException:  # closed, interrupted: nothing advanced; the next caller flushes
            with self._cond:
                self._syncing = False
                self._cond.notify_all()
            raise
        elapsed = time.perf_counter() - started
        dropped: list[SsdEntry] = []
        with self._cond:  # one critical section: no new flush starts before the verdict
            self._syncing = False
            self._syncs += 1
            self._sync_seconds += elapsed
            if error is None:
                self._synced_seq = max(self._synced_seq, upto)
                for key in [k for k, seq in self._unsynced.items() if seq <= upto]:
                    del self._unsynced[key]
                self._cond.notify_all()
                return
            broken = self._broken = (
                f"SSD tier at {self.directory}: flushing to the device failed ({error}); "
                "objects written since the last good flush were deleted and the tier "
                "takes no more writes until the node restarts (which re-verifies every "
                "file)"
            )
            dropped = self._forget_unsynced_locked()
            self._cond.notify_all()
        self._delete_dropped(dropped)
        log.error("%s", broken)
        raise Internal(broken) from error

    def put(self, key: bytes, data: _Buffer, checksum: int, sync: bool | None = None) -> SsdEntry:
        """Store `data` under `key`, durably (see the module docstring) and atomically.

        `checksum` must be xxh3_64 of `data`; a mismatch raises CorruptObject and stores
        nothing (the source copy is damaged). A key already stored is a no-op returning
        its entry. If the cap leaves no room after evicting every unpinned object, raises
        StoreFull and evicts nothing.

        `sync`: None follows the tier's `fsync` setting (fsync the file and its directory
        before returning); False is group commit: the object is durable only once a
        later `sync()` returns, and must not be acknowledged before.
        """
        check_key(key)
        key = bytes(key)
        view = _byte_view(data)
        self._require_open()
        if fmt.checksum(view) != checksum:
            raise CorruptObject(
                f"refusing to store {len(view)} bytes whose checksum does not match the "
                "one given: the source copy is damaged",
                key=key,
            )
        need = fmt.file_length(len(key), len(view))
        durable = self.fsync if sync is None else sync
        group = sync is False and self.fsync  # a group commit: sync() follows
        with self._cond:
            while key in self._busy:
                self._cond.wait()
            if self._broken is not None:
                raise Unavailable(self._broken, key=key)
            slot = self._index.get(key)
            if slot is not None:
                self._index.move_to_end(key)
                return slot.entry
            victims = self._choose_victims_locked(key, need)
            freed = sum(v.disk_bytes for v in victims)
            # Until the victims are unlinked this put holds their space; then just `need`.
            hold = max(need, freed)
            self._used += hold - freed
            self._reserved += need
            self._busy.add(key)
            self._busy.update(v.key for v in victims)
        started = time.perf_counter()
        entry: SsdEntry | None = None
        late: SsdEntry | None = None  # written, but a flush failed meanwhile: not kept
        try:
            self._unlink_victims(victims, hold - need)
            entry = self._write_file(key, view, checksum, need, durable, group)
        finally:
            elapsed = time.perf_counter() - started
            with self._cond:
                self._reserved -= need
                self._busy.discard(key)
                if entry is not None and group and self._broken is not None:
                    late, entry = entry, None
                if entry is None:
                    self._used -= need
                else:
                    self._index[key] = _Slot(entry)
                    if group:
                        self._write_seq += 1
                        self._unsynced[key] = self._write_seq
                    self._stored += need
                    self._writes += 1
                    self._write_bytes += entry.size
                    self._write_seconds += elapsed
                self._cond.notify_all()
        if late is not None:
            _unlink_quietly(late.path)
            raise Unavailable(self._broken or "SSD tier refuses writes", key=key)
        assert entry is not None
        return entry

    def read_into(self, key: bytes, out: memoryview | bytearray) -> int:
        """Read the object into `out[:size]` and verify it; return its size.

        Raises NotFound if absent, CorruptObject (after deleting the file) if the file no
        longer matches its checksum. Counts as a use for LRU.
        """
        check_key(key)
        key = bytes(key)
        dest = _byte_view(out)
        if dest.readonly:
            raise InvalidArgument("read_into needs a writable buffer")
        self._require_open()
        with self._cond:
            slot = self._index.get(key)
            if slot is None:
                raise NotFound(f"key is not on the SSD tier of {self.directory}", key=key)
            self._index.move_to_end(key)
            entry = slot.entry
        if len(dest) < entry.size:
            raise InvalidArgument(
                f"read buffer of {len(dest)} bytes is smaller than the {entry.size}-byte object",
                key=key,
            )
        started = time.perf_counter()
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(
                f"key was removed from the SSD tier of {self.directory}", key=key
            ) from None
        try:
            problem = self._read_verified(fd, entry, dest[: entry.size])
            if problem is None:
                # The mtime is the last-use time that orders reindexed files after a restart.
                with contextlib.suppress(OSError):
                    os.utime(fd)
        finally:
            os.close(fd)
        if problem is not None:
            self._drop_corrupt(entry)
            raise CorruptObject(
                f"SSD copy at {entry.path} is corrupt ({problem}); it was deleted, reload "
                "the object from another replica or recompute it",
                key=key,
            )
        elapsed = time.perf_counter() - started
        with self._cond:
            self._reads += 1
            self._read_bytes += entry.size
            self._read_seconds += elapsed
        return entry.size

    def read(self, key: bytes) -> bytes:
        """The object's bytes (a copy; prefer `read_into` on hot paths)."""
        entry = self.get(key)
        buf = bytearray(entry.size)
        self.read_into(key, memoryview(buf))
        return bytes(buf)

    def remove(self, key: bytes) -> bool:
        """Delete the object, pinned or not; False if it was not here."""
        check_key(key)
        key = bytes(key)
        self._require_open()
        with self._cond:
            while key in self._busy:
                self._cond.wait()
            slot = self._index.pop(key, None)
            if slot is None:
                return False
            self._unsynced.pop(key, None)
            self._stored -= slot.entry.disk_bytes
            self._busy.add(key)
        try:
            _unlink_quietly(slot.entry.path)
        finally:
            with self._cond:
                self._used -= slot.entry.disk_bytes
                self._busy.discard(key)
                self._cond.notify_all()
        return True

    def pin(self, key: bytes) -> None:
        """Protect the object from the cap until a matching `unpin`. Pins count."""
        self._require_open()
        with self._cond:
            slot = self._index.get(bytes(key))
            if slot is None:
                raise NotFound(
                    f"cannot pin: key is not on the SSD tier of {self.directory}", key=bytes(key)
                )
            slot.pins += 1

    def unpin(self, key: bytes) -> None:
        """Undo one `pin`. Unpinning an absent or unpinned key does nothing, so a release
        after a forced remove is harmless."""
        with self._cond:
            slot = self._index.get(bytes(key))
            if slot is not None and slot.pins > 0:
                slot.pins -= 1

    def contains(self, key: bytes) -> bool:
        self._require_open()
        with self._cond:
            return bytes(key) in self._index

    def get(self, key: bytes) -> SsdEntry:
        """The entry of a stored key (no LRU touch); NotFound if absent."""
        self._require_open()
        with self._cond:
            slot = self._index.get(bytes(key))
            if slot is None:
                raise NotFound(f"key is not on the SSD tier of {self.directory}", key=bytes(key))
            return slot.entry

    def entries(self) -> list[SsdEntry]:
        """The inventory, least recently used first."""
        self._require_open()
        with self._cond:
            return [slot.entry for slot in self._index.values()]

    def drain_evicted(self) -> list[bytes]:
        """Keys the cap evicted since the last call (including at `open()`)."""
        with self._cond:
            evicted, self._evicted = self._evicted, []
            return evicted

    def stats(self) -> SsdStats:
        with self._cond:
            return SsdStats(
                capacity_bytes=self.capacity_bytes,
                used_bytes=self._used,
                stored_bytes=self._stored,
                objects=len(self._index),
                pinned_objects=sum(1 for s in self._index.values() if s.pins),
                writes=self._writes,
                write_bytes=self._write_bytes,
                reads=self._reads,
                read_bytes=self._read_bytes,
                evictions=self._evictions,
                evicted_bytes=self._evicted_bytes,
                corrupt_dropped=self._corrupt_dropped,
                write_seconds=self._write_seconds,
                read_seconds=self._read_seconds,
                syncs=self._syncs,
                sync_seconds=self._sync_seconds,
                unsynced_objects=len(self._unsynced),
            )

    def __len__(self) -> int:
        with self._cond:
            return len(self._index)

    # ---------------------------------------------------------------- internals

    def _require_open(self) -> None:
        if not self._opened:
            raise Unavailable(
                f"SSD tier at {self.directory} is not open: call open() first"
                if not self._closed
                else f"SSD tier at {self.directory} is closed"
            )

    def _sync_fd_or_raise(self) -> int:
        fd = self._sync_fd
        if fd is None:
            raise Unavailable(f"SSD tier at {self.directory} is closed")
        return fd

    def _forget_unsynced_locked(self) -> list[SsdEntry]:
        """Take every unflushed object out of the index (a flush failed); the caller
        deletes the files, with `_delete_dropped`, outside the lock."""
        dropped: list[SsdEntry] = []
        for key in list(self._unsynced):
            slot = self._index.pop(key, None)
            if slot is None:
                continue
            dropped.append(slot.entry)
            self._stored -= slot.entry.disk_bytes
            self._busy.add(key)
        self._unsynced.clear()
        return dropped

    def _delete_dropped(self, dropped: Sequence[SsdEntry]) -> None:
        try:
            for entry in dropped:
                _unlink_quietly(entry.path)
        finally:
            with self._cond:
                for entry in dropped:
                    self._used -= entry.disk_bytes
                    self._busy.discard(entry.key)
                self._cond.notify_all()

    def _choose_victims_locked(self, key: bytes, need: int) -> list[SsdEntry]:
        """Evict from the cold end, skipping pinned objects, until `need` bytes fit.

        All or nothing: if even evicting every unpinned object would not make room, raise
        StoreFull and evict nothing, since dropping objects would not help this put.
        """
        free = self.capacity_bytes - self._used
        if free >= need:
            return []
        chosen: list[_Slot] = []
        for slot in self._index.values():
            if slot.pins:
                continue
            chosen.append(slot)
            free += slot.entry.disk_bytes
            if free >= need:
                break
        if free < need:
            pinned = sum(s.entry.disk_bytes for s in self._index.values() if s.pins)
            raise StoreFull(
                f"SSD tier full: an object needs {need} bytes on disk but only {free} of "
                f"{self.capacity_bytes} can be freed ({pinned} bytes pinned, "
                f"{self._reserved} reserved by puts in flight); unpin objects or raise "
                "the SSD capacity",
                key=key,
            )
        victims = [slot.entry for slot in chosen]
        for victim in victims:
            del self._index[victim.key]
            self._unsynced.pop(victim.key, None)
            self._stored -= victim.disk_bytes
            self._evicted.append(victim.key)
            self._evictions += 1
            self._evicted_bytes += victim.disk_bytes
        return victims

    def _unlink_victims(self, victims: Sequence[SsdEntry], surplus: int) -> None:
        if not victims:
            return
        try:
            for victim in victims:
                _unlink_quietly(victim.path)
        finally:
            with self._cond:
                self._used -= surplus
                for victim in victims:
                    self._busy.discard(victim.key)
                self._cond.notify_all()

    def _write_file(self, key: bytes, view: memoryview, checksum: int, need: int,
                    durable: bool, start_writeback: bool = False) -> SsdEntry:
        stem = fmt.object_name(key)
        shard = self.directory / stem[: fmt.SHARD_HEX_DIGITS]
        final = shard / f"{stem}{fmt.OBJECT_SUFFIX}"
        temp = shard / fmt.temp_name(stem, f"{os.getpid()}-{next(self._temp_ids)}")
        header = fmt.pack_header(
            fmt.Header(key_len=len(key), data_len=len(view), checksum=checksum)
        )
        renamed = False
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, [header, key, view, fmt.padding(len(key), len(view))])
                if durable:
                    os.fsync(fd)
                elif start_writeback:
                    _start_writeback(fd)
            finally:
                os.close(fd)
            os.rename(temp, final)
            renamed = True
            if durable:
                _fsync_dir(shard)
        except OSError as err:
            _unlink_quietly(temp)
            if renamed:
                _unlink_quietly(final)
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(
                    f"SSD tier full: the device under {self.directory} ran out of space "
                    f"({err.strerror}); lower the SSD capacity below the free space",
                    key=key,
                ) from err
            raise Internal(f"SSD write to {final} failed: {err}", key=key) from err
        except BaseException:
            _unlink_quietly(temp)
            if renamed:
                _unlink_quietly(final)
            raise
        return SsdEntry(
            key=key, size=len(view), checksum=checksum, disk_bytes=need, path=str(final)
        )

    @staticmethod
    def _read_verified(fd: int, entry: SsdEntry, dest: memoryview) -> str | None:
        """Fill `dest` with the object's data; the reason it is corrupt, or None."""
        prefix = os.pread(fd, fmt.HEADER_SIZE + len(entry.key), 0)
        try:
            header = fmt.unpack_header(prefix)
        except fmt.FormatError as err:
            return str(err)
        if prefix[fmt.HEADER_SIZE :] != entry.key:
            return "key in the file does not match"
        if header.data_len != entry.size or header.checksum != entry.checksum:
            return "header does not match the index"
        if not _pread_exact(fd, dest, fmt.HEADER_SIZE + len(entry.key)):
            return "file truncated"
        if fmt.checksum(dest) != header.checksum:
            return "data checksum mismatch"
        return None

    def _drop_corrupt(self, entry: SsdEntry) -> None:
        with self._cond:
            slot = self._index.get(entry.key)
            if slot is None or slot.entry is not entry:
                return  # already removed (and maybe stored afresh) by someone else
            del self._index[entry.key]
            self._unsynced.pop(entry.key, None)
            self._stored -= entry.disk_bytes
            self._busy.add(entry.key)
            self._corrupt_dropped += 1
        try:
            _unlink_quietly(entry.path)
        finally:
            with self._cond:
                self._used -= entry.disk_bytes
                self._busy.discard(entry.key)
                self._cond.notify_all()
        log.warning("ssd tier %s: deleted corrupt object file %s", self.directory, entry.path)

    def _take_dir_lock(self) -> int:
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Unavailable(
                f"SSD directory {self.directory} is in use by another tier or process; "
                "give each store node its own directory"
            ) from None
        return fd

    def _release_dir_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    def _reindex(self, verify_data: bool, started: float) -> ReindexReport:
        for name in fmt.shard_names():
            (self.directory / name).mkdir(exist_ok=True)
        _fsync_dir(self.directory)
        found: list[tuple[int, str, SsdEntry]] = []
        corrupt = corrupt_bytes = temp_removed = ignored = 0
        for shard_name in fmt.shard_names():
            with os.scandir(self.directory / shard_name) as it:
                dirents = list(it)
            for dirent in dirents:
                if not dirent.is_file(follow_symlinks=False):
                    ignored += 1
                    continue
                if fmt.is_temp_name(dirent.name):
                    _unlink_quietly(dirent.path)
                    temp_removed += 1
                    continue
                stem = fmt.stem_of(dirent.name)
                if stem is None or not stem.startswith(shard_name):
                    ignored += 1
                    continue
                try:
                    entry, mtime_ns = _check_file(dirent.path, stem, verify_data)
                except fmt.FormatError as err:
                    log.warning("ssd tier %s: deleting %s: %s", self.directory, dirent.path, err)
                    corrupt += 1
                    with contextlib.suppress(OSError):
                        corrupt_bytes += dirent.stat(follow_symlinks=False).st_size
                    _unlink_quietly(dirent.path)
                    continue
                found.append((mtime_ns, entry.path, entry))
        found.sort(key=lambda item: (item[0], item[1]))  # least recently used first
        total = sum(entry.disk_bytes for _, _, entry in found)
        dropped: list[SsdEntry] = []
        for _, _, entry in found:
            if total <= self.capacity_bytes:
                break
            _unlink_quietly(entry.path)
            total -= entry.disk_bytes
            dropped.append(entry)
        del found[: len(dropped)]
        with self._cond:
            for _, _, entry in found:
                self._index[entry.key] = _Slot(entry)
            self._used = self._stored = total
            self._evicted.extend(entry.key for entry in dropped)
            self._evictions += len(dropped)
            self._evicted_bytes += sum(entry.disk_bytes for entry in dropped)
            self._opened = True
        return ReindexReport(
            recovered=len(found),
            bytes=total,
            corrupt=corrupt,
            corrupt_bytes=corrupt_bytes,
            temp_removed=temp_removed,
            evicted_over_cap=len(dropped),
            evicted_bytes=sum(entry.disk_bytes for entry in dropped),
            ignored=ignored,
            seconds=time.perf_counter() - started,
        )


# -------------------------------------------------------------------- file helpers


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


_LIBC = _load_libc()
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait
if _LIBC is not None:
    with contextlib.suppress(AttributeError):  # not Linux: os.sync(), no writeback hint
        _LIBC.syncfs.argtypes = [ctypes.c_int]
        _LIBC.syncfs.restype = ctypes.c_int
    with contextlib.suppress(AttributeError):
        _LIBC.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                          ctypes.c_uint]
        _LIBC.sync_file_range.restype = ctypes.c_int


def _syncfs(fd: int) -> None:
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


def _start_writeback(fd: int) -> None:
    """Start writing the file's dirty pages to the device now, without waiting (a hint:
    the flush in `sync()` is what waits and what makes them durable)."""
    if _LIBC is not None and hasattr(_LIBC, "sync_file_range"):
        _LIBC.sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def _byte_view(data: _Buffer) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _check_file(path: str, stem: str, verify_data: bool) -> tuple[SsdEntry, int]:
    """Validate one object file; its entry and mtime, or FormatError with the reason."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise fmt.FormatError(f"cannot open: {err}") from err
    try:
        st = os.fstat(fd)
        header = fmt.unpack_header(os.pread(fd, fmt.HEADER_SIZE, 0))
        key = os.pread(fd, header.key_len, fmt.HEADER_SIZE)
        if len(key) != header.key_len:
            raise fmt.FormatError("file truncated inside the key")
        if fmt.object_name(key) != stem:
            raise fmt.FormatError("key does not match the file name")
        if st.st_size != header.file_len:
            raise fmt.FormatError(
                f"length {st.st_size} is not the expected {header.file_len}"
                + (" (truncated)" if st.st_size < header.file_len else "")
            )
        if verify_data:
            hasher = xxhash.xxh3_64()
            buf = memoryview(bytearray(min(_VERIFY_CHUNK, max(header.data_len, 1))))
            offset, left = fmt.HEADER_SIZE + header.key_len, header.data_len
            while left:
                chunk = buf[: min(left, len(buf))]
                if not _pread_exact(fd, chunk, offset):
                    raise fmt.FormatError("file truncated inside the data")
                hasher.update(chunk)
                offset += len(chunk)
                left -= len(chunk)
            if hasher.intdigest() != header.checksum:
                raise fmt.FormatError("data checksum mismatch")
    except OSError as err:
        raise fmt.FormatError(f"read failed: {err}") from err
    finally:
        os.close(fd)
    entry = SsdEntry(
        key=key,
        size=header.data_len,
        checksum=header.checksum,
        disk_bytes=header.file_len,
        path=path,
    )
    return entry, st.st_mtime_ns


def _write_all(fd: int, parts: Sequence[_Buffer]) -> None:
    views = [_byte_view(p) for p in parts if len(p)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _pread_exact(fd: int, dest: memoryview, offset: int) -> bool:
    """Fill `dest` from `offset`; False if the file ends first."""
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n == 0:
            return False
        done += n
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.error("ssd tier: could not delete %s: %s", path, err)
