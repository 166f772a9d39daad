"""Trace replay: a Mooncake-format trace against kvstore (and Mooncake Store), with the
hit rates an offline cache of the same capacity must reach.

    python -m bench.replay [--trace bench/data/conversation_trace.jsonl.xz] [--limit 2000]
        [--capacity-blocks 10000] [--block-bytes 64KiB] [--nodes 1] [--concurrency 1]
        [--speed 0] [--mooncake] [--te] [--prefill-tokens-per-s 10000]
        [--plot out.png] [--json out.json] [--etcd HOST:PORT --no-start]

Each request's `hash_ids` are its block keys (one 512-token block per id; each block is
stored as one object of --block-bytes, a stand-in small enough for a replay to fit in
memory here). Per request, as a vLLM connector would:

  kvstore:  Lookup (pins the hit prefix under a lease) -> get_into registered buffers
            under that lease -> put_from the blocks after the prefix -> release.
  Mooncake: it has no lease: batch_is_exist gives the prefix, batch_get_into reads it
            (an object evicted in between is a lost hit, counted), batch_put_from writes
            the blocks after the prefix that batch_is_exist did not report.

Hits are the blocks actually loaded. The store's figures are set against an offline
simulation (bench/lru_sim.py) of the same trace: a mirror of the master's policy over
the very segments the cluster mounted (watermark eviction 0.90 -> 0.80, LRU order,
pinned prefix), plain LRU at --capacity-blocks, and an infinite cache (the bound).
With one replayer the store must match the mirror; with several, requests interleave
and small differences are expected.

Capacity: --capacity-blocks N is the mean number of blocks the store holds in steady
state. Its occupancy saws between the low and the high watermark, so the DRAM pool gets
N / 0.85 slots of one 64-byte-aligned block (rounded up to whole slots per node). Mooncake
gets a segment of the same total bytes (its own policy: evict 5 % of objects above 0.90,
objects read in the last 10 s are leased and not evicted).

--ssd SIZE adds a run of the same DRAM with an SSD tier of SIZE; with --mooncake also a
Mooncake run with its own SSD offload on (master --enable_offload, the node's local-disk
segment of SIZE in a temporary directory; bench/clusters.py). Where this wheel has no
offload, the report says so in a sentence and the other runs go on.

Runs one system at a time, each on a fresh cluster, inside a private network namespace
(loopback only; re-executes itself under `unshare -n`, needs root). With --nodes > 1 or
--concurrency > 1 it also replays on one node with one replayer at the same total
capacity, and says whether the hit rates agree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import Worker, bench_main, serve
from bench.lru_sim import (
    BLOCK_TOKENS,
    EVICT_HIGH,
    EVICT_LOW,
    Request,
    SimStats,
    Sizing,
    StoreSim,
    read_trace,
    simulate,
)
from bench.progress import ProgressBar
from bench.stats import fmt_rate, fmt_seconds, format_table, percentile
from bench.systems.base import Slots, System
from kvstore.units import format_size, parse_size

MODULE = "bench.replay"
# The Mooncake FAST'25 conversation trace, shipped compressed (bench/data/README.md).
DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "conversation_trace.jsonl.xz"
OURS, MC = "kvstore", "mooncake"
MATCH_PP = 1.0  # "matches": block hit rates within 1 percentage point

# One replayed request, as the worker reports it (a JSON list, in this order).
FIELDS = ("pos", "t0", "t1", "lookup_hits", "hits", "lookup_s", "load_s", "put_s",
          "release_s", "put_errors", "read_bytes", "written_bytes", "ssd_waits")


@dataclass
class Rec:
    pos: int
    t0: float           # start, seconds after the common start
    t1: float           # end
    lookup_hits: int    # blocks the lookup reported
    hits: int           # blocks loaded (the hit that counts)
    lookup_s: float
    load_s: float
    put_s: float
    release_s: float
    put_errors: int
    read_bytes: int
    written_bytes: int
    ssd_waits: int = 0  # objects the load waited for while they came back from SSD

    def row(self) -> list[Any]:
        return [getattr(self, f) for f in FIELDS]


# -- the replayer (each runs in a process of its own, with its own client) ----------------


def open_system(args: argparse.Namespace, endpoint: dict[str, str], max_blocks: int) -> System:
    """This replayer's client (bench/systems/), with a registered buffer of `max_blocks`
    random source blocks and as many destinations."""
    slots = Slots.random(max_blocks, args.block_bytes)
    if args.worker == OURS:
        from bench.systems.ours import Ours

        return Ours(OURS, endpoint["etcd"], slots, max(16 << 20, 2 * args.block_bytes),
                    lease_ttl=args.lease_ttl, same_host=not args.te)
    from bench.systems.mooncake import Mooncake

    return Mooncake(endpoint, slots, slots.count * args.block_bytes + (16 << 20))


def _ssd_waits(system: System) -> int:
    """Objects our client has waited for while they came back from SSD; for Mooncake,
    its client's reads from the node's SSD offload (RPCs: the split by tier only asks
    whether a request read from SSD at all)."""
    ssd_reads = getattr(system, "ssd_reads", None)
    if ssd_reads is not None:
        return int(ssd_reads())
    stats = getattr(getattr(system, "c", None), "stats", None)
    return int(getattr(stats, "ssd_waits", 0))


def run_worker(args: argparse.Namespace) -> int:
    """One replayer, driven by the orchestrator (bench/harness.py's protocol):
    {"start": t} waits until t (a time.monotonic() value, common to all replayers);
    {"pos": i} replays request i of the trace and returns its record (a row of FIELDS);
    {"finish": true} returns the error counts and the client's counters."""
    requests = read_trace(args.trace, args.limit)
    t_first = requests[0].timestamp_ms if requests else 0
    max_blocks = max((len(r.hash_ids) for r in requests), default=1)
    system = open_system(args, json.loads(args.endpoint), max_blocks)
    start = 0.0

    def handle(ask: dict[str, Any]) -> Any:
        nonlocal start
        if "start" in ask:
            start = float(ask["start"])
            while time.monotonic() < start:
                time.sleep(min(0.01, max(0.0, start - time.monotonic())))
            return None
        if "finish" in ask:
            return {"rc_counts": system.rc_counts, "info": system.info()}
        pos = int(ask["pos"])
        r = requests[pos]
        if args.speed > 0:
            due = start + (r.timestamp_ms - t_first) / 1000 / args.speed
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        keys = [f"{args.key_prefix}{h}" for h in r.hash_ids]
        waits0 = _ssd_waits(system)
        t0 = time.monotonic() - start
        step = system.replay_step(keys)
        t1 = time.monotonic() - start
        return Rec(pos, t0, t1, *step, _ssd_waits(system) - waits0).row()

    try:
        serve(handle)
    finally:
        system.close()
    return 0


# -- the orchestrator ---------------------------------------------------------------------


@dataclass
class RunSpec:
    label: str
    system: str            # OURS or MC
    nodes: int
    concurrency: int
    dram_per_node: int     # bytes; every run gets the same total
    ssd_per_node: int = 0  # bytes of SSD tier per node (0: DRAM only)


@dataclass
class RunResult:
    spec: RunSpec
    records: list[Rec]
    wall_s: float
    segments: list[int]                       # DRAM bytes per node as mounted
    evictions: int | None = None
    held: list[int] = field(default_factory=list)   # objects held, sampled after the 1st eviction
    rc_counts: dict[str, int] = field(default_factory=dict)
    info: list[dict[str, Any]] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)  # the master's tier counters, this run


