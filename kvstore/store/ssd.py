"""The SSD tier of a store node: a directory of self-describing object files under a byte cap.

`SsdTier` is the face the node uses (service.py, daemon.py, tier_metrics.py); it holds the
one lock and the rules of each operation, and delegates the mechanisms:
- `ssd_index`: which keys are stored, last-use order, the byte cap (no files, no locks);
- `ssd_commit`: group commit, which unflushed writes a flush covers (no I/O);
- `ssd_files`: object files written, read and verified, the scan at open, the lock file;
- `ssd_libc`: syncfs(2) and sync_file_range(2) through ctypes;
- `ssd_format`: the bytes of one file.

Eviction belongs to the master: its core counts every SSD object against this node's cap
at a worst-case size and drops objects from a node's SSD LRU to make room for a demotion.
The cap here is only the node's hard limit for the moments the two views differ; the
tier reports its inventory (`entries()`) and nothing else. docs/ssd.md, "Who evicts from
the SSD tier", has the argument and the cases.

Calls block on file I/O; the node calls them from a thread pool. One lock guards the
index, the group-commit state and the counters; reads, writes and unlinks run outside it.
A key that is being written or unlinked is busy (see `ssd_index`): another put or remove
of the same key waits for it.

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
- Concurrent callers share flushes (`ssd_commit`): N batches in flight cost about one
  flush each, not N per object.
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
capacity / read bandwidth); bad files are deleted and counted. Survivors are ordered by
file mtime (a read touches the mtime, so this is last-use order) and, if they exceed a cap
lowered since the last run, the oldest are dropped before the inventory is first read, so
the master never hears of them. A directory is held by one tier at a time (`flock` on
`LOCK`).

Packs (`put_many`): the store node's Move writes a batch of small demotions as one pack
file of records (ssd_format), because creating a file is most of what a small object's
demotion costs. Each record is indexed as (pack, offset) and counted at its exact length
like a file; a removed record is cleared (its blocks punched out) by a background thread,
since nothing writes that range again, and the pack is unlinked with its last record.
Re-indexing walks every pack record by record. A record whose clearing a crash lost comes
back, like a file whose unlink was lost; a key found twice keeps its most recent copy.

An explicit `remove` is the master's decision; it checks its own leases.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kvstore.checksum import matches
from kvstore.errors import (
    CorruptObject,
    Internal,
    InvalidArgument,
    KVStoreError,
    NotFound,
    Unavailable,
    check_key,
)
from kvstore.store import ssd_files as files
from kvstore.store import ssd_format as fmt
from kvstore.store import ssd_libc
from kvstore.store.ssd_commit import GroupCommit
from kvstore.store.ssd_files import LOCK_FILE, Buffer
from kvstore.store.ssd_index import PutPlan, SsdEntry, SsdIndex, over_cap

__all__ = ["LOCK_FILE", "ReindexReport", "SsdEntry", "SsdStats", "SsdTier"]

log = logging.getLogger(__name__)


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
    writes: int
    write_bytes: int  # object bytes written
    reads: int
    read_bytes: int
    evictions: int  # by the cap, at open and by puts
    evicted_bytes: int
    corrupt_dropped: int
    write_seconds: float
    read_seconds: float
    syncs: int = 0  # group-commit flushes (syncfs calls)
    sync_seconds: float = 0.0
    unsynced_objects: int = 0  # written with sync=False, not yet flushed


@dataclass(slots=True)
class _IoCounts:
    writes: int = 0
    write_bytes: int = 0
    write_seconds: float = 0.0
    reads: int = 0
    read_bytes: int = 0
    read_seconds: float = 0.0
    corrupt_dropped: int = 0


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
        self._index = SsdIndex(capacity_bytes)
        self._commit = GroupCommit(self._cond)
        self._io = _IoCounts()
        self._lock_fd: int | None = None
        self._sync_fd: int | None = None  # kept open: syncfs reports errors since its open
        self._opened = False
        self._closed = False
        self._temp_ids = itertools.count()
        self._packs: dict[str, int] = {}  # pack file -> records in the index or being taken
        # Pack records out of the index, waiting to be cleared by the clearer thread
        # (clearing a record costs a filesystem journal operation; nothing ever writes
        # that range again, so it may happen later, off the caller's path).
        self._to_clear: list[SsdEntry] = []
        self._clear_wake = threading.Condition(threading.Lock())
        self._clearer: threading.Thread | None = None

    # ---------------------------------------------------------------- life cycle

    def open(self, verify_data: bool = True) -> ReindexReport:
        """Take the directory and re-index what a previous run left in it."""
        with self._cond:
            if self._opened or self._closed:
                raise InvalidArgument("an SsdTier is opened once; create a new one to reopen")
        started = time.perf_counter()
        self._lock_fd = files.take_dir_lock(self.directory)
        try:
            self._sync_fd = files.open_dir(self.directory)
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
            self.directory, report.recovered, report.bytes, report.corrupt,
            report.temp_removed, report.evicted_over_cap, report.seconds,
        )
        return report

    def close(self) -> None:
        """Release the directory. The files stay; a new tier can `open()` them."""
        with self._clear_wake:
            self._closed = True
            self._clear_wake.notify_all()
            clearer = self._clearer
        if clearer is not None:
            clearer.join()
        self.flush_clears()
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
        upto = self._commit.begin()
        if upto is None:
            return
        started = time.perf_counter()
        error: OSError | None = None
        try:
            ssd_libc.syncfs(self._sync_fd_or_raise())
        except OSError as err:
            error = err
        except BaseException:
            self._commit.abandon()
            raise
        elapsed = time.perf_counter() - started
        with self._cond:  # one critical section: no new flush starts before the verdict
            if error is None:
                self._commit.succeeded_locked(upto, elapsed)
                return
            broken = (
                f"SSD tier at {self.directory}: flushing to the device failed ({error}); "
                "objects written since the last good flush were deleted and the tier "
                "takes no more writes until the node restarts (which re-verifies every "
                "file)"
            )
            taken = [e for k in self._commit.failed_locked(broken, elapsed)
                     if (e := self._index.take(k)) is not None]
        self._unlink_taken(taken)
        log.error("%s", broken)
        raise Internal(broken) from error

    def put(self, key: bytes, data: Buffer, checksum: int, sync: bool | None = None) -> SsdEntry:
        """Store `data` under `key`, durably (see the module docstring) and atomically.

        `checksum` must be xxh3_64 of `data`; a mismatch raises CorruptObject and stores
        nothing (the source copy is damaged). A key already stored is a no-op returning
        its entry. If the cap leaves no room even after evicting every object not being
        written, raises StoreFull and evicts nothing.

        `sync`: None follows the tier's `fsync` setting (fsync the file and its directory
        before returning); False is group commit: the object is durable only once a
        later `sync()` returns, and must not be acknowledged before.
        """
        check_key(key)
        key = bytes(key)
        view = files.byte_view(data)
        self._require_open()
        _refuse_damaged(key, view, checksum)
        need = fmt.file_length(len(key), len(view))
        durable = self.fsync if sync is None else sync
        group = sync is False and self.fsync  # a group commit: sync() follows
        plan = self._reserve(key, need)
        if isinstance(plan, SsdEntry):
            return plan
        started = time.perf_counter()
        entry: SsdEntry | None = None
        late: SsdEntry | None = None  # written, but a flush failed meanwhile: not kept
        try:
            if plan.victims:
                try:
                    self._discard(plan.victims)
                finally:
                    with self._cond:
                        self._index.victims_unlinked(plan)
                        self._cond.notify_all()
            entry = files.write_object(self.directory, key, view, checksum, need, durable,
                                       group, f"{os.getpid()}-{next(self._temp_ids)}")
        finally:
            elapsed = time.perf_counter() - started
            with self._cond:
                if entry is not None and group and self._commit.broken is not None:
                    late, entry = entry, None
                self._index.finish_put(plan, entry)
                if entry is not None:
                    if group:
                        self._commit.wrote_locked(key)
                    self._io.writes += 1
                    self._io.write_bytes += entry.size
                    self._io.write_seconds += elapsed
                self._cond.notify_all()
        if late is not None:
            self._discard([late])
            raise Unavailable(self._commit.broken or "SSD tier refuses writes", key=key)
        assert entry is not None
        return entry

    def put_many(self, items: Sequence[tuple[bytes, Buffer, int]]) -> list[SsdEntry | KVStoreError]:
        """Group-commit puts of many objects (`put(..., sync=False)` each), written as
        one pack file: per item its entry, or the error `put` would have raised. The
        objects are durable once a later `sync()` returns."""
        self._require_open()
        out: list[SsdEntry | KVStoreError | None] = [None] * len(items)
        plans: list[tuple[int, PutPlan, memoryview, int]] = []
        seen: dict[bytes, int] = {}
        try:
            for i, (raw_key, data, checksum) in enumerate(items):
                try:
                    check_key(raw_key)
                    key = bytes(raw_key)
                    view = files.byte_view(data)
                    if key in seen:  # the same key twice in one batch: stored once
                        continue
                    seen[key] = i
                    _refuse_damaged(key, view, checksum)
                    plan = self._reserve(key, fmt.file_length(len(key), len(view)))
                    if isinstance(plan, SsdEntry):
                        out[i] = plan
                        continue
                    plans.append((i, plan, view, checksum))
                except KVStoreError as exc:
                    out[i] = exc
            self._write_pack(plans, out)
        finally:
            with self._cond:  # plans whose write never ran give their room back
                for i, plan, _, _ in plans:
                    if out[i] is None:
                        self._index.finish_put(plan, None)
                self._cond.notify_all()
        for i, (raw_key, _, _) in enumerate(items):
            if out[i] is None:
                out[i] = out[seen[bytes(raw_key)]]
        return [o for o in out if o is not None]

    def _reserve(self, key: bytes, need: int) -> SsdEntry | PutPlan:
        """Room for `key` (the plan, its victims forgotten by the group commit), or the
        entry already stored under it; waits while another write of the key runs."""
        with self._cond:
            while self._index.is_busy(key):
                self._cond.wait()
            if self._commit.broken is not None:
                raise Unavailable(self._commit.broken, key=key)
            existing = self._index.touch(key)
            if existing is not None:
                return existing
            # Victims here are files the master does not count (it reserves a worst-case
            # size per object against this cap and drops its own victims before the
            # Move): nobody is told, because the master already treats a missing SSD
            # copy as lost when it promotes it. docs/ssd.md, "Who evicts".
            plan = self._index.plan_put(key, need)
            for victim in plan.victims:
                self._commit.forget_locked(victim.key)
            return plan

    def _write_pack(self, plans: list[tuple[int, PutPlan, memoryview, int]],
                    out: list[SsdEntry | KVStoreError | None]) -> None:
        """put_many's write: the victims out, one pack, the entries in."""
        if not plans:
            return
        victims = [v for _, plan, _, _ in plans for v in plan.victims]
        try:
            self._discard(victims)
        finally:
            with self._cond:
                for _, plan, _, _ in plans:
                    self._index.victims_unlinked(plan)
                self._cond.notify_all()
        started = time.perf_counter()
        error: KVStoreError | None = None
        entries: list[SsdEntry] = []
        try:
            entries = files.write_pack(
                self.directory, [(plan.key, view, checksum, plan.need)
                                 for _, plan, view, checksum in plans],
                # A name no other run can have made: a pack is never renamed over.
                self.fsync, uuid.uuid4().hex)
        except KVStoreError as exc:
            error = exc
        elapsed = time.perf_counter() - started
        late: list[SsdEntry] = []
        with self._cond:
            broken = self._commit.broken
            written: list[SsdEntry | None] = list(entries) if entries else [None] * len(plans)
            for (i, plan, _, _), entry in zip(plans, written, strict=True):
                if entry is not None and broken is not None:
                    late.append(entry)  # written, but a flush failed meanwhile: not kept
                    entry = None
                self._index.finish_put(plan, entry)
                if entry is None:
                    out[i] = error or Unavailable(broken or "SSD tier refuses writes",
                                                  key=plan.key)
                    continue
                out[i] = entry
                if self.fsync:
                    self._commit.wrote_locked(plan.key)
                self._io.writes += 1
                self._io.write_bytes += entry.size
                self._io.write_seconds += elapsed / len(plans)
            if entries and not late:
                self._packs[entries[0].path] = len(entries)
            elif late:
                self._packs[late[0].path] = len(late)
            self._cond.notify_all()
        if late:
            self._discard(late)

    def read_into(self, key: bytes, out: memoryview | bytearray) -> int:
        """Read the object into `out[:size]` and verify it; return its size.

        Raises NotFound if absent, CorruptObject (after deleting the file) if the file no
        longer matches its checksum. Counts as a use for LRU.
        """
        check_key(key)
        key = bytes(key)
        dest = files.byte_view(out)
        if dest.readonly:
            raise InvalidArgument("read_into needs a writable buffer")
        self._require_open()
        with self._cond:
            entry = self._index.touch(key)
        if entry is None:
            raise NotFound(f"key is not on the SSD tier of {self.directory}", key=key)
        if len(dest) < entry.size:
            raise InvalidArgument(
                f"read buffer of {len(dest)} bytes is smaller than the {entry.size}-byte object",
                key=key,
            )
        started = time.perf_counter()
        try:
            problem = files.read_object(entry, dest[: entry.size])
        except FileNotFoundError:
            raise NotFound(
                f"key was removed from the SSD tier of {self.directory}", key=key
            ) from None
        if problem is not None:
            self._drop_corrupt(entry)
            raise CorruptObject(
                f"SSD copy at {entry.path} is corrupt ({problem}); it was deleted, reload "
                "the object from another replica or recompute it",
                key=key,
            )
        elapsed = time.perf_counter() - started
        with self._cond:
            self._io.reads += 1
            self._io.read_bytes += entry.size
            self._io.read_seconds += elapsed
        return entry.size

    def read(self, key: bytes) -> bytes:
        """The object's bytes (a copy; prefer `read_into` on hot paths)."""
        entry = self.get(key)
        buf = bytearray(entry.size)
        self.read_into(key, memoryview(buf))
        return bytes(buf)

    def remove(self, key: bytes) -> bool:
        """Delete the object; False if it was not here."""
        check_key(key)
        key = bytes(key)
        self._require_open()
        with self._cond:
            while self._index.is_busy(key):
                self._cond.wait()
            entry = self._take_locked(key)
        if entry is None:
            return False
        self._unlink_taken([entry])
        return True

    def contains(self, key: bytes) -> bool:
        self._require_open()
        with self._cond:
            return bytes(key) in self._index

    def get(self, key: bytes) -> SsdEntry:
        """The entry of a stored key (no LRU touch); NotFound if absent."""
        self._require_open()
        with self._cond:
            entry = self._index.get(bytes(key))
        if entry is None:
            raise NotFound(f"key is not on the SSD tier of {self.directory}", key=bytes(key))
        return entry

    def entries(self) -> list[SsdEntry]:
        """The inventory, least recently used first: what the node reports to the master."""
        self._require_open()
        with self._cond:
            return self._index.entries()

    def stats(self) -> SsdStats:
        with self._cond:
            index, io, commit = self._index, self._io, self._commit
            return SsdStats(
                capacity_bytes=self.capacity_bytes,
                used_bytes=index.used,
                stored_bytes=index.stored,
                objects=len(index),
                writes=io.writes,
                write_bytes=io.write_bytes,
                reads=io.reads,
                read_bytes=io.read_bytes,
                evictions=index.evictions,
                evicted_bytes=index.evicted_bytes,
                corrupt_dropped=io.corrupt_dropped,
                write_seconds=io.write_seconds,
                read_seconds=io.read_seconds,
                syncs=commit.syncs,
                sync_seconds=commit.seconds,
                unsynced_objects=commit.pending_locked(),
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

    def _take_locked(self, key: bytes, entry: SsdEntry | None = None) -> SsdEntry | None:
        """Take `key` out of the index (and out of what a flush owes) before its unlink."""
        taken = self._index.take(key, entry)
        if taken is not None:
            self._commit.forget_locked(key)
        return taken

    def _discard(self, gone: Sequence[SsdEntry]) -> None:
        """Delete the files (or pack records) of entries out of the index: an object
        file is unlinked, a pack record cleared, and a pack unlinked with its last one."""
        emptied: list[str] = []
        records: list[SsdEntry] = []
        with self._cond:
            for entry in gone:
                if not entry.packed:
                    continue
                left = self._packs.get(entry.path, 0) - 1
                if left > 0:
                    self._packs[entry.path] = left
                    records.append(entry)
                elif self._packs.pop(entry.path, None) is not None:
                    emptied.append(entry.path)
        for entry in gone:
            if not entry.packed:
                files.unlink_quietly(entry.path)
        for path in emptied:
            files.unlink_quietly(path)  # its cleared records no longer matter
        if records:
            with self._clear_wake:
                self._to_clear += records
                self._clear_wake.notify()
                if self._clearer is None:
                    self._clearer = threading.Thread(target=self._clear_loop, daemon=True,
                                                     name="ssd-clear")
                    self._clearer.start()

    def _clear_loop(self) -> None:
        while True:
            with self._clear_wake:
                while not self._to_clear and not self._closed:
                    self._clear_wake.wait()
                batch, self._to_clear = self._to_clear, []
                if not batch and self._closed:
                    return
            self._clear_records(batch)

    def _clear_records(self, batch: list[SsdEntry]) -> None:
        with self._cond:
            live = set(self._packs)
        for entry in batch:
            if entry.path in live:  # a pack unlinked meanwhile needs nothing
                files.clear_record(entry)

    def flush_clears(self) -> None:
        """Clear every pack record waiting for it now (close and tests)."""
        with self._clear_wake:
            batch, self._to_clear = self._to_clear, []
        self._clear_records(batch)

    def _unlink_taken(self, taken: list[SsdEntry]) -> None:
        try:
            self._discard(taken)
        finally:
            with self._cond:
                self._index.release(taken)
                self._cond.notify_all()

    def _drop_corrupt(self, entry: SsdEntry) -> None:
        with self._cond:
            if self._take_locked(entry.key, entry) is None:
                return  # already removed (and maybe stored afresh) by someone else
            self._io.corrupt_dropped += 1
        self._unlink_taken([entry])
        log.warning("ssd tier %s: deleted corrupt object file %s", self.directory, entry.path)

    def _release_dir_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    def _reindex(self, verify_data: bool, started: float) -> ReindexReport:
        found = files.scan(self.directory, verify_data)
        cut = over_cap(found.found, self.capacity_bytes)
        dropped, kept = found.found[:cut], found.found[cut:]
        with self._cond:
            for entry in (*found.found, *found.duplicates):
                if entry.packed:
                    self._packs[entry.path] = self._packs.get(entry.path, 0) + 1
        self._discard([*dropped, *found.duplicates])
        with self._cond:
            self._index.load(kept, dropped)
            self._opened = True
            recovered_bytes = self._index.stored
        return ReindexReport(
            recovered=len(kept),
            bytes=recovered_bytes,
            corrupt=found.corrupt,
            corrupt_bytes=found.corrupt_bytes,
            temp_removed=found.temp_removed,
            evicted_over_cap=len(dropped),
            evicted_bytes=sum(entry.disk_bytes for entry in dropped),
            ignored=found.ignored,
            seconds=time.perf_counter() - started,
        )


def _refuse_damaged(key: bytes, view: memoryview, checksum: int) -> None:
    """CorruptObject when the bytes to store do not match `checksum`: a copy that is
    already wrong (a torn or stray write) is never persisted."""
    if not matches(view, checksum):
        raise CorruptObject(f"refusing to store {len(view)} bytes whose checksum does not "
                            "match the one given: the source copy is damaged", key=key)
