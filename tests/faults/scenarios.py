"""Fault scenarios against real processes, under checked traffic (tests/faults/traffic.py).

Each scenario starts its own cluster (etcd, master(s), store nodes with 2 s etcd leases),
writes a preload of keys (some with 2 replicas), starts the traffic, snapshots where
every written key's replicas are (`Inspect` at the leader), injects one fault, waits
until new puts and gets succeed again (a probe client), lets traffic run a little longer,
stops it and reads every tracked key back. It returns a `FaultRow`; `FaultRow.problems()`
lists what broke the rules (wrong bytes, calls past their deadline, untyped errors, lost
objects that the fault does not explain, no recovery). The tests assert it is empty;
`python -m bench.faults` prints the rows as a table.

A lost object is a key whose put returned OK before the fault and that reads back as
absent afterwards. The only acceptable reasons: every replica of it was on the node the
fault took out (its DRAM is gone, or the master dropped its replicas when the node's
etcd lease ended), or, for a master failover, it was committed in the old leader's last
moments, before the inventory delta that tells its store node reached it.

Processes are ours and stopped by pid. Everything runs in the caller's private network
namespace (`unshare -n`); the network scenario adds a veth pair to a second namespace
it creates, and the disk scenario mounts a small tmpfs in a mount namespace of its own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.devcluster import etcd_command, free_port
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from tests.conftest import Cluster, Proc
from tests.faults.traffic import Traffic, value_for

LEASE_TTL = 2  # s: etcd leases of masters and store nodes (short: the suite must be quick)
TIMEOUT = 5.0  # s: the traffic clients' timeout
# How long a stopped or cut-off node stays so: past its lease and past the clients' timeout
# (a transfer to it must fail at the timeout, not when the node comes back).
OUTAGE = max(LEASE_TTL, TIMEOUT) + 3.0
# A call longer than this is past its deadline: the client's timeout bounds each control
# round trip and (MC_TRANSFER_TIMEOUT, from the same timeout) each transfer batch; with
# one fault at a time a call waits out at most one of them. The slack is for the
# calls that follow it in the same operation on 2 busy cores.
DEADLINE = TIMEOUT + 2.5
HANG = 6 * TIMEOUT  # a call still running after this is a hang
RECOVERY_LIMIT = 30.0  # s: the cluster must serve again within this
PRELOAD = 120  # keys per replica count written before the traffic starts

VETH_HOST = "10.199.0.1"  # the test namespace's end of the veth pair (a private /30)
VETH_NODE = "10.199.0.2"  # the isolated node's end
SERVICE_HOST = "10.199.1.1"  # etcd and the masters, on lo: reachable from both namespaces


@dataclass
class FaultRow:
    fault: str
    operations: int = 0
    reads_ok: int = 0
    misses: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    wrong_bytes: int = 0
    untyped: list[str] = field(default_factory=list)
    max_call_s: float = 0.0
    max_call_op: str = ""
    deadline_s: float = DEADLINE
    hung: list[str] = field(default_factory=list)
    tracked: int = 0  # keys written before the fault and read back after it
    tracked_2r: int = 0  # of which stored with 2 replicas on 2 nodes
    at_risk: int = 0  # tracked keys whose every replica was on the faulted node
    lost: int = 0
    lost_2r: int = 0
    unexplained: list[str] = field(default_factory=list)
    why_lost: str = ""
    master_lost: int = -1  # objects_lost the leader reports for the gone node (-1: n/a)
    recovery_s: float = -1.0  # fault (or its end, see `recovered_from`) until puts+gets work
    recovered_from: str = "the fault"
    failed_probes: int = 0
    notes: list[str] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)  # per traffic worker
    seconds: float = 0.0  # the scenario's wall time, cluster start to stop

    def problems(self) -> list[str]:
        out = []
        if self.wrong_bytes:
            out.append(f"{self.wrong_bytes} reads returned wrong bytes")
        if self.untyped:
            out.append(f"{len(self.untyped)} untyped exceptions: {self.untyped[:3]}")
        if self.hung:
            out.append(f"hung calls: {self.hung}")
        if self.max_call_s > self.deadline_s:
            out.append(f"a call took {self.max_call_s:.1f} s ({self.max_call_op}), past the "
                       f"{self.deadline_s:.0f} s deadline")
        if self.unexplained:
            out.append(f"{len(self.unexplained)} lost objects not explained by the fault: "
                       f"{self.unexplained[:5]}")
        if self.lost_2r:
            out.append(f"{self.lost_2r} objects with 2 replicas on 2 nodes were lost")
        if self.recovery_s < 0:
            out.append(f"the cluster did not serve again within {RECOVERY_LIMIT:.0f} s")
        if self.operations == 0 or self.reads_ok == 0:
            out.append("no traffic ran")
        elif self.workers and not sum(w.get("one_call_puts", 0) for w in self.workers):
            out.append("no put went into space started ahead (the same-sized workers' "
                       "one-call path never ran)")
        return out


# -- the cluster --------------------------------------------------------------------------


def wait_port(host: str, port: int, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited while starting:\n"
                                 + proc.log.read_text(errors="replace")[-3000:])
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"{proc.name} did not open {host}:{port} within {timeout:.0f} s")


class FaultCluster:
    """A `tests.conftest.Cluster` plus what the scenarios need: a supervisor that restarts
    masters that exit (systemd's Restart=always, RestartSec=1: a deposed leader exits 3
    for it), leader-side admin calls, and services on another address when asked."""

    def __init__(self, tmp: Path, service_host: str = "127.0.0.1") -> None:
        self.c = Cluster(tmp)
        self.tmp = tmp
        self.host = service_host
        self.restarts = 0
        self._supervise = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.started = time.monotonic()

    # lifecycle

    def __enter__(self) -> FaultCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self._supervise.clear()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        # Masters and nodes first, etcd last: a node leaves cleanly through etcd.
        procs = [p for p in reversed(self.c.procs) if not p.name.startswith("etcd")]
        for p in [*procs, *(p for p in self.c.procs if p.name.startswith("etcd"))]:
            with contextlib.suppress(ProcessLookupError):
                if p.alive():
                    os.kill(p.popen.pid, signal.SIGCONT)  # a stopped process ignores TERM
            p.kill(signal.SIGTERM)

    @property
    def etcd(self) -> str:
        return f"{self.host}:{self.c.etcd_port}"

    def start_etcd(self) -> None:
        port, peer = free_port(), free_port()
        cmd = etcd_command(self.tmp / "etcd", port, peer)
        if self.host != "127.0.0.1":
            urls = f"http://127.0.0.1:{port},http://{self.host}:{port}"
            cmd[cmd.index("--listen-client-urls") + 1] = urls
            cmd[cmd.index("--advertise-client-urls") + 1] = f"http://{self.host}:{port}"
        self.c.etcd_port = port
        wait_port("127.0.0.1", port, self.c.spawn("etcd", cmd))

    def start_master(self) -> str:
        port = free_port()
        address = f"{self.host}:{port}"
        proc = self.c.spawn(f"master-{len(self.c.masters)}", [
            sys.executable, "-m", "kvstore", "master", "--etcd", self.etcd, "--listen", address,
            "--etcd-lease-ttl", str(LEASE_TTL), *self.open_flags()])
        wait_port(self.host, port, proc)
        self.c.masters.append((proc, address))
        return address

    def open_flags(self) -> list[str]:
        """Off loopback the daemons want TLS and tokens; these namespaces are ours alone."""
        return [] if self.host == "127.0.0.1" else ["--insecure"]

    def store_command(self, node_id: str, dram: str, *extra: str, etcd: str = "") -> list[str]:
        return [sys.executable, "-m", "kvstore", "store", "--etcd", etcd or self.etcd,
                "--dram", dram, "--node-id", node_id, "--etcd-lease-ttl", str(LEASE_TTL),
                *self.open_flags(), *extra]

    def start_store(self, node_id: str, dram: str = "128MiB", *extra: str) -> Proc:
        proc = self.c.spawn(f"store-{node_id}", self.store_command(node_id, dram, *extra))
        self.c.stores.append(proc)
        return proc

    def start_wrapped_store(self, node_id: str, wrapper: list[str], setup: str, dram: str,
                            *extra: str, etcd: str = "") -> Proc:
        """A store node started through `wrapper` (unshare ...) running `setup` first; the
        shell execs the node, so the pid we hold is the node's."""
        inner = shlex.join(self.store_command(node_id, dram, *extra, etcd=etcd))
        proc = self.c.spawn(f"store-{node_id}", [*wrapper, "sh", "-c", f"{setup} && exec {inner}"])
        self.c.stores.append(proc)
        return proc

    def supervise_masters(self) -> None:
        self._supervise.set()
        self._supervisor = threading.Thread(target=self._supervise_loop, daemon=True)
        self._supervisor.start()

    def _supervise_loop(self) -> None:
        while self._supervise.is_set():
            for i, (proc, address) in enumerate(list(self.c.masters)):
                if proc.alive():
                    continue
                time.sleep(1.0)  # RestartSec=1
                if not self._supervise.is_set():
                    return
                again = self.c.spawn(f"{proc.name}-r{self.restarts}", proc.cmd)
                self.c.masters[i] = (again, address)
                self.restarts += 1
            time.sleep(0.1)

    # calls at the leader

    def leader_record(self) -> MasterRecord:
        raw = read_key_sync(self.etcd, Layout().leader)
        if raw is None:
            raise grpc.RpcError("no leader in etcd")
        return MasterRecord.decode(raw)

    def leader(self) -> str:
        return self.leader_record().address

    def admin(self, method: str, request: Any, timeout: float = 5.0) -> Any:
        with grpc.insecure_channel(self.leader()) as ch:
            reply = getattr(pbg.MasterStub(ch), method)(request, timeout=timeout)
        if reply.error.code:
            raise grpc.RpcError(f"{method}: {reply.error.message}")
        return reply

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 30.0) -> float:
        """Poll `cond` (errors count as False) until true; seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            with contextlib.suppress(grpc.RpcError, OSError, ValueError):
                if cond():
                    return time.monotonic() - t0
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout:.0f} s\n" + self.c.logs())

    def alive_nodes(self) -> set[str]:
        return {n.node_id for n in self.admin("NodeList", pb.NodeListRequest()).nodes
                if n.state == "alive"}

    def wait_nodes(self, n: int, timeout: float = 60.0) -> None:
        self.wait(f"{n} store nodes alive", lambda: len(self.alive_nodes()) == n, timeout)

    def node_info(self, node_id: str) -> pb.NodeInfo | None:
        for n in self.admin("NodeList", pb.NodeListRequest()).nodes:
            if n.node_id == node_id:
                return n
        return None

    def placement(self, keys: list[bytes]) -> dict[bytes, frozenset[str]]:
        out: dict[bytes, frozenset[str]] = {}
        for lo in range(0, len(keys), 500):
            reply = self.admin("Inspect", pb.KeysRequest(keys=keys[lo:lo + 500]))
            for key, item in zip(keys[lo:lo + 500], reply.items, strict=True):
                if item.code == 0:
                    out[key] = frozenset(r.node_id for r in item.object.replicas)
        return out

    def evictions(self) -> dict[str, tuple[int, int]]:
        """Per tier: (objects evicted, objects demoted) since the leader started."""
        reply = self.admin("EvictionStats", pb.EvictionStatsRequest())
        return {t.tier: (t.evicted, t.demoted) for t in reply.tiers}


# -- probing whether the cluster serves ------------------------------------------------


class Probe:
    """A client putting and reading back fresh keys in a loop, from its own thread; a
    round succeeds if every put and every read did."""

    def __init__(self, etcd: str, tag: str) -> None:
        self.etcd = etcd
        self.tag = tag
        self.rounds: list[tuple[float, float, bool]] = []  # (start, end, ok)
        self.longest = 0.0  # the longest single call (put_many or get_many)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Probe:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from kvstore_client import KVStoreClient, KVStoreError

        client = None
        n = 0
        while not self._stop.is_set():
            if client is None:
                try:
                    client = KVStoreClient(etcd=self.etcd, timeout=TIMEOUT, same_host=False)
                except KVStoreError:
                    time.sleep(0.1)
                    continue
            t0 = time.monotonic()
            ok = False
            try:
                n += 1
                keys = [f"{self.tag}-probe-{n}-{i}".encode() for i in range(8)]
                vals = [value_for(k) for k in keys]
                ok = self._timed(client.put_many, keys, vals) == [None] * 8
                ok = self._timed(client.get_many, keys) == vals and ok
            except KVStoreError:
                pass
            self.rounds.append((t0, time.monotonic(), ok))
            time.sleep(0.1)
        if client is not None:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HANG)

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.longest = max(self.longest, time.monotonic() - t0)

    def failed(self, since: float) -> int:
        return sum(not ok for t0, _, ok in self.rounds if t0 >= since)

    def wait_serving(self, since: float, streak: int = 3,
                     timeout: float = RECOVERY_LIMIT) -> float:
        """Seconds from `since` until the first of `streak` successful rounds in a row
        (begun after `since` and after every failed round) had completed: new puts and
        gets work again. -1 if that does not happen within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rounds = [r for r in list(self.rounds) if r[0] >= since]
            fails = [i for i, r in enumerate(rounds) if not r[2]]
            ok_run = rounds[fails[-1] + 1:] if fails else rounds
            if len(ok_run) >= streak:
                return max(0.0, ok_run[0][1] - since)
            time.sleep(0.1)
        return -1.0


