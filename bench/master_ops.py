"""Control-plane benchmark: our master against Mooncake's, no object bytes moved.

    python -m bench.master_ops [--duration 2] [--turns 2] [--clients 8] [--quick]
                               [--json out.json] [--transport fast|grpc]
                               [--profile-master DIR] [--nested-replicas]

Re-executes itself in a private network namespace (loopback only; needs root). Starts
both systems (ours: etcd + master + one store node; Mooncake: mooncake_master + one
store-node process), each with a 1 GiB segment that only receives allocations, and
measures them in --turns turns each, alternating (who goes first alternates too), each
turn running every case for its share of --duration, from separate client processes
(samples pooled over the turns, so a slow spell of a shared machine falls on both):

| case        | kvstore (raw MasterStub calls; --transport| Mooncake (Python client)                  |
|             | fast: the fast channel, grpc: gRPC)      |                                           |
|-------------|------------------------------------------|-------------------------------------------|
| lookup128   | Lookup of 128 present keys: pins them    | batch_is_exist of 128 keys (existence)    |
|             | under a new lease (ttl --lease-ttl, not  |                                           |
|             | released: it expires on its own)         |                                           |
| exists128   | Exists of 128 keys                       | batch_is_exist of 128 keys                |
| exists1     | Exists of 1 key                          | is_exist                                  |
| replicas128 | GetReplicas of 128 keys (locations +     | batch_get_replica_desc of 128 keys        |
|             | a new lease, not released)               | (locations; any lease it takes unchecked) |
| put64       | PutStart + PutEnd of 64 new 1 KiB keys   | batch_put_session_start + _end, 64 keys   |
|             | (allocate and commit; nothing written)   | ("reserve objects without transfer")      |

lookup128 and put64 run from 1 and from --clients concurrent processes, the rest from
1. Each case runs for --duration seconds in every client at once (they start together).
Latency percentiles are over every call of every client; rates are keys (or objects)
per second over the span from the first client's start to the last client's end. A
write case's keys are removed afterwards, untimed. The master's and the store node's CPU
time (user + system, from /proc/PID/stat) from the start of a case until every client
has finished its timed calls is divided by the objects (or keys) the case handled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.stats import (
    Latency,
    better_ratio,
    fmt_rate,
    fmt_ratio,
    fmt_seconds,
    format_table,
)

MODULE = "bench.master_ops"
HOT_KEYS = 1024          # populated once; lookups read 128-key windows of them
WINDOW = 128
PUT_BATCH = 64
OBJECT_SIZE = 1024
MAX_CALLS = 50_000       # per client and case: bounds the memory a put case allocates
SEGMENT = 1 << 30
PREFIX = "@@"            # protocol lines on a worker's stdout; anything else is ignored

# Keys (or objects) handled per call, per case.
UNITS = {"lookup128": WINDOW, "exists128": WINDOW, "exists1": 1, "replicas128": WINDOW,
         "put64": PUT_BATCH}
CASE_TEXT = {
    "lookup128": ("Lookup 128 keys (+lease)", "batch_is_exist 128"),
    "exists128": ("Exists 128 keys", "batch_is_exist 128"),
    "exists1": ("Exists 1 key", "is_exist"),
    "replicas128": ("GetReplicas 128 (+lease)", "batch_get_replica_desc 128"),
    "put64": ("PutStart+PutEnd 64", "batch_put_session_start+end 64"),
}


def hot_keys() -> list[str]:
    return [f"hot-{i:05d}" for i in range(HOT_KEYS)]


def windows() -> list[list[str]]:
    keys = hot_keys()
    return [keys[i:i + WINDOW] for i in range(0, HOT_KEYS, WINDOW)]


# -- the client side, per system ----------------------------------------------------------


class OursOps:
    """Raw calls to our master, or to N master shards: then each call's keys are grouped
    by shard, every shard's request is sent before any reply is read, and the replies
    are merged (what the client does, docs/scaling.md)."""

    def __init__(self, master: str, wid: int, lease_ttl: float, fast: str = "",
                 columns: bool = True) -> None:
        import grpc

        from kvstore.rpc.client import FastChannel, FastStub
        from kvstore.v1 import master_pb2 as pb
        from kvstore.v1 import master_pb2_grpc as pbg

        self.pb = pb
        self.channel = grpc.insecure_channel(master.split(",")[0])
        # The same messages and calls over the master's fast channel (--transport fast).
        self.stub: Any = (FastStub(FastChannel(fast.split(",")[0])) if fast
                          else pbg.MasterStub(self.channel))
        # One fast channel per shard (comma-separated addresses, shard order).
        self.shards = [FastChannel(a) for a in fast.split(",")] if "," in fast else []
        self.holder = f"bench-{wid}-{os.getpid()}"
        self.writer = self.holder
        self.lease_ttl = lease_ttl
        self.wins = [[k.encode() for k in w] for w in windows()]
        # GetReplicas and PutStart answered in columns, as our client asks (False: the
        # nested items of older clients, --nested-replicas)
        self.columns = columns
        from kvstore.rpc import columns as wire

        self.columns_version = wire.READS  # packed (version 2), what our client reads
        self._start_items = ((lambda r: wire.start_items(r, len(r.items) or r.columns.keys))
                             if columns else (lambda r: list(r.items)))

    @staticmethod
    def _ok(reply: Any, what: str) -> Any:
        if reply.error.code:
            raise RuntimeError(f"{what}: {reply.error.message}")
        return reply

    def fan(self, method: str, keys: list[bytes], make: Callable[[list[bytes]], Any]) -> list[Any]:
        """`method` over `keys`: one reply with one shard, else one per shard touched."""
        if not self.shards:
            return [getattr(self.stub, method)(make(keys))]
        from kvstore.shards import positions_by_shard

        groups = positions_by_shard(keys, len(self.shards))
        asked = [(ch, ch.ask(method, make([keys[p] for p in g]), 30.0))
                 for ch, g in zip(self.shards, groups, strict=True) if g]
        return [ch.answer(a) for ch, a in asked]

    def put_objects(self, keys: list[str]) -> None:
        pb = self.pb
        raw = [k.encode() for k in keys]
        # Placements answered in columns when asked for, as our client asks and reads them.
        placed = {"columns_version": self.columns_version} if self.columns else {}
        starts = self.fan("PutStart", raw, lambda ks: pb.PutStartRequest(
            keys=ks, sizes=[OBJECT_SIZE] * len(ks), checksums=[0] * len(ks),
            writer=self.writer, **placed))
        bad = [i.code for r in starts for i in self._start_items(self._ok(r, "PutStart"))
               if i.code]
        if bad:
            raise RuntimeError(f"PutStart refused {len(bad)} of {len(raw)} keys (codes {set(bad)})")
        ends = self.fan("PutEnd", raw, lambda ks: pb.KeysRequest(keys=ks, writer=self.writer))
        if any(c for r in ends for c in self._ok(r, "PutEnd").codes):
            raise RuntimeError(f"PutEnd codes {set(c for r in ends for c in r.codes)}")

    def remove(self, keys: list[str]) -> None:
        for lo in range(0, len(keys), 8192):
            self.fan("Remove", [k.encode() for k in keys[lo:lo + 8192]],
                     lambda ks: self.pb.RemoveRequest(keys=ks, force=True))

    def op(self, case: str) -> Callable[[int], None]:
        pb, wins, fan = self.pb, self.wins, self.fan
        read_items: Callable[[Any], list[Any]] = lambda r: list(r.items)  # noqa: E731
        columns = ({"columns": True, "columns_version": self.columns_version} if self.columns
                   else {})
        if self.columns:
            from kvstore.rpc.columns import read_items
        if case == "lookup128":
            def lookup(i: int) -> None:
                rs = fan("Lookup", wins[i % len(wins)], lambda ks: pb.LookupRequest(
                    keys=ks, lease_ttl=self.lease_ttl, holder=self.holder))
                if sum(r.count for r in rs) != WINDOW:
                    raise RuntimeError(f"Lookup found {sum(r.count for r in rs)} of {WINDOW} "
                                       f"({'; '.join(r.error.message for r in rs)})")
            return lookup
        if case == "exists128":
            def exists(i: int) -> None:
                rs = fan("Exists", wins[i % len(wins)], lambda ks: pb.KeysRequest(keys=ks))
                found = [e for r in rs for e in r.exists]
                if not all(found) or len(found) != WINDOW:
                    raise RuntimeError(f"Exists: {rs[0].error.message or 'keys missing'}")
            return exists
        if case == "exists1":
            def exists1(i: int) -> None:
                w = wins[i % len(wins)]
                (r,) = fan("Exists", [w[i % WINDOW]], lambda ks: pb.KeysRequest(keys=ks))
                if list(r.exists) != [True]:
                    raise RuntimeError(f"Exists(1): {r.error.message or 'missing'}")
            return exists1
        if case == "replicas128":
            def replicas(i: int) -> None:
                rs = fan("GetReplicas", wins[i % len(wins)], lambda ks: pb.GetReplicasRequest(
                    keys=ks, lease_ttl=self.lease_ttl, holder=self.holder, **columns))
                items = [it for r in rs for it in read_items(r)]  # what our client reads
                if len(items) != WINDOW or any(it.code for it in items):
                    raise RuntimeError(f"GetReplicas: {rs[0].error.message or 'keys missing'}")
            return replicas
        raise ValueError(case)

    def close(self) -> None:
        self.channel.close()
        for ch in self.shards:
            ch.close()


class MooncakeOps:
    def __init__(self, master: str, metadata: str) -> None:
        from bench.clusters import MooncakeCluster, mooncake_client

        self.s = mooncake_client(MooncakeCluster(master=master, metadata=metadata,
                                                 logs=Path(".")), 16 << 20)
        self.wins = windows()

    def put_objects(self, keys: list[str]) -> None:
        rcs = self.s.batch_put_session_start(keys, [OBJECT_SIZE] * len(keys))
        if any(rcs):
            raise RuntimeError(f"batch_put_session_start rcs {set(rcs)}")
        rcs = self.s.batch_put_session_end(keys)
        if any(rcs):
            raise RuntimeError(f"batch_put_session_end rcs {set(rcs)}")

    def remove(self, keys: list[str]) -> None:
        for lo in range(0, len(keys), 8192):
            self.s.batch_remove(keys[lo:lo + 8192], True)

    def op(self, case: str) -> Callable[[int], None]:
        s, wins = self.s, self.wins
        if case in ("lookup128", "exists128"):
            def batch_exists(i: int) -> None:
                r = s.batch_is_exist(wins[i % len(wins)])
                if r.count(1) != WINDOW:
                    raise RuntimeError(f"batch_is_exist: {sorted(set(r))}")
            return batch_exists
        if case == "exists1":
            def exists1(i: int) -> None:
                if s.is_exist(wins[i % len(wins)][i % WINDOW]) != 1:
                    raise RuntimeError("is_exist: missing")
            return exists1
        if case == "replicas128":
            def replicas(i: int) -> None:
                r = s.batch_get_replica_desc(wins[i % len(wins)])
                if len(r) != WINDOW:
                    raise RuntimeError(f"batch_get_replica_desc found {len(r)} of {WINDOW}")
            return replicas
        raise ValueError(case)

    def close(self) -> None:
        self.s.close()


def run_case(ops: OursOps | MooncakeOps, case: str, duration: float, wid: int) -> dict[str, Any]:
    clock = time.perf_counter
    lat: list[float] = []
    written: list[str] = []
    op: Callable[[int], None]
    if case == "put64":
        seq = iter(range(1 << 62))

        def put(_i: int) -> None:
            keys = [f"w{wid}-{os.getpid()}-{next(seq)}" for _ in range(PUT_BATCH)]
            ops.put_objects(keys)
            written.extend(keys)
        op = put
    else:
        op = ops.op(case)
    for i in range(3):  # connection and code paths warm, untimed
        op(i)
    lat.clear()
    start_wall = time.time()
    stop = clock() + duration
    calls = 0
    while calls < MAX_CALLS:
        t0 = clock()
        op(calls)
        t1 = clock()
        lat.append(t1 - t0)
        calls += 1
        if t1 >= stop:
            break
    end_wall = time.time()
    # The daemons' CPU is read between every client's "timed" and this go-ahead, so the
    # removal below is not counted.
    _say(sys.stdout, "timed", case)
    if sys.stdin.readline().strip() != "cleanup":
        raise RuntimeError("no go-ahead for the cleanup")
    if written:
        ops.remove(written)
    return {"case": case, "calls": calls, "start": start_wall, "end": end_wall, "lat": lat}


def _say(out: TextIO, *words: str) -> None:
    out.write(PREFIX + " ".join(words) + "\n")
    out.flush()


def run_worker(args: argparse.Namespace) -> int:
    endpoint = json.loads(args.endpoint)
    ops: OursOps | MooncakeOps
    if args.worker == "ours":
        ops = OursOps(endpoint["master"], args.wid, args.lease_ttl, endpoint.get("fast", ""),
                      columns=not args.nested_replicas)
    else:
        ops = MooncakeOps(endpoint["master"], endpoint["metadata"])
    try:
        if args.populate:
            keys = hot_keys()
            for lo in range(0, len(keys), PUT_BATCH):
                ops.put_objects(keys[lo:lo + PUT_BATCH])
        for case in args.cases.split(","):
            _say(sys.stdout, "ready", case)
            if sys.stdin.readline().strip() != "go":
                return 1
            result = run_case(ops, case, args.duration, args.wid)
            _say(sys.stdout, "result", json.dumps(result))
    finally:
        ops.close()
    return 0


# -- the orchestrator ---------------------------------------------------------------------


@dataclass
class CaseResult:
    system: str
    case: str
    clients: int
    calls: int
    lat: Latency
    rate: float  # keys or objects per second, all clients together
    samples: list[float] = field(default_factory=list, repr=False)  # seconds per call
    span: float = 0.0  # seconds from the first client's start to the last one's end
    cpu: dict[str, float] = field(default_factory=dict)  # daemon kind -> CPU seconds

    def cpu_us_per_unit(self, kind: str) -> float | None:
        units = self.calls * UNITS[self.case]
        return self.cpu[kind] / units * 1e6 if kind in self.cpu and units else None

    def as_dict(self) -> dict[str, Any]:
        return {"system": self.system, "case": self.case, "clients": self.clients,
                "calls": self.calls, "latency_s": self.lat.as_dict(), "units_per_s": self.rate,
                "cpu_s": self.cpu,
                "cpu_us_per_unit": {k: self.cpu_us_per_unit(k) for k in self.cpu}}


def merge(system: str, case: str, parts: list[dict[str, Any]]) -> CaseResult:
    lat = [x for p in parts for x in p["lat"]]
    calls = sum(p["calls"] for p in parts)
    span = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    return CaseResult(system, case, len(parts), calls, Latency.of(lat),
                      calls * UNITS[case] / span, lat, span)


def pool_turns(results: list[CaseResult]) -> list[CaseResult]:
    """One result per (system, case, clients) from its turns: latencies over every call
    of every turn, the rate over the summed spans."""
    groups: dict[tuple[str, str, int], list[CaseResult]] = {}
    for r in results:
        groups.setdefault((r.system, r.case, r.clients), []).append(r)
    out = []
    for (system, case, clients), parts in groups.items():
        lat = [x for p in parts for x in p.samples]
        calls = sum(p.calls for p in parts)
        span = sum(p.span for p in parts)
        cpu: dict[str, float] = {}
        for p in parts:
            for k, v in p.cpu.items():
                cpu[k] = cpu.get(k, 0.0) + v
        out.append(CaseResult(system, case, clients, calls, Latency.of(lat),
                              calls * UNITS[case] / span, lat, span, cpu))
    return out


def _expect(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a client exited (code {proc.wait()}) while waiting for {what}")
        if line.startswith(PREFIX):
            body = line[len(PREFIX):].rstrip("\n")
            if not body.startswith(what):
                raise RuntimeError(f"client said {body[:80]!r}, expected {what!r}")
            return body[len(what):].strip()


def spy_top(raw: Path, top: int = 15) -> str:
    """The top entries of a py-spy raw (collapsed stacks) profile: each function's share
    of the samples as the innermost frame (own) and anywhere on the stack (total)."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            total[f] = total.get(f, 0) + n
    if not samples:
        return f"{raw.name}: no samples"
    lines = [f"{raw.name}: {samples} samples; own % / total %, by own"]
    for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * n / samples:5.1f} {100 * total[f] / samples:5.1f}  {f}")
    return "\n".join(lines)


