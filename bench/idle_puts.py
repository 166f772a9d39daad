"""Single puts right after an idle spell: where a put's time goes, block by block.

    python -m bench.idle_puts [--idle 0.2] [--puts 150] [--block 25] [--rounds 3]
                              [--size 64KiB]

One cluster (etcd, a master, a store node) and one client over the engine. Each round
sleeps `--idle` seconds, then makes `--puts` single puts of new keys, and prints, per
block of `--block` puts, the p50 of each phase of a one-call put as the client's flow
yields them: before the transfer (checksum, record, plan), submitting it, waiting for
it, and the PutCommit round trip; then the whole put. `bench.vs_mooncake` runs each
system in turns, so our processes have sat idle through Mooncake's turn when ours
begins: this shows what the first puts of a turn pay for that (docs/perf-notes.md).
Re-executes itself in a private network namespace (loopback only; needs root).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.netns import ensure_private_netns
from kvstore.units import parse_size

PHASES = ("before", "submit", "transfer", "PutCommit", "put")


def run(args: argparse.Namespace) -> None:
    import kvstore_client.drive as drive
    from bench.clusters import ours
    from kvstore_client import KVStoreClient

    marks: list[float] = []
    step = drive.Pump.next

    def timed(pump: drive.Pump[object]) -> object:
        item = step(pump)
        marks.append(time.perf_counter())
        return item

    drive.Pump.next = timed  # this process's flows only
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory() as d, ours(Path(d), dram="1GiB") as cluster:
        client = KVStoreClient(etcd=cluster.etcd, same_host=False)
        value = os.urandom(size)
        for i in range(300):  # connections, registrations, the placeholder pool
            client.put(b"warm-%d" % i, value)
        print(f"{size} B single puts after {args.idle} s idle; p50 per block of "
              f"{args.block} (µs): {', '.join(PHASES)}")
        for r in range(args.rounds):
            time.sleep(args.idle)
            rows = []
            for i in range(args.puts):
                marks.clear()
                t0 = time.perf_counter()
                client.put(b"r%d-%d" % (r, i), value)
                t1 = time.perf_counter()
                if len(marks) == 4:  # Start, Finish, Rpc, end: a one-call put
                    m = marks
                    rows.append((m[0] - t0, m[1] - m[0], m[2] - m[1], m[3] - m[2], t1 - t0))
            for a in range(0, len(rows), args.block):
                block = rows[a:a + args.block]
                cells = [f"{statistics.median(x[j] for x in block) * 1e6:5.0f}"
                         for j in range(len(PHASES))]
                print(f"round {r} puts {a:4d}+  " + "  ".join(cells))
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_puts",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--idle", type=float, default=0.2, help="seconds asleep before each round")
    p.add_argument("--puts", type=int, default=150)
    p.add_argument("--block", type=int, default=25)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", default="64KiB")
    args = p.parse_args(argv)
    ensure_private_netns("bench.idle_puts")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