class Dispatcher:
    """Hands out request positions in trace order to whichever replayer asks first, so
    that at most `concurrency` neighbouring requests are in flight at once (replayers
    with fixed shares drift apart by dozens of requests when run as fast as possible,
    which reorders the trace). Thread-safe."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._next = 0
        self._asked: dict[int, int] = {}
        self._lock = threading.Lock()

    def take(self, replayer: int) -> int | None:
        """The next position for `replayer`, None when the trace is done. Asking again
        means the previous request is finished."""
        with self._lock:
            self._asked[replayer] = self._asked.get(replayer, 0) + 1
            if self._next >= self.total:
                return None
            self._next += 1
            return self._next - 1

    @property
    def finished(self) -> int:
        with self._lock:
            return sum(max(0, n - 1) for n in self._asked.values())


def _worker_cmd(args: argparse.Namespace, system: str, endpoint: dict[str, str],
                key_prefix: str) -> list[str]:
    cmd = [sys.executable, "-m", MODULE, "--worker", system, "--endpoint", json.dumps(endpoint),
           "--trace", str(args.trace),
           "--block-bytes", str(args.block_bytes), "--speed", str(args.speed),
           "--lease-ttl", str(args.lease_ttl), "--key-prefix", key_prefix]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if args.te:
        cmd.append("--te")
    return cmd


class Sampler(threading.Thread):
    """Polls the store every `interval` s: objects held, eviction counter."""

    def __init__(self, poll: Any, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.poll = poll
        self.interval = interval
        self.samples: list[tuple[int, int]] = []   # (held, evictions so far)
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            with contextlib.suppress(Exception):
                self.samples.append(self.poll())

    def stop(self) -> list[int]:
        self.stop_event.set()
        self.join(timeout=10)
        first = next((i for i, (_, ev) in enumerate(self.samples) if ev > 0), None)
        return [] if first is None else [h for h, _ in self.samples[first:]]


def drive(args: argparse.Namespace, spec: RunSpec, endpoint: dict[str, str], total: int,
          logs: Path) -> tuple[list[Rec], float, dict[str, int], list[dict[str, Any]]]:
    """Start the replayers, release them together, show progress, collect records."""
    key_prefix = f"rp{uuid.uuid4().hex[:8]}/"
    queue = Dispatcher(total)
    workers: list[Worker] = []
    rows: list[list[list[Any]]] = [[] for _ in range(spec.concurrency)]
    ends: list[dict[str, Any]] = [{} for _ in range(spec.concurrency)]
    failures: list[BaseException] = []

    def replay(i: int, w: Worker, start: float) -> None:
        try:
            w.ask({"start": start})
            while (pos := queue.take(i)) is not None:
                rows[i].append(w.ask({"pos": pos}))
            ends[i] = w.ask({"finish": True})
        except (RuntimeError, OSError, ValueError) as exc:  # the replayer died or was killed
            failures.append(exc)

    ok = False
    try:
        for i in range(spec.concurrency):
            workers.append(Worker(f"replayer {i}",
                                  _worker_cmd(args, spec.system, endpoint, key_prefix),
                                  logs / f"{spec.label}-w{i}.log"))
        for i, w in enumerate(workers):
            try:
                w.ready()
            except RuntimeError as exc:
                raise RuntimeError(f"replayer {i} did not start\n{exc}") from None
        start = time.monotonic() + 0.2
        threads = [threading.Thread(target=replay, args=(i, w, start), daemon=True)
                   for i, w in enumerate(workers)]
        for t in threads:
            t.start()
        bar = ProgressBar(total, f"{spec.label:<22}")
        while any(t.is_alive() for t in threads):
            bar.update(queue.finished)
            time.sleep(0.1)
        bar.update(queue.finished)
        bar.close()
        wall = time.monotonic() - start
        if failures:
            raise RuntimeError(str(failures[0]))
        ok = True
    finally:
        for w in workers:
            w.close(kill=not ok)
    records = sorted((Rec(*row) for part in rows for row in part), key=lambda r: r.pos)
    rc_counts: dict[str, int] = {}
    for end in ends:
        for k, v in end["rc_counts"].items():
            rc_counts[k] = rc_counts.get(k, 0) + v
    if records:
        wall = max(r.t1 for r in records)
    return records, wall, rc_counts, [end["info"] for end in ends]


def _leader(etcd: str, cluster: str = "default") -> str:
    """The leader's gRPC address, from etcd."""
    from kvstore.coord.etcd import read_key_sync
    from kvstore.coord.layout import Layout, MasterRecord

    raw = read_key_sync(etcd, Layout(cluster).leader)
    if raw is None:
        raise RuntimeError(f"no kvstore master is registered in etcd at {etcd}")
    return MasterRecord.decode(raw).address


