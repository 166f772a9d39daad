"""SsdTier: round trips, the byte cap and LRU eviction."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import xxhash

from kvstore.errors import CorruptObject, InvalidArgument, NotFound, StoreFull, Unavailable
from kvstore.store import ssd, ssd_files
from kvstore.store import ssd_format as fmt
from kvstore.store.ssd import SsdEntry, SsdTier

BLOCK = fmt.BLOCK


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def put(tier: SsdTier, key: bytes, data: bytes) -> SsdEntry:
    return tier.put(key, data, xxhash.xxh3_64_intdigest(data))


def disk_usage(root: Path) -> tuple[int, int]:
    """(sum of st_size, sum of st_blocks * 512) over every file under `root`."""
    size = blocks = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            size += st.st_size
            blocks += st.st_blocks * 512
    return size, blocks


def files_under(root: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, n), root)
        for d, _, names in os.walk(root)
        for n in names
        if n != ssd.LOCK_FILE
    )


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[SsdTier]:
    with SsdTier(tmp_path / "ssd", capacity_bytes=64 * BLOCK, fsync=False) as t:
        t.open()
        yield t


def small_tier(tmp_path: Path, objects: int) -> SsdTier:
    """A tier with room for exactly `objects` one-block objects."""
    t = SsdTier(tmp_path / "ssd", capacity_bytes=objects * BLOCK, fsync=False)
    t.open()
    return t


# ------------------------------------------------------------------ round trips

ROUND_TRIP_SIZES = [1, 2, 63, 64, BLOCK - 64 - 4, BLOCK - 64 - 3, BLOCK, 65_537, 1 << 20, 4 << 20]


def test_round_trip_is_byte_identical_from_1_byte_to_4_mib(tmp_path: Path) -> None:
    with SsdTier(tmp_path / "ssd", capacity_bytes=64 << 20, fsync=True) as tier:
        tier.open()
        for i, size in enumerate(ROUND_TRIP_SIZES):
            key = f"k{i:03d}".encode()
            data = blob(size, seed=i)
            entry = put(tier, key, data)
            assert entry.size == size and entry.checksum == xxhash.xxh3_64_intdigest(data)
            assert entry.disk_bytes == os.stat(entry.path).st_size
            assert entry.disk_bytes % BLOCK == 0
            assert tier.read(key) == data
            out = bytearray(size + 100)
            assert tier.read_into(key, memoryview(out)) == size
            assert out[:size] == data and out[size:] == bytes(100)
        stats = tier.stats()
        assert stats.writes == len(ROUND_TRIP_SIZES)
        assert stats.write_bytes == sum(ROUND_TRIP_SIZES)
        assert stats.reads == 2 * len(ROUND_TRIP_SIZES)
        assert stats.read_bytes == 2 * sum(ROUND_TRIP_SIZES)
        assert stats.used_bytes == stats.stored_bytes == disk_usage(tier.directory)[0]


def test_put_accepts_any_contiguous_buffer(tier: SsdTier) -> None:
    data = blob(1000)
    checksum = xxhash.xxh3_64_intdigest(data)
    tier.put(b"mv", memoryview(data), checksum)
    tier.put(b"ba", bytearray(data), checksum)
    tier.put(b"u32", memoryview(data[:1000]).cast("I"), checksum)
    assert tier.read(b"mv") == tier.read(b"ba") == tier.read(b"u32") == data


def test_putting_an_existing_key_is_a_no_op(tier: SsdTier) -> None:
    first = put(tier, b"k", b"hello")
    assert put(tier, b"k", b"hello") == first
    assert tier.stats().writes == 1
    assert len(files_under(tier.directory)) == 1


def test_put_with_a_wrong_checksum_stores_nothing(tier: SsdTier) -> None:
    with pytest.raises(CorruptObject):
        tier.put(b"k", b"hello", 12345)
    assert not tier.contains(b"k")
    assert files_under(tier.directory) == []
    assert tier.stats().used_bytes == 0


def test_remove(tier: SsdTier) -> None:
    entry = put(tier, b"k", b"hello")
    assert tier.remove(b"k") is True
    assert not os.path.exists(entry.path)
    assert tier.remove(b"k") is False
    assert not tier.contains(b"k")
    with pytest.raises(NotFound):
        tier.read(b"k")
    assert tier.stats().used_bytes == 0


def test_missing_keys_bad_keys_and_small_buffers(tier: SsdTier) -> None:
    with pytest.raises(NotFound):
        tier.read_into(b"nope", memoryview(bytearray(10)))
    with pytest.raises(InvalidArgument):
        put(tier, b"", b"x")
    put(tier, b"k", b"0123456789")
    with pytest.raises(InvalidArgument):
        tier.read_into(b"k", memoryview(bytearray(9)))
    with pytest.raises(InvalidArgument):
        tier.read_into(b"k", memoryview(bytes(10)))


def test_use_requires_open_and_one_tier_per_directory(tmp_path: Path) -> None:
    first = SsdTier(tmp_path / "ssd", capacity_bytes=1 << 20, fsync=False)
    with pytest.raises(Unavailable, match="open"):
        put(first, b"k", b"v")
    first.open()
    second = SsdTier(tmp_path / "ssd", capacity_bytes=1 << 20, fsync=False)
    with pytest.raises(Unavailable, match="in use"):
        second.open()
    first.close()
    with pytest.raises(Unavailable, match="closed"):
        first.read(b"k")
    second.open()
    second.close()


# ------------------------------------------------------------------ the cap


def test_bytes_on_disk_never_exceed_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capacity = 2 << 20
    root = tmp_path / "ssd"
    tier = SsdTier(root, capacity_bytes=capacity, fsync=False)
    tier.open()
    peaks: list[tuple[int, int]] = []
    real_write_all = ssd_files.write_all

    def measured_write_all(fd: int, parts: Sequence[ssd_files.Buffer]) -> None:
        # Victims are gone and the temp file exists: the worst moments of a put.
        peaks.append(disk_usage(root))
        real_write_all(fd, parts)
        peaks.append(disk_usage(root))

    monkeypatch.setattr(ssd_files, "write_all", measured_write_all)
    rng = random.Random(7)
    written = i = 0
    while written < 3 * capacity:
        data = blob(rng.randint(1, 300_000), seed=i)
        put(tier, f"obj-{i}".encode(), data)
        written += len(data)
        i += 1
        size, blocks = disk_usage(root)
        assert size <= capacity and blocks <= capacity
        assert tier.stats().used_bytes == size
    assert peaks and all(s <= capacity and b <= capacity for s, b in peaks)
    stats = tier.stats()
    assert stats.evictions > 0
    assert stats.objects + stats.evictions == i
    tier.close()


def test_evictions_follow_least_recent_use(tmp_path: Path) -> None:
    tier = small_tier(tmp_path, objects=4)
    for key in (b"a", b"b", b"c", b"d"):
        put(tier, key, key * 10)
    assert tier.read(b"a") == b"a" * 10  # a is now the most recent
    put(tier, b"e", b"e")
    assert [e.key for e in tier.entries()] == [b"c", b"d", b"a", b"e"]  # b went
    put(tier, b"a", b"a" * 10)  # a no-op put is a use too
    put(tier, b"f", b"f")
    assert [e.key for e in tier.entries()] == [b"d", b"e", b"a", b"f"]  # then c
    put(tier, b"g", b"g")
    assert [e.key for e in tier.entries()] == [b"e", b"a", b"f", b"g"]  # then d
    assert tier.stats().evictions == 3


def test_a_big_object_evicts_as_many_as_it_needs(tmp_path: Path) -> None:
    tier = small_tier(tmp_path, objects=4)
    for key in (b"a", b"b", b"c", b"d"):
        put(tier, key, key)
    put(tier, b"big", blob(2 * BLOCK))  # three blocks with its header
    assert tier.stats().evictions == 3
    assert [e.key for e in tier.entries()] == [b"d", b"big"]


def test_store_full_leaves_files_and_accounting_unchanged(tmp_path: Path) -> None:
    tier = small_tier(tmp_path, objects=4)
    for key in (b"a", b"b", b"c", b"d"):
        put(tier, key, key)
    before_files = files_under(tier.directory)
    before_stats = tier.stats()
    with pytest.raises(StoreFull, match="SSD tier full"):
        put(tier, b"huge", blob(10 * BLOCK))  # larger than the whole tier
    assert files_under(tier.directory) == before_files
    assert tier.stats() == before_stats
    put(tier, b"e", b"e")
    assert [e.key for e in tier.entries()] == [b"b", b"c", b"d", b"e"]


def test_room_held_by_a_put_in_flight_is_not_evictable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = small_tier(tmp_path, objects=4)
    put(tier, b"a", b"a")
    writing, release = threading.Event(), threading.Event()
    real_write_all = ssd_files.write_all

    def held_write_all(fd: int, parts: Sequence[ssd_files.Buffer]) -> None:
        writing.set()
        assert release.wait(10)
        real_write_all(fd, parts)

    monkeypatch.setattr(ssd_files, "write_all", held_write_all)
    slow = threading.Thread(target=put, args=(tier, b"big", blob(2 * BLOCK)))  # 3 blocks
    slow.start()
    try:
        assert writing.wait(10)
        monkeypatch.setattr(ssd_files, "write_all", real_write_all)
        with pytest.raises(StoreFull, match="reserved by puts in flight"):
            put(tier, b"two", blob(BLOCK))  # 2 blocks: only a's one could be freed
        assert tier.contains(b"a")
    finally:
        release.set()
        slow.join(10)
    assert [e.key for e in tier.entries()] == [b"a", b"big"]
    assert tier.stats().used_bytes == 4 * BLOCK


def test_store_full_evicts_nothing_when_eviction_would_not_help(tmp_path: Path) -> None:
    tier = small_tier(tmp_path, objects=4)
    for key in (b"a", b"b", b"c"):
        put(tier, key, key)
    with pytest.raises(StoreFull):
        put(tier, b"huge", blob(10 * BLOCK))  # larger than the whole tier
    assert [e.key for e in tier.entries()] == [b"a", b"b", b"c"]
    assert tier.stats().evictions == 0
    assert files_under(tier.directory) == sorted(fmt.relative_path(k) for k in (b"a", b"b", b"c"))


def test_a_failed_write_leaves_nothing_and_releases_its_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = small_tier(tmp_path, objects=4)

    def disk_full(fd: int, parts: Sequence[ssd_files.Buffer]) -> None:
        os.write(fd, b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ssd_files, "write_all", disk_full)
    with pytest.raises(StoreFull, match="ran out of space"):
        put(tier, b"k", b"v")
    assert files_under(tier.directory) == []
    assert tier.stats().used_bytes == 0 and not tier.contains(b"k")
    monkeypatch.undo()
    put(tier, b"k", b"v")
    assert tier.read(b"k") == b"v"


def test_group_commit_puts_then_one_sync(tmp_path: Path) -> None:
    with SsdTier(tmp_path, 1 << 20) as tier:
        tier.open()
        data = [bytes([i]) * (1000 + i) for i in range(8)]
        for i, d in enumerate(data):
            tier.put(f"g{i}".encode(), d, xxhash.xxh3_64_intdigest(d), sync=False)
        tier.sync()
        assert [tier.read(f"g{i}".encode()) for i in range(8)] == data
    with SsdTier(tmp_path, 1 << 20) as again:  # what was synced survives a reopen
        report = again.open()
        assert report.recovered == 8 and report.corrupt == 0
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