# -- one run ----------------------------------------------------------------------------


class Run:
    """Preload, traffic, placement snapshot, then the fault (by the scenario), then
    `finish`: stop the traffic and account for every tracked key."""

    def __init__(self, fc: FaultCluster, fault: str, tag: str, all_remote: bool = False) -> None:
        self.fc = fc
        self.row = FaultRow(fault)
        self.tag = tag
        self.all_remote = all_remote
        self.preload_keys: list[tuple[bytes, float, int]] = []
        self.traffic: Traffic | None = None
        self.probe: Probe | None = None
        self.placement: dict[bytes, frozenset[str]] = {}
        self.tracked: list[tuple[bytes, float, int]] = []
        self.snapshot_at = self.fault_at = 0.0

    def preload(self) -> None:
        from kvstore_client import KVStoreClient

        for replicas in (1, 2):
            keys = [f"{self.tag}-pre{replicas}-{i}".encode() for i in range(PRELOAD)]
            with KVStoreClient(etcd=self.fc.etcd, timeout=TIMEOUT, replicas=replicas,
                               same_host=False) as client:
                for lo in range(0, len(keys), 40):
                    part = keys[lo:lo + 40]
                    errs = client.put_many(part, [value_for(k) for k in part])
                    assert errs == [None] * len(part), errs
            now = time.monotonic()
            self.preload_keys += [(k, now, replicas) for k in keys]

    def start_traffic(self, warmup: float = 1.5) -> None:
        self.traffic = Traffic(self.fc.etcd, TIMEOUT, self.tag,
                               read_pool=[k for k, _, _ in self.preload_keys],
                               all_remote=self.all_remote)
        self.traffic.start()
        self.traffic.wait_running()
        time.sleep(warmup)  # traffic before the fault (a duration, not an assertion)

    def snapshot(self) -> None:
        """Where every key written so far lives, just before the fault."""
        assert self.traffic is not None
        self.snapshot_at = time.monotonic()
        self.tracked = self.preload_keys + self.traffic.acked()
        self.placement = self.fc.placement([k for k, _, _ in self.tracked])
        self.probe = Probe(self.fc.etcd, self.tag).start()
        self.fault_at = time.monotonic()  # a scenario may set it again, right at the fault

    def serving(self, since: float | None = None, what: str = "") -> None:
        assert self.probe is not None
        start = self.fault_at if since is None else since
        self.row.recovery_s = round(self.probe.wait_serving(start), 2)
        if what:
            self.row.recovered_from = what

    def finish(self, victims: set[str], why: str, explain_recent: float = 0.0,
               explain_evicted: bool = False, after: float = 1.0,
               track_recent: bool = False) -> FaultRow:
        """Stop everything, read every tracked key back and account for the missing ones.

        A lost key is explained if all its replicas were on `victims`, or (failover) if
        its put returned less than `explain_recent` s before the fault, or (with
        `explain_evicted`) if the master evicted it: it is no longer in the index.
        `track_recent`: also check the keys acked between the snapshot and the fault."""
        assert self.traffic is not None and self.probe is not None
        row = self.row
        if row.recovery_s >= 0:
            time.sleep(after)  # traffic on the recovered cluster (a duration, not an assertion)
        self.probe.stop()
        row.failed_probes = self.probe.failed(self.fault_at)
        self.traffic.stop(HANG)
        if explain_recent or track_recent:
            # Failover: also the keys acked between the snapshot and the fault, the very
            # ones a dying leader might not have passed on (their placement is moot).
            self.tracked += [a for a in self.traffic.acked()
                             if self.snapshot_at <= a[1] < self.fault_at]
        t = self.traffic
        row.operations = t.total("calls")
        row.reads_ok, row.misses = t.total("reads_ok"), t.total("misses")
        row.wrong_bytes, row.errors, row.untyped = t.total("wrong_bytes"), t.errors(), t.untyped()
        row.max_call_s, row.max_call_op = t.max_call()
        if self.probe.longest > row.max_call_s:
            row.max_call_s, row.max_call_op = self.probe.longest, "probe (a client new at the fault)"
        row.max_call_s = round(row.max_call_s, 2)
        row.hung = t.hung
        row.workers = [{k: v for k, v in asdict(s).items() if k != "untyped"} for s in t.stats]
        row.notes += [f"WRONG {s.name} {w} (fault at {self.fault_at:.3f})" for s in t.stats
                      for w in s.wrong]
        self._account(victims, why, explain_recent, explain_evicted)
        if self.fc.restarts:
            row.notes.append(f"the supervisor restarted {self.fc.restarts} master process(es)")
        row.seconds = round(time.monotonic() - self.fc.started, 1)
        return row

    def _account(self, victims: set[str], why: str, explain_recent: float,
                 explain_evicted: bool) -> None:
        from kvstore_client import KVStoreClient

        row = self.row
        keys = [k for k, _, _ in self.tracked]
        # What the master still indexes, before the reads below (a read of an object whose
        # SSD copy vanished would make the master drop it: that must not look evicted).
        indexed = set(self.fc.placement(keys)) if explain_evicted else set()
        got: list[bytes | None] = []
        with KVStoreClient(etcd=self.fc.etcd, timeout=TIMEOUT, same_host=False) as client:
            for lo in range(0, len(keys), 200):
                got += client.get_many(keys[lo:lo + 200])
            # A key the master indexes but that did not read back may be slow, not lost
            # (e.g. its promotion from SSD waited for DRAM): a few more reads, in small
            # batches. Still absent after them, it counts as lost.
            slow = 0
            for _ in range(3):
                again = [i for i, v in enumerate(got)
                         if v is None and (not explain_evicted or keys[i] in indexed)]
                if not again:
                    break
                time.sleep(0.5)
                for lo in range(0, len(again), 20):
                    part = again[lo:lo + 20]
                    for i, v in zip(part, client.get_many([keys[i] for i in part]), strict=True):
                        if v is not None:
                            got[i] = v
                            slow += 1
        if slow:
            row.notes.append(f"{slow} tracked key(s) read back only on a second try")
        two = {k for k, nodes in self.placement.items() if len(nodes) >= 2}
        row.tracked, row.tracked_2r = len(keys), len(two)
        row.at_risk = sum(1 for k in keys if self.placement.get(k) and self.placement[k] <= victims)
        lost_recent = evicted = 0
        oldest_recent = 0.0
        for (key, acked, _replicas), value in zip(self.tracked, got, strict=True):
            if value is not None:
                if value != value_for(key):
                    row.wrong_bytes += 1
                continue
            row.lost += 1
            nodes = self.placement.get(key)
            if explain_recent and acked > self.fault_at - explain_recent:
                # A commit the dying leader never passed on is lost on every node alike.
                lost_recent += 1
                oldest_recent = max(oldest_recent, self.fault_at - acked)
                continue
            row.lost_2r += key in two
            if nodes and nodes <= victims:
                continue
            if explain_evicted and key not in indexed:
                evicted += 1
                continue
            row.unexplained.append(f"{key.decode()} on {sorted(nodes or ['?'])}"
                                   + (" (still indexed)" if key in indexed else ""))
        if evicted:
            row.notes.append(f"{evicted} lost key(s) evicted by the master (gone from its index)")
        row.why_lost = why if row.lost else "-"
        if lost_recent:
            row.notes.append(f"{lost_recent} lost key(s), acked at most {oldest_recent * 1000:.0f} ms "
                             "before the leader died (explained up to "
                             f"{explain_recent * 1000:.0f} ms)")