def _frame(text: str) -> str:
    """'handle (kvstore/master/service.py:170)' -> 'handle (service.py)'."""
    name, _, where = text.partition(" (")
    if not where:
        return text
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0].rsplit('/', 1)[-1]})"


SAMPLER = Path(__file__).parent / "pysample"  # the stand-in for py-spy: see its sitecustomize


def _py_spy() -> str | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return spy if Path(spy).exists() else None


@contextlib.contextmanager
def sampler_env(ctl: Path | None) -> Iterator[None]:
    """Daemons started inside get the stand-in sampler (no py-spy; `ctl`: its control
    directory), the clients started later do not."""
    if ctl is None:
        yield
        return
    saved = {k: os.environ.get(k) for k in ("KVSTORE_SAMPLE_CTL", "PYTHONPATH")}
    ctl.mkdir(parents=True, exist_ok=True)
    os.environ["KVSTORE_SAMPLE_CTL"] = str(ctl)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(SAMPLER), *([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])])
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spy(pid: int, out: Path, seconds: float, ctl: Path | None) -> Callable[[], None]:
    """Record process `pid` for `seconds` into `out` (raw collapsed stacks), with py-spy
    or (`ctl`) the stand-in sampler; returns a wait for the file."""
    spy = _py_spy()
    if spy is not None:
        proc = subprocess.Popen([spy, "record", "-r", "250", "-d", str(max(1, round(seconds))),
                                 "-p", str(pid), "-f", "raw", "-o", str(out), "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return lambda: (proc.wait(timeout=60), None)[1]
    if ctl is None:
        raise RuntimeError("--profile-master: no py-spy and no sampler in the master")
    on = ctl / f"{pid}.on"
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    on.write_text(str(out))
    started = time.monotonic()

    def finish() -> None:
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        on.unlink()
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return finish


def run_clients(args: argparse.Namespace, system: str, endpoint: dict[str, str], n: int,
                cases: list[str], populate: bool, log: Path,
                daemons: dict[str, int], profile: bool = False) -> list[CaseResult]:
    """`daemons`: kind (master, node) -> pid, whose CPU each case measures; `profile`:
    py-spy the master (with --profile-master)."""
    from bench.clusters import MOONCAKE_ENV, log_tail, uninterrupted
    from bench.mix import proc_cpu

    procs: list[subprocess.Popen[str]] = []
    results: list[CaseResult] = []
    fh = open(log, "a")  # noqa: SIM115 - closed below, after the children
    try:
        for wid in range(n):
            worker = "mooncake" if system == "mooncake" else "ours"
            cmd = [sys.executable, "-m", MODULE, "--worker", worker, "--endpoint",
                   json.dumps(endpoint), "--wid", str(wid), "--cases", ",".join(cases),
                   "--duration", str(args.duration), "--lease-ttl", str(args.lease_ttl)]
            if args.nested_replicas:
                cmd.append("--nested-replicas")
            if populate and wid == 0:
                cmd.append("--populate")
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=fh, text=True, env={**os.environ, **MOONCAKE_ENV}))
        for case in cases:
            for p in procs:
                _expect(p, f"ready {case}")
            spy = None
            if profile and args.profile_master and "master" in daemons:
                out = Path(args.profile_master) / f"{system}-master-{case}-{n}c.txt"
                spy = _spy(daemons["master"], out, args.duration, args.sample_ctl)
                time.sleep(0.3)  # attached before the clients start
            cpu0 = {k: proc_cpu(pid) for k, pid in daemons.items()}
            _tell(procs, "go")
            for p in procs:
                _expect(p, f"timed {case}")
            cpu = {k: proc_cpu(pid) - cpu0[k] for k, pid in daemons.items()}
            _tell(procs, "cleanup")
            parts = [json.loads(_expect(p, "result")) for p in procs]
            results.append(merge(system, case, parts))
            results[-1].cpu = cpu
            if spy is not None:
                spy()
                print(spy_top(out), flush=True)
                gc_file = out.with_name(out.name + ".gc")
                if gc_file.exists():
                    print("  garbage collector meanwhile: " + "; ".join(
                        gc_file.read_text().splitlines()), flush=True)
        for p in procs:
            p.wait(timeout=60)
    except RuntimeError as exc:
        fh.flush()
        raise RuntimeError(f"{system}: {exc}\n{log_tail(log)}") from None
    finally:
        with uninterrupted():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            fh.close()
    return results


