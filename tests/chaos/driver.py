"""Seeded chaos: random operator events under checked traffic, every acknowledged object
accounted for.

    python -m tests.chaos.driver --seed 7 --rounds 40          # as root; or `make chaos`
    python -m tests.chaos.driver --seed 7 --events kill9-leader,etcd-down-long --rounds 4
    python -m tests.chaos.driver --seed 7 --rounds 40 --shards 2  # 2 master shards

The seed is printed first; the same seed draws the same events, targets, durations and
pauses again (the timing of the processes themselves is not replayable). One round: a
burst of acknowledged puts (replicas 1 and 2), then at once, with no pause, one event
(events.py: the first rounds take every kind once, in a seeded order, then each is
drawn); then, while the traffic goes on, the checks:

- wrong bytes: every read (traffic, probe, checks) is compared with `value_for(key)`; 0.
- serving again: a probe's puts and reads succeed three rounds in a row within
  SERVE_BOUND s of the event's end (measured and reported), and the cluster is back at
  full strength (every daemon running, 3 nodes mounted) within FULL_BOUND s. The checks
  below start SETTLE s (two etcd leases) after the event's end at the earliest, so that
  what an event breaks one lease later is charged to it.
- no loss the rules do not explain: every acknowledged object still live is read back
  (an SSD-tier object set up cold is asked with Exists, so that reading it does not
  promote it out of the SSD tier, and read at the end); a miss is read again for up to
  REREAD_S s; still missing, it is lost, and `ledger.py` says whether every copy of it
  was in DRAM that died. Cross-checked with the leader: its eviction counter
  (ClusterStatus counters_json) stays 0, so no loss is an eviction, and the objects it
  counted lost with a departed node (NodeList objects_lost) are at least those found.
- no daemon exits that no event caused (a daemon must not exit because etcd was away).

At the end the traffic stops, every object is read back once more, and the leader must
hold no lease and no PENDING object within LEAK_BOUND s (puts cut short are reclaimed
after the master's 30 s put timeout; leases end after their 10 s TTL).

With `--shards N` the control plane is N master shards, a leader and a standby each
(cluster.py): the clients route each key to its shard, the checks ask each key's shard
where it is and sum every shard's counters, and a master event draws its shard
(`kill9-leader` and `term-leader` one shard's leader or every shard's at once; events.py).
The same seed with another shard count draws other targets.

Runs only in a private network namespace (re-executes itself under `unshare -n` as root)
and stops by itself: every call is bounded by the clients' timeout and every wait by a
bound, and no event starts after --max-seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import format_table
from kvstore.v1 import master_pb2 as pb
from tests.chaos.cluster import ETCD_LEASE_TTL, TRANSIENT, ChaosCluster
from tests.chaos.events import EVENTS, Applied, Ctx
from tests.chaos.ledger import Ledger
from tests.chaos.traffic import TIMEOUT, Probe, Traffic
from tests.faults.traffic import value_for

# The Transfer Engine of this process's clients logs every connection at INFO; only its
# errors are worth a run's output (read when its library loads, before any client exists).
os.environ.setdefault("GLOG_minloglevel", "2")

SERVE_BOUND = 30.0  # s after an event's end: the cluster serves again within this
FULL_BOUND = 60.0  # s after an event's end: every daemon up and every node mounted again
START_BOUND = 120.0  # s for the cluster to start (2 busy cores)
SETTLE = 2 * ETCD_LEASE_TTL  # s after an event's end before its check starts
REREAD_S = 5.0  # s a missing object is read again before it counts as lost
LEAK_BOUND = 30.0 + 10.0 + 20.0  # put timeout + lease TTL + slack
BURST = 32  # keys per replica count put just before each event
COLD = 48  # keys demoted to the SSD tiers at set-up
PLACE_EVERY = 0.3  # s between the placer's Inspect calls


@dataclass
class Row:
    round: int
    kind: str
    detail: str = ""
    checked: int = 0
    checked_2r: int = 0  # of which with copies on 2 nodes
    checked_cold: int = 0  # of which on an SSD tier since the set-up
    explained: int = 0
    unexplained: int = 0
    lost_2r: int = 0  # lost objects that had copies on 2 nodes
    lost_cold: int = 0  # lost objects of the cold set
    why: dict[str, int] = field(default_factory=dict)  # explained losses by cause
    lost_keys: list[str] = field(default_factory=list)  # the first unexplained, with why
    wrong_bytes: int = 0
    serve_s: float = -1.0
    full_s: float = -1.0
    exits: list[str] = field(default_factory=list)  # unplanned daemon exits
    master_lost: dict[str, int] = field(default_factory=dict)  # node -> objects_lost
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class Report:
    seed: int
    rounds: list[Row] = field(default_factory=list)
    final: Row = field(default_factory=lambda: Row(0, "end of run"))
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def all_problems(self) -> list[str]:
        out = [f"round {r.round} {r.kind}: {p}" for r in self.rounds for p in r.problems]
        out += [f"end: {p}" for p in self.final.problems]
        return out + self.problems


HEADERS = ["event", "count", "objects checked", "lost, explained", "lost, unexplained",
           "wrong bytes", "max time to serve again", "unplanned exits"]


def table(report: Report) -> str:
    kinds: dict[str, list[Row]] = {}
    for r in [*report.rounds, report.final]:
        kinds.setdefault(r.kind, []).append(r)
    rows = []
    for kind, rs in kinds.items():
        serve = [r.serve_s for r in rs]
        rows.append([
            kind, str(len(rs)), f"{sum(r.checked for r in rs):,}",
            f"{sum(r.explained for r in rs):,}", f"{sum(r.unexplained for r in rs):,}",
            str(sum(r.wrong_bytes for r in rs)),
            "-" if kind == "end of run" else
            ("NO" if min(serve) < 0 else f"{max(serve):.1f} s"),
            str(sum(len(r.exits) for r in rs)),
        ])
    return format_table(HEADERS, rows, align="lrrrrrrr")


def details(report: Report) -> str:
    rows = [*report.rounds, report.final]
    lines = [f"objects with copies on 2 nodes: {sum(r.checked_2r for r in rows):,} checked, "
             f"{sum(r.lost_2r for r in rows):,} lost; cold objects (SSD tier): "
             f"{sum(r.checked_cold for r in rows):,} checked, "
             f"{sum(r.lost_cold for r in rows):,} lost"]
    for r in [*report.rounds, report.final]:
        why = "; ".join(f"{n} {c}" for c, n in r.why.items())
        times = ("" if r is report.final else
                 f"; serving again {r.serve_s:.1f} s, full strength {r.full_s:.1f} s")
        lines.append(f"- round {r.round} {r.kind}: {r.detail}; checked {r.checked} ("
                     f"{r.checked_2r} on 2 nodes, {r.checked_cold} cold), lost "
                     f"{r.explained} explained ({why or '-'}), {r.unexplained} unexplained "
                     f"({r.lost_2r} on 2 nodes, {r.lost_cold} cold)"
                     + times
                     + (f"; the leader counted lost {r.master_lost}" if r.master_lost else ""))
        lines += [f"    {n}" for n in r.notes]
        lines += [f"    unexplained: {k}" for k in r.lost_keys]
        lines += [f"    unplanned exit: {e}" for e in r.exits]
        lines += [f"    PROBLEM: {p}" for p in r.problems]
    lines += [f"- {n}" for n in report.notes]
    lines += [f"- PROBLEM: {p}" for p in report.problems]
    return "\n".join(lines)


class Run:
    def __init__(self, seed: int, rounds: int, workdir: Path, events: list[str] | None = None,
                 max_seconds: float = 0.0, log: Any = print, shards: int = 1) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.n_rounds = rounds
        self.events = events
        self.max_seconds = max_seconds or START_BOUND + rounds * 120.0
        self.c = ChaosCluster(workdir, shards)
        self.ledger = Ledger()
        self.report = Report(seed)
        self.log = log
        self._checker: Any = None
        self._bursts: dict[int, Any] = {}
        self._placing = threading.Event()
        self._place_lock = threading.Lock()
        self._master_logs: dict[str, int] = {}
        self._departed: dict[str, int] = {}  # node id -> objects_lost the leader listed

    # -- the whole run -----------------------------------------------------------------

    def run(self) -> Report:
        t0 = time.monotonic()
        traffic: Traffic | None = None
        probe: Probe | None = None
        placer: threading.Thread | None = None
        try:
            self.c.start()
            self.c.wait("the cluster at full strength", self.c.full_strength, START_BOUND)
            if self.c.shards > 1:
                self.report.notes.append(f"{self.c.shards} master shards, a leader and a "
                                         "standby each")
            self.report.notes.append(
                "store flags: node-0, node-1 --ssd-dir --ssd 64MiB; node-2 "
                + ("--data-dir" if self.c.data_dir_flag else "no data dir (the store has no "
                   "--data-dir flag yet)") + "; no --node-id, default etcd lease (5 s)")
            self.report.notes.append("node ids at start: " + ", ".join(
                f"{d.name} {self.c.node_id(d)}" for d in self.c.stores))
            self._cold_set()
            traffic = started = Traffic(self.c.endpoint, self.ledger, self.seed)
            started.start()
            self.c.wait("traffic running", lambda: started.running(3), 60)
            probe = Probe(self.c.endpoint, f"c{self.seed}").start()
            self._placing.set()
            placer = threading.Thread(target=self._placer, name="chaos-placer", daemon=True)
            placer.start()
            # Every kind once, in a seeded order, then seeded draws: a long run covers all.
            kinds = list(EVENTS)
            order = self.rng.sample(kinds, len(kinds))
            for i in range(self.n_rounds):
                if time.monotonic() - t0 > self.max_seconds:
                    self.report.notes.append(f"stopped after {i} rounds: --max-seconds "
                                             f"{self.max_seconds:.0f} reached")
                    break
                kind = (self.events[i % len(self.events)] if self.events else
                        order[i] if i < len(order) else self.rng.choice(kinds))
                pause = self.rng.choice([0.0, 0.0, self.rng.uniform(0.2, 2.0)])
                time.sleep(pause)  # traffic between events (a duration, not an assertion)
                row = self._round(i + 1, kind, traffic, probe)
                self.report.rounds.append(row)
                self.log(f"round {row.round} {row.kind}: {row.detail}; serving again "
                         f"{row.serve_s:.1f} s; lost {row.explained} explained, "
                         f"{row.unexplained} unexplained"
                         + (f"; PROBLEMS {row.problems}" if row.problems else ""))
            self._placing.clear()
            self.report.notes.append("node ids at the end: " + ", ".join(
                f"{d.name} {self.c.node_id(d)}" for d in self.c.stores))
            self._finish(traffic, probe)
            traffic = probe = None
        except Exception as exc:  # the run itself broke: report it, with the logs
            self.report.problems.append(f"the run stopped: {type(exc).__name__}: {exc}")
            self.report.notes.append("daemon logs:\n" + self.c.logs())
        finally:
            self._placing.clear()
            if placer is not None:
                placer.join(timeout=2 * TIMEOUT)
            if probe is not None:
                probe.stop()
            if traffic is not None:
                traffic.stop()
            for client in [self._checker, *self._bursts.values()]:
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.close()
            self.c.stop()
            self.report.seconds = round(time.monotonic() - t0, 1)
        return self.report

    # -- set-up --------------------------------------------------------------------------

    def _cold_set(self) -> None:
        """Objects on the SSD tiers: written while node-2 (DRAM only) takes no new
        placements, then demoted by an operator evict (`kvstore evict` to 0)."""
        from kvstore_client import KVStoreClient

        node2 = self.c.node_id(self.c.isolated())
        self.c.admin_all("SetDraining", pb.SetDrainingRequest(node_id=node2, draining=True))
        keys = [f"cold{self.seed}-{i}".encode() for i in range(COLD)]
        with KVStoreClient(etcd=self.c.endpoint, timeout=TIMEOUT, same_host=False) as client:
            errs = client.put_many(keys, [value_for(k) for k in keys])
        self.c.admin_all("SetDraining", pb.SetDrainingRequest(node_id=node2, draining=False))
        acked = [k for k, e in zip(keys, errs, strict=True) if e is None]
        now = time.monotonic()
        for k in acked:
            self.ledger.acked(k, now, 1, cold=True)
        self.c.admin_all("Evict", pb.EvictRequest(ratio=0.0))

        def demoted() -> bool:
            where = self.c.placement(acked)
            return all(c.tier == "ssd" for cs in where.values() for c in cs)

        self.c.wait("the cold set demoted to SSD", demoted, 30)
        where = self.c.placement(acked)
        for k in acked:
            if k in where:
                self.ledger.placed(k, where[k], time.monotonic())
            else:
                self.ledger.retired(k)  # the evict dropped it: an operator's choice
        self.report.notes.append(f"cold set: {len(where)} of {COLD} objects on the SSD tiers "
                                 f"of {sorted({c.node_id for cs in where.values() for c in cs})}")

    def _placer(self) -> None:
        while self._placing.is_set():
            with contextlib.suppress(*TRANSIENT):
                self.place()
            time.sleep(PLACE_EVERY)

    def place(self) -> None:
        """Ask the leader where the keys without a known placement are (bounded)."""
        with self._place_lock:
            keys = self.ledger.unplaced()
            if not keys:
                return
            now = time.monotonic()
            with contextlib.suppress(*TRANSIENT):
                for key, copies in self.c.placement(keys).items():
                    self.ledger.placed(key, copies, now)

    # -- one round -------------------------------------------------------------------------

    def _burst(self) -> dict[int, list[bytes]]:
        """Put BURST keys with each replica count; the keys acknowledged, by count."""
        from kvstore_client import KVStoreClient, KVStoreError

        acked: dict[int, list[bytes]] = {1: [], 2: []}
        for replicas in (1, 2):
            try:
                if replicas not in self._bursts:
                    self._bursts[replicas] = KVStoreClient(
                        etcd=self.c.endpoint, timeout=TIMEOUT, replicas=replicas, same_host=False)
                n = self.rng.getrandbits(48)
                keys = [f"burst{replicas}-{n:x}-{i}".encode() for i in range(BURST)]
                self.ledger.writing(keys)
                try:
                    errs = self._bursts[replicas].put_many(keys, [value_for(k) for k in keys])
                    now = time.monotonic()
                    for k, e in zip(keys, errs, strict=True):
                        if e is None:
                            self.ledger.acked(k, now, replicas)
                            acked[replicas].append(k)
                finally:
                    self.ledger.written(keys)
            except KVStoreError:
                self._bursts.pop(replicas, None)
        return acked

    def _retire(self, burst: dict[int, list[bytes]]) -> None:
        """Remove a round's burst keys once its check read them back (bounded store)."""
        from kvstore_client import KVStoreError

        for replicas, keys in burst.items():
            live = [k for k in keys if self.ledger.state(k) == "live"]
            for k in live:
                self.ledger.retired(k)
            client = self._bursts.get(replicas)
            if live and client is not None:
                with contextlib.suppress(KVStoreError):
                    client.remove_many(live)

    def _round(self, n: int, kind: str, traffic: Traffic, probe: Probe) -> Row:
        row = Row(n, kind)
        wrong_before = traffic.total("wrong_bytes") + probe.wrong_bytes
        self._master_logs = self.c.master_log_sizes()
        self._departed = {}
        watching = threading.Event()
        watching.set()
        watcher = threading.Thread(target=self._watch_departed, args=(watching,), daemon=True,
                                   name="chaos-departed")
        watcher.start()
        burst = self._burst()
        ctx = Ctx(self.c, self.ledger, self.rng, self.place)
        try:
            a: Applied = EVENTS[kind](ctx)
        except TRANSIENT as exc:  # e.g. no leader to kill: the last event left none
            row.problems.append(f"the event could not be applied: {type(exc).__name__}: {exc}")
            a = Applied(kind, "not applied", time.monotonic(), time.monotonic())
        row.detail = a.detail
        row.serve_s = round(probe.wait_serving(a.ended, SERVE_BOUND), 2)
        if row.serve_s < 0:
            row.problems.append(f"not serving within {SERVE_BOUND:.0f} s of the event's end")
        try:
            self.c.wait("full strength", self.c.full_strength,
                        max(1.0, a.ended + FULL_BOUND - time.monotonic()))
            row.full_s = round(time.monotonic() - a.ended, 2)
        except TimeoutError:
            row.problems.append(f"not at full strength within {FULL_BOUND:.0f} s (daemons "
                                f"{[(d.name, d.alive()) for d in self.c.sup.daemons]})")
            self.c.resume_all()
        # Some consequences come one etcd lease later (a node whose keepalive does not
        # resume after an outage loses its lease, and its objects, seconds after the
        # cluster served again): the check waits them out.
        time.sleep(max(0.0, a.ended + SETTLE - time.monotonic()))
        watching.clear()
        watcher.join(timeout=2 * TIMEOUT)
        self._check(row, a)
        self._retire(burst)
        row.wrong_bytes += traffic.total("wrong_bytes") + probe.wrong_bytes - wrong_before
        if row.wrong_bytes:
            row.problems.append(f"{row.wrong_bytes} reads returned wrong bytes: "
                                f"{traffic.wrong()[-3:]}")
        for d in self.c.sup.daemons:
            for e in d.unplanned_exits():
                if e.at >= a.started:
                    row.exits.append(f"{d.name} exited with code {e.code}")
        if row.exits:
            row.problems.append(f"daemons exited without an event causing it: {row.exits}")
        return row

    def _watch_departed(self, watching: threading.Event) -> None:
        """The leader lists a departed node (with the objects that went with it) only
        until the node mounts again: look while the event runs."""
        while watching.is_set():
            with contextlib.suppress(*TRANSIENT):
                for n in self.c.node_list():
                    if n.state != "alive":
                        self._departed[n.node_id] = max(self._departed.get(n.node_id, 0),
                                                        n.objects_lost)
            watching.wait(0.2)

    # -- checks ------------------------------------------------------------------------------

    def _client(self) -> Any:
        from kvstore_client import KVStoreClient

        if self._checker is None:
            self._checker = KVStoreClient(etcd=self.c.endpoint, timeout=TIMEOUT, same_host=False)
        return self._checker

    def _read(self, keys: list[bytes], cold: bool, row: Row) -> list[bytes]:
        """Read (or, cold, ask Exists for) each key; the keys that did not come back."""
        from kvstore_client import KVStoreError

        missing: list[bytes] = []
        for lo in range(0, len(keys), 100):
            part = keys[lo:lo + 100]
            try:
                client = self._client()
                if cold:
                    found = client.exists(part)
                    missing += [k for k, f in zip(part, found, strict=True) if not f]
                    continue
                for key, got in zip(part, client.get_many(part), strict=True):
                    if got is None:
                        missing.append(key)
                    elif got != value_for(key):
                        row.wrong_bytes += 1
                        row.notes.append(f"WRONG BYTES at check: {key!r}")
            except KVStoreError:
                missing += part
                self._checker = None
        return missing

    def _check(self, row: Row, a: Applied | None, final: bool = False) -> None:
        live = self.ledger.live()
        if final:
            live += [r for r in self.ledger.records.values() if r.state == "lost"]
        keys = [r.key for r in live]
        now = time.monotonic()
        with contextlib.suppress(*TRANSIENT):
            for key, copies in self.c.placement(keys).items():
                self.ledger.placed(key, copies, now)
        cold = {r.key for r in live if r.cold and not final}
        missing = (self._read([k for k in keys if k not in cold], False, row)
                   + self._read([k for k in keys if k in cold], True, row))
        deadline = time.monotonic() + REREAD_S
        while missing and time.monotonic() < deadline:
            time.sleep(0.5)
            missing = (self._read([k for k in missing if k not in cold], False, row)
                       + self._read([k for k in missing if k in cold], True, row))
        row.checked = len(keys)
        row.checked_2r = sum(1 for r in live if len({c.node_id for c in r.placement}) >= 2)
        row.checked_cold = sum(1 for r in live if r.cold)
        gone = set(missing)
        for r in live:
            if r.state == "lost" and r.key not in gone:
                self.ledger.found_again(r.key)
                row.notes.append(f"{r.key!r}, counted lost earlier, read back at the end")
        # What the leader still says of each missing key: an object it indexes on a live
        # node but that does not read back is another failure than one it dropped.
        indexed: dict[bytes, frozenset[Any]] = {}
        with contextlib.suppress(*TRANSIENT):
            indexed = self.c.placement([k for k in missing if self.ledger.state(k) == "live"])
        why: Counter[str] = Counter()
        by_node: Counter[str] = Counter()
        for key in missing:
            if self.ledger.state(key) == "lost":
                continue  # lost at an earlier event and still lost: counted there
            if self.ledger.state(key) != "live":
                continue  # retired by its writer meanwhile
            rec = self.ledger.records[key]
            row.lost_2r += len({c.node_id for c in rec.placement}) >= 2
            row.lost_cold += rec.cold
            v = self.ledger.lose(key, a.started if a is not None else 0.0)
            if v.explained:
                row.explained += 1
                why[v.why] += 1
                for copy in rec.placement:
                    by_node[copy.node_id] += 1
            else:
                row.unexplained += 1
                if len(row.lost_keys) < 8:
                    where = (f"the leader still indexes it on "
                             f"{sorted(f'{c.node_id}/{c.tier}' for c in indexed[key])}"
                             if key in indexed else "the leader no longer indexes it")
                    row.lost_keys.append(f"{key.decode(errors='replace')}: {v.why}; {where}")
        row.why = dict(why)
        if row.unexplained:
            row.problems.append(f"{row.unexplained} acknowledged objects lost that no DRAM "
                                f"loss explains, e.g. {row.lost_keys[:3]}")
        self._cross_check(row, a, by_node)

    def _cross_check(self, row: Row, a: Applied | None, by_node: Counter[str]) -> None:
        try:
            status = self.c.status()
            nodes = self.c.node_list()
        except TRANSIENT as exc:
            row.notes.append(f"no counters from the leader: {exc}")
            return
        counters = json.loads(status.counters_json or "{}")
        if counters.get("evictions", 0):
            row.problems.append(f"the leader evicted {counters['evictions']} objects (the "
                                "working set fits: nothing should be evicted)")
        logged = self.c.objects_gone(self._master_logs)
        for n in nodes:
            if n.state != "alive":
                self._departed[n.node_id] = max(self._departed.get(n.node_id, 0), n.objects_lost)
        for node in a.lost_nodes if a is not None else []:
            # A node that left (SIGTERM) is counted when it unmounts; its etcd record's
            # end is logged later with 0: the largest count is the leader's.
            seen = [c for c in (self._departed.get(node), logged.get(node)) if c is not None]
            if not seen or (max(seen) == 0 and node not in self._departed):
                row.notes.append(f"the leader neither listed {node} as departed nor logged "
                                 "objects gone with it (its next incarnation fenced it): no "
                                 "count to compare")
                continue
            counted = max(seen)
            row.master_lost[node] = counted
            if by_node[node] > counted:
                row.problems.append(f"the suite found {by_node[node]} objects lost with {node}, "
                                    f"the leader counted {counted}")

    def _finish(self, traffic: Traffic, probe: Probe) -> None:
        row = self.report.final
        probe.stop()
        hung = traffic.stop()
        if hung:
            row.problems.append(f"traffic workers did not stop: {hung}")
        self._check(row, None, final=True)
        row.detail = (f"traffic: {traffic.total('calls'):,} calls, {traffic.total('acked'):,} "
                      f"objects acknowledged, {traffic.total('reads_ok'):,} checked reads, "
                      f"{traffic.total('misses'):,} misses, {traffic.total('leases'):,} leases, "
                      f"{traffic.total('retired'):,} retired; typed errors {traffic.errors()}")
        row.wrong_bytes += traffic.total("wrong_bytes") + probe.wrong_bytes - sum(
            r.wrong_bytes for r in self.report.rounds)
        row.wrong_bytes = max(row.wrong_bytes, 0)
        if traffic.untyped():
            row.problems.append(f"untyped exceptions: {traffic.untyped()[:2]}")
        t0 = time.monotonic()
        last: tuple[int, int] = (-1, -1)

        def drained() -> bool:
            nonlocal last
            s = self.c.status()
            last = (s.objects_pending, s.active_leases)
            return last == (0, 0)

        try:
            took = self.c.wait("no PENDING objects, no leases", drained, LEAK_BOUND)
            row.notes.append(f"no PENDING objects and no leases {took:.1f} s after the "
                             "traffic stopped")
        except TimeoutError:
            row.problems.append(f"after {time.monotonic() - t0:.0f} s the leader still holds "
                                f"{last[0]} PENDING objects and {last[1]} leases")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.driver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=-1, help="default: drawn (and printed)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--events", default="", help="comma-separated event kinds to cycle "
                   f"through instead of drawing them: {', '.join(EVENTS)}")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="start no event after this (default: 120 + 120 per round)")
    p.add_argument("--dir", default="", help="work directory (default: a temporary one)")
    p.add_argument("--json", default="", help="write the report here")
    p.add_argument("--shards", type=int, default=1,
                   help="master shards, a leader and a standby each (default 1)")
    args = p.parse_args(argv)
    events = [e for e in args.events.split(",") if e]
    unknown = [e for e in events if e not in EVENTS]
    if unknown:
        p.error(f"unknown events {unknown}; choose from {list(EVENTS)}")
    if not 1 <= args.shards <= 8:
        p.error(f"--shards {args.shards}: give 1 to 8 master shards (two masters each share "
                "this host's cores with the nodes and the traffic)")
    from bench.netns import ensure_private_netns

    ensure_private_netns("tests.chaos.driver")
    seed = args.seed if args.seed >= 0 else random.SystemRandom().randrange(1 << 31)
    print(f"chaos seed {seed} (replay: python -m tests.chaos.driver --seed {seed} "
          f"--rounds {args.rounds}{' --events ' + args.events if events else ''}"
          f"{f' --shards {args.shards}' if args.shards > 1 else ''})", flush=True)
    with contextlib.ExitStack() as stack:
        work = Path(args.dir) if args.dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix=f"kvstore-chaos-{seed}-")))
        work.mkdir(parents=True, exist_ok=True)
        report = Run(seed, args.rounds, work, events or None, args.max_seconds,
                     log=lambda s: print(s, flush=True), shards=args.shards).run()
    print(table(report))
    print(details(report))
    problems = report.all_problems()
    print(f"chaos seed {seed}: {len(report.rounds)} rounds in {report.seconds:.0f} s, "
          + (f"{len(problems)} problems" if problems else "every check held"), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=1, default=str))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