# -- helpers for the faults ----------------------------------------------------------------


def fill_disk(path: Path) -> int:
    """Write zeros to `path` until the filesystem is full; the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                break
        # the last partial MiB: fill what is left byte-exactly
        for size in (1 << 16, 1 << 12, 1 << 9):
            piece = b"\0" * size
            while True:
                try:
                    written += f.write(piece)
                except OSError:
                    break
    return written


@contextlib.contextmanager
def veth_pair(name: str) -> Iterator[tuple[str, str]]:
    """A veth pair in this namespace (VETH_HOST on ours) and SERVICE_HOST on lo; removed
    afterwards (the peer's end goes away with the namespace it is moved to)."""
    host_end, node_end = f"{name}h", f"{name}n"
    subprocess.run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end],
                   check=True)
    try:
        for cmd in (["ip", "addr", "add", f"{VETH_HOST}/30", "dev", host_end],
                    ["ip", "link", "set", host_end, "up"],
                    ["ip", "addr", "add", f"{SERVICE_HOST}/32", "dev", "lo"]):
            subprocess.run(cmd, check=True)
        yield host_end, node_end
    finally:
        subprocess.run(["ip", "link", "del", host_end], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "addr", "del", f"{SERVICE_HOST}/32", "dev", "lo"], check=False,
                       stderr=subprocess.DEVNULL)