_TIER_COUNTERS = ("demotions", "promotions", "ssd_evictions", "demotion_failures",
                  "promotion_failures")


def _ours_tiers(master: str) -> dict[str, int]:
    """The master's tier counters (ClusterStatus counters_json)."""
    import grpc

    from kvstore.v1 import master_pb2 as pb
    from kvstore.v1 import master_pb2_grpc as pbg

    with grpc.insecure_channel(master) as ch:
        st = pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=5)
    counters = json.loads(st.counters_json or "{}")
    return {k: int(counters.get(k, 0)) for k in _TIER_COUNTERS}


def _ours_counters(master: str) -> tuple[int, int, list[int]]:
    """(objects held, evictions so far, DRAM bytes per node) from ClusterStatus."""
    import grpc

    from kvstore.v1 import master_pb2 as pb
    from kvstore.v1 import master_pb2_grpc as pbg

    with grpc.insecure_channel(master) as ch:
        st = pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=5)
    if st.error.code:
        raise RuntimeError(f"ClusterStatus at {master}: {st.error.message}")
    counters = json.loads(st.counters_json or "{}")
    segs = [n.capacity for n in st.nodes if n.tier == "dram"]
    return st.objects_complete, int(counters.get("evictions", 0)), segs


def run_ours(args: argparse.Namespace, spec: RunSpec, requests: list[Request],
             tmp: Path) -> RunResult:
    from bench.clusters import OursCluster, ours

    @contextlib.contextmanager
    def cluster() -> Iterator[OursCluster]:
        if args.start:
            master_args = ["--max-lease-ttl", str(max(60.0, args.lease_ttl)),
                           "--evict-high", str(args.evict_high), "--evict-low", str(args.evict_low)]
            store_args: list[str] = []
            if spec.ssd_per_node:
                store_args = ["--ssd-dir", str(tmp / spec.label.replace(" ", "_") / "ssd-{node}"),
                              "--ssd", str(spec.ssd_per_node)]
                if not args.ssd_fsync:
                    store_args.append("--ssd-no-fsync")
            with ours(tmp / spec.label.replace(" ", "_"), dram=str(spec.dram_per_node),
                      nodes=spec.nodes, master_args=master_args, store_args=store_args) as oc:
                yield oc
        else:
            yield OursCluster(etcd=args.etcd, master=args.master or _leader(args.etcd), logs=tmp)

    logs = tmp / "replay"
    logs.mkdir(parents=True, exist_ok=True)
    with cluster() as oc:
        _, ev0, segs = _ours_counters(oc.master)
        tiers0 = _ours_tiers(oc.master)

        def poll() -> tuple[int, int]:
            held, ev, _ = _ours_counters(oc.master)
            return held, ev - ev0

        sampler = Sampler(poll)
        sampler.start()
        try:
            records, wall, rcs, info = drive(args, spec, {"etcd": oc.etcd}, len(requests), logs)
        finally:
            held = sampler.stop()
        _, ev1, _ = _ours_counters(oc.master)
        tiers = {k: v - tiers0[k] for k, v in _ours_tiers(oc.master).items()}
    return RunResult(spec, records, wall, segs, ev1 - ev0, held, rcs, info, tiers)


def _mooncake_metrics(url: str) -> dict[str, float]:
    import urllib.request

    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
    return out