def _tell(procs: list[subprocess.Popen[str]], line: str) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()


def rows_for(results: list[CaseResult]) -> list[list[str]]:
    by = {(r.system, r.case, r.clients): r for r in results}
    rows: list[list[str]] = []
    for (system, case, clients), o in by.items():
        if not system.startswith("ours"):
            continue
        mc = by.get(("mooncake", case, clients))
        ours_label, mc_label = CASE_TEXT[case]
        unit = "obj/s" if case == "put64" else "keys/s" if UNITS[case] > 1 else "calls/s"
        label = f"{ours_label} | {mc_label}"
        if system != "ours":
            label += f" [{system[5:]}]"
        for metric, a, b, hib, fmt in (
            ("p50", o.lat.p50, mc.lat.p50 if mc else None, False, fmt_seconds),
            ("p99", o.lat.p99, mc.lat.p99 if mc else None, False, fmt_seconds),
            (unit, o.rate, mc.rate if mc else None, True, fmt_rate),
        ):
            rows.append([label, str(clients), metric, fmt(a), fmt(b),
                         fmt_ratio(better_ratio(a, b, higher_is_better=hib))])
    return rows


def render(results: list[CaseResult]) -> str:
    head = ("ratio > 1 means kvstore is better: latency rows are Mooncake/ours, rate rows "
            "ours/Mooncake.")
    table = format_table(["operation: kvstore | Mooncake", "clients", "metric", "kvstore",
                          "Mooncake", "ratio"], rows_for(results), align="lrlrrr")
    cpu_rows: list[list[str]] = []
    for r in results:
        if r.cpu:
            masters = [k for k in r.cpu if k.startswith("master")]
            total = {**r.cpu, "master": sum(r.cpu[k] for k in masters)}
            each = ", ".join(f"{r.cpu[k] / (r.calls * UNITS[r.case]) * 1e6:.1f}"
                             for k in masters) if len(masters) > 1 and r.calls else ""
            cpu_rows.append([r.system, CASE_TEXT[r.case][0 if r.system != "mooncake" else 1],
                             str(r.clients)] + [
                f"{v:.1f}" if (v := CaseResult(r.system, r.case, r.clients, r.calls, r.lat,
                                               r.rate, cpu=total).cpu_us_per_unit(k))
                is not None else "-" for k in ("master", "node")] + [each or "-"])
    if cpu_rows:
        table += ("\n\nCPU per object (put64) or key, µs (user + system, from the case's "
                  "start until every client's last timed call; master: all shards' masters "
                  "together, then each shard's):\n\n" + format_table(
                      ["system", "operation", "clients", "master", "node", "per shard"],
                      cpu_rows, align="llrrrr"))
    return head + "\n\n" + table + shard_table(results)


