"""kvstore against Mooncake Store, side by side, in one run on the same machine.

    python -m bench.vs_mooncake [--sizes 64KiB,1MiB,4MiB] [--iters 200] [--batch 32]
                                [--rounds 0] [--turns 4] [--quick] [--json out.json] [--plot out.png]
                                [--runs 1] [--phases] [--profile DIR] [--no-mooncake] [--no-warm]
                                [--engine-pool on|off] [--no-other-reader] [--dram 2GiB]

Re-executes itself in a private network namespace (loopback only; needs root). Both
systems are started, then measured in turn, one object size at a time, in --turns turns
each (who goes first alternates from turn to turn; each turn does its share of the
single ops and batches, and the samples of all turns are pooled), so that on a shared,
noisy machine both see the same background load, slow spells included; the idle
processes of either cost the other next to nothing:

- ours: etcd + our master + one store node (--dram, default 2 GiB) and a client in
  another process, `KVStoreClient(etcd=...)`, in two configurations:
  "kvstore TE" (`same_host=False`): bytes cross the Transfer Engine over TCP exactly as
  Mooncake's do; the like-for-like comparison.
  "kvstore same-host" (the default, `same_host=True`): a client on a store node's host
  maps the node's memfd segment and copies with memcpy; its column is labelled as what
  it is, our memcpy against Mooncake over TCP. The client's `local_transfers` counter
  proves which path each configuration took.
  "another reader" (--no-other-reader skips it): a second client of ours, its own
  engine, reads what the TE client wrote. The TE client read keys it wrote itself, so
  its early reads (placements remembered from its puts) help it; they help no other
  reader, as a second inference engine is. Its get rows only (its puts are the TE
  client's).
- Both engines reuse their TCP connections by default (MC_TCP_ENABLE_CONNECTION_POOL=1,
  our client's default, set for Mooncake's node and client too); --engine-pool off gives
  both the engine's own default, a connection per transfer.
- Mooncake: `mooncake_master` (HTTP metadata server on), a store-node process that
  mounts a global segment of the same size, and a client in another process with no
  segment of its own, so all bytes cross the Transfer Engine. (Mooncake's own same-host
  path, a `setup_dummy` client sharing memory with a `mooncake_client` process, is not
  measured here.)

Each client is measured through two APIs, and every row shows each system's faster one
for that row (marked b or r; the raw figures of both are in --json):
  b, bytes API: ours put/get and put_many/get_many; Mooncake put/get and
     put_batch/get_batch. Values are Python bytes; a get returns new bytes.
  r, registered-buffer API: ours register + put_from/get_into; Mooncake register_buffer
     + put_from/get_into and batch_put_from/batch_get_into. Bytes move straight from and
     into memory registered with the engine.
A latency row's p99 comes from the API chosen by its p50. Both systems' operations are
in bench/systems/ (one adapter each); the client processes speak bench/harness.py's
protocol.

Per object size: single put and single get latency (p50/p99 over --iters operations,
fresh keys), and the throughput of batches of --batch objects (put then get; GB/s =
10^9 bytes/s over the summed call times of --rounds batches; 0 picks ~1 GiB worth).
Objects are removed between phases so neither store nears its eviction watermark: at
most LIVE_SHARE of --dram is alive at once (a --dram that holds less than one batch
there is refused). Both
transports are TCP over loopback, both store nodes DRAM. Our figures include the
checksum our client computes on every put and verifies on every get.

Before measuring, each client writes WARM_SHARE of its store's DRAM in batches of the
largest size and removes it again (--no-warm skips this), so that both are measured on
memory that has been written once: a new store node maps its segment's pages at first
write unless it reserved them at start (ours does, Mooncake's does not), and which
system pays those page faults during the measurement would otherwise depend on where
its allocator places objects, not on its data path.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import math
import os
import pstats
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import Worker, bench_main, serve
from bench.stats import (
    Latency,
    better_ratio,
    fmt_gbps,
    fmt_ratio,
    fmt_seconds,
    format_table,
    gbps,
)
from bench.systems.base import Api, BytesApi, RegisteredApi, Slots, System
from bench.systems.ours import Ours, Phases
from kvstore.errors import InvalidArgument
from kvstore.units import format_size, parse_size

MODULE = "bench.vs_mooncake"
TE, TE2, SHM, MC = "kvstore-te", "kvstore-te-other", "kvstore-shm", "mooncake"
# Of each store's DRAM, what the objects of one phase may take at once (written, read,
# then removed): far below either system's eviction mark (0.9), with room for the space
# our clients start ahead for their puts. 512 MiB of the default 2 GiB.
LIVE_SHARE = 0.25
# Batch calls per size and direction (--rounds 0; at least 5, at most 200): a figure that
# rests on a few calls moves with one stall of the VM (docs/perf-notes.md has the
# measurements that set it).
AUTO_ROUND_BYTES = 1 << 30
# Of each store's DRAM, what the warm-up writes (and removes): below both systems'
# eviction watermark (0.9 by default for each).
WARM_SHARE = 0.8


# -- the driver (runs in the client process) ----------------------------------------------


def live_bytes(dram: int) -> int:
    """What the objects alive at once may take in a store of `dram` bytes."""
    return int(dram * LIVE_SHARE)


def chunks(items: Sequence[Any], per_item_bytes: int, live: int) -> Iterator[Sequence[Any]]:
    """Slices of `items` whose objects fit in `live` bytes together."""
    step = max(1, live // max(1, per_item_bytes))
    for lo in range(0, len(items), step):
        yield items[lo:lo + step]


def _check(data: Any, value: bytes, what: str) -> None:
    if data is None or len(data) != len(value) or data != value:
        raise RuntimeError(f"{what}: wrong or missing data "
                           f"({'none' if data is None else len(data)} bytes)")


def warm(api: Api, total: int, size: int, batch: int) -> float:
    """Write `total` bytes of `size`-byte objects through `api` in batches, all alive at
    once, then remove them: the pages under them have been written once. Seconds taken."""
    api.prepare(os.urandom(size))
    t0 = time.perf_counter()
    written: list[list[str]] = []
    for r in range(total // (size * batch)):
        keys = [f"warm-{r}-{i}" for i in range(batch)]
        api.put_many(keys)
        written.append(keys)
    for keys in written:
        api.remove(keys)
    return time.perf_counter() - t0


def measure(api: Api, size: int, iters: int, batch: int, rounds: int, tag: str,
            live: int) -> dict[str, Any]:
    value = os.urandom(size)
    api.prepare(value)
    _warm_up(api, value, batch, tag)
    marks = _Marks(api.phases)
    single = [f"{tag}-s{i}" for i in range(iters)]
    put_lat, get_lat = _single_ops(api, value, single, size, marks, live)
    all_rounds = [[f"{tag}-b{r}-{i}" for i in range(batch)] for r in range(rounds)]
    put_t, get_t = _batch_ops(api, value, all_rounds, size, batch, marks, live)
    phases: dict[str, dict[str, float]] = {}
    if marks.on:
        # Phases of single ops are only taken when one chunk holds them all (no removes
        # in between to blur them).
        if len(list(chunks(single, size, live))) == 1:
            phases["put"] = marks.per_call("put", put_lat)
            phases["get"] = marks.per_call("get", get_lat)
        for op in ("batch put", "batch get"):
            phases[op] = {k: v / rounds for k, v in marks.sums[op].items()}
    return {
        "phases": phases,
        "system": api.system, "api": api.api, "size": size, "iters": iters, "batch": batch,
        "rounds": rounds,
        "local_transfers": api.local_transfers(),
        "early_reads": api.early_reads(),
        "one_call_puts": api.one_call_puts(),
        **summary({"put": put_lat, "get": get_lat, "batch_put": put_t, "batch_get": get_t},
                  size * batch * rounds),
    }


def _warm_up(api: Api, value: bytes, batch: int, tag: str) -> None:
    """Before a measurement: connections, registrations and first-touch page faults on
    both ends, through a few single ops and one batch."""
    warm = [f"{tag}-w{i}" for i in range(batch)]
    for k in warm[:3]:
        api.put(k)
        _check(api.get(k), value, "warm-up get")
    api.remove(warm[:3])
    api.put_many(warm)
    for data in api.get_many(warm):
        _check(data, value, "warm-up get_many")
    api.remove(warm)


class _Marks:
    """Our client's phase times around each timed loop of a measurement (--phases: the
    api has `phases`; otherwise nothing is taken): snapshots at the start and the end
    ("<op> end") of the loop, per call between the two, and for the batch ops summed
    over the chunks (weighted by calls)."""

    def __init__(self, ph: Phases | None) -> None:
        self.on = ph is not None
        self._ph = ph
        self._at: dict[str, dict[str, float]] = {}
        self.sums: dict[str, dict[str, float]] = {"batch put": {}, "batch get": {}}

    def mark(self, name: str) -> None:
        if self._ph is not None:
            self._at[name] = self._ph.snapshot()

    def per_call(self, op: str, samples: list[float]) -> dict[str, float]:
        return Phases.per_call(self._at[op], self._at[op + " end"], len(samples), sum(samples))

    def add(self, op: str, samples: list[float]) -> None:
        if self.on:
            sums = self.sums[op]
            for k, v in self.per_call(op, samples).items():
                sums[k] = sums.get(k, 0.0) + v * len(samples)


def _single_ops(api: Api, value: bytes, keys: list[str], size: int,
                marks: _Marks, live: int) -> tuple[list[float], list[float]]:
    """Single puts, then single gets, of `keys`, a chunk at a time (removed after it):
    the seconds of each put and of each get."""
    clock = time.perf_counter
    put_lat: list[float] = []
    get_lat: list[float] = []
    for part in chunks(keys, size, live):
        marks.mark("put")
        for k in part:
            t0 = clock()
            api.put(k)
            put_lat.append(clock() - t0)
        marks.mark("put end")
        marks.mark("get")
        for j, k in enumerate(part):
            t0 = clock()
            data = api.get(k)
            get_lat.append(clock() - t0)
            if j == 0 or data is None:
                _check(data, value, f"get {k}")
        marks.mark("get end")
        api.remove(list(part))
    return put_lat, get_lat


def _batch_ops(api: Api, value: bytes, all_rounds: list[list[str]], size: int, batch: int,
               marks: _Marks, live: int) -> tuple[list[float], list[float]]:
    """put_many, then get_many, of each round's `batch` keys, as many rounds at a time as fit
    (removed after them): the seconds of each put_many and of each get_many."""
    clock = time.perf_counter
    put_t: list[float] = []
    get_t: list[float] = []
    for part in chunks(all_rounds, size * batch, live):
        marks.mark("batch put")
        n0 = len(put_t)
        for keys in part:
            t0 = clock()
            api.put_many(keys)
            put_t.append(clock() - t0)
        marks.mark("batch put end")
        marks.add("batch put", put_t[n0:])
        marks.mark("batch get")
        n0 = len(get_t)
        for keys in part:
            t0 = clock()
            out = api.get_many(keys)
            get_t.append(clock() - t0)
            if any(d is None for d in out):
                raise RuntimeError(f"get_many: {sum(d is None for d in out)} of {batch} missing")
            _check(out[0], value, "get_many")
        marks.mark("batch get end")
        marks.add("batch get", get_t[n0:])
        api.remove([k for keys in part for k in keys])
    return put_t, get_t


def summary(samples: dict[str, list[float]], batch_bytes: float) -> dict[str, Any]:
    """The figures of one measurement from its samples (seconds per call): latencies of
    the single ops and of the batch calls, and GB/s over the summed batch call times of
    `batch_bytes` each way."""
    return {
        "samples": samples,
        "put": Latency.of(samples["put"]).as_dict(), "get": Latency.of(samples["get"]).as_dict(),
        "batch_put_gbps": gbps(batch_bytes, sum(samples["batch_put"])),
        "batch_get_gbps": gbps(batch_bytes, sum(samples["batch_get"])),
        "batch_put_call": Latency.of(samples["batch_put"]).as_dict(),
        "batch_get_call": Latency.of(samples["batch_get"]).as_dict(),
    }


def share(total: int, turns: int, turn: int) -> int:
    """This turn's part of `total` operations split over `turns` (at least 1)."""
    return max(1, total // turns + (1 if turn < total % turns else 0))


def merge_turns(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (system, API, size) from the results of its turns: samples pooled,
    latencies and throughputs computed over all of them, phases weighted by calls,
    counters (cumulative in the client) from the last turn."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["system"], r["api"], r["size"]), []).append(r)
    out = []
    for parts in groups.values():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        pooled = {k: [x for p in parts for x in p["samples"][k]] for k in parts[0]["samples"]}
        merged = dict(parts[-1])
        iters, rounds = sum(p["iters"] for p in parts), sum(p["rounds"] for p in parts)
        merged.update({"iters": iters, "rounds": rounds, "turns": len(parts),
                       "phases": _merge_phases(parts),
                       **summary(pooled, merged["size"] * merged["batch"] * rounds)})
        out.append(merged)
    return out


def _merge_phases(parts: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    weights = {"put": "iters", "get": "iters", "batch put": "rounds", "batch get": "rounds"}
    out: dict[str, dict[str, float]] = {}
    for op, by in weights.items():
        have = [(p["phases"][op], p[by]) for p in parts if p.get("phases", {}).get(op)]
        total = sum(w for _, w in have)
        if total:
            keys = {k for ph, _ in have for k in ph}
            out[op] = {k: sum(ph.get(k, 0.0) * w for ph, w in have) / total for k in keys}
    return out


def auto_rounds(rounds: int, size: int, batch: int) -> int:
    if rounds > 0:
        return rounds
    return max(5, min(200, math.ceil(AUTO_ROUND_BYTES / (size * batch))))


def staging_bytes(sizes: Sequence[int], batch: int) -> int:
    """Client-side buffer for one batch of the largest objects (the same for both)."""
    return batch * max(sizes) + (16 << 20)


def open_apis(args: argparse.Namespace, endpoint: dict[str, str],
              sizes: list[int]) -> tuple[list[Api], list[System]]:
    """The client process's systems (ours: over the engine and same-host; or Mooncake's),
    each through both APIs."""
    systems: list[System] = []
    if args.worker == "ours":
        options: dict[str, Any] = {}
        if args.no_early_reads:
            options["placement_memory"] = 0
        if args.no_one_call_puts:
            options["reserve_bytes"] = 0
        ours_systems = [Ours(name, endpoint["etcd"], Slots(args.batch, max(sizes)),
                             staging_bytes(sizes, args.batch), same_host=same_host, **options)
                        for name, same_host in ((TE, False), (SHM, True))]
        systems += ours_systems
        if not args.no_other_reader:
            from bench.systems.ours import OtherReader

            systems.append(OtherReader(TE2, endpoint["etcd"], ours_systems[0],
                                       staging_bytes(sizes, args.batch), same_host=False,
                                       **options))
    else:
        from bench.systems.mooncake import Mooncake

        systems.append(Mooncake(endpoint, Slots(args.batch, max(sizes)),
                                staging_bytes(sizes, args.batch)))
    from bench.systems.ours import OtherReader

    apis: list[Api] = []
    timers: dict[int, Phases] = {}
    for system in systems:
        mine: list[Api] = [BytesApi(system), RegisteredApi(system)]
        if args.phases and isinstance(system, Ours):
            if isinstance(system, OtherReader):
                # its puts are the writer's calls: one timer sees both clients
                timer = timers[id(system.writer)]
            else:
                timer = timers[id(system)] = Phases()
            timer.install(system)
            for api in mine:
                api.phases = timer
        apis += mine
    return apis, systems


def run_worker(args: argparse.Namespace) -> int:
    """One client process: measures one size whenever the orchestrator asks, so that
    both systems are measured in alternation, each under the same background load."""
    endpoint = json.loads(args.endpoint)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    profiler = cProfile.Profile() if args.profile else None
    max_size = max(sizes)
    live = live_bytes(parse_size(args.dram))
    apis, systems = open_apis(args, endpoint, sizes)

    def handle(ask: dict[str, Any]) -> Any:
        if "warm" in ask:
            # Over the engine, like Mooncake's: through the node's own data path.
            api = next((a for a in apis if a.api == "r" and a.system == TE), apis[0])
            if args.worker != "ours":
                api = next((a for a in apis if a.api == "r"), apis[0])
            return {"seconds": warm(api, int(ask["warm"]), max_size, args.batch)}
        size, turn, turns = int(ask["size"]), int(ask["turn"]), int(ask["turns"])
        if profiler:
            profiler.enable()
        rounds = auto_rounds(args.rounds, size, args.batch)
        part = [measure(api, size, share(args.iters, turns, turn), args.batch,
                        share(rounds, turns, turn),
                        tag=f"{api.system}-{api.api}-{size}-t{turn}", live=live)
                for api in apis]
        if profiler:
            profiler.disable()
        return part

    try:
        serve(handle)
        if profiler:
            profiler.dump_stats(str(Path(args.profile) / f"{args.worker}.pstats"))
    finally:
        for system in systems:
            system.close()
    return 0


# -- the orchestrator ---------------------------------------------------------------------


@dataclass
class Row:
    """One measure at one size: each system's figure from its faster API for it, and
    ratios against Mooncake oriented so that > 1 means ours is better."""

    size: int
    measure: str                 # "put p50", "batch get x32", ...
    unit: str                    # "s" or "GB/s"
    values: dict[str, float]     # system -> figure
    apis: dict[str, str]         # system -> "b" or "r"
    ratios: dict[str, float | None]  # TE / TE2 / SHM -> vs Mooncake

    def cells(self) -> list[str]:
        f = fmt_seconds if self.unit == "s" else fmt_gbps

        def val(system: str) -> str:
            return f"{f(self.values[system])} {self.apis[system]}" if system in self.values else "-"

        def ratio(system: str) -> str:
            return fmt_ratio(self.ratios.get(system)) if system in self.values else "-"

        return [format_size(self.size).replace(".0 ", " "), self.measure, val(TE), val(MC),
                ratio(TE), val(TE2), ratio(TE2), val(SHM), ratio(SHM)]


def _dig(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for key in path:
        value = value[key]
    return float(value)


def build_rows(results: list[dict[str, Any]]) -> list[Row]:
    """One row per size and measure, from every system's and API's `measure` results."""
    rows: list[Row] = []
    sizes = sorted({r["size"] for r in results})
    batch = results[0]["batch"] if results else 0
    measures: list[tuple[str, str, tuple[str, ...], tuple[str, ...], bool]] = [
        # name, unit, figure, what picks the API, higher is better
        ("put p50", "s", ("put", "p50"), ("put", "p50"), False),
        ("put p99", "s", ("put", "p99"), ("put", "p50"), False),
        ("get p50", "s", ("get", "p50"), ("get", "p50"), False),
        ("get p99", "s", ("get", "p99"), ("get", "p50"), False),
        (f"batch put x{batch}", "GB/s", ("batch_put_gbps",), ("batch_put_gbps",), True),
        (f"batch get x{batch}", "GB/s", ("batch_get_gbps",), ("batch_get_gbps",), True),
    ]
    for size in sizes:
        for name, unit, path, pick, hib in measures:
            values: dict[str, float] = {}
            apis: dict[str, str] = {}
            for system in (TE, TE2, SHM, MC):
                if system == TE2 and "get" not in name:
                    continue  # its puts are the TE client's: the same figures again
                cands = [r for r in results if r["size"] == size and r["system"] == system]
                if not cands:
                    continue
                best = (max if hib else min)(cands, key=lambda r: _dig(r, pick))
                values[system], apis[system] = _dig(best, path), best["api"]
            ratios = {s: better_ratio(values.get(s), values.get(MC), higher_is_better=hib)
                      for s in (TE, TE2, SHM) if s in values}
            rows.append(Row(size, name, unit, values, apis, ratios))
    return rows


def render_phases(results: list[dict[str, Any]]) -> str:
    """Per size, configuration, API and operation: ms per call, by phase (--phases)."""
    lines = ["our client, ms per call by phase (exclusive; bg: = in another thread, "
             "overlapped; other = the call minus the phases):"]
    for r in results:
        for op, parts in r.get("phases", {}).items():
            if not parts:
                continue
            label = (f"{format_size(r['size']).replace('.0 ', ' ')} {r['system']} "
                     f"{r['api']} {op}:")
            body = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in sorted(
                parts.items(), key=lambda kv: -kv[1]) if k != "call")
            lines.append(f"  {label:<30} {parts['call'] * 1e3:8.3f} = {body}")
    return "\n".join(lines)


def render(rows: list[Row]) -> str:
    head = "\n".join([
        "ratio > 1 means kvstore is better: latency rows Mooncake/ours, throughput rows "
        "ours/Mooncake.",
        "kvstore TE: same_host=False, bytes over the Transfer Engine (TCP loopback), as "
        "Mooncake's client does; its",
        "client reads keys it wrote itself (its early reads and one-call puts help it). "
        "another reader: a second",
        "client of ours, which never saw the keys, reads what the TE client wrote, as a "
        "second engine would",
        "(Mooncake's reader is its writer). memcpy: our default same_host=True, memcpy into "
        "the store node's",
        "mapped segment, against Mooncake over TCP (Mooncake's own same-host setting is not "
        "measured).",
        "Both engines reuse TCP connections unless --engine-pool off. Each figure is from "
        "that system's faster",
        "API for the row: b = bytes API (put/get, put_many|put_batch/get_many|get_batch), "
        "r = registered",
        "buffers (put_from/get_into, Mooncake batch_put_from/batch_get_into). p99 comes "
        "from the API chosen by p50.",
    ])
    table = format_table(
        HEADERS, [r.cells() for r in rows], align="llrrrrrrr")
    return head + "\n\n" + table


HEADERS = ["size", "measure", "kvstore TE", "Mooncake", "ratio", "another reader", "ratio",
           "memcpy vs MC TCP", "ratio"]


@dataclass
class RangeRow:
    """One measure at one size over several runs: (min, max) of each figure and ratio."""

    size: int
    measure: str
    unit: str
    values: dict[str, tuple[float, float]]
    apis: dict[str, str]                 # system -> the APIs its figures came from, "b/r"
    ratios: dict[str, tuple[float, float]]
    medians: dict[str, float]            # system -> median ratio (for the plot)

    def cells(self) -> list[str]:
        f = fmt_seconds if self.unit == "s" else fmt_gbps

        def span(lo: float, hi: float, fmt: Any) -> str:
            a, b = fmt(lo), fmt(hi)
            unit_a, unit_b = a.split(" ")[-1], b.split(" ")[-1]
            if a == b:
                return a
            if unit_a == unit_b and " " in a:  # "1.2-1.5 ms", not "1.2 ms-1.5 ms"
                return f"{a.rsplit(' ', 1)[0]}-{b}"
            return f"{a}-{b}"

        def val(system: str) -> str:
            if system not in self.values:
                return "-"
            return f"{span(*self.values[system], f)} {self.apis[system]}"

        def ratio(system: str) -> str:
            if system not in self.ratios:
                return "-"
            lo, hi = self.ratios[system]
            if f"{lo:.2f}" == f"{hi:.2f}":
                return f"{lo:.2f}x"
            return f"{lo:.2f}-{hi:.2f}x ({self.medians[system]:.2f})"

        return [format_size(self.size).replace(".0 ", " "), self.measure, val(TE), val(MC),
                ratio(TE), val(TE2), ratio(TE2), val(SHM), ratio(SHM)]


def range_rows(runs: list[list[Row]]) -> list[RangeRow]:
    """The same rows of several runs, folded into (min, max) per figure and ratio."""
    out: list[RangeRow] = []
    for same in zip(*runs, strict=True):
        first = same[0]
        if any((r.size, r.measure) != (first.size, first.measure) for r in same):
            raise ValueError("runs with different rows cannot be folded")
        values: dict[str, tuple[float, float]] = {}
        apis: dict[str, str] = {}
        ratios: dict[str, tuple[float, float]] = {}
        medians: dict[str, float] = {}
        for system in (TE, TE2, MC, SHM):
            vs = [r.values[system] for r in same if system in r.values]
            if vs:
                values[system] = (min(vs), max(vs))
                apis[system] = "/".join(sorted({r.apis[system] for r in same
                                                if system in r.apis}))
            rs = [x for r in same if (x := r.ratios.get(system)) is not None]
            if rs:
                ratios[system] = (min(rs), max(rs))
                medians[system] = statistics.median(rs)
        out.append(RangeRow(first.size, first.measure, first.unit, values, apis, ratios,
                            medians))
    return out


def render_ranges(rows: list[RangeRow], runs: int) -> str:
    head = (f"over {runs} runs, min-max of each figure and of each ratio, with the median "
            "ratio in brackets\n(ratio > 1 means kvstore is better); b/r: the API each "
            "system's figures came from, as above.")
    table = format_table(
        HEADERS, [r.cells() for r in rows], align="llrrrrrrr")
    return head + "\n\n" + table


def early_note(results: list[dict[str, Any]]) -> str:
    """How many of our gets read while asking (the client had seen the keys: it wrote
    them), and how many of those early reads it had to throw away."""
    kept = wasted = 0
    for r in results:
        early = r.get("early_reads")
        if early:
            kept, wasted = max(kept, early[0]), max(wasted, early[1])
    if not kept and not wasted:
        return "our client read nothing early (every get asked where first)"
    return (f"our client read {kept} objects while asking where they were (it had written "
            f"them) and threw {wasted} such reads away")


def one_call_note(results: list[dict[str, Any]]) -> str:
    """How many of our puts went into space started ahead (one control call each)."""
    ahead = total = 0
    for r in results:
        got = r.get("one_call_puts")
        if got:
            ahead, total = max(ahead, got[0]), max(total, got[1])
    if not total:
        return ""
    return (f"our client put {ahead} of {total} objects into space it had started ahead "
            "(PutCommit: one control call), the rest with PutStart and PutEnd")


def path_warnings(results: list[dict[str, Any]]) -> list[str]:
    """Whether each of our configurations took the data path it is labelled with."""
    out = []
    for r in results:
        n = r.get("local_transfers")
        where = f"{format_size(r['size'])}, API {r['api']}"
        if r["system"] == TE and n:
            out.append(f"{where}: the same_host=False client moved {n} objects by memcpy")
        if r["system"] == SHM and not n:
            out.append(f"{where}: the same-host client never used its memcpy path (segment "
                       "not mappable?); its figures are Transfer Engine figures")
    return out


def plot(rows: list[Row] | list[RangeRow], path: str) -> None:
    """A bar per row and configuration: the ratio, or with several runs the median ratio
    and a line from the lowest to the highest."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("--plot needs matplotlib: .venv/bin/pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    labels = [f"{format_size(r.size).replace('.0 ', ' ')} {r.measure}" for r in rows]
    x = list(range(len(rows)))
    shown = [(TE, "kvstore TE / Mooncake"),
             (TE2, "kvstore TE, another reader / Mooncake"),
             (SHM, "kvstore memcpy / Mooncake over TCP")]
    shown = [(s, label) for s, label in shown if any(r.ratios.get(s) is not None for r in rows)]
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows)), 5))

    def bars(system: str, xs: list[float], label: str) -> None:
        if rows and isinstance(rows[0], RangeRow):
            ranged = [r for r in rows if isinstance(r, RangeRow)]
            mid = [r.medians.get(system, 0.0) for r in ranged]
            lo = [m - r.ratios[system][0] if system in r.ratios else 0.0
                  for m, r in zip(mid, ranged, strict=True)]
            hi = [r.ratios[system][1] - m if system in r.ratios else 0.0
                  for m, r in zip(mid, ranged, strict=True)]
            ax.bar(xs, mid, width, label=label + " (median, min-max)", yerr=[lo, hi],
                   capsize=2, error_kw={"linewidth": 0.8})
        else:
            ax.bar(xs, [r.ratios.get(system) or 0.0 for r in rows], width,  # type: ignore[misc]
                   label=label)

    for n, (system, label) in enumerate(shown):
        bars(system, [i + (n - (len(shown) - 1) / 2) * width for i in x], label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ratio (>1: kvstore better; log scale)")
    ax.set_title("kvstore vs Mooncake Store: 1 store node, clients in another process")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _worker_cmd(args: argparse.Namespace, system: str, endpoint: dict[str, str]) -> list[str]:
    cmd = [sys.executable, "-m", MODULE, "--worker", system, "--endpoint", json.dumps(endpoint),
           "--sizes", args.sizes, "--iters", str(args.iters), "--dram", args.dram,
           "--batch", str(args.batch), "--rounds", str(args.rounds)]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.phases:
        cmd += ["--phases"]
    if args.no_early_reads:
        cmd += ["--no-early-reads"]
    if args.no_one_call_puts:
        cmd += ["--no-one-call-puts"]
    if args.no_other_reader:
        cmd += ["--no-other-reader"]
    return cmd


def measure_both(args: argparse.Namespace, sizes: list[int], dram: int,
                 tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One run: both systems started afresh, then measured in turn, size by size."""
    from bench.clusters import mooncake, ours

    ours_res: list[dict[str, Any]] = []
    mc_res: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:

        def start(name: str, endpoint: dict[str, str]) -> Worker:
            w = stack.enter_context(contextlib.closing(Worker(
                name, _worker_cmd(args, name, endpoint), tmp / f"client-{name}.log")))
            w.ready()
            return w

        oc = stack.enter_context(ours(tmp, dram=args.dram))
        workers = [start("ours", {"etcd": oc.etcd})]
        if not args.no_mooncake:
            mc = stack.enter_context(mooncake(tmp, dram))
            workers.append(start("mooncake", {"master": mc.master, "metadata": mc.metadata}))
        if not args.no_warm:
            total = int(dram * WARM_SHARE)
            # each client writes `total` bytes and removes them again (see `warm`)
            took = ", ".join(f"{w.name} {w.ask({'warm': total})['seconds']:.1f} s"
                             for w in workers)
            print(f"warm-up: each client wrote {format_size(total)} and removed it ({took})",
                  flush=True)
        print(f"both systems up; measuring them in turn, one size at a time, in "
              f"{args.turns} turns each ...", flush=True)
        k = 0
        for size in sizes:
            for turn in range(args.turns):
                # who goes first alternates, so neither always follows the other
                for w in workers if k % 2 == 0 else workers[::-1]:
                    (ours_res if w.name == "ours" else mc_res).extend(
                        w.ask({"size": size, "turn": turn, "turns": args.turns}))
                k += 1
    return merge_turns(ours_res), merge_turns(mc_res)


def orchestrate(args: argparse.Namespace, tmp: Path) -> int:
    """Every run, its table, and the figures over all runs (the orchestrator's part)."""
    from bench.clusters import engine_pool

    engine_pool(args.engine_pool == "on")  # both systems alike
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    dram = parse_size(args.dram)
    t_start = time.monotonic()
    print(f"sizes {args.sizes}, {args.iters} single ops, batches of {args.batch}, "
          f"rounds {[auto_rounds(args.rounds, s, args.batch) for s in sizes]}, "
          f"{args.runs} run(s); logs in {tmp}", flush=True)
    runs: list[dict[str, Any]] = []
    for n in range(args.runs):
        load_start = os.getloadavg()[0]
        run_dir = tmp / f"run{n + 1}"
        run_dir.mkdir()
        ours_res, mc_res = measure_both(args, sizes, dram, run_dir)
        rows = build_rows(ours_res + mc_res)
        load = (load_start, os.getloadavg()[0])
        runs.append({"rows": rows, "raw": {"kvstore": ours_res, "mooncake": mc_res},
                     "load": load})
        print(f"\n--- run {n + 1} of {args.runs} ---\n" if args.runs > 1 else "")
        print(render(rows))
        print(f"\nload average (1 min) at start {load[0]:.2f}, at end {load[1]:.2f} "
              f"on {os.cpu_count()} CPUs")
        for warning in path_warnings(ours_res):
            print(f"WARNING: {warning}")
        print(early_note(ours_res))
        note = one_call_note(ours_res)
        if note:
            print(note)
        if args.phases:
            print()
            print(render_phases(ours_res))
    ranged = range_rows([r["rows"] for r in runs]) if args.runs > 1 else None
    if ranged is not None:
        print(f"\n--- all {args.runs} runs ---\n")
        print(render_ranges(ranged, args.runs))
    print(f"\n(total {time.monotonic() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "config": {"sizes": sizes, "iters": args.iters, "batch": args.batch,
                       "rounds": args.rounds, "dram": dram, "transport": "tcp loopback",
                       "runs": args.runs, "turns": args.turns},
            "runs": [{"rows": [r.__dict__ for r in run["rows"]], "raw": run["raw"],
                      "load_average": run["load"]} for run in runs],
            "ranges": [r.__dict__ for r in ranged] if ranged else None,
        }, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(ranged if ranged is not None else runs[-1]["rows"], args.plot)
        print(f"wrote {args.plot}")
    if args.profile:
        for system in ("ours", "mooncake"):
            print(f"\n--- client profile, {system}, all its APIs (top by own time) ---")
            stats = pstats.Stats(str(Path(args.profile) / f"{system}.pstats"))
            stats.sort_stats("tottime").print_stats(15)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes", default="64KiB,1MiB,4MiB", help="object sizes, comma-separated")
    p.add_argument("--iters", type=int, default=200, help="single puts and gets per size")
    p.add_argument("--turns", type=int, default=4,
                   help="per size, the systems take this many turns each, alternating, "
                        "each doing its share of the single ops and batches; the samples "
                        "of all turns are pooled (a slow spell of the machine then falls "
                        "on both)")
    p.add_argument("--batch", type=int, default=32, help="objects per batch call")
    p.add_argument("--rounds", type=int, default=0,
                   help="batch calls per size and direction (0: ~1 GiB worth, 5..200)")
    p.add_argument("--dram", default="2GiB", help="store-node DRAM, both systems")
    p.add_argument("--runs", type=int, default=1,
                   help="measure this many times (fresh processes each) and also print the "
                        "min-max of every figure and ratio; the plot then shows the medians")
    p.add_argument("--quick", action="store_true", help="64KiB,1MiB, 50 iters, 5 rounds")
    p.add_argument("--json", help="write rows and raw results here")
    p.add_argument("--plot", help="write a bar chart of the ratios here (matplotlib)")
    p.add_argument("--profile", help="cProfile both clients; pstats files go in this directory")
    p.add_argument("--no-mooncake", action="store_true",
                   help="measure kvstore only (no ratios; for profiling our client)")
    p.add_argument("--phases", action="store_true",
                   help="time our client's phases (control calls, transfer, checksum, ...) "
                        "and print ms per call; adds a little overhead to our figures")
    p.add_argument("--no-early-reads", action="store_true",
                   help="our client remembers no placements (placement_memory=0): every get "
                        "asks where before reading, as a client that never saw the keys")
    p.add_argument("--no-one-call-puts", action="store_true",
                   help="our client starts no space ahead (reserve_bytes=0): every put is "
                        "PutStart, transfer, PutEnd")
    p.add_argument("--no-warm", action="store_true",
                   help="measure without writing each store's memory through first (see "
                        "WARM_SHARE): first-touch page faults then count where they fall")
    p.add_argument("--engine-pool", choices=["on", "off"], default="on",
                   help="both systems' engines reuse their TCP connections (on: "
                        "MC_TCP_ENABLE_CONNECTION_POOL=1, our client's default) or open one "
                        "per transfer (off: the engine's own default)")
    p.add_argument("--no-other-reader", action="store_true",
                   help="skip the rows where a second client of ours reads what the first "
                        "wrote")
    p.add_argument("--keep-logs", action="store_true", help="keep the temporary log directory")
    # Internal: the client process.
    p.add_argument("--worker", choices=["ours", "mooncake"], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    return p


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.turns < 1:
        parser.error(f"--turns must be 1 or more, got {args.turns}")
    if args.quick:
        args.sizes, args.iters, args.rounds = "64KiB,1MiB", 50, 5
    try:
        sizes, dram = [parse_size(s) for s in args.sizes.split(",")], parse_size(args.dram)
    except InvalidArgument as exc:
        parser.error(str(exc))
    live = live_bytes(dram)
    if max(sizes) * args.batch > live:
        need = math.ceil(max(sizes) * args.batch / LIVE_SHARE)
        parser.error(f"--dram {args.dram} leaves {format_size(live)} for the objects alive at "
                     f"once ({LIVE_SHARE:g} of it), less than one batch of {args.batch} x "
                     f"{format_size(max(sizes))}: give --dram {format_size(need)} or more, "
                     "or a smaller --batch")


def main(argv: list[str] | None = None) -> int:
    return bench_main(build_parser(), argv, MODULE, run_worker, orchestrate, check)


if __name__ == "__main__":
    sys.exit(main())
