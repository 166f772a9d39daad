"""The end-to-end mix: many client processes putting and looking up at once, bytes moving,
against Mooncake Store in the same run, with the CPU every process spent per object.

    python -m bench.mix [--clients 8] [--duration 3] [--put 64] [--size 4KiB]
                        [--lookup 128] [--same-host] [--no-mooncake] [--shards 1]
                        [--two-call-puts] [--json out.json]

Re-executes itself in a private network namespace (loopback only; needs root). Both
systems are up at once (ours: etcd + master + one store node, or with --shards N one
master per shard, each leading its shard's part of the node; Mooncake: mooncake_master
+ one store-node process, each --dram of DRAM), each with --clients client processes,
and are measured in turn, phase by phase (who goes first alternates):

- mix: each iteration puts --put new objects of --size (ours `put_many` over the Transfer
  Engine unless --same-host; Mooncake `put_batch`) and looks up --lookup keys this
  client wrote in its two previous iterations (ours `lookup`, which pins the hits under a
  lease, then `release`, as a connector does; Mooncake `batch_is_exist`, which has no
  lease). ops/s = iterations per second, all clients together; p50/p99 of an iteration.
- put: the puts alone; lookup: the lookups alone (of keys written before the phase).

Every process's CPU time over each phase (user + system: the clients' own getrusage,
the daemons' from /proc/PID/stat) is divided by the objects the phase handled (objects
put plus keys looked up): CPU per object operation, by process and by kind (with shards,
the master column is every shard's master together). The phase
runs --duration seconds in every client at once (a start time is given to all).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import Worker, bench_main, serve
from bench.stats import Latency, better_ratio, fmt_rate, fmt_ratio, fmt_seconds, format_table
from kvstore.errors import InvalidArgument
from kvstore.units import format_size, parse_size

MODULE = "bench.mix"
PHASES = ("mix", "put", "lookup")
# Of the store's DRAM, what one system's clients may write over all phases: below the
# eviction watermark (0.9), so no lookup misses a key to eviction.
FILL_SHARE = 0.6
LEASE_TTL = 30.0
TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# -- the client process ---------------------------------------------------------------------


class OursMix:
    def __init__(self, etcd: str, size: int, batch: int, same_host: bool,
                 two_call_puts: bool = False) -> None:
        from kvstore_client import KVStoreClient

        # reserve_bytes=0: no space started ahead, so every put takes PutStart and PutEnd,
        # as a client of several shards always does (kvstore_client/sharded.py).
        extra = {"reserve_bytes": 0} if two_call_puts else {}
        self.c = KVStoreClient(etcd=etcd, same_host=same_host,
                               buffer_size=batch * size + (16 << 20), **extra)

    def put(self, keys: list[str], value: bytes) -> None:
        errors = self.c.put_many([k.encode() for k in keys], [value] * len(keys))
        bad = [e for e in errors if e is not None]
        if bad:
            raise RuntimeError(f"put_many: {len(bad)} of {len(keys)} failed: {bad[0]!r}")

    def lookup(self, keys: list[str]) -> None:
        lease = self.c.lookup([k.encode() for k in keys], ttl=LEASE_TTL)
        try:
            if lease.count != len(keys):
                raise RuntimeError(f"lookup found {lease.count} of {len(keys)}")
        finally:
            if lease.id:
                self.c.release(lease)

    def close(self) -> None:
        self.c.close()


class MooncakeMix:
    def __init__(self, endpoint: dict[str, str], size: int, batch: int) -> None:
        from bench.clusters import MooncakeCluster, mooncake_client

        self.s = mooncake_client(MooncakeCluster(master=endpoint["master"],
                                                 metadata=endpoint["metadata"],
                                                 logs=Path(".")), batch * size + (16 << 20))

    def put(self, keys: list[str], value: bytes) -> None:
        rc = self.s.put_batch(keys, [value] * len(keys))
        if rc != 0:
            raise RuntimeError(f"put_batch rc={rc}")

    def lookup(self, keys: list[str]) -> None:
        found = self.s.batch_is_exist(keys)
        if list(found).count(1) != len(keys):
            raise RuntimeError(f"batch_is_exist found {list(found).count(1)} of {len(keys)}")

    def close(self) -> None:
        self.s.close()


def run_worker(args: argparse.Namespace) -> int:
    endpoint = json.loads(args.endpoint)
    size, batch, window = parse_size(args.size), args.put, args.lookup
    client: OursMix | MooncakeMix
    if args.worker == "ours":
        client = OursMix(endpoint["etcd"], size, batch, args.same_host, args.two_call_puts)
    else:
        client = MooncakeMix(endpoint, size, batch)
    value = os.urandom(size)
    seq = [0]
    written: list[str] = []

    def fresh() -> list[str]:
        seq[0] += 1
        keys = [f"mix-{args.wid}-{os.getpid()}-{seq[0]}-{i}" for i in range(batch)]
        written.extend(keys)
        return keys

    for _ in range(-(-window // batch)):  # keys for the first lookups, untimed
        client.put(fresh(), value)

    def handle(ask: dict[str, Any]) -> Any:
        phase, until_n = ask["phase"], int(ask["max_iters"])
        hot = written[-window:]  # the lookup phase reads these, written before it

        def step() -> None:
            if phase in ("mix", "put"):
                client.put(fresh(), value)
            if phase == "mix":
                client.lookup(written[-batch - window:-batch])
            elif phase == "lookup":
                client.lookup(hot)

        step()  # this phase's path warm, untimed
        clock = time.perf_counter
        delay = float(ask["start_at"]) - time.time()
        if delay > 0:
            time.sleep(delay)
        lat: list[float] = []
        cpu0, start = self_cpu(), time.time()
        stop = clock() + float(ask["duration"])
        while len(lat) < until_n:
            t0 = clock()
            step()
            t1 = clock()
            lat.append(t1 - t0)
            if t1 >= stop:
                break
        return {"lat": lat, "start": start, "end": time.time(), "cpu": self_cpu() - cpu0}

    try:
        serve(handle)
    finally:
        client.close()
    return 0


# -- the orchestrator -----------------------------------------------------------------------


def objects_per_iter(phase: str, batch: int, window: int) -> int:
    return {"mix": batch + window, "put": batch, "lookup": window}[phase]


def summarize(phase: str, parts: list[dict[str, Any]], daemons: dict[str, float],
              batch: int, window: int) -> dict[str, Any]:
    lat = [x for p in parts for x in p["lat"]]
    span = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    iters = len(lat)
    objects = iters * objects_per_iter(phase, batch, window)
    cpu = {"clients": sum(p["cpu"] for p in parts), **daemons}
    return {"phase": phase, "iters": iters, "ops_per_s": iters / span,
            "latency_s": Latency.of(lat).as_dict(), "objects": objects,
            "cpu_s": cpu, "cpu_us_per_object": {k: v / objects * 1e6 for k, v in cpu.items()},
            "cpu_share": {k: v / span for k, v in cpu.items()}}


def run_phase(workers: list[Worker], daemons: dict[str, int], phase: str, duration: float,
              max_iters: int, batch: int, window: int) -> dict[str, Any]:
    """`daemons`: process name -> pid; their CPU is summed by kind (every master shard's
    in "master")."""
    before = {name: proc_cpu(pid) for name, pid in daemons.items()}
    ask = {"phase": phase, "duration": duration, "max_iters": max_iters,
           "start_at": time.time() + 0.5}
    with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
        parts = list(pool.map(lambda w: w.ask(ask), workers))
    spent: dict[str, float] = {}
    for name, pid in daemons.items():
        spent[_kind(name)] = spent.get(_kind(name), 0.0) + proc_cpu(pid) - before[name]
    return summarize(phase, parts, spent, batch, window)


def render(results: dict[str, dict[str, dict[str, Any]]], clients: int,
           shards: int = 1) -> str:
    ours, mc = results.get("ours", {}), results.get("mooncake", {})
    rows: list[list[str]] = []
    for phase in PHASES:
        o, m = ours.get(phase), mc.get(phase)
        if o is None:
            continue
        for metric, key, hib, fmt in (("ops/s", ("ops_per_s",), True, fmt_rate),
                                      ("p50", ("latency_s", "p50"), False, fmt_seconds),
                                      ("p99", ("latency_s", "p99"), False, fmt_seconds)):
            a = _dig(o, key)
            b = _dig(m, key) if m else None
            rows.append([phase, str(clients), metric, fmt(a), fmt(b),
                         fmt_ratio(better_ratio(a, b, higher_is_better=hib))])
    table = format_table(["phase", "clients", "metric", "kvstore", "Mooncake", "ratio"], rows,
                         align="lrlrrr")
    cpu_rows: list[list[str]] = []
    for system, by in (("kvstore", ours), ("Mooncake", mc)):
        for phase in PHASES:
            r = by.get(phase)
            if r is None:
                continue
            per = r["cpu_us_per_object"]
            share = r["cpu_share"]
            cpu_rows.append([system, phase] + [
                f"{per[k]:.1f} ({share[k] * 100:.0f}%)" if k in per else "-"
                for k in ("clients", "master", "node", "etcd")])
    cpu = format_table(["system", "phase", "clients", "master", "node", "etcd"], cpu_rows,
                       align="llrrrr")
    return (table + "\n\nCPU µs per object operation (objects put + keys looked up), by "
            "process, and in brackets\nthe share of one core it kept busy over the phase; "
            "clients: all of them together"
            + (f"; kvstore's master: its {shards} shards' together" if shards > 1 else "")
            + "\n\n" + cpu)


def _dig(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for key in path:
        value = value[key]
    return float(value)


def _worker_cmd(args: argparse.Namespace, system: str, endpoint: dict[str, str],
                wid: int) -> list[str]:
    cmd = [sys.executable, "-m", MODULE, "--worker", system, "--endpoint", json.dumps(endpoint),
           "--wid", str(wid), "--size", args.size, "--put", str(args.put),
           "--lookup", str(args.lookup)]
    if args.same_host:
        cmd.append("--same-host")
    if args.two_call_puts:
        cmd.append("--two-call-puts")
    return cmd


def orchestrate(args: argparse.Namespace, tmp: Path) -> int:
    from bench.clusters import engine_pool, mooncake, ours

    engine_pool(args.engine_pool == "on")
    size, dram = parse_size(args.size), parse_size(args.dram)
    # every iteration of every phase writes at most --put objects
    max_iters = max(10, int(dram * FILL_SHARE / (size * args.put) / args.clients / len(PHASES)))
    t_start = time.monotonic()
    print(f"{args.clients} clients per system, {args.put} x {format_size(size)} puts and "
          f"{args.lookup}-key lookups, {args.duration:g} s per phase (at most {max_iters} "
          f"iterations per client), kvstore over "
          f"{'same-host memcpy' if args.same_host else 'the Transfer Engine'}"
          f"{f' with {args.shards} master shards' if args.shards > 1 else ''}; logs in {tmp}",
          flush=True)
    results: dict[str, dict[str, dict[str, Any]]] = {"ours": {}}
    with contextlib.ExitStack() as stack:
        oc = stack.enter_context(ours(tmp, dram=args.dram, shards=args.shards))
        systems: list[tuple[str, list[Worker], dict[str, int]]] = []
        systems.append(("ours", _start(stack, args, "ours", {"etcd": oc.etcd}, tmp),
                        dict(oc.pids)))
        if not args.no_mooncake:
            mc = stack.enter_context(mooncake(tmp, dram))
            results["mooncake"] = {}
            ep = {"master": mc.master, "metadata": mc.metadata}
            systems.append(("mooncake", _start(stack, args, "mooncake", ep, tmp),
                            {n: p.pid for n, p in mc.procs}))
        print("both systems up; measuring them in turn, phase by phase ...", flush=True)
        for k, phase in enumerate(PHASES):
            for system, workers, pids in systems if k % 2 == 0 else systems[::-1]:
                results[system][phase] = run_phase(workers, pids, phase, args.duration,
                                                   max_iters, args.put, args.lookup)
    print()
    print(render(results, args.clients, args.shards))
    print(f"\n(total {time.monotonic() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "config": {"clients": args.clients, "duration": args.duration, "put": args.put,
                       "size": size, "lookup": args.lookup, "same_host": args.same_host,
                       "engine_pool": args.engine_pool, "dram": dram,
                       "shards": args.shards, "two_call_puts": args.two_call_puts},
            "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


def _kind(name: str) -> str:
    """A daemon's column: master, node or etcd (ours: master, or master-K with shards,
    store-0, etcd; Mooncake: mooncake_master, mooncake-node)."""
    if "store" in name:
        return "node"
    for kind in ("master", "node", "etcd"):
        if kind in name:
            return kind
    return name


def _start(stack: contextlib.ExitStack, args: argparse.Namespace, system: str,
           endpoint: dict[str, str], tmp: Path) -> list[Worker]:
    workers = [stack.enter_context(contextlib.closing(Worker(
        f"{system}-{wid}", _worker_cmd(args, system, endpoint, wid),
        tmp / f"client-{system}-{wid}.log"))) for wid in range(args.clients)]
    for w in workers:
        w.ready()
    return workers


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--clients", type=int, default=8, help="client processes per system")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    p.add_argument("--put", type=int, default=64, help="objects per put batch")
    p.add_argument("--size", default="4KiB", help="object size")
    p.add_argument("--lookup", type=int, default=128, help="keys per lookup")
    p.add_argument("--dram", default="2GiB", help="store-node DRAM, both systems")
    p.add_argument("--same-host", action="store_true",
                   help="our clients copy into the node's mapped segment (memcpy) instead "
                        "of moving bytes over the Transfer Engine as Mooncake's do")
    p.add_argument("--engine-pool", choices=["on", "off"], default="on",
                   help="both systems' engines reuse TCP connections (on) or open one per "
                        "transfer (off)")
    p.add_argument("--no-mooncake", action="store_true", help="measure kvstore only")
    p.add_argument("--shards", type=int, default=1,
                   help="our control plane's master shards, one master process each "
                        "(docs/scaling.md); the node's DRAM is split between them")
    p.add_argument("--two-call-puts", action="store_true",
                   help="our clients start no space ahead for one-call puts: every put "
                        "takes PutStart and PutEnd (to compare the two put paths, at one "
                        "shard or several)")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--keep-logs", action="store_true", help="keep the temporary log directory")
    p.add_argument("--worker", choices=["ours", "mooncake"], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--wid", type=int, default=0, help=argparse.SUPPRESS)
    return p


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        parse_size(args.size)
        parse_size(args.dram)
    except InvalidArgument as exc:
        parser.error(str(exc))
    if args.clients < 1 or args.put < 1 or args.lookup < 1:
        parser.error("--clients, --put and --lookup must be 1 or more")
    if not 1 <= args.shards <= 64:
        parser.error(f"--shards {args.shards}: give 1 to 64 master shards")
    if args.lookup > 2 * args.put:
        parser.error(f"--lookup {args.lookup} reads keys of a client's two previous "
                     f"iterations: at most 2 x --put ({2 * args.put})")


def main(argv: list[str] | None = None) -> int:
    return bench_main(build_parser(), argv, MODULE, run_worker, orchestrate, check)


if __name__ == "__main__":
    sys.exit(main())