def run_mooncake(args: argparse.Namespace, spec: RunSpec, requests: list[Request],
                 tmp: Path) -> RunResult:
    """One Mooncake run; with spec.ssd_per_node, its SSD offload on (bench/clusters.py
    raises MooncakeSSDUnavailable where this wheel cannot)."""
    from bench.clusters import dir_bytes, mooncake

    logs = tmp / "replay"
    logs.mkdir(parents=True, exist_ok=True)
    pool = spec.dram_per_node * spec.nodes
    with mooncake(tmp / spec.label.replace(" ", "_"), pool, ssd_bytes=spec.ssd_per_node) as mc:
        ssd_dir = mc.ssd_dir
        # What its SSD directory holds during the run: (files, bytes) every 0.5 s.
        disk_sampler = (Sampler(lambda d=ssd_dir: dir_bytes(d), interval=0.5)
                        if ssd_dir is not None else None)
        if disk_sampler:
            disk_sampler.start()
        url = getattr(mc, "metrics", "")

        def poll() -> tuple[int, int]:
            m = _mooncake_metrics(url)
            return int(m.get("master_key_count", 0)), int(m.get("master_evicted_key_count", 0))

        ev0 = poll()[1] if url else 0
        sampler = Sampler(poll) if url else None
        if sampler:
            sampler.start()
        try:
            records, wall, rcs, info = drive(
                args, spec, {"master": mc.master, "metadata": mc.metadata}, len(requests), logs)
        finally:
            held = sampler.stop() if sampler else []
            if disk_sampler:
                disk_sampler.stop()
        evictions = poll()[1] - ev0 if url else None
        tiers: dict[str, int] = {}
        if ssd_dir is not None:
            files, size = dir_bytes(ssd_dir)
            tiers = {"ssd_files": files, "ssd_bytes": size,
                     "ssd_bytes_max": max([size] + [b for _, b in disk_sampler.samples]
                                          if disk_sampler else [size]),
                     "ssd_reads": sum(int(i.get("ssd_reads", 0)) for i in info)}
    return RunResult(spec, records, wall, [pool], evictions, held, rcs, info, tiers)


# -- figures ------------------------------------------------------------------------------