def link(dev: str, up: bool) -> None:
    subprocess.run(["ip", "link", "set", dev, "up" if up else "down"], check=True)


# -- the scenarios ------------------------------------------------------------------------


def three_nodes(fc: FaultCluster, standby: bool = False) -> None:
    fc.start_etcd()
    fc.start_master()
    for i in range(3):
        fc.start_store(f"node-{i}")
    fc.wait_nodes(3)
    if standby:
        fc.start_master()
    fc.supervise_masters()


def kill_store(tmp: Path) -> FaultRow:
    with FaultCluster(tmp) as fc:
        three_nodes(fc)
        run = Run(fc, "kill -9 a store node", "ks")
        run.preload()
        run.start_traffic()
        run.snapshot()
        fc.c.stores[0].kill(signal.SIGKILL)
        fc.wait("node-0 declared lost", lambda: fc.alive_nodes() == {"node-1", "node-2"})
        info = fc.node_info("node-0")
        run.row.master_lost = info.objects_lost if info is not None else -1
        run.serving()
        return run.finish({"node-0"}, "only replica on the killed node (its DRAM died)")


def kill_leader(tmp: Path) -> FaultRow:
    with FaultCluster(tmp) as fc:
        three_nodes(fc, standby=True)
        run = Run(fc, "kill -9 the master leader (1 standby)", "kl")
        run.preload()
        run.start_traffic()
        old = fc.leader_record()
        run.snapshot()
        leader = next(p for p, _ in fc.c.masters if p.popen.pid == old.pid)
        run.fault_at = time.monotonic()
        leader.kill(signal.SIGKILL)
        # The standby or, restarted by the supervisor on the same address, the old one.
        fc.wait("a new leader", lambda: fc.leader_record().pid != old.pid)
        run.serving()
        # No loss is explained: an acknowledged commit is on its node's inventory
        # before the reply leaves (docs/durability.md).
        return run.finish(set(), "none: every acknowledged commit was on its node",
                          track_recent=True)


