"""SSD tier throughput through the store node's Move handler against the raw device,
measured in the same run on the same directory.

    python -m bench.ssd_throughput --dir D --size-mib 1 --count 256

Our side runs the code a store node runs for tier moves: `StoreNodeService.Move` (the
gRPC handler, called in-process), with a real DRAM segment (memfd) holding the objects
and an `SsdTier` with fsync on, under uvloop as `kvstore store` runs.
- write: demotions. The batches are the ones the master sends: the master core itself
  (`MasterCore`, no I/O) is fed put batches of 32 objects into a DRAM pool of `--dram-mib`
  and the sizes of the demotion batches it queues are replayed, one Move at a time. Each
  Move writes its objects without fsync, flushes once (group commit, `SsdTier.sync`) and
  only then answers OK. Also shown: the same objects as single-object Moves, several in
  flight (what a full pool's put path sends), and, for reference, the node's previous
  write path (fsync of every file and its directory, objects of a Move in parallel).
- read, cold: promotions back into the segment, `--read-batch` objects per Move (one
  lookup's worth), after every object file was dropped from the page cache with
  posix_fadvise(DONTNEED) (needs no privileges, unlike /proc/sys/vm/drop_caches). Each read
  is checksum-verified, as in the node.
Raw (`dd`, `--size-mib` blocks, on a file in the same directory):
- `dd oflag=direct conv=fsync`: streaming direct writes and one flush at the end, the
  device's sequential write throughput; the target is ours >= 0.70 of it.
- `dd oflag=direct,dsync`: one flush per block, the bar the old per-object fsync had.
- `dd oflag=direct conv=fsync` with 4x larger blocks: the same bytes, to show how far the
  object-sized dd is from what the device streams with bigger requests.
- `dd iflag=direct`: sequential direct reads. On a virtual machine the host may cache the
  disk image, for both sides alike.
If the filesystem refuses O_DIRECT (tmpfs, some overlay setups) the raw side falls back to
plain `dd` with `conv=fsync` / `oflag=dsync` and fadvise(DONTNEED) before the read, and
the table says so. MB/s is 10^6 bytes/s of object bytes (headers and padding, one 4 KiB
block per object, are not counted on our side). Sides alternate round by round and each
shows its best round: on a shared machine a neighbour's burst is noise, not either side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.store import ssd_format as fmt
from kvstore.store.inventory import Inventory
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import TierCounters
from kvstore.v1 import store_pb2 as spb

MIB = 1 << 20
PUT_BATCH = 32  # objects per put_from / put_many call, as the client batches them


@dataclass
class Row:
    phase: str
    ours: float | None  # MB/s
    raw: float | None
    raw_method: str


@dataclass
class Ours:
    write: float  # Move, master batches
    single: float  # Move x1, several in flight
    per_object: float  # the previous node path: fsync per object
    cold: float  # Move promote
    syncs: int  # flushes in the master-batch write phase


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def drop_cache(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def master_batches(dram: int, size: int, count: int) -> list[int]:
    """Demotion batch sizes the master core queues while clients put `size`-byte
    objects, PUT_BATCH per call, into a DRAM pool of `dram` bytes; enough for `count`."""
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "dram:n0", 1 << 32, dram)
    core.mount_segment("n0", "ssd:n0", 0, 1 << 40, tier="ssd")
    batches: list[int] = []
    n = 0
    for _ in range(100_000):
        if sum(batches) >= count:
            break
        keys = [f"o{n + i}".encode() for i in range(PUT_BATCH)]
        n += PUT_BATCH
        results = core.put_start(keys, [size] * PUT_BATCH, [0] * PUT_BATCH)
        core.put_end([k for k, r in zip(keys, results, strict=True) if r.code == Code.OK])
        core.tick()  # the server's 100 ms tick: the watermark check
        moves = core.take_tier_moves()  # what the mover loop sends as one Move
        if moves:
            batches.append(len(moves))
        for m in moves:
            core.finish_tier_move(m, Code.OK)
    else:
        raise RuntimeError("the master core queued no demotions: is --dram-mib too large?")
    left, out = count, []
    for b in batches:
        out.append(min(b, left))
        left -= out[-1]
        if not left:
            break
    return out


class BenchNode:
    """The store node's Move path: a DRAM segment with `count` objects, an SSD tier, the
    gRPC servicer (called directly: no network in the measurement)."""

    def __init__(self, size: int, count: int) -> None:
        self.size, self.count = size, count
        self.segment = DramSegment(size * count, name="kvstore-bench")
        base = os.urandom(size + count)  # object i is base[i : i + size]: all distinct
        self.sums = []
        for i in range(count):
            data = memoryview(base)[i : i + size]
            self.segment.view[i * size : (i + 1) * size] = data
            self.sums.append(xxhash.xxh3_64_intdigest(data))
        self.keys = [f"bench-object-{i:06d}".encode() for i in range(count)]

    def items(self, kind: str, indexes: range | list[int]) -> list[spb.MoveItem]:
        return [spb.MoveItem(kind=kind, key=self.keys[i], size=self.size,
                             checksum=self.sums[i], dram_offset=i * self.size,
                             ssd_offset=i) for i in indexes]

    def tier(self, root: Path, fsync: bool) -> SsdTier:
        capacity = self.count * fmt.file_length(len(self.keys[0]), self.size) + MIB
        tier = SsdTier(root, capacity_bytes=capacity, fsync=fsync)
        tier.open()
        return tier

    def service(self, tier: SsdTier) -> StoreNodeService:
        return StoreNodeService("bench", Inventory(), self.segment, tier, TierCounters())

    def close(self) -> None:
        self.segment.close()


async def moves(service: StoreNodeService, requests: list[list[spb.MoveItem]],
                inflight: int) -> float:
    """Send the requests, at most `inflight` at once; seconds taken. Fails on any code."""
    gate = asyncio.Semaphore(inflight)

    async def one(items: list[spb.MoveItem]) -> None:
        async with gate:
            reply = await service.Move(spb.MoveRequest(epoch=1, items=items), None)
        if reply.error.code or any(c != Code.OK for c in reply.codes):
            raise RuntimeError(f"Move failed: {reply.error.message} {list(reply.codes)}")

    started = time.perf_counter()
    await asyncio.gather(*(one(r) for r in requests))
    return time.perf_counter() - started


def chunks(indexes: range, sizes: list[int]) -> list[list[int]]:
    out, at = [], 0
    for s in sizes:
        out.append(list(indexes[at : at + s]))
        at += s
    return out


def run_ours(node: BenchNode, root: Path, fsync: bool, batches: list[int],
             single_inflight: int, read_batch: int) -> Ours:
    total = node.size * node.count
    everything = range(node.count)

    def phase(name: str, work: Callable[[SsdTier, StoreNodeService], Awaitable[float]],
              keep: bool = False) -> tuple[float, SsdTier]:
        tier = node.tier(root / name, fsync)
        seconds = run(work(tier, node.service(tier)))
        if not keep:
            tier.close()
            shutil.rmtree(root / name)
        return mbps(total, seconds), tier

    async def demote(tier: SsdTier, svc: StoreNodeService) -> float:
        return await moves(svc, [node.items("demote", c) for c in chunks(everything, batches)], 1)

    async def demote_single(tier: SsdTier, svc: StoreNodeService) -> float:
        return await moves(svc, [node.items("demote", [i]) for i in everything], single_inflight)

    async def per_object(tier: SsdTier, svc: StoreNodeService) -> float:
        # The node's write path before group commit: each object of a Move in a worker
        # thread, checksum, then put with fsync of the file and of its directory
        # (none with --no-fsync, as `kvstore store --ssd-no-fsync` ran it).
        def put(item: spb.MoveItem) -> None:
            view = node.segment.view[item.dram_offset : item.dram_offset + item.size]
            try:
                assert xxhash.xxh3_64_intdigest(view) == item.checksum
                tier.put(item.key, view, item.checksum)  # fsync per the tier's setting
            finally:
                view.release()

        started = time.perf_counter()
        for c in chunks(everything, batches):
            await asyncio.gather(*(asyncio.to_thread(put, it) for it in node.items("demote", c)))
        return time.perf_counter() - started

    single, _ = phase("single", demote_single)
    old, _ = phase("per-object", per_object)
    write, tier = phase("batches", demote, keep=True)
    syncs = tier.stats().syncs
    try:
        os.sync()  # with --no-fsync pages may still be dirty, and those fadvise cannot drop
        drop_cache([entry.path for entry in tier.entries()])
        svc = node.service(tier)
        reads = [node.items("promote", list(everything[i : i + read_batch]))
                 for i in range(0, node.count, read_batch)]
        cold = mbps(total, run(moves(svc, reads, 1)))
    finally:
        tier.close()
        shutil.rmtree(root / "batches")
    return Ours(write, single, old, cold, syncs)


def run(coro: Awaitable[float]) -> float:
    async def main() -> float:
        return await coro

    try:
        import uvloop  # the store node runs under uvloop (kvstore/cli.py)
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def dd(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(["dd", *args], capture_output=True, text=True, check=False)
    return time.perf_counter() - started, proc


def run_raw(path: Path, size_mib: int, count: int) -> tuple[dict[str, tuple[str, float]], str]:
    """{"dsync"|"stream"|"stream4"|"read": (method, MB/s)} and a note."""
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
    results = {"dsync": (f"dd oflag={'direct,' if direct else ''}dsync", mbps(total, seconds))}
    flags = ["oflag=direct"] if direct else []
    seconds, proc = dd("if=/dev/zero", out, *common, *flags, "conv=fsync")
    proc.check_returncode()
    results["stream"] = (f"dd {'oflag=direct ' if direct else ''}conv=fsync", mbps(total, seconds))
    # The same bytes in 4x larger blocks: is the object-sized dd the device's ceiling?
    big = 4 * size_mib
    seconds, proc = dd("if=/dev/zero", out, f"bs={big}M", f"count={max(1, count // 4)}",
                       *flags, "conv=fsync")
    proc.check_returncode()
    results["stream4"] = (f"dd {'oflag=direct ' if direct else ''}conv=fsync bs={big}M",
                          mbps(big * MIB * max(1, count // 4), seconds))
    if direct:
        seconds, proc = dd(f"if={path}", "of=/dev/null", *common, "iflag=direct")
        method = "dd iflag=direct"
    else:
        drop_cache([str(path)])
        seconds, proc = dd(f"if={path}", "of=/dev/null", *common)
        method = "dd after fadvise(DONTNEED)"
    proc.check_returncode()
    results["read"] = (method, mbps(total, seconds))
    return results, note


def table(rows: list[Row]) -> str:
    width = max(len(r.phase) for r in rows) + 2
    lines = [
        f"{'phase':<{width}}{'ours MB/s':>10}{'raw MB/s':>10}{'ours/raw':>10}  raw method",
        "-" * (width + 30 + 40),
    ]
    for row in rows:
        ours = f"{row.ours:10.0f}" if row.ours is not None else f"{'':10}"
        raw = f"{row.raw:10.0f}" if row.raw is not None else f"{'-':>10}"
        ratio = f"{row.ours / row.raw:10.2f}" if row.ours and row.raw else f"{'-':>10}"
        lines.append(f"{row.phase:<{width}}{ours}{raw}{ratio}  {row.raw_method}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--dir", help="directory on the device to measure (default: a temp dir)")
    parser.add_argument("--size-mib", type=int, default=1, help="object size in MiB")
    parser.add_argument("--count", type=int, default=256, help="number of objects")
    parser.add_argument("--dram-mib", type=int, default=1024,
                        help="the DRAM pool whose evictions size the demotion batches")
    parser.add_argument("--single-inflight", type=int, default=8,
                        help="single-object Moves in flight at once")
    parser.add_argument("--read-batch", type=int, default=32, help="objects per promotion Move")
    parser.add_argument("--no-fsync", action="store_true",
                        help="run the tier with fsync=False (kvstore store --ssd-no-fsync)")
    parser.add_argument("--keep", action="store_true", help="leave the files behind")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side; best is shown")
    args = parser.parse_args(argv)

    size = args.size_mib * MIB
    batches = master_batches(args.dram_mib * MIB, size, args.count)
    node = BenchNode(size, args.count)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kvstore-ssd-bench-"))
    work = root / f"ssd-bench-{os.getpid()}"
    work.mkdir(parents=True)
    ours: list[Ours] = []
    raws: list[dict[str, tuple[str, float]]] = []
    note = "" if shutil.which("dd") else "dd not found: no raw figures"
    try:
        for _ in range(args.rounds):
            ours.append(run_ours(node, work, not args.no_fsync, batches,
                                 args.single_inflight, args.read_batch))
            if not note:
                raw, note = run_raw(work / "raw.dd", args.size_mib, args.count)
                raws.append(raw)
                os.unlink(work / "raw.dd")
    finally:
        node.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)

    def best_raw(name: str) -> tuple[str, float | None]:
        if not raws:
            return "-", None
        return raws[0][name][0], max(r[name][1] for r in raws)

    def best(field: str) -> float:
        return max(float(getattr(o, field)) for o in ours)

    flush = "no fsync (--no-fsync)" if args.no_fsync else "group commit: one flush per Move"
    shown = ", ".join(str(b) for b in batches[:4]) + (", ..." if len(batches) > 4 else "")
    print(
        f"SSD tier through the store node's Move handler vs raw dd: {args.count} x "
        f"{args.size_mib} MiB objects in {work.parent}, {flush}, best of {args.rounds} rounds\n"
        f"demotion batches from the master core for a {args.dram_mib} MiB DRAM pool: "
        f"{shown} objects per Move ({len(batches)} Moves, "
        f"{min(o.syncs for o in ours)} flushes)"
    )
    stream, dsync, read = best_raw("stream"), best_raw("dsync"), best_raw("read")
    stream4 = best_raw("stream4")
    biggest = max(batches)
    rows = [
        Row(f"write, Move x<={biggest} (master batches)", best("write"), stream[1],
            stream[0] + " (one flush at end)"),
        Row("", best("write"), dsync[1], dsync[0] + " (flush per block)"),
        Row("", best("write"), stream4[1], stream4[0] + " (larger blocks, one flush)"),
        Row(f"write, Move x1, {args.single_inflight} in flight", best("single"), stream[1],
            stream[0]),
        Row("write, old node path" + (" (no fsync)" if args.no_fsync else " (fsync each)"),
            best("per_object"), stream[1], stream[0]),
        Row(f"read, cold, Move x{args.read_batch} promote", best("cold"), read[1],
            read[0] + "; ours after fadvise(DONTNEED)"),
    ]
    print(table(rows))
    if note:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
