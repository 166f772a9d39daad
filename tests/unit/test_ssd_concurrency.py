"""SsdTier under a few threads: no torn files, no lost accounting."""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import xxhash

from kvstore.errors import NotFound, StoreFull
from kvstore.store import ssd
from kvstore.store import ssd_format as fmt
from kvstore.store.ssd import SsdTier

KEYS = [f"key-{i}".encode() for i in range(16)]
DATA = {key: random.Random(key).randbytes(1000 + 7000 * i) for i, key in enumerate(KEYS)}
SUMS = {key: xxhash.xxh3_64_intdigest(data) for key, data in DATA.items()}


def run_threads(target: Callable[[int], None], count: int) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors


def assert_consistent(tier: SsdTier) -> None:
    """The index, the accounting and the directory agree; no temp file is left."""
    on_disk: dict[str, int] = {}
    for dirpath, _, names in os.walk(tier.directory):
        for name in names:
            if name != ssd.LOCK_FILE:
                assert not fmt.is_temp_name(name), name
                on_disk[os.path.join(dirpath, name)] = os.stat(os.path.join(dirpath, name)).st_size
    entries = tier.entries()
    assert sorted(on_disk) == sorted(e.path for e in entries)
    stats = tier.stats()
    assert stats.used_bytes == stats.stored_bytes == sum(on_disk.values())
    assert stats.used_bytes <= stats.capacity_bytes
    for entry in entries:
        assert tier.read(entry.key) == DATA[entry.key]


def test_mixed_puts_reads_and_removes(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path / "ssd", capacity_bytes=300_000, fsync=False)
    tier.open()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            key = rng.choice(KEYS)
            op = rng.random()
            if op < 0.45:
                # StoreFull: every other object is being written or unlinked right now.
                with contextlib.suppress(StoreFull):
                    tier.put(key, DATA[key], SUMS[key])
            elif op < 0.9:
                with contextlib.suppress(NotFound):
                    assert tier.read(key) == DATA[key]
            else:
                tier.remove(key)

    run_threads(worker, 6)
    assert tier.stats().corrupt_dropped == 0
    assert_consistent(tier)
    tier.close()


def test_a_put_racing_a_remove_never_leaves_a_half_file(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path / "ssd", capacity_bytes=8 << 20, fsync=False)
    tier.open()
    key = KEYS[-1]
    for _ in range(100):
        barrier = threading.Barrier(2)

        def race(i: int, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            if i == 0:
                tier.put(key, DATA[key], SUMS[key])
            else:
                tier.remove(key)

        run_threads(race, 2)
        path = tmp_path / "ssd" / fmt.relative_path(key)
        assert tier.contains(key) == path.exists()
        assert_consistent(tier)
    tier.close()


def test_concurrent_reads_of_one_key(tmp_path: Path) -> None:
    tier = SsdTier(tmp_path / "ssd", capacity_bytes=8 << 20, fsync=False)
    tier.open()
    data = random.Random(5).randbytes(1 << 20)
    tier.put(b"hot", data, xxhash.xxh3_64_intdigest(data))

    def reader(_: int) -> None:
        out = memoryview(bytearray(len(data)))
        for _ in range(20):
            assert tier.read_into(b"hot", out) == len(data)
            assert out == data

    run_threads(reader, 4)
    assert tier.stats().reads == 80
    tier.close()