def restart_etcd(tmp: Path) -> FaultRow:
    with FaultCluster(tmp) as fc:
        three_nodes(fc)
        run = Run(fc, "restart etcd (kill -9, down 1 s)", "et")
        run.preload()
        run.start_traffic()
        run.snapshot()
        etcd = fc.c.procs[0]
        etcd.kill(signal.SIGKILL)
        time.sleep(1.0)  # etcd stays down this long (the fault, not an assertion)
        wait_port("127.0.0.1", fc.c.etcd_port, fc.c.spawn("etcd-again", etcd.cmd))
        run.serving()
        fc.wait_nodes(3)
        return run.finish(set(), "nothing should be lost")


def stop_store(tmp: Path) -> FaultRow:
    with FaultCluster(tmp) as fc:
        three_nodes(fc)
        run = Run(fc, f"SIGSTOP a store node {OUTAGE:.0f} s (lease {LEASE_TTL} s), SIGCONT", "ss")
        run.preload()
        run.start_traffic()
        run.snapshot()
        victim = fc.c.stores[0]
        victim.kill(signal.SIGSTOP)
        fc.wait("node-0 declared lost", lambda: fc.alive_nodes() == {"node-1", "node-2"})
        info = fc.node_info("node-0")
        run.row.master_lost = info.objects_lost if info is not None else -1
        time.sleep(max(0.0, run.fault_at + OUTAGE - time.monotonic()))  # stopped this long
        victim.kill(signal.SIGCONT)
        resumed = time.monotonic()
        rejoin = fc.wait("node-0 back", lambda: fc.alive_nodes() == {"node-0", "node-1", "node-2"})
        run.row.notes.append(f"node-0 rejoined {rejoin:.1f} s after SIGCONT")
        run.serving()
        fc.wait("node-0 holds new objects", lambda: (fc.node_info("node-0") or pb.NodeInfo()).objects
                > 0)
        run.row.notes.append(f"node-0 took new objects {time.monotonic() - resumed:.1f} s "
                             "after SIGCONT")
        return run.finish({"node-0"}, "only replica on the stopped node (lease ended)")