@dataclass
class Summary:
    label: str
    requests: int
    blocks: int
    hit_blocks: int
    tokens: int
    hit_tokens: int

    @property
    def block_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def token_rate(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0


def summarize(label: str, requests: Sequence[Request], hits: Sequence[int]) -> Summary:
    return Summary(label, len(requests), sum(len(r.hash_ids) for r in requests), sum(hits),
                   sum(r.input_length for r in requests),
                   sum(r.hit_tokens(h) for r, h in zip(requests, hits, strict=True)))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def pp(a: float, b: float) -> str:
    """a - b in percentage points; a difference that rounds to zero reads +0.00."""
    return f"{round(100 * (a - b), 2) + 0.0:+.2f} pp"


def lat(samples: Sequence[float]) -> str:
    if not samples:
        return "-"
    return f"{fmt_seconds(percentile(samples, 50))} / {fmt_seconds(percentile(samples, 99))}"


@dataclass
class Prefill:
    """The estimated effect on time to first token (a model, not a measurement)."""

    saved_mean: float        # s per request: hit_tokens / rate - (lookup + load)
    saved_p50_hit: float     # same, median over requests with a hit
    compute_avoided: float   # s in all: hit_tokens / rate
    share: float             # saved / prefill time of all prompts without a cache


def prefill_estimate(requests: Sequence[Request], recs: Sequence[Rec], rate: float) -> Prefill:
    saved = []
    for r, rec in zip(requests, recs, strict=True):
        saved.append(r.hit_tokens(rec.hits) / rate - rec.lookup_s - rec.load_s)
    with_hit = [s for s, rec in zip(saved, recs, strict=True) if rec.hits]
    total_prefill = sum(r.input_length for r in requests) / rate
    return Prefill(
        saved_mean=sum(saved) / len(saved) if saved else 0.0,
        saved_p50_hit=percentile(with_hit, 50) if with_hit else 0.0,
        compute_avoided=sum(r.hit_tokens(rec.hits) for r, rec in zip(requests, recs, strict=True)) / rate,
        share=sum(saved) / total_prefill if total_prefill else 0.0,
    )


@dataclass
class Report:
    requests: list[Request]
    sizing: Sizing
    runs: list[RunResult]
    mirror: dict[str, SimStats]       # run label -> mirror sim over its segments
    lru: SimStats
    infinite: SimStats
    args: argparse.Namespace
    lru_full: tuple[int, SimStats] | None = None   # plain LRU as large as the whole pool
    notes: list[str] = field(default_factory=list)  # runs that could not be made, and why

    @property
    def tiered(self) -> set[str]:
        return {r.spec.label for r in self.runs if r.spec.ssd_per_node}

    def text(self) -> str:
        a = self.args
        sz = self.sizing
        reqs = self.requests
        lines = [
            f"trace {a.trace}: {len(reqs)} requests, "
            f"{sum(len(r.hash_ids) for r in reqs)} blocks of {BLOCK_TOKENS} tokens, "
            f"{sum(r.input_length for r in reqs)} prompt tokens; speed "
            f"{'as fast as possible' if a.speed <= 0 else f'{a.speed:g}x'}",
            f"block object {format_size(a.block_bytes)}; capacity {a.capacity_blocks} blocks "
            f"= mean held in steady state -> {sz.nodes} x {format_size(sz.dram_per_node)} DRAM "
            f"({sz.slots_per_node * sz.nodes} slots of {format_size(sz.asize)}; evict above "
            f"{a.evict_high:.2f} down to {a.evict_low:.2f} of it)"
            if a.start else
            f"block object {format_size(a.block_bytes)}; the running cluster's DRAM: "
            + ", ".join(f"{len(r.segments)} x {format_size(max(r.segments))}" for r in self.runs[:1])
            + f" (mirror assumes watermarks {a.evict_high:.2f}/{a.evict_low:.2f}; capacity "
              f"{a.capacity_blocks} blocks derived from it)",
            "",
        ]
        rows = []
        for run in self.runs:
            s = summarize(run.spec.label, reqs, [r.hits for r in run.records])
            held = run.held
            # A run with an SSD tier has no offline mirror: it is set against the bound.
            vs = (pp(s.block_rate, self.infinite.block_hit_rate) + " (vs bound)"
                  if run.spec.ssd_per_node else
                  pp(s.block_rate, self.mirror[run.spec.label].block_hit_rate))
            rows.append([
                f"{run.spec.label} (replayed)", pct(s.block_rate), pct(s.token_rate), vs,
                "-" if run.evictions is None else str(run.evictions),
                f"{sum(held) / len(held):.0f}" if held else "-",
            ])
        shown: list[SimStats] = []
        for label, sim in self.mirror.items():
            if label in self.tiered:
                continue
            # Every run has the same total DRAM: one row unless a geometry differs.
            if any(sim.per_request == other.per_request for other in shown):
                continue
            name = "offline mirror of the store policy" + (f" ({label})" if shown else "")
            shown.append(sim)
            rows.append([name, pct(sim.block_hit_rate), pct(sim.token_hit_rate), "",
                         str(sim.evictions), f"{sim.held_mean:.0f}" if sim.held_mean else "-"])
        rows.append([f"offline plain LRU, {a.capacity_blocks} blocks", pct(self.lru.block_hit_rate),
                     pct(self.lru.token_hit_rate), "", str(self.lru.evictions),
                     str(a.capacity_blocks)])
        if self.lru_full is not None:
            slots, full = self.lru_full
            rows.append([f"offline plain LRU, whole pool ({slots} blocks)",
                         pct(full.block_hit_rate), pct(full.token_hit_rate), "",
                         str(full.evictions), str(slots)])
        rows.append(["infinite cache (bound)", pct(self.infinite.block_hit_rate),
                     pct(self.infinite.token_hit_rate), "", "0",
                     f"{len(self.infinite_keys())} at end"])
        lines.append(format_table(["hit rate", "blocks", "tokens", "vs mirror", "evictions",
                                   "held (mean)"], rows))
        lines.append("")
        lines += self.perf_table()
        lines.append("")
        lines += self.verdicts()
        lines += self.notes
        return "\n".join(lines)

    def infinite_keys(self) -> set[int]:
        return {h for r in self.requests for h in r.hash_ids}

    def perf_table(self) -> list[str]:
        a = self.args
        heads = ["measure"] + [run.spec.label for run in self.runs]
        cols: list[list[str]] = []
        for run in self.runs:
            recs = run.records
            n = len(recs)
            hit = [r for r in recs if r.hits]
            put = [r for r, q in zip(recs, self.requests, strict=True) if r.hits < len(q.hash_ids)]
            read = sum(r.read_bytes for r in recs)
            written = sum(r.written_bytes for r in recs)
            pf = prefill_estimate(self.requests, recs, a.prefill_tokens_per_s)
            lost = sum(r.lookup_hits - r.hits for r in recs)
            tiers = run.tiers
            errors = sum(r.put_errors for r in recs)
            col = [
                f"{run.spec.nodes} node(s), {run.spec.concurrency} replayer(s)",
                f"{fmt_rate(n / run.wall_s, ' req/s')}, "
                f"{fmt_rate(sum(len(r.hash_ids) for r in self.requests) / run.wall_s, ' blk/s')}"
                if run.wall_s > 0 else "-",
                f"{run.wall_s:.1f} s",
                lat([r.lookup_s for r in recs]),
                lat([r.load_s for r in hit]),
                lat([r.put_s for r in put]),
                lat([r.release_s for r in recs if r.lookup_hits]) if run.spec.system == OURS else "no lease",
                f"{format_size(read)} / {format_size(written)}",
                f"{(read + written) / run.wall_s / 1e9:.2f} GB/s" if run.wall_s > 0 else "-",
                str(lost),
                str(errors),
                f"{pf.saved_mean * 1e3:.1f} ms",
                f"{pf.saved_p50_hit * 1e3:.1f} ms",
                f"{pf.share * 100:.1f}%",
                lat([r.load_s for r in hit if not r.ssd_waits]),
                lat([r.load_s for r in hit if r.ssd_waits]),
                f"{tiers.get('demotions', 0)} / {tiers.get('promotions', 0)}"
                if "demotions" in tiers else "-",
            ]
            if a.speed > 0:
                t_first = self.requests[0].timestamp_ms
                lag = [rec.t0 - (q.timestamp_ms - t_first) / 1000 / a.speed
                       for rec, q in zip(recs, self.requests, strict=True)]
                col.append(lat([max(0.0, x) for x in lag]))
            cols.append(col)
        names = ["cluster", "throughput" + (" (paced by --speed)" if a.speed > 0 else ""),
                 "replay wall time", "lookup p50 / p99",
                 "load p50 / p99 (requests with a hit)", "put p50 / p99 (requests with a miss)",
                 "release p50 / p99", "bytes read / written", "data moved",
                 "hits lost between lookup and load", "put errors",
                 "est. TTFT saved / request, mean *", "est. TTFT saved, p50 of hit requests *",
                 "est. share of prefill time saved *",
                 "load p50 / p99, hits all in DRAM", "load p50 / p99, some hits from SSD",
                 "demotions / promotions"]
        if a.speed > 0:
            names.append("start behind schedule p50 / p99")
        rows = [[name, *(c[i] for c in cols)] for i, name in enumerate(names)]
        return [
            format_table(heads, rows),
            f"* estimate, not measured: saved = hit tokens / {a.prefill_tokens_per_s:g} tokens/s "
            "(--prefill-tokens-per-s) - (lookup + load time measured here for "
            f"{format_size(a.block_bytes)} block objects; real KV blocks are larger and load slower).",
        ]

    def verdicts(self) -> list[str]:
        out = []
        for run in self.runs:
            sim = self.mirror[run.spec.label]
            s = summarize(run.spec.label, self.requests, [r.hits for r in run.records])
            d = round(100 * (s.block_rate - sim.block_hit_rate), 2) + 0.0
            if run.spec.ssd_per_node:
                out.append(self.tier_verdict(run, s))
            elif run.spec.system == OURS:
                same = sum(1 for r, h in zip(run.records, sim.per_request, strict=True) if r.hits != h)
                ok = abs(d) <= MATCH_PP
                out.append(f"{run.spec.label}: block hit rate {d:+.2f} pp from the offline mirror "
                           f"(within {MATCH_PP:g} pp: {'yes' if ok else 'NO'}); {same} of "
                           f"{len(run.records)} requests hit a different number of blocks; "
                           f"evictions {run.evictions} vs {sim.evictions} simulated")
            else:
                out.append(f"{run.spec.label}: block hit rate {d:+.2f} pp from the offline mirror of "
                           "kvstore's policy (Mooncake's own policy: evict 5% of objects above "
                           "0.90, objects read in the last 10 s are not evicted). Mooncake has no "
                           "lease: its prefix comes from batch_is_exist, then batch_get_into and "
                           "batch_put_from, and nothing pins the prefix in between")
        dram = [r for r in self.runs if r.spec.system == OURS and not r.spec.ssd_per_node]
        singles = [r for r in dram if r.spec.nodes == 1 and r.spec.concurrency == 1]
        multi = [r for r in dram if r not in singles]
        for run in multi:
            for base in singles:
                a = summarize("", self.requests, [r.hits for r in run.records]).block_rate
                b = summarize("", self.requests, [r.hits for r in base.records]).block_rate
                ok = abs(a - b) * 100 <= MATCH_PP
                out.append(f"{run.spec.label} vs {base.spec.label} (equal total capacity): "
                           f"{pp(a, b)} (matches within {MATCH_PP:g} pp: {'yes' if ok else 'NO'}); "
                           f"throughput {len(run.records) / run.wall_s:.0f} vs "
                           f"{len(base.records) / base.wall_s:.0f} req/s")
        for run in self.runs:
            if run.rc_counts:
                out.append(f"{run.spec.label}: errors {run.rc_counts}")
            for i, info in enumerate(run.info):
                if run.spec.system == OURS and info:
                    path = "same-host memcpy" if info.get("local_transfers") else "Transfer Engine"
                    out.append(f"{run.spec.label} replayer {i}: data path {path} "
                               f"({info.get('local_transfers', 0)} local transfers)")
        return out

    def tier_verdict(self, run: RunResult, s: Summary) -> str:
        """An SSD run against the bound and against the DRAM-only run of its geometry."""
        base = next((r for r in self.runs if r.spec.system == run.spec.system
                     and not r.spec.ssd_per_node
                     and r.spec.nodes == run.spec.nodes
                     and r.spec.concurrency == run.spec.concurrency), None)
        words = [f"{run.spec.label}: block hit rate {pp(s.block_rate, self.infinite.block_hit_rate)} "
                 f"from the infinite-cache bound"]
        if base is not None:
            b = summarize("", self.requests, [r.hits for r in base.records])
            rate = len(run.records) / run.wall_s if run.wall_s else 0.0
            brate = len(base.records) / base.wall_s if base.wall_s else 0.0
            words.append(f"{pp(s.block_rate, b.block_rate)} over DRAM only ({base.spec.label}); "
                         f"request rate {rate:.0f} vs {brate:.0f} req/s "
                         f"({100 * rate / brate:.0f}% of DRAM only)" if brate else "")
        t = run.tiers
        if run.spec.system == MC and "ssd_bytes" in t:
            words.append(f"its SSD directory held {t['ssd_files']} files, "
                         f"{format_size(t['ssd_bytes'])} at the end (at most "
                         f"{format_size(t['ssd_bytes_max'])} seen); its clients read from it "
                         f"{t['ssd_reads']} times (offload RPC reads; one may carry several "
                         f"objects)")
        return "; ".join(w for w in words if w)

    def as_json(self) -> dict[str, Any]:
        return {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()},
            "sizing": {"dram_per_node": self.sizing.dram_per_node, "nodes": self.sizing.nodes,
                       "slots_per_node": self.sizing.slots_per_node},
            "runs": [{"label": r.spec.label, "system": r.spec.system, "nodes": r.spec.nodes,
                      "concurrency": r.spec.concurrency, "wall_s": r.wall_s,
                      "segments": r.segments, "evictions": r.evictions, "held": r.held,
                      "rc_counts": r.rc_counts, "info": r.info, "fields": list(FIELDS),
                      "ssd_per_node": r.spec.ssd_per_node, "tiers": r.tiers,
                      "records": [x.row() for x in r.records]} for r in self.runs],
            "sims": {
                "mirror": {k: _sim_json(v) for k, v in self.mirror.items()},
                "lru": _sim_json(self.lru), "infinite": _sim_json(self.infinite),
                "lru_full": None if self.lru_full is None else _sim_json(self.lru_full[1]),
            },
        }


