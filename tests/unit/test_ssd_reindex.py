"""SsdTier after a restart: re-indexing, leftovers, corruption."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import xxhash

from kvstore.errors import CorruptObject, NotFound
from kvstore.store import ssd_format as fmt
from kvstore.store.ssd import SsdEntry, SsdTier

CAPACITY = 8 << 20


def put(tier: SsdTier, key: bytes, data: bytes) -> SsdEntry:
    return tier.put(key, data, xxhash.xxh3_64_intdigest(data))


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def populate(root: Path, count: int = 20) -> dict[bytes, bytes]:
    rng = random.Random(3)
    objects = {f"key-{i}".encode(): rng.randbytes(rng.randint(1, 100_000)) for i in range(count)}
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=True) as tier:
        tier.open()
        for key, data in objects.items():
            put(tier, key, data)
    return objects


def test_reopen_recovers_every_object(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    objects = populate(root)
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        report = tier.open()
        assert report.recovered == len(objects)
        assert report.corrupt == report.temp_removed == report.evicted_over_cap == 0
        entries = {e.key: e for e in tier.entries()}
        assert entries.keys() == objects.keys()
        for key, data in objects.items():
            assert entries[key].size == len(data)
            assert entries[key].checksum == xxhash.xxh3_64_intdigest(data)
            assert tier.read(key) == data
        assert (
            report.bytes == tier.stats().used_bytes == sum(e.disk_bytes for e in entries.values())
        )


def test_leftover_temp_files_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    objects = populate(root, count=3)
    stem = fmt.object_name(b"interrupted")
    temp = root / stem[:2] / fmt.temp_name(stem, "999-0")
    temp.write_bytes(b"half an object")
    foreign = root / "00" / "README"
    foreign.write_text("not ours")
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        report = tier.open()
        assert report.temp_removed == 1 and report.ignored == 1
        assert report.recovered == len(objects)
        assert not temp.exists() and foreign.exists()
        assert not tier.contains(b"interrupted")


def test_a_flipped_data_byte_is_dropped_at_open(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    objects = populate(root)
    victim = b"key-5"
    path = root / fmt.relative_path(victim)
    flip_byte(str(path), fmt.HEADER_SIZE + len(victim) + len(objects[victim]) // 2)
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        report = tier.open()
        assert report.corrupt == 1 and report.recovered == len(objects) - 1
        assert report.corrupt_bytes == fmt.file_length(len(victim), len(objects[victim]))
        assert not path.exists() and not tier.contains(victim)
        for key, data in objects.items():
            if key != victim:
                assert tier.read(key) == data


@pytest.mark.parametrize("where", ["magic", "header_field", "key"])
def test_a_damaged_header_or_key_is_dropped_at_open(tmp_path: Path, where: str) -> None:
    root = tmp_path / "ssd"
    objects = populate(root, count=4)
    path = root / fmt.relative_path(b"key-1")
    offset = {"magic": 0, "header_field": 12, "key": fmt.HEADER_SIZE + 1}[where]
    flip_byte(str(path), offset)
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        report = tier.open()
        assert report.corrupt == 1 and report.recovered == len(objects) - 1
        assert not path.exists()


def test_a_truncated_file_is_dropped_at_open(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    objects = populate(root, count=5)
    cut = root / fmt.relative_path(b"key-2")
    os.truncate(cut, fmt.HEADER_SIZE + 10)
    empty = root / fmt.relative_path(b"key-3")
    os.truncate(empty, 0)
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        report = tier.open()
        assert report.corrupt == 2 and report.recovered == len(objects) - 2
        assert not cut.exists() and not empty.exists()


def test_header_only_open_skips_the_data_check_but_reads_still_verify(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    objects = populate(root, count=3)
    path = root / fmt.relative_path(b"key-0")
    flip_byte(str(path), fmt.HEADER_SIZE + len(b"key-0"))
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        assert tier.open(verify_data=False).recovered == len(objects)
        with pytest.raises(CorruptObject):
            tier.read(b"key-0")


def test_a_flipped_byte_after_open_fails_the_read_and_deletes_the_file(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    with SsdTier(root, capacity_bytes=CAPACITY, fsync=False) as tier:
        tier.open()
        data = random.Random(1).randbytes(50_000)
        entry = put(tier, b"k", data)
        put(tier, b"other", b"fine")
        flip_byte(entry.path, fmt.HEADER_SIZE + 1 + 49_999)  # the last data byte
        out = bytearray(len(data))
        with pytest.raises(CorruptObject, match="corrupt"):
            tier.read_into(b"k", memoryview(out))
        assert not os.path.exists(entry.path)
        assert not tier.contains(b"k")
        stats = tier.stats()
        assert stats.corrupt_dropped == 1 and stats.used_bytes == stats.stored_bytes
        with pytest.raises(NotFound):
            tier.read(b"k")
        assert tier.read(b"other") == b"fine"
        put(tier, b"k", data)  # a fresh copy is welcome
        assert tier.read(b"k") == data


def test_a_lowered_cap_drops_the_least_recently_used_files(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    keys = [f"k{i}".encode() for i in range(6)]
    with SsdTier(root, capacity_bytes=1 << 20, fsync=False) as tier:
        tier.open()
        for key in keys:
            put(tier, key, key)  # one block each
    # Last use: k3 oldest, then k0, k5, k1, k4, k2 (a read touches the mtime; set it here).
    for age, key in enumerate([b"k2", b"k4", b"k1", b"k5", b"k0", b"k3"]):
        t = 1_700_000_000 - age * 60
        os.utime(root / fmt.relative_path(key), (t, t))
    with SsdTier(root, capacity_bytes=3 * fmt.BLOCK, fsync=False) as tier:
        report = tier.open()
        assert report.evicted_over_cap == 3 and report.recovered == 3
        assert report.bytes == 3 * fmt.BLOCK
        assert tier.stats().evictions == 3
        assert not any(tier.contains(k) for k in (b"k3", b"k0", b"k5"))
        assert [e.key for e in tier.entries()] == [b"k1", b"k4", b"k2"]
        assert not (root / fmt.relative_path(b"k3")).exists()


def test_a_read_refreshes_the_file_mtime(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    with SsdTier(root, capacity_bytes=1 << 20, fsync=False) as tier:
        tier.open()
        entry = put(tier, b"k", b"v")
        os.utime(entry.path, (1_000_000, 1_000_000))
        tier.read(b"k")
        assert os.stat(entry.path).st_mtime > 1_000_000