def full_disk(tmp: Path) -> FaultRow:
    ssd = tmp / "ssd"
    ssd.mkdir()
    with FaultCluster(tmp) as fc:
        fc.start_etcd()
        fc.start_master()
        # The SSD tier on a 48 MiB tmpfs that only the node's mount namespace sees; its cap
        # (40 MiB) fits, so only our filler can make the device run out of space.
        node = fc.start_wrapped_store(
            "node-0", ["unshare", "-m", "--propagation", "private"],
            f"mount -t tmpfs -o size=48m kvstore-fault-ssd {shlex.quote(str(ssd))}", "8MiB",
            "--ssd-dir", str(ssd), "--ssd", "40MiB")
        fc.wait_nodes(1)
        fc.supervise_masters()
        run = Run(fc, "fill the SSD tier's disk (ENOSPC) for 3 s, then free it", "fd")
        run.preload()
        run.start_traffic()
        fc.wait("demotions to SSD", lambda: fc.evictions().get("dram", (0, 0))[1] > 0)
        run.snapshot()
        before = fc.evictions()
        filler = Path(f"/proc/{node.popen.pid}/root") / ssd.relative_to("/") / "filler"
        filled = fill_disk(filler)
        full = fc.evictions()
        time.sleep(3.0)  # traffic against the full disk (a duration, not an assertion)
        during = fc.evictions()
        filler.unlink()
        run.serving(time.monotonic(), "space freed")
        fc.wait("demotions after space was freed",
                lambda: fc.evictions()["dram"][1] > during["dram"][1])
        end = fc.evictions()
        ssd_ev = end.get("ssd", (0, 0))[0]
        run.row.notes += [
            f"the filler took the last {filled >> 20} MiB of the 48 MiB device",
            f"before the fault: {before['dram'][1]} demotions, {before['dram'][0]} DRAM evictions",
            f"disk full (3 s): {during['dram'][1] - full['dram'][1]} demotions still succeeded "
            "(into space freed by promotions, which move objects back to DRAM), "
            f"{during['dram'][0] - full['dram'][0]} objects evicted from DRAM without an SSD copy",
            f"after: demotions resumed; {ssd_ev} SSD-tier evictions in all",
        ]
        return run.finish(set(), "evicted: the full disk refused their demotion",
                          explain_evicted=True)


