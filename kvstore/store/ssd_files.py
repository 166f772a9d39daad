"""The SSD tier's file I/O: writing one object file atomically, reading and verifying it,
checking every file at open, and the directory lock. The byte layout is `ssd_format`'s;
which files should exist, and how many bytes they may take, is `ssd_index`'s; when a
write must reach the device is `SsdTier`'s (ssd.py, whose docstring argues the fsync
order used here).

Functions take paths and buffers and return entries or reasons; nothing here holds state
beyond the open descriptors it is handed, so each can be tested on a temporary directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvstore.checksum import Verifier, matches
from kvstore.errors import Internal, StoreFull, Unavailable
from kvstore.store import ssd_format as fmt
from kvstore.store import ssd_libc
from kvstore.store.ssd_index import SsdEntry

# One logger for the whole tier, under the name it had before the split, so existing
# log configuration keeps matching.
log = logging.getLogger("kvstore.store.ssd")

LOCK_FILE = "LOCK"
_VERIFY_CHUNK = 4 << 20
Buffer = bytes | bytearray | memoryview


def byte_view(data: Buffer) -> memoryview:
    """A flat byte view of any contiguous buffer (no copy)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


# -------------------------------------------------------------------- the directory


def take_dir_lock(directory: Path) -> int:
    """flock the directory's LOCK file; the descriptor holds it until closed."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Unavailable(
            f"SSD directory {directory} is in use by another tier or process; "
            "give each store node its own directory"
        ) from None
    return fd


def open_dir(directory: Path) -> int:
    """A descriptor of the directory itself (syncfs reports errors since its open)."""
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def fsync_dir(path: Path) -> None:
    fd = open_dir(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: str | Path) -> None:
    """Unlink, logging rather than raising: a file left behind is re-checked at the next
    open, while an exception here would leave the index's accounting half done."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.error("ssd tier: could not delete %s: %s", path, err)


# -------------------------------------------------------------------- one object


def write_object(directory: Path, key: bytes, view: memoryview, checksum: int, need: int,
                 durable: bool, start_writeback: bool, unique: str) -> SsdEntry:
    """Write the object under a temporary name in its shard, then rename it to its final
    name. `durable`: fsync the file before the rename and the shard directory after it.
    `start_writeback`: no fsync, but start the device working on the file now (a group
    commit's flush follows). `unique` names the temporary file."""
    stem = fmt.object_name(key)
    shard = directory / stem[: fmt.SHARD_HEX_DIGITS]
    final = shard / f"{stem}{fmt.OBJECT_SUFFIX}"
    temp = shard / fmt.temp_name(stem, unique)
    header = fmt.pack_header(fmt.Header(key_len=len(key), data_len=len(view), checksum=checksum))
    renamed = False
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, [header, key, view, fmt.padding(len(key), len(view))])
            if durable:
                os.fsync(fd)
            elif start_writeback:
                ssd_libc.start_writeback(fd)
        finally:
            os.close(fd)
        os.rename(temp, final)
        renamed = True
        if durable:
            fsync_dir(shard)
    except OSError as err:
        unlink_quietly(temp)
        if renamed:
            unlink_quietly(final)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(
                f"SSD tier full: the device under {directory} ran out of space "
                f"({err.strerror}); lower the SSD capacity below the free space",
                key=key,
            ) from err
        raise Internal(f"SSD write to {final} failed: {err}", key=key) from err
    except BaseException:
        unlink_quietly(temp)
        if renamed:
            unlink_quietly(final)
        raise
    return SsdEntry(key=key, size=len(view), checksum=checksum, disk_bytes=need, path=str(final))


def write_pack(directory: Path, items: Sequence[tuple[bytes, memoryview, int, int]],
               start_writeback: bool, unique: str) -> list[SsdEntry]:
    """Write objects (key, data, checksum, record length) as one pack file: one file
    created for the lot instead of one per object (creating a file is what a small
    object's demotion costs most). No fsync: packs are only written by group commit,
    whose flush follows, and a torn pack is found record by record at open."""
    packs = directory / fmt.PACK_DIR
    final = packs / f"{unique}{fmt.PACK_SUFFIX}"
    temp = packs / f".{unique}{fmt.TEMP_SUFFIX}"
    entries: list[SsdEntry] = []
    parts: list[Buffer] = []
    offset = 0
    for key, view, checksum, need in items:
        parts += fmt.pack_record(key, view, checksum)
        entries.append(SsdEntry(key=key, size=len(view), checksum=checksum, disk_bytes=need,
                                path=str(final), offset=offset))
        offset += need
    renamed = False
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, parts)
            if start_writeback:
                ssd_libc.start_writeback(fd)
        finally:
            os.close(fd)
        os.rename(temp, final)
        renamed = True
    except OSError as err:
        unlink_quietly(temp)
        if renamed:
            unlink_quietly(final)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(
                f"SSD tier full: the device under {directory} ran out of space "
                f"({err.strerror}); lower the SSD capacity below the free space") from err
        raise Internal(f"SSD write to {final} failed: {err}") from err
    except BaseException:
        unlink_quietly(temp)
        if renamed:
            unlink_quietly(final)
        raise
    return entries


