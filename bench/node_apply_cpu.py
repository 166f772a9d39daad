"""The store node's CPU per inventory delta row, in process (no socket, no master).

    python -m bench.node_apply_cpu [--frames 400] [--batch 64] [--repeat 3]

Builds `--frames` columnar Apply frames as the leader sends them for puts of `--batch`
objects (each object's intent, then its commit: two rows), then has a store node's
service decode and apply every frame (`StoreNodeService.apply_columns`, the delta
channel's work on the node's side), `--repeat` times, printing the process's CPU time
(user + system) per row each time. What it leaves out: the socket, the framing and the
event loop around each frame. Run it under `valgrind --tool=callgrind` with two
`--repeat` counts and take the difference for instructions per row, which the machine's
other load does not move (docs/perf-notes.md).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys

from kvstore.rpc import delta_columns as dc
from kvstore.store.inventory import Inventory
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.tier_metrics import TierCounters

SIZE = 4096


def frames(count: int, batch: int) -> list[bytes]:
    """`count` frames of one batch of puts each: the batch's intents, then its commits."""
    out = []
    for b in range(count):
        keys = [b"key-%d-%d" % (b, i) for i in range(batch)]
        rows = [(k, i * SIZE, SIZE, 77, dc.INTENT) for i, k in enumerate(keys)]
        rows += [dc.row(k, i * SIZE, SIZE, 77, "dram") for i, k in enumerate(keys)]
        out.append(dc.encode(1, 0, rows))
    return out


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run(sent: list[bytes], repeat: int) -> list[float]:
    service = StoreNodeService("n1", Inventory(), DramSegment(1 << 20), None, TierCounters())
    rows = sum(len(dc.decode(f).keys) for f in sent)
    per_row = []
    for _ in range(repeat):
        t0 = _cpu()
        for frame in sent:
            reply = await service.apply_columns(dc.decode(frame))
            if reply.error.code:
                raise RuntimeError(f"the node refused a frame: {reply.error.message}")
        per_row.append((_cpu() - t0) / rows * 1e6)
    return per_row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.node_apply_cpu",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=400, help="Apply frames per repeat")
    p.add_argument("--batch", type=int, default=64, help="puts per frame (two rows each)")
    p.add_argument("--repeat", type=int, default=3, help="passes over the frames")
    args = p.parse_args(argv)
    for us in asyncio.run(run(frames(args.frames, args.batch), args.repeat)):
        print(f"{us:.3f} µs of CPU per delta row (intents and commits, {args.batch} puts "
              "per Apply)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