def shard_table(results: list[CaseResult]) -> str:
    """With more than one shard count: each sharded system against one shard."""
    by = {(r.system, r.case, r.clients): r for r in results}
    rows = []
    for (system, case, clients), o in by.items():
        one = by.get(("ours", case, clients))
        if not system.startswith("ours-") or one is None:
            continue
        for metric, a, b, hib in (("p50", o.lat.p50, one.lat.p50, False),
                                  ("p99", o.lat.p99, one.lat.p99, False),
                                  ("rate", o.rate, one.rate, True)):
            rows.append([CASE_TEXT[case][0], system[5:], str(clients), metric,
                         fmt_ratio(better_ratio(a, b, higher_is_better=hib))])
    if not rows:
        return ""
    return ("\n\nShards against one shard, same run (ratio > 1: the sharded cluster is "
            "better):\n\n" + format_table(["operation", "shards", "clients", "metric",
                                           "ratio"], rows, align="llrlr"))


def fast_address(etcd: str, shards: int = 1) -> str:
    """Each shard's leader's fast channel, comma-separated in shard order."""
    from kvstore.coord.etcd import read_key_sync
    from kvstore.coord.layout import Layout, MasterRecord

    out = []
    for k in range(shards):
        raw = read_key_sync(etcd, Layout().for_shard(k, shards).leader)
        fast = MasterRecord.decode(raw).fast if raw else ""
        if not fast:
            raise RuntimeError("the master announces no fast channel; use --transport grpc")
        out.append(fast)
    return ",".join(out)