def clear_record(entry: SsdEntry) -> None:
    """Free a removed pack record's blocks (zeros where the filesystem cannot punch)."""
    try:
        fd = os.open(entry.path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as err:
        log.error("ssd tier: could not open %s to clear a record: %s", entry.path, err)
        return
    try:
        if not ssd_libc.punch_hole(fd, entry.offset, entry.disk_bytes):
            os.pwrite(fd, bytes(entry.disk_bytes), entry.offset)
    except OSError as err:
        log.error("ssd tier: could not clear a record of %s: %s", entry.path, err)
    finally:
        os.close(fd)


def read_object(entry: SsdEntry, dest: memoryview) -> str | None:
    """Fill `dest` (exactly `entry.size` bytes) with the object's data and verify it; the
    reason it is corrupt, or None. On success the file's mtime becomes now: it is the
    last-use time that orders re-indexed files after a restart. FileNotFoundError if the
    file is gone."""
    fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        problem = _read_verified(fd, entry, dest)
        if problem is None:
            with contextlib.suppress(OSError):
                os.utime(fd)
        return problem
    finally:
        os.close(fd)


def _read_verified(fd: int, entry: SsdEntry, dest: memoryview) -> str | None:
    at = entry.offset
    prefix = os.pread(fd, fmt.HEADER_SIZE + len(entry.key), at)
    try:
        header = fmt.unpack_header(prefix)
    except fmt.FormatError as err:
        return str(err)
    if prefix[fmt.HEADER_SIZE :] != entry.key:
        return "key in the file does not match"
    if header.data_len != entry.size or header.checksum != entry.checksum:
        return "header does not match the index"
    if not pread_exact(fd, dest, at + fmt.HEADER_SIZE + len(entry.key)):
        return "file truncated"
    if not matches(dest, header.checksum):
        return "data checksum mismatch"
    return None


def write_all(fd: int, parts: Sequence[Buffer]) -> None:
    views = [byte_view(p) for p in parts if len(p)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def pread_exact(fd: int, dest: memoryview, offset: int) -> bool:
    """Fill `dest` from `offset`; False if the file ends first."""
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n == 0:
            return False
        done += n
    return True


# -------------------------------------------------------------------- re-indexing


@dataclass(slots=True)
class Scan:
    """What `scan` found in a directory a previous run left."""

    found: list[SsdEntry] = field(default_factory=list)  # valid files, least recently used first
    corrupt: int = 0  # bad header, key, length or checksum: deleted
    corrupt_bytes: int = 0
    temp_removed: int = 0  # leftover temporary files of interrupted puts: deleted
    ignored: int = 0  # files that are not ours: left alone
    duplicates: list[SsdEntry] = field(default_factory=list)  # older copies of a key: to clear


def scan(directory: Path, verify_data: bool) -> Scan:
    """Create the shard directories, delete leftover temporary and bad files, and list the
    valid object files in last-use order (file mtime: a read touches it)."""
    for name in fmt.shard_names():
        (directory / name).mkdir(exist_ok=True)
    fsync_dir(directory)
    result = Scan()
    dated: list[tuple[int, str, SsdEntry]] = []
    for shard_name in fmt.shard_names():
        with os.scandir(directory / shard_name) as it:
            dirents = list(it)
        for dirent in dirents:
            if _passed_over(dirent, result):
                continue
            stem = fmt.stem_of(dirent.name)
            if stem is None or not stem.startswith(shard_name):
                result.ignored += 1
                continue
            try:
                entry, mtime_ns = check_file(dirent.path, stem, verify_data)
            except fmt.FormatError as err:
                log.warning("ssd tier %s: deleting %s: %s", directory, dirent.path, err)
                result.corrupt += 1
                with contextlib.suppress(OSError):
                    result.corrupt_bytes += dirent.stat(follow_symlinks=False).st_size
                unlink_quietly(dirent.path)
                continue
            dated.append((mtime_ns, entry.path, entry))
    _scan_packs(directory, verify_data, result, dated)
    dated.sort(key=lambda item: (item[0], item[1], item[2].offset))
    # A key found twice (a record whose removal a crash lost, beside a newer copy): the
    # most recently used copy wins, the other is cleared.
    latest: dict[bytes, SsdEntry] = {}
    for _, _, entry in dated:
        old = latest.pop(entry.key, None)
        if old is not None:
            result.duplicates.append(old)
        latest[entry.key] = entry
    result.found = list(latest.values())
    return result


def _passed_over(dirent: os.DirEntry[str], result: Scan) -> bool:
    """Whether a scan skips this entry: not a plain file (counted as ignored), or the
    temporary file of a write a crash cut short (removed)."""
    if not dirent.is_file(follow_symlinks=False):
        result.ignored += 1
        return True
    if fmt.is_temp_name(dirent.name):
        unlink_quietly(dirent.path)
        result.temp_removed += 1
        return True
    return False


def _scan_packs(directory: Path, verify_data: bool, result: Scan,
                dated: list[tuple[int, str, SsdEntry]]) -> None:
    packs = directory / fmt.PACK_DIR
    packs.mkdir(exist_ok=True)
    with os.scandir(packs) as it:
        dirents = list(it)
    for dirent in dirents:
        if _passed_over(dirent, result):
            continue
        if not dirent.name.endswith(fmt.PACK_SUFFIX):
            result.ignored += 1
            continue
        try:
            entries, mtime_ns, bad = check_pack(dirent.path, verify_data)
        except fmt.FormatError as err:
            log.warning("ssd tier %s: deleting %s: %s", directory, dirent.path, err)
            result.corrupt += 1
            unlink_quietly(dirent.path)
            continue
        result.corrupt += bad
        result.corrupt_bytes += bad * fmt.BLOCK
        if not entries:
            unlink_quietly(dirent.path)
            continue
        dated += [(mtime_ns, entry.path, entry) for entry in entries]


def check_pack(path: str, verify_data: bool) -> tuple[list[SsdEntry], int, int]:
    """The valid records of a pack, its mtime, and how many damaged records it held
    (a cleared block is no record; a damaged one is skipped a block at a time)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise fmt.FormatError(f"cannot open: {err}") from err
    entries: list[SsdEntry] = []
    bad = 0
    try:
        st = os.fstat(fd)
        offset = 0
        while offset + fmt.HEADER_SIZE <= st.st_size:
            raw = os.pread(fd, fmt.HEADER_SIZE, offset)
            if not any(raw):  # a removed record's cleared blocks
                offset += fmt.BLOCK
                continue
            try:
                header = fmt.unpack_header(raw)
                if not header.flags & fmt.KEY_SUM:
                    raise fmt.FormatError("a pack record without its key's checksum")
                if offset + header.file_len > st.st_size:
                    raise fmt.FormatError("record truncated")
                key = os.pread(fd, header.key_len, offset + fmt.HEADER_SIZE)
                if fmt.checksum(key) != header.key_sum:
                    raise fmt.FormatError("key checksum mismatch")
                if verify_data:
                    _verify_data(fd, header, offset)
            except fmt.FormatError as err:
                log.warning("ssd tier: skipping a damaged record of %s at %d: %s", path,
                            offset, err)
                bad += 1
                offset += fmt.BLOCK
                continue
            entries.append(SsdEntry(key=key, size=header.data_len, checksum=header.checksum,
                                    disk_bytes=header.file_len, path=path, offset=offset))
            offset += header.file_len
    except OSError as err:
        raise fmt.FormatError(f"read failed: {err}") from err
    finally:
        os.close(fd)
    return entries, st.st_mtime_ns, bad


def check_file(path: str, stem: str, verify_data: bool) -> tuple[SsdEntry, int]:
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
            _verify_data(fd, header)
    except OSError as err:
        raise fmt.FormatError(f"read failed: {err}") from err
    finally:
        os.close(fd)
    entry = SsdEntry(key=key, size=header.data_len, checksum=header.checksum,
                     disk_bytes=header.file_len, path=path)
    return entry, st.st_mtime_ns


def _verify_data(fd: int, header: fmt.Header, at: int = 0) -> None:
    hasher = Verifier(header.checksum)
    buf = memoryview(bytearray(min(_VERIFY_CHUNK, max(header.data_len, 1))))
    offset, left = at + fmt.HEADER_SIZE + header.key_len, header.data_len
    while left:
        chunk = buf[: min(left, len(buf))]
        if not pread_exact(fd, chunk, offset):
            raise fmt.FormatError("file truncated inside the data")
        hasher.update(chunk)
        offset += len(chunk)
        left -= len(chunk)
    if not hasher.ok():
        raise fmt.FormatError("data checksum mismatch")