def drop_network(tmp: Path) -> FaultRow:
    name = f"kvf{os.getpid() % 100000}"
    with veth_pair(name) as (host_end, node_end), FaultCluster(tmp, SERVICE_HOST) as fc:
        fc.start_etcd()
        fc.start_master()
        # node-0 in a network namespace of its own, reached only through the veth pair.
        setup = " && ".join([
            f"while ! ip link show {node_end} >/dev/null 2>&1; do sleep 0.05; done",
            "ip link set lo up",
            f"ip addr add {VETH_NODE}/30 dev {node_end}",
            f"ip link set {node_end} up",
            f"ip route add default via {VETH_HOST}",
        ])
        node = fc.start_wrapped_store("node-0", ["unshare", "-n"], setup, "128MiB",
                                      "--host", VETH_NODE)
        # Move our end's peer into the node's namespace once `unshare -n` has made it.
        fc.wait("node-0's network namespace", lambda: os.readlink(f"/proc/{node.popen.pid}/ns/net")
                != os.readlink("/proc/self/ns/net"), timeout=20)
        subprocess.run(["ip", "link", "set", node_end, "netns", str(node.popen.pid)], check=True)
        fc.start_store("node-1")
        fc.start_store("node-2")
        fc.wait_nodes(3)
        fc.supervise_masters()
        run = Run(fc, f"cut one node's network ({OUTAGE:.0f} s, veth down), then restore", "nd",
                  all_remote=True)
        run.preload()
        run.start_traffic()
        run.snapshot()
        link(host_end, False)
        fc.wait("node-0 declared lost", lambda: fc.alive_nodes() == {"node-1", "node-2"})
        info = fc.node_info("node-0")
        run.row.master_lost = info.objects_lost if info is not None else -1
        time.sleep(max(0.0, run.fault_at + OUTAGE - time.monotonic()))  # cut this long
        link(host_end, True)
        restored = time.monotonic()
        run.row.notes.append(f"link down at {run.fault_at:.3f}, up at {restored:.3f}")
        rejoin = fc.wait("node-0 back", lambda: fc.alive_nodes() == {"node-0", "node-1", "node-2"})
        run.row.notes.append(f"node-0 rejoined {rejoin:.1f} s after the link came back")
        run.serving()
        fc.wait("node-0 holds new objects", lambda: (fc.node_info("node-0") or pb.NodeInfo()).objects
                > 0)
        run.row.notes.append(f"node-0 took new objects {time.monotonic() - restored:.1f} s "
                             "after the link came back")
        return run.finish({"node-0"}, "only replica on the cut-off node (lease ended)")


SCENARIOS: dict[str, Callable[[Path], FaultRow]] = {
    "kill_store": kill_store,
    "kill_leader": kill_leader,
    "restart_etcd": restart_etcd,
    "stop_store": stop_store,
    "full_disk": full_disk,
    "drop_network": drop_network,
}


def row_dict(row: FaultRow) -> dict[str, Any]:
    return asdict(row)