def _sim_json(s: SimStats) -> dict[str, Any]:
    return {"block_hit_rate": s.block_hit_rate, "token_hit_rate": s.token_hit_rate,
            "evictions": s.evictions, "held_mean": s.held_mean, "per_request": s.per_request}


def rolling(values: Sequence[float], weights: Sequence[float], window: int) -> list[float]:
    """Sum(values)/sum(weights) over the last `window` items, at each item."""
    out: list[float] = []
    sv = sw = 0.0
    for i, (v, w) in enumerate(zip(values, weights, strict=True)):
        sv += v
        sw += w
        if i >= window:
            sv -= values[i - window]
            sw -= weights[i - window]
        out.append(sv / sw if sw else 0.0)
    return out


def plot(report: Report, path: str, window: int = 200) -> None:
    try:
        import matplotlib
    except ImportError:
        sys.exit("--plot needs matplotlib: .venv/bin/pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reqs = report.requests
    nblocks = [len(r.hash_ids) for r in reqs]
    x = list(range(1, len(reqs) + 1))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    first = report.runs[0].spec.label if report.runs else ""
    series: list[tuple[str, list[int], str]] = [
        (f"{run.spec.label} (replayed)", [rec.hits for rec in run.records], "-") for run in report.runs]
    if first:
        series.append(("offline mirror of the store policy", report.mirror[first].per_request, "--"))
    series.append((f"offline plain LRU ({report.args.capacity_blocks} blocks)",
                   report.lru.per_request, ":"))
    series.append(("infinite cache", report.infinite.per_request, "-."))
    colors = [f"C{i}" for i in range(len(report.runs))] + ["black", "grey", "purple"]
    for (label, hits, style), color in zip(series, colors, strict=False):
        ax1.plot(x, [100 * v for v in rolling([float(h) for h in hits], [float(n) for n in nblocks],
                                              window)], style, label=label, linewidth=1, color=color)
    ax1.set_xlabel("request (trace order)")
    ax1.set_ylabel(f"block hit rate, % (last {window} requests)")
    ax1.set_title("hit rate over the replay")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    for i, run in enumerate(report.runs):
        for (name, vals), style in zip((("lookup", [r.lookup_s for r in run.records]),
                           ("load", [r.load_s for r in run.records if r.hits]),
                           ("put", [r.put_s for r, q in zip(run.records, reqs, strict=True)
                                    if r.hits < len(q.hash_ids)])), ("-", "--", ":"), strict=True):
            if not vals:
                continue
            vs = sorted(v * 1e3 for v in vals)
            ax2.plot(vs, [(j + 1) / len(vs) for j in range(len(vs))], style, color=f"C{i}",
                     label=f"{run.spec.label} {name}", linewidth=1.2)
    ax2.set_xscale("log")
    ax2.set_xlabel("latency, ms (log)")
    ax2.set_ylabel("fraction of requests")
    ax2.set_title("latency per request (CDF)")
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------


def plan_runs(args: argparse.Namespace, sizing: Sizing) -> list[RunSpec]:
    """The main run, then (--compare-single) one node with one replayer, then Mooncake
    (one store node: bench/clusters.py starts one), all with the same total DRAM."""
    pool = sizing.pool_bytes
    runs = [RunSpec(f"kvstore {args.nodes}n c{args.concurrency}", OURS, args.nodes,
                    args.concurrency, sizing.dram_per_node)]
    compare = args.compare_single
    if compare is None:
        compare = True
    if compare and (args.nodes > 1 or args.concurrency > 1):
        runs.append(RunSpec("kvstore 1n c1", OURS, 1, 1, pool))
    if args.ssd:
        runs.insert(1, RunSpec(f"kvstore {args.nodes}n c{args.concurrency} +SSD "
                               f"{format_size(args.ssd)}", OURS, args.nodes, args.concurrency,
                               sizing.dram_per_node, ssd_per_node=args.ssd // args.nodes))
    if args.mooncake:
        runs.append(RunSpec(f"mooncake 1n c{args.concurrency}", MC, 1, args.concurrency, pool))
        if args.ssd:
            # Its SSD offload beside ours: same DRAM, the whole --ssd on its one node.
            runs.append(RunSpec(f"mooncake 1n c{args.concurrency} +SSD {format_size(args.ssd)}",
                                MC, 1, args.concurrency, pool, ssd_per_node=args.ssd))
    return runs


def orchestrate(args: argparse.Namespace, tmp: Path) -> int:
    """Every planned run, the sims, the report (the orchestrator's part)."""
    t_start = time.monotonic()
    requests = read_trace(args.trace, args.limit)
    if not requests:
        print("replay: the trace has no requests", file=sys.stderr)
        return 1
    sizing = Sizing(args.capacity_blocks, args.block_bytes, args.nodes, high=args.evict_high,
                    low=args.evict_low)
    where = (f"capacity {args.capacity_blocks} blocks -> {args.nodes} x "
             f"{format_size(sizing.dram_per_node)} DRAM" if args.start
             else f"against the cluster at {args.etcd}")
    print(f"replaying {len(requests)} requests, {where}; logs in {tmp}", flush=True)
    from bench.clusters import MooncakeSSDUnavailable

    runs: list[RunResult] = []
    notes: list[str] = []
    for spec in plan_runs(args, sizing):
        try:
            run = (run_ours if spec.system == OURS else run_mooncake)(args, spec, requests, tmp)
        except MooncakeSSDUnavailable as exc:
            notes.append(f"{spec.label}: not run. {str(exc).splitlines()[0]}")
            print(notes[-1], file=sys.stderr, flush=True)
            continue
        runs.append(run)
    if not args.start and runs:
        # A running cluster: its DRAM decides the capacity the sims are given.
        slots = sum(s // sizing.asize for s in runs[0].segments)
        args.capacity_blocks = max(1, round(slots * (args.evict_high + args.evict_low) / 2))
    lru = simulate(requests, StoreSim.lru(args.capacity_blocks))
    inf = simulate(requests, StoreSim.infinite())
    mirror = {run.spec.label: simulate(requests, StoreSim.watermark(
        run.segments, args.block_bytes, high=args.evict_high, low=args.evict_low))
        for run in runs}
    slots = StoreSim.pool_slots(runs[0].segments, args.block_bytes) if runs else 0
    full = (slots, simulate(requests, StoreSim.lru(slots))) if slots else None
    report = Report(requests, sizing, runs, mirror, lru, inf, args, full, notes)
    print()
    print(report.text())
    print(f"\n(total {time.monotonic() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json()))
        print(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake-format JSONL trace")
    p.add_argument("--limit", type=int, default=None, help="replay the first N requests")
    p.add_argument("--capacity-blocks", type=int, default=10000,
                   help="blocks the store holds in steady state (mean); sizes the DRAM")
    p.add_argument("--block-bytes", type=parse_size, default=64 << 10,
                   help="bytes of one block object (default 64KiB)")
    p.add_argument("--nodes", type=int, default=1, help="store nodes (capacity split among them)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="replayer processes, each with its own client; each takes the next "
                        "request in trace order when it is free")
    p.add_argument("--speed", type=float, default=0.0,
                   help="trace time scaling: 1 = real time, 10 = ten times faster, "
                        "0 = as fast as possible")
    p.add_argument("--mooncake", action="store_true",
                   help="also replay against Mooncake Store (same trace, same DRAM bytes)")
    p.add_argument("--compare-single", action=argparse.BooleanOptionalAction, default=None,
                   help="with --nodes/--concurrency > 1, also replay on 1 node with 1 replayer "
                        "at the same total capacity (default: on)")
    p.add_argument("--ssd", type=parse_size, default=0,
                   help="also replay with an SSD tier of this many bytes in all (split among "
                        "--nodes) under the same DRAM, e.g. 256MiB; with --mooncake, also "
                        "Mooncake with its SSD offload of this size")
    p.add_argument("--ssd-fsync", action=argparse.BooleanOptionalAction, default=True,
                   help="the SSD tier syncs what it writes (default; --no-ssd-fsync: the "
                        "page cache only)")
    p.add_argument("--te", action="store_true",
                   help="our client moves bytes over the Transfer Engine (same_host=False), as "
                        "Mooncake's does; default: the client's same-host memcpy path")
    p.add_argument("--lease-ttl", type=float, default=30.0, help="our lookup lease TTL, s")
    p.add_argument("--evict-high", type=float, default=EVICT_HIGH,
                   help="our master's high watermark (the started master and the mirror sim)")
    p.add_argument("--evict-low", type=float, default=EVICT_LOW, help="... and its low watermark")
    p.add_argument("--prefill-tokens-per-s", type=float, default=10000.0,
                   help="prefill rate of the GPU the estimate stands for")
    p.add_argument("--plot", help="write hit rate over time and latency CDFs here (PNG)")
    p.add_argument("--json", help="write the configuration, every request record and the sims here")
    p.add_argument("--start", action=argparse.BooleanOptionalAction, default=True,
                   help="start our own cluster (default); --no-start uses --etcd's")
    p.add_argument("--etcd", default="", help="with --no-start: the running cluster's etcd")
    p.add_argument("--master", default="", help="with --no-start: its master (default: from etcd)")
    p.add_argument("--keep-logs", action="store_true", help="keep the temporary log directory")
    # Internal: one replayer process.
    p.add_argument("--worker", choices=[OURS, MC], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--key-prefix", default="rp/", help=argparse.SUPPRESS)
    return p


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.capacity_blocks < 1 or args.block_bytes < 1 or args.nodes < 1 or args.concurrency < 1:
        p.error("--capacity-blocks, --block-bytes, --nodes and --concurrency must be >= 1")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    if not 0 < args.evict_low < args.evict_high <= 1:
        p.error("need 0 < --evict-low < --evict-high <= 1")
    if not args.start and not args.etcd:
        p.error("--no-start needs --etcd HOST:PORT of the running cluster")
    if not args.trace.exists():
        p.error(f"no trace at {args.trace}")
    args.trace = args.trace.resolve()


def main(argv: list[str] | None = None) -> int:
    return bench_main(build_parser(), argv, MODULE, run_worker, orchestrate, check)


if __name__ == "__main__":
    sys.exit(main())