def _daemons(pids: dict[str, int]) -> dict[str, int]:
    """master and node pids by kind (see bench.mix._kind); etcd is left out. With master
    shards each shard's master is its own entry, "master", "master-1", ..."""
    from bench.mix import _kind

    out: dict[str, int] = {}
    for name, pid in pids.items():
        kind = _kind(name)
        if kind == "master" and "master" in out:
            kind = f"master-{sum(k.startswith('master') for k in out)}"
        if kind.startswith("master") or (kind == "node" and kind not in out):
            out[kind] = pid
    return out


def system_name(shards: int) -> str:
    return "ours" if shards == 1 else f"ours-{shards}sh"


def orchestrate(args: argparse.Namespace) -> int:
    from bench.clusters import mooncake, ours, raise_on_sigterm

    raise_on_sigterm()

    single = ["lookup128", "exists128", "exists1", "replicas128", "put64"]
    multi = ["lookup128", "put64"]
    tmp = Path(tempfile.mkdtemp(prefix="kvstore-master-ops-"))
    t_start = time.monotonic()
    results: list[CaseResult] = []
    try:
        print(f"{args.duration:g} s per case in {args.turns} turn(s) per system, 1 and "
              f"{args.clients} clients, kvstore over {args.transport}; logs in {tmp}",
              flush=True)
        with contextlib.ExitStack() as stack:
            args.sample_ctl = (tmp / "sample-ctl" if args.profile_master and _py_spy() is None
                               else None)
            systems = []
            for n in args.shards:
                with sampler_env(args.sample_ctl):
                    oc = stack.enter_context(ours(tmp / f"s{n}", dram="1GiB", shards=n))
                fast = fast_address(oc.etcd, n) if args.transport == "fast" else ""
                systems.append((system_name(n), {"master": oc.master, "fast": fast},
                                _daemons(oc.pids)))
            mc = stack.enter_context(mooncake(tmp, SEGMENT))
            systems.append(("mooncake", {"master": mc.master, "metadata": mc.metadata},
                            _daemons({n: p.pid for n, p in mc.procs})))
            print("both systems up; measuring them in turn ...", flush=True)
            whole = args.duration
            args.duration = whole / args.turns  # each turn's share of every case
            for turn in range(args.turns):
                # who goes first alternates, so a slow spell falls on both
                for system, ep, pids in systems if turn % 2 == 0 else systems[::-1]:
                    log = tmp / f"clients-{system}.log"
                    results += run_clients(args, system, ep, 1, single, turn == 0, log, pids)
                    results += run_clients(args, system, ep, args.clients, multi, False, log,
                                           pids, profile=system.startswith("ours") and turn == 0)
            args.duration = whole
        results = pool_turns(results)
        print()
        print(render(results))
        print(f"\n(total {time.monotonic() - t_start:.0f} s; lookup leases ttl "
              f"{args.lease_ttl:g} s, never released)")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "config": {"duration": args.duration, "clients": args.clients,
                           "lease_ttl": args.lease_ttl, "object_size": OBJECT_SIZE},
                "results": [r.as_dict() for r in results],
            }, indent=2))
            print(f"wrote {args.json}")
    except RuntimeError as exc:
        print(f"master_ops failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep_logs:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per case")
    p.add_argument("--turns", type=int, default=2,
                   help="both systems are up at once and take this many turns each, "
                        "alternating (who goes first too), each running every case for "
                        "its share of --duration; the samples of all turns are pooled")
    p.add_argument("--clients", type=int, default=8, help="concurrent client processes")
    # Short: the leases are never released, and a fast client that pinned half the pool
    # within one ttl meets the per-client pin cap (pin_share), its lookups then finding 0.
    p.add_argument("--lease-ttl", type=float, default=0.3,
                   help="ttl of the leases Lookup/GetReplicas grant (never released)")
    p.add_argument("--quick", action="store_true", help="0.5 s per case")
    p.add_argument("--transport", choices=["fast", "grpc"], default="fast",
                   help="kvstore's control channel: the fast one the clients use by default, "
                        "or gRPC")
    p.add_argument("--shards", default="1",
                   help="comma-separated master shard counts to run our cluster with, "
                        "e.g. 1,2: each is its own cluster, measured beside the others "
                        "(requests fan out per shard as the client's do)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--nested-replicas", action="store_true",
                   help="GetReplicas answered as one message per key (what clients before "
                        "the columnar answer asked for) instead of in columns")
    p.add_argument("--profile-master", metavar="DIR",
                   help="py-spy our master during each --clients case (without py-spy, a "
                        "sampling thread in the master: bench/pysample); raw stacks go in "
                        "DIR, the top entries are printed")
    p.add_argument("--keep-logs", action="store_true", help="keep the temporary log directory")
    p.add_argument("--worker", choices=["ours", "mooncake"], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--wid", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cases", default="", help=argparse.SUPPRESS)
    p.add_argument("--populate", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration = 0.5
    if args.turns < 1:
        build_parser().error(f"--turns must be 1 or more, got {args.turns}")
    try:
        args.shards = [int(n) for n in str(args.shards).split(",")]
    except ValueError:
        build_parser().error(f"--shards takes shard counts such as 1,2, not {args.shards!r}")
    if any(n < 1 for n in args.shards) or (args.transport == "grpc" and max(args.shards) > 1):
        build_parser().error("--shards: counts of 1 or more, and more than 1 only over "
                             "--transport fast")
    if args.profile_master:
        args.profile_master = str(Path(args.profile_master).resolve())
        Path(args.profile_master).mkdir(parents=True, exist_ok=True)
    if args.worker:
        return run_worker(args)
    from bench.netns import ensure_private_netns

    ensure_private_netns(MODULE)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

