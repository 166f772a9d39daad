"""Soak: mixed traffic at full speed for a while; do the daemons' RSS stay flat, and is
anything left behind (leases, PENDING objects) once the clients are gone?

    python -m bench.soak --seconds 600      # `make soak`
    python -m bench.soak --seconds 60       # the CI version (tests/integration/test_soak.py)

Starts etcd, a master and two store nodes (small DRAM, so eviction runs all the time),
and several client processes that each loop over: put_many of a batch, lookup with a
lease, get_into under it, get_many, release, exists, remove. Every other client writes
values of one size (as KV blocks are), so its puts go into space started ahead (one
control call each, see kvstore_client/reservations.py); the others' sizes vary, so
theirs never do. Every read is checked against what was written, and a key the lease
covers must load (get_into) and be found (get_many): anything else is counted as an
error. The anonymous RSS (RssAnon: the heap, not the mapped segment) of each daemon is
sampled every second; the slope is fitted over the second half of the
run (after warm-up). At the end, each store node's inventory (what it would report to a
new leader) must hold exactly the replicas the master places on it: an entry the
node never drops is a leak that grows with traffic.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import numpy as np

from bench.clusters import ours
from bench.netns import ensure_private_netns
from bench.stats import format_table
from kvstore.coord.etcd import read_prefix_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg


@dataclass
class SoakReport:
    seconds: float
    operations: int = 0
    wrong_bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    rss_mib: dict[str, list[float]] = field(default_factory=dict)
    slope_mib_per_min: dict[str, float] = field(default_factory=dict)
    leases_left: int = -1
    pending_left: int = -1
    # Per store node: entries in its inventory minus the replicas the master places there.
    inventory_excess: dict[str, int] = field(default_factory=dict)
    one_call_puts: int = 0  # objects put into space started ahead, all clients


def _client(etcd: str, seed: int, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from kvstore_client import KVStoreClient, KVStoreError

    rng = random.Random(seed)
    fixed = seed % 2 == 1  # same-sized values: one control call per put after the second
    ops = wrong = 0
    errors: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    with KVStoreClient(etcd=etcd, timeout=10) as c:
        buf = np.zeros(16 * 65536, dtype=np.uint8)
        c.register(buf)
        n = 0
        while time.monotonic() < deadline:
            keys = [f"s{seed}-{n}-{i}".encode() for i in range(16)]
            vals = [rng.randbytes(32768 if fixed else rng.randint(1, 65536)) for _ in keys]
            n += 1
            try:
                for e in c.put_many(keys, vals):  # per key: a failed put is an error too
                    if e is not None:
                        errors[type(e).__name__] += 1
                with c.lookup(keys, ttl=5) as lease:
                    views = [buf[i * 65536:i * 65536 + len(v)] for i, v in enumerate(vals)]
                    errs = c.get_into(lease.keys, views[:lease.count], lease=lease)
                    for i, e in enumerate(errs):
                        if e is not None:  # a leased key must load: the lookup promised it
                            errors[f"get_into under a lease: {type(e).__name__}"] += 1
                        elif bytes(views[i]) != vals[i]:
                            wrong += 1
                    # Still under the lease: its keys cannot have been evicted, so a None
                    # for one of them is a failure (a lost object, or bytes that failed
                    # their checksum); past the leased prefix a None is an eviction.
                    got = c.get_many(keys)
                errors["get_many: None for a leased key"] += sum(g is None for g in got[:lease.count])
                wrong += sum(g is not None and g != v for g, v in zip(got, vals, strict=True))
                c.exists(keys)
                if n % 3 == 0:
                    c.remove_many(keys[:4])
                ops += 5
            except KVStoreError as exc:
                errors[type(exc).__name__] += 1
        one_call = c.stats.one_call_puts
    out.put((ops, wrong, {k: v for k, v in errors.items() if v}, one_call))


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):  # segment pages (shared memfd) are not leaks
                return int(line.split()[1]) / 1024
    return 0.0


def _inventory_excess(etcd: str, st: pb.ClusterStatusResponse) -> dict[str, int]:
    """Each node's DRAM inventory size minus the master's count of its replicas."""
    placed = {n.node_id: n.objects for n in st.nodes if n.tier == "dram"}
    out = {}
    for raw in read_prefix_sync(etcd, Layout("default").nodes):
        rec = NodeRecord.decode(raw)
        with grpc.insecure_channel(rec.service) as ch:
            inv = spbg.StoreNodeStub(ch).Inventory(spb.InventoryRequest(epoch=st.epoch),
                                                   timeout=10)
        held = sum(r.tier == "dram" for r in inv.replicas)
        out[rec.node_id] = held - placed.get(rec.node_id, 0)
    return out


def run_soak(seconds: float, clients: int = 3) -> SoakReport:
    report = SoakReport(seconds)
    with tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp, \
            ours(Path(tmp), dram="64MiB", nodes=2) as cluster:
        pids = {name: pid for name, pid in cluster.pids.items() if name != "etcd"}
        report.rss_mib = {name: [] for name in pids}
        ctx = mp.get_context("spawn")
        queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [ctx.Process(target=_client, args=(cluster.etcd, i, seconds, queue))
                 for i in range(clients)]
        for p in procs:
            p.start()
        start = time.monotonic()
        while any(p.is_alive() for p in procs):
            for name, pid in pids.items():
                report.rss_mib[name].append(_rss_mib(pid))
            time.sleep(1.0)
            if time.monotonic() - start > seconds + 120:
                break
        for p in procs:
            p.join(timeout=30)
        while not queue.empty():
            ops, wrong, errors, one_call = queue.get()
            report.operations += ops
            report.one_call_puts += one_call
            report.wrong_bytes += wrong
            for k, v in errors.items():
                report.errors[k] = report.errors.get(k, 0) + v
        time.sleep(1.0)  # released leases are gone at once; nothing may be PENDING
        with grpc.insecure_channel(cluster.master) as ch:
            st = pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=10)
        report.leases_left = st.active_leases
        report.pending_left = st.objects_pending
        report.inventory_excess = _inventory_excess(cluster.etcd, st)
        for name, samples in report.rss_mib.items():
            half = samples[len(samples) // 2:]
            if len(half) >= 2:
                slope = float(np.polyfit(np.arange(len(half)) / 60.0, half, 1)[0])
                report.slope_mib_per_min[name] = round(slope, 2)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    ensure_private_netns("bench.soak")
    r = run_soak(args.seconds, args.clients)
    rows = [[name, f"{s[0]:.0f}" if s else "-", f"{s[-1]:.0f}" if s else "-",
             f"{r.slope_mib_per_min.get(name, 0.0):+.2f}"] for name, s in r.rss_mib.items()]
    print(f"soak {r.seconds:.0f} s, {args.clients} clients: {r.operations} operations, "
          f"{r.wrong_bytes} wrong bytes, errors {r.errors or 'none'}, "
          f"{r.one_call_puts} objects put with one control call, leases left "
          f"{r.leases_left}, PENDING left {r.pending_left}, store inventory entries beyond "
          f"the master's replicas {r.inventory_excess}")
    print(format_table(["daemon", "RSS start MiB", "RSS end MiB", "slope MiB/min (2nd half)"],
                       rows))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(r), indent=2))
    clean = (r.wrong_bytes == 0 and not r.errors and r.leases_left == 0 and r.pending_left == 0
             and not any(r.inventory_excess.values()))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
