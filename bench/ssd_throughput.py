"""SSD tier throughput against the raw device, measured in the same run on the same directory.

    python -m bench.ssd_throughput --dir D --size-mib 1 --count 256

Writes `count` objects of `size-mib` MiB through `SsdTier` (fsync per object by default,
as the store node runs it), reads them back twice, then measures the filesystem under the
same directory with `dd` and prints MB/s (10^6 bytes/s) for ours and raw, and the ratio.

What is compared with what:
- write: ours fsyncs each object (plus its directory); the fair raw figure is
  `dd oflag=direct,dsync` (one flush per block of the same size). The streaming raw figure
  (`oflag=direct conv=fsync`, one flush at the end) is the ceiling.
- read, cold: before reading, every object file is dropped from the page cache with
  posix_fadvise(DONTNEED), which needs no privileges (unlike /proc/sys/vm/drop_caches).
  Raw is `dd iflag=direct`, which bypasses the cache. On a virtual machine the host may
  still cache the disk image, for both sides alike.
- read, warm: the same reads right after writing, served by the page cache; raw has no
  equivalent, so no ratio.
If the filesystem refuses O_DIRECT (tmpfs, some overlay setups) the raw side falls back to
plain `dd` with `conv=fsync` / `oflag=dsync` for writes and fadvise(DONTNEED) before the
read, and the table says so. Object bytes only are counted on our side (headers and
padding, one 4 KiB block per object, are not).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kvstore.store import ssd_format as fmt
from kvstore.store.ssd import SsdTier

MIB = 1 << 20


@dataclass
class Row:
    phase: str
    ours: float | None  # MB/s
    raw: float | None
    raw_method: str


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def drop_cache(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_ours(
    root: Path, size: int, count: int, fsync: bool, threads: int, group: int = 0
) -> tuple[float, float, float]:
    """(write, cold read, warm read) MB/s through SsdTier."""
    base = os.urandom(size + count)  # object i is base[i : i + size]: distinct, no copies
    view = memoryview(base)
    objects = [(f"bench-{i}".encode(), view[i : i + size]) for i in range(count)]
    sums = [xxhash.xxh3_64_intdigest(data) for _, data in objects]
    capacity = count * fmt.file_length(16, size) + MIB
    total = size * count
    shards = [list(range(i, count, threads)) for i in range(threads)]
    with (
        SsdTier(root, capacity_bytes=capacity, fsync=fsync) as tier,
        ThreadPoolExecutor(threads) as pool,
    ):
        tier.open()

        def timed(work: Callable[[list[int]], None]) -> float:
            started = time.perf_counter()
            list(pool.map(work, shards))
            return mbps(total, time.perf_counter() - started)

        def put_some(indexes: list[int]) -> None:
            # Like the store node's move handler: a batch of puts, then one flush.
            for n, i in enumerate(indexes, 1):
                tier.put(objects[i][0], objects[i][1], sums[i], sync=not group and fsync)
                if group and fsync and (n % group == 0 or n == len(indexes)):
                    tier.sync()

        def read_some(indexes: list[int]) -> None:
            out = memoryview(bytearray(size))
            for i in indexes:
                tier.read_into(objects[i][0], out)

        write = timed(put_some)
        warm = timed(read_some)
        drop_cache([entry.path for entry in tier.entries()])
        cold = timed(read_some)
    return write, cold, warm


def dd(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(["dd", *args], capture_output=True, text=True, check=False)
    return time.perf_counter() - started, proc


def run_raw(path: Path, size_mib: int, count: int) -> tuple[list[tuple[str, float]], str]:
    """[(method, MB/s)] for dsync write, streaming write, cold read; and a note."""
    total = size_mib * MIB * count
    common = [f"bs={size_mib}M", f"count={count}"]
    note = ""
    out = f"of={path}"
    seconds, proc = dd("if=/dev/zero", out, *common, "oflag=direct,dsync")
    direct = proc.returncode == 0
    if not direct:
        if "Invalid argument" not in proc.stderr:
            raise RuntimeError(f"dd failed: {proc.stderr.strip()}")
        note = "O_DIRECT unsupported by this filesystem: raw is plain dd (buffered)"
        seconds, proc = dd("if=/dev/zero", out, *common, "oflag=dsync")
        proc.check_returncode()
    results = [(f"dd oflag={'direct,' if direct else ''}dsync", mbps(total, seconds))]
    flags = ["oflag=direct"] if direct else []
    seconds, proc = dd("if=/dev/zero", out, *common, *flags, "conv=fsync")
    proc.check_returncode()
    results.append((f"dd {'oflag=direct ' if direct else ''}conv=fsync", mbps(total, seconds)))
    if direct:
        seconds, proc = dd(f"if={path}", "of=/dev/null", *common, "iflag=direct")
        method = "dd iflag=direct"
    else:
        drop_cache([str(path)])
        seconds, proc = dd(f"if={path}", "of=/dev/null", *common)
        method = "dd after fadvise(DONTNEED)"
    proc.check_returncode()
    results.append((method, mbps(total, seconds)))
    return results, note


def table(rows: list[Row]) -> str:
    lines = [
        f"{'phase':<22}{'ours MB/s':>11}{'raw MB/s':>11}{'ours/raw':>10}  raw method",
        "-" * 86,
    ]
    for row in rows:
        ours = f"{row.ours:11.0f}" if row.ours is not None else f"{'':11}"
        raw = f"{row.raw:11.0f}" if row.raw is not None else f"{'-':>11}"
        ratio = f"{row.ours / row.raw:10.2f}" if row.ours and row.raw else f"{'-':>10}"
        lines.append(f"{row.phase:<22}{ours}{raw}{ratio}  {row.raw_method}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--dir", help="directory on the device to measure (default: a temp dir)")
    parser.add_argument("--size-mib", type=int, default=1, help="object size in MiB")
    parser.add_argument("--count", type=int, default=256, help="number of objects")
    parser.add_argument("--no-fsync", action="store_true", help="run the tier with fsync=False")
    parser.add_argument("--keep", action="store_true", help="leave the files behind")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side; best is shown")
    parser.add_argument("--threads", type=int, default=1, help="threads calling the tier")
    parser.add_argument("--group", type=int, default=0,
                        help="objects per syncfs flush (group commit, SsdTier.sync); "
                        "0: fsync every object, as the store node does")
    args = parser.parse_args(argv)

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kvstore-ssd-bench-"))
    work = root / f"ssd-bench-{os.getpid()}"
    work.mkdir(parents=True)
    size = args.size_mib * MIB
    ours: list[tuple[float, float, float]] = []
    raws: list[list[tuple[str, float]]] = []
    note = "" if shutil.which("dd") else "dd not found: no raw figures"
    try:
        # Alternate the two sides and keep each one's best round: the first writes on a
        # fresh VM pay for first-touch memory and writeback, which is noise, not either side.
        for _ in range(args.rounds):
            tier_dir = work / "tier"
            ours.append(run_ours(tier_dir, size, args.count, not args.no_fsync, args.threads,
                                 args.group))
            shutil.rmtree(tier_dir)  # same free space for dd as the tier had
            if not note:
                raw, note = run_raw(work / "raw.dd", args.size_mib, args.count)
                raws.append(raw)
                os.unlink(work / "raw.dd")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)
    write, cold, warm = (max(r[i] for r in ours) for i in range(3))
    raw = [(raws[0][i][0], max(r[i][1] for r in raws)) for i in range(3)] if raws else []
    if not raw:
        raw = [("-", float("nan"))] * 3

    fsync = ("no fsync" if args.no_fsync else
             f"one flush per {args.group} objects (group commit)" if args.group
             else "fsync per object")
    print(
        f"SSD tier vs raw dd: {args.count} x {args.size_mib} MiB objects in {work.parent}, "
        f"{fsync}, {args.threads} thread(s) on our side, best of {args.rounds} rounds"
    )
    rows = [
        Row("write", write, raw[0][1], raw[0][0] + " (flush per block, like ours)"),
        Row("write vs streaming", write, raw[1][1], raw[1][0] + " (one flush at end)"),
        Row("read, cold", cold, raw[2][1], raw[2][0] + "; ours after fadvise(DONTNEED)"),
        Row("read, warm", warm, None, "page cache (files just written); no raw equivalent"),
    ]
    print(table(rows))
    if note:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
