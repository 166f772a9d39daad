"""Memory per object of the master core's index, and the cost of a 128-key lookup.

Builds a MasterCore holding N COMPLETE objects with 64-byte keys spread over several
segments (put_start + put_end in batches, as the server would), then reports bytes per
object measured two ways, each in a fresh process:

  tracemalloc  Python allocations, split into the key bytes objects themselves and
               everything the core adds (index dict, columns, allocators, ...);
  rss          growth of the process's resident set, everything included.

Then, on the same full index, times lookup / get_replicas / release of 128 keys.

    .venv/bin/python bench/master_memory.py            # 1M objects
    .venv/bin/python bench/master_memory.py --objects 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import timeit
import tracemalloc

from kvstore.master.core import CoreConfig, ManualClock, MasterCore


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_keys(n: int) -> list[bytes]:
    rng = random.Random(1)
    return [rng.randbytes(64) for _ in range(n)]


def build(keys: list[bytes], segments: int, size: int, batch: int) -> MasterCore:
    n = len(keys)
    core = MasterCore(CoreConfig(max_lease_ttl=3600.0), ManualClock())
    # Roomy enough to stay under the high watermark: this measures holding, not evicting.
    per_segment = int(n * size / segments / 0.8) + (64 << 20)
    for i in range(segments):
        core.mount_segment(f"node-{i}", f"10.0.0.{i}:15000", 0x7F00_0000_0000 + (i << 40), per_segment)
    sizes = [size] * batch
    checksums = [0x9E3779B97F4A7C15 + i for i in range(batch)]  # 64-bit values
    for i in range(0, n, batch):
        part = keys[i : i + batch]
        rs = core.put_start(part, sizes[: len(part)], checksums[: len(part)])
        assert all(r.code == 0 for r in rs), rs[0]
        core.put_end(part)
    return core


def measure(method: str, n: int, segments: int, size: int, batch: int) -> dict[str, float]:
    gc.collect()
    out: dict[str, float] = {"objects": n}
    if method == "tracemalloc":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        keys = make_keys(n)
        with_keys = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        core = build(keys, segments, size, batch)
        out["build_s"] = time.perf_counter() - t0
        gc.collect()
        total = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        # The bench's own list of keys is not the master's.
        list_bytes = sys.getsizeof(keys)
        out["key_bytes"] = (with_keys - base - list_bytes) / n
        out["core_bytes"] = (total - with_keys) / n
        out["total_bytes"] = out["key_bytes"] + out["core_bytes"]
    else:
        base = rss_bytes()
        keys = make_keys(n)
        t0 = time.perf_counter()
        core = build(keys, segments, size, batch)
        out["build_s"] = time.perf_counter() - t0
        gc.collect()
        out["total_bytes"] = (rss_bytes() - base - sys.getsizeof(keys)) / n
        out.update(time_lookups(core, keys))
    assert core.stats().objects_complete == n, "objects were evicted; segments too small"
    return out


def time_lookups(core: MasterCore, keys: list[bytes]) -> dict[str, float]:
    rng = random.Random(2)
    starts = [rng.randrange(len(keys) - 128) for _ in range(64)]
    runs = [keys[s : s + 128] for s in starts]
    it = iter(range(10**9))
    leases: list[int] = []

    def lookup() -> None:
        r = core.lookup(runs[next(it) % 64])
        leases.append(r.lease_id)

    def release() -> None:
        core.release_lease(leases.pop())

    n = 2000
    out = {"lookup_us": min(timeit.repeat(lookup, number=n, repeat=3)) / n * 1e6}
    out["release_us"] = min(timeit.repeat(release, number=n, repeat=3)) / n * 1e6
    while leases:
        core.release_lease(leases.pop())
    miss = [b"\x00" * 64, *runs[0][1:]]
    out["lookup_miss_us"] = min(timeit.repeat(lambda: core.lookup(miss), number=n, repeat=3)) / n * 1e6
    lease = core.lookup(runs[0]).lease_id
    out["get_replicas_us"] = (
        min(timeit.repeat(lambda: core.get_replicas(runs[0], lease_id=lease), number=200, repeat=3))
        / 200
        * 1e6
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--size", type=int, default=16 << 10, help="object size in bytes")
    p.add_argument("--batch", type=int, default=1024, help="keys per put_start")
    p.add_argument("--method", choices=["tracemalloc", "rss"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.method:
        print(json.dumps(measure(a.method, a.objects, a.segments, a.size, a.batch)))
        return
    res = {}
    for method in ("tracemalloc", "rss"):
        cmd = [
            sys.executable,
            __file__,
            "--method",
            method,
            "--objects",
            str(a.objects),
            "--segments",
            str(a.segments),
            "--size",
            str(a.size),
            "--batch",
            str(a.batch),
        ]
        res[method] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    tm, rss = res["tracemalloc"], res["rss"]
    print(
        f"master core memory: {a.objects:,} COMPLETE objects, 64-byte keys, {a.segments} segments, 1 replica"
    )
    print()
    print(f"{'measure':<40}{'bytes/object':>14}")
    print("-" * 54)
    print(f"{'tracemalloc: key bytes objects':<40}{tm['key_bytes']:>14.1f}")
    print(f"{'tracemalloc: core (index, columns, ...)':<40}{tm['core_bytes']:>14.1f}")
    print(f"{'tracemalloc: total':<40}{tm['total_bytes']:>14.1f}")
    print(f"{'RSS delta: total':<40}{rss['total_bytes']:>14.1f}")
    print()
    print(
        f"build (put_start + put_end, batches of {a.batch}): "
        f"{rss['build_s']:.1f} s, {rss['build_s'] / a.objects * 1e6:.1f} us/object"
    )
    print()
    print(f"{'call on the full index (128 keys)':<40}{'us/call':>14}")
    print("-" * 54)
    print(f"{'lookup, all hit (pins 128)':<40}{rss['lookup_us']:>14.1f}")
    print(f"{'release_lease of that lease':<40}{rss['release_us']:>14.1f}")
    print(f"{'lookup, first key misses':<40}{rss['lookup_miss_us']:>14.1f}")
    print(f"{'get_replicas under a lease':<40}{rss['get_replicas_us']:>14.1f}")


if __name__ == "__main__":
    main()
