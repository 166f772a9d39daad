"""Pack files of the SSD tier: small demotions written together as one file of records
(ssd_format's object layout, each record with its key's checksum), read back verified,
cleared when removed, and re-indexed record by record after a restart."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import xxhash

from kvstore.errors import CorruptObject, KVStoreError, StoreFull
from kvstore.store import ssd_format as fmt
from kvstore.store.ssd import SsdTier
from kvstore.store.ssd_index import SsdEntry

KiB = 1 << 10


def objects(n: int, size: int = 4 * KiB, seed: int = 1) -> list[tuple[bytes, bytes, int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        data = rng.randbytes(size)
        out.append((b"key-%05d" % i, data, xxhash.xxh3_64_intdigest(data)))
    return out


def packs(root: Path) -> list[Path]:
    return sorted((root / fmt.PACK_DIR).glob(f"*{fmt.PACK_SUFFIX}"))


def test_put_many_writes_one_pack_and_reads_back_verified(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 10 << 20)
    tier.open()
    items = objects(40)
    got = tier.put_many(items)
    assert all(isinstance(e, SsdEntry) and e.packed for e in got)
    assert len(packs(tmp_path)) == 1 and not list(tmp_path.glob("??/*.kvs"))
    tier.sync()
    for key, data, _ in items:
        assert tier.read(key) == data
    st = tier.stats()
    assert st.objects == 40 and st.stored_bytes == 40 * 8 * KiB
    # Already stored: a no-op returning the entry; the same key twice: stored once.
    again = tier.put_many([items[0], (b"new", b"x" * 100, xxhash.xxh3_64_intdigest(b"x" * 100)),
                           (b"new", b"x" * 100, xxhash.xxh3_64_intdigest(b"x" * 100))])
    assert again[0] == got[0] and again[1] == again[2] and len(tier) == 41
    tier.close()


def test_a_bad_checksum_is_refused_per_item(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 10 << 20)
    tier.open()
    items = objects(3)
    key, data, _ = items[1]
    got = tier.put_many([items[0], (key, data, 12345), items[2]])
    assert isinstance(got[1], CorruptObject) and not tier.contains(key)
    assert isinstance(got[0], SsdEntry) and isinstance(got[2], SsdEntry)
    tier.close()


def test_removed_records_are_cleared_and_stay_gone_after_a_restart(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 10 << 20)
    tier.open()
    items = objects(30)
    tier.put_many(items)
    for key, _, _ in items[::2]:
        assert tier.remove(key)
    tier.flush_clears()
    pack = packs(tmp_path)[0]
    # Cleared records free their blocks (or read as zeros where punching is not offered).
    raw = pack.read_bytes()
    assert raw[:4] != fmt.MAGIC or raw[8 * KiB:8 * KiB + 4] == fmt.MAGIC
    assert not any(raw[:8 * KiB])
    tier.close()
    again = SsdTier(tmp_path, 10 << 20)
    report = again.open()
    assert report.recovered == 15 and report.corrupt == 0
    assert {e.key for e in again.entries()} == {k for k, _, _ in items[1::2]}
    for key, data, _ in items[1::2]:
        assert again.read(key) == data
    # The pack goes with its last record.
    for key, _, _ in items[1::2]:
        again.remove(key)
    assert packs(tmp_path) == []
    again.close()


def test_a_damaged_record_is_dropped_and_its_neighbours_kept(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 10 << 20)
    tier.open()
    items = objects(5)
    entries = tier.put_many(items)
    tier.close()
    pack = packs(tmp_path)[0]
    e2 = entries[2]
    assert isinstance(e2, SsdEntry)
    with open(pack, "r+b") as f:       # one flipped data byte in record 2
        f.seek(e2.offset + fmt.HEADER_SIZE + len(e2.key) + 100)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    again = SsdTier(tmp_path, 10 << 20)
    report = again.open()
    assert report.corrupt >= 1 and report.recovered == 4
    assert not again.contains(items[2][0])
    for key, data, _ in items[:2] + items[3:]:
        assert again.read(key) == data
    again.close()


def test_a_pack_torn_by_a_crash_keeps_its_complete_records(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 10 << 20)
    tier.open()
    items = objects(6)
    tier.put_many(items)
    tier.close()
    pack = packs(tmp_path)[0]
    os.truncate(pack, 8 * KiB * 4 + 100)  # records 0-3 whole, record 4 torn, 5 missing
    again = SsdTier(tmp_path, 10 << 20)
    report = again.open()
    assert report.recovered == 4
    assert [e.key for e in again.entries()] == [k for k, _, _ in items[:4]]
    again.close()


def test_a_record_without_its_key_sum_is_not_trusted(tmp_path: Path) -> None:
    (tmp_path / fmt.PACK_DIR).mkdir(parents=True)
    data = b"d" * 100
    header = fmt.pack_header(fmt.Header(key_len=3, data_len=100,
                                        checksum=xxhash.xxh3_64_intdigest(data)))
    raw = header + b"abc" + data + fmt.padding(3, 100)
    good = b"".join(bytes(p) for p in fmt.pack_record(b"xyz", data,
                                                         xxhash.xxh3_64_intdigest(data)))
    (tmp_path / fmt.PACK_DIR / f"old{fmt.PACK_SUFFIX}").write_bytes(raw + good)
    tier = SsdTier(tmp_path, 10 << 20)
    report = tier.open()
    assert report.recovered == 1 and tier.read(b"xyz") == data and not tier.contains(b"abc")
    tier.close()


def test_the_header_flag_keeps_old_files_readable_and_refuses_unknown_bits() -> None:
    h = fmt.Header(key_len=3, data_len=10, checksum=7)
    assert fmt.unpack_header(fmt.pack_header(h)) == h
    k = fmt.Header(key_len=3, data_len=10, checksum=7, flags=fmt.KEY_SUM, key_sum=99)
    assert fmt.unpack_header(fmt.pack_header(k)) == k
    with pytest.raises(fmt.FormatError, match="unknown flags"):
        fmt.unpack_header(fmt.pack_header(fmt.Header(key_len=3, data_len=10, checksum=7,
                                                     flags=2)))


def test_a_key_found_twice_keeps_the_newer_copy(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 10 << 20)
    tier.open()
    items = objects(2)
    tier.put_many(items)
    tier.close()
    # A crash lost the removal of key-00000's record, and a newer copy was written as a
    # file of its own since.
    again = SsdTier(tmp_path, 10 << 20)
    again.open()
    lost = again._index.take(items[0][0])  # forgotten, its record not cleared: as a
    assert lost is not None                  # removal that a crash lost would leave it
    again._index.release([lost])
    again.put(items[0][0], items[0][1], items[0][2])
    again.close()
    third = SsdTier(tmp_path, 10 << 20)
    report = third.open()
    assert report.recovered == 2 and third.read(items[0][0]) == items[0][1]
    third.close()


def test_put_many_errors_are_per_item_and_typed(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path, 16 * KiB)  # room for two 4 KiB objects (8 KiB records)
    tier.open()
    got = tier.put_many(objects(3))
    # The third finds the room reserved by the first two, which are still being written.
    assert isinstance(got[0], SsdEntry) and isinstance(got[1], SsdEntry)
    assert isinstance(got[2], StoreFull) and isinstance(got[2], KVStoreError)
    assert len(tier) == 2 and tier.stats().used_bytes == 16 * KiB
    tier.close()
