"""The master's CPU per object of PutStart + PutEnd, in process (no network, no node).

    python -m bench.master_put_cpu [--batches 3000] [--batch 64] [--profile OUT]

The daemon's own objects (MasterCore, MasterService, the Recorder and NodeLinks) run on
one event loop; each call is parsed from its bytes, handled, settled and its reply
serialized, as the fast channel does; the node link's sender hands its rows to a
stand-in for the delta channel, which packs them in columns (`DeltaClient.apply_rows`'s
work on the master's side) and answers at once. What it leaves out: the sockets (framing, the
syscalls) and the store node. The garbage collector is set as the daemon sets it
(`tune_gc`). Prints the process's CPU time (user + system) per object;
--profile writes a cProfile of the timed loop to OUT (sorted by own time, top 30
printed).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import sys
from typing import Any

from kvstore.clock import MonotonicClock
from kvstore.master.core import MasterCore
from kvstore.master.core.config import CoreConfig
from kvstore.master.daemon import tune_gc
from kvstore.master.durability import Recorder
from kvstore.master.metrics import MasterMetrics
from kvstore.master.nodes import NodeLinks, _Link
from kvstore.master.service import MasterService
from kvstore.put_record import room_for
from kvstore.rpc import delta_columns
from kvstore.rpc.columns import READS as COLUMNS
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import store_pb2 as spb
from kvstore_client.puts import RECORDS_UP_TO

NODE = "node-0"
BASE = 0x7F00_0000_0000
SEGMENT = 8 << 30
SIZE = 1024


class _Leader:
    is_leader = True
    epoch = 1
    leader_address = "here"
    leader_for = 1.0


class _Loopback:
    """The node's delta channel (DeltaClient) as far as the master's side goes: the
    rows packed in columns (or a request serialized), the reply parsed."""

    address = "loop"

    async def apply_rows(self, epoch: int, shard: int, rows: list[Any],
                         timeout: float) -> spb.ApplyResponse:
        delta_columns.encode(epoch, shard, rows)
        await asyncio.sleep(0)
        return spb.ApplyResponse.FromString(b"")

    async def apply(self, request: spb.ApplyRequest, timeout: float) -> spb.ApplyResponse:
        request.SerializeToString()
        await asyncio.sleep(0)
        return spb.ApplyResponse.FromString(b"")

    async def close(self) -> None:
        pass


class _LoopLinks(NodeLinks):
    def attach(self, node_id: str) -> None:
        link = _Link("loop", None, None)  # type: ignore[arg-type]
        link.fast = _Loopback()  # type: ignore[assignment]
        link.sender = asyncio.ensure_future(self._send_loop(node_id, link))
        self._links[node_id] = link


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run(batches: int, batch: int, profile: str, one_call: bool = False) -> float:
    core = MasterCore(CoreConfig(), MonotonicClock())
    core.journal = []
    core.mount_segment(NODE, "seg-0", BASE, SEGMENT)
    links = _LoopLinks(lambda: 1)
    links.attach(NODE)
    recorder = Recorder(core.take_replica_changes, links, 3.0, lambda n: BASE)
    service = MasterService(core, _Leader(), MasterMetrics())
    service.recorder = recorder.record
    starts = []
    ends = []
    # A one-call put's placeholders carry put records only in small batches, as the
    # client's (kvstore_client/puts.py, RECORDS_UP_TO).
    records = batch <= RECORDS_UP_TO
    for b in range(batches + 20):
        keys = [f"w0-{b}-{i}".encode() for i in range(batch)]
        if one_call:
            # The client's refill (space started ahead, under placeholder names), then
            # the commit of a batch written into them.
            held = [b"~put/w0/%d" % (b * batch + i) for i in range(batch)]
            starts.append(pb.PutStartRequest(
                keys=held, sizes=[SIZE] * batch, checksums=[0] * batch, writer="w0",
                ahead=True, record_room=room_for(len(keys[-1])) if records else 0,
                columns_version=COLUMNS).SerializeToString())
            ends.append(pb.PutCommitRequest(
                placeholders=held, keys=keys, sizes=[SIZE] * batch, checksums=[7] * batch,
                writer="w0", records=records).SerializeToString())
            continue
        starts.append(pb.PutStartRequest(keys=keys, sizes=[SIZE] * batch, checksums=[7] * batch,
                                         writer="w0", columns_version=COLUMNS,  # as clients ask
                                         ).SerializeToString())
        ends.append(pb.KeysRequest(keys=keys, writer="w0").SerializeToString())
    end_call, end_type = ("PutCommit", pb.PutCommitRequest) if one_call else (
        "PutEnd", pb.KeysRequest)

    async def call(method: str, request: Any, payload: bytes) -> None:
        reply = service.handle(method, request.FromString(payload))
        wait = service.settle(method, reply)
        if wait is not None:
            await wait
        if reply.error.code:
            raise RuntimeError(f"{method}: {reply.error.message}")
        reply.SerializeToString()

    async def put(b: int) -> None:
        await call("PutStart", pb.PutStartRequest, starts[b])
        await asyncio.sleep(0)  # the client's round trip: the intent's Apply goes out
        await call(end_call, end_type, ends[b])

    for b in range(20):  # warm
        await put(b)
    prof = cProfile.Profile() if profile else None
    t0 = _cpu()
    if prof is not None:
        prof.enable()
    # 8 writers at once, as bench.master_ops's 8 clients
    lanes = 8
    per = batches // lanes

    async def lane(j: int) -> None:
        for b in range(20 + j * per, 20 + (j + 1) * per):
            await put(b)
    await asyncio.gather(*(lane(j) for j in range(lanes)))
    if prof is not None:
        prof.disable()
    spent = _cpu() - t0
    if prof is not None:
        prof.dump_stats(profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
    return spent / (per * lanes * batch) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.master_put_cpu",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="runs; each one's figure is printed")
    p.add_argument("--profile", default="", help="write a cProfile of the timed loop here")
    p.add_argument("--one-call", action="store_true",
                   help="PutStart of space ahead + PutCommit (a one-call put) instead")
    args = p.parse_args(argv)
    tune_gc()  # the daemon's collector settings (kvstore master runs it before it serves)
    for _ in range(args.repeat if not args.profile else 1):
        us = asyncio.run(run(args.batches, args.batch, args.profile, args.one_call))
        calls = "PutStart ahead + PutCommit" if args.one_call else "PutStart + PutEnd"
        print(f"{us:.2f} µs of CPU per object ({calls}, {args.batch} per call)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
