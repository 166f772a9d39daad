"""The chaos cluster: etcd, two masters per master shard, three store nodes, all under
one `Supervisor`.

Built the way tests/conftest.py's `Cluster` and tests/faults/scenarios.py build theirs
(kvstore.devcluster's etcd_command/free_port, one log per daemon), with the daemons'
default flags: no --node-id, no --etcd-lease-ttl (5 s), default put timeout and lease
caps. Sizes are the only flags chosen: 64 MiB of DRAM per node, a 64 MiB SSD tier on
node-0 and node-1; node-2 keeps its identity in --data-dir when the store has that flag.

node-2 runs in a network namespace of its own, joined to ours by a veth pair, so that its
network can be cut (tests/faults/scenarios.py's `veth_pair` and `link`). Unlike that
scenario the namespace belongs to a holder process (`unshare -n sleep`), not to the node:
the supervisor restarts the node into the same namespace (`nsenter --net`), and the veth
end survives the node's deaths. etcd and the masters listen on SERVICE_HOST, an address
on our loopback device that both namespaces reach; off 127.0.0.1 the daemons need
--insecure, and these namespaces are ours alone. Everything stays inside the caller's
private network namespace.

With `shards=N` (N > 1) the control plane is N master shards (`--shard K/N`,
docs/scaling.md), a leader and a standby each. The calls at "the leader" then go to the
leader of each key's shard (Inspect) or of every shard, their replies summed as the
admin CLI sums them (ClusterStatus, NodeList, Evict, SetDraining); a node counts as alive
only once every shard's leader has it mounted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.devcluster import etcd_command, free_port
from kvstore.errors import KVStoreError
from kvstore.shards import positions_by_shard
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from tests.chaos.ledger import Copy
from tests.chaos.supervisor import Daemon, Supervisor
from tests.faults.scenarios import SERVICE_HOST, VETH_HOST, VETH_NODE, link, veth_pair

DRAM = "64MiB"
SSD = "64MiB"
ETCD_LEASE_TTL = 5.0  # s: the daemons' default --etcd-lease-ttl
ADMIN_TIMEOUT = 3.0
# What an admin call or an etcd read raises while a daemon is down or being replaced: the
# caller polls again (a failed call never counts as a check passing).
TRANSIENT: tuple[type[BaseException], ...] = (grpc.RpcError, OSError, LookupError, ValueError,
                                              StopIteration, KVStoreError)
_ANNOUNCED = re.compile(r"node (\S+) announced in etcd")
_GONE = re.compile(r"node (\S+) is gone \(etcd lease ended\); (\d+) objects went with it")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def store_has_flag(flag: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "kvstore", "store", "--help"],
                         capture_output=True, text=True, timeout=60, check=False).stdout
    return flag in out


@dataclass
class StoreSpec:
    name: str
    ssd_dir: Path | None
    data_dir: Path | None
    isolated: bool  # in the cut-able namespace


class ChaosCluster:
    def __init__(self, workdir: Path, shards: int = 1) -> None:
        self.dir = workdir
        self.shards = shards
        self.sup = Supervisor()
        self.etcd_port = 0
        self.etcd: Daemon | None = None
        self.masters: list[Daemon] = []
        self.by_shard: dict[int, list[Daemon]] = {}  # shard -> its masters
        self.stores: list[Daemon] = []
        self.specs: dict[str, StoreSpec] = {}
        self.layout = Layout()
        self.host_end = ""  # our end of node-2's veth pair
        self._holder: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.ExitStack()
        self.data_dir_flag = False
        self._last_leader: dict[int, str] = {}  # shard -> the last leader address seen

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.sup.stop_all()
        if self._holder is not None and self._holder.poll() is None:
            self._holder.kill()
            self._holder.wait(timeout=5)
        self._stack.close()

    @property
    def endpoint(self) -> str:
        return f"{SERVICE_HOST}:{self.etcd_port}"

    def start(self) -> None:
        self.data_dir_flag = store_has_flag("--data-dir")
        self._isolate_namespace()
        self._start_etcd()
        for k in range(self.shards):
            for _ in range(2):
                self._start_master(k)
        self._start_store(StoreSpec("node-0", self.dir / "ssd-0", None, False))
        self._start_store(StoreSpec("node-1", self.dir / "ssd-1", None, False))
        self._start_store(StoreSpec("node-2", None,
                                    self.dir / "data-2" if self.data_dir_flag else None, True))

    def _isolate_namespace(self) -> None:
        name = f"kvc{os.getpid() % 100000}"
        self.host_end, node_end = self._stack.enter_context(veth_pair(name))
        self._holder = subprocess.Popen(["unshare", "-n", "sleep", "86400"])
        deadline = time.monotonic() + 20
        ns = f"/proc/{self._holder.pid}/ns/net"
        while os.readlink(ns) == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline:
                raise AssertionError("the holder's network namespace did not appear")
            time.sleep(0.02)
        subprocess.run(["ip", "link", "set", node_end, "netns", str(self._holder.pid)], check=True)
        inner = " && ".join([
            "ip link set lo up", f"ip addr add {VETH_NODE}/30 dev {node_end}",
            f"ip link set {node_end} up", f"ip route add default via {VETH_HOST}"])
        subprocess.run(["nsenter", f"--net={ns}", "sh", "-c", inner], check=True)

    def _start_etcd(self) -> None:
        self.etcd_port = port = free_port()
        cmd = etcd_command(self.dir / "etcd", port, free_port())
        cmd[cmd.index("--listen-client-urls") + 1] = (f"http://127.0.0.1:{port},"
                                                      f"http://{SERVICE_HOST}:{port}")
        cmd[cmd.index("--advertise-client-urls") + 1] = f"http://{SERVICE_HOST}:{port}"
        self.etcd = self.sup.add("etcd", cmd, self.dir / "logs" / "etcd.log")
        self.wait("etcd serving", lambda: self._port_open(port), 30)

    def _start_master(self, shard: int) -> None:
        cmd = [sys.executable, "-m", "kvstore", "master", "--etcd", self.endpoint,
               "--listen", f"{SERVICE_HOST}:{free_port()}", "--insecure"]
        if self.shards > 1:
            cmd += ["--shard", f"{shard}/{self.shards}"]
        # One shard keeps the names it always had (master-0, master-1).
        i = len(self.masters)
        name = f"master-{i}" if self.shards == 1 else f"master-s{shard}-{i % 2}"
        d = self.sup.add(name, cmd, self.dir / "logs" / f"{name}.log")
        self.masters.append(d)
        self.by_shard.setdefault(shard, []).append(d)

    def _start_store(self, spec: StoreSpec) -> None:
        cmd = [sys.executable, "-m", "kvstore", "store", "--etcd", self.endpoint, "--dram", DRAM]
        if spec.ssd_dir is not None:
            spec.ssd_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--ssd-dir", str(spec.ssd_dir), "--ssd", SSD]
        if spec.data_dir is not None:
            spec.data_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--data-dir", str(spec.data_dir)]
        if spec.isolated:
            assert self._holder is not None
            cmd = ["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", *cmd,
                   "--host", VETH_NODE, "--insecure"]
        self.specs[spec.name] = spec
        self.stores.append(self.sup.add(spec.name, cmd, self.dir / "logs" / f"{spec.name}.log"))

    @staticmethod
    def _port_open(port: int) -> bool:
        import socket

        with socket.socket() as s:
            return s.connect_ex((SERVICE_HOST, port)) == 0

    # -- who is who ------------------------------------------------------------------

    def node_id(self, d: Daemon) -> str:
        """The node id this incarnation announced ("" until it did)."""
        found = _ANNOUNCED.findall(d.output())
        return found[-1] if found else ""

    def leader_record(self, shard: int = 0) -> MasterRecord:
        layout = self.layout if self.shards == 1 else self.layout.for_shard(shard, self.shards)
        raw = read_key_sync(self.endpoint, layout.leader, timeout=ADMIN_TIMEOUT)
        if raw is None:
            raise LookupError("no leader in etcd" + (f" for shard {shard}" if self.shards > 1
                                                    else ""))
        return MasterRecord.decode(raw)

    def leader(self, shard: int = 0) -> Daemon:
        """The master daemon whose process etcd names as leader (of `shard`)."""
        rec = self.leader_record(shard)
        for d in self.by_shard[shard]:
            if d.pid == rec.pid and d.alive():
                return d
        raise LookupError(f"the leader in etcd (pid {rec.pid}) is not a live master of ours"
                          + (f" of shard {shard}" if self.shards > 1 else ""))

    def standby(self, shard: int = 0) -> Daemon:
        lead = self.leader(shard)
        return next(d for d in self.by_shard[shard] if d is not lead)

    def isolated(self) -> Daemon:
        return next(d for d in self.stores if self.specs[d.name].isolated)

    def cut(self, down: bool) -> None:
        link(self.host_end, not down)

    # -- calls at the leader -------------------------------------------------------------

    def admin(self, method: str, request: Any, timeout: float = ADMIN_TIMEOUT,
              shard: int = 0) -> Any:
        """`method` at shard `shard`'s leader (the only one with one shard)."""
        # While etcd is down the last leader seen is asked: it may still serve, and the
        # placements of what was written just before the outage are wanted then.
        try:
            address = self.leader_record(shard).address
            self._last_leader[shard] = address
        except KVStoreError:
            if not self._last_leader.get(shard):
                raise
            address = self._last_leader[shard]
        with grpc.insecure_channel(address) as ch:
            reply = getattr(pbg.MasterStub(ch), method)(request, timeout=timeout)
        if reply.error.code:
            raise LookupError(f"{method} at {address}: {reply.error.message}")
        return reply

    def admin_all(self, method: str, request: Any) -> list[Any]:
        """`method` at every shard's leader, in shard order (an operator's evict or drain
        reaches each shard's part of every node)."""
        return [self.admin(method, request, shard=k) for k in range(self.shards)]

    def status(self) -> pb.ClusterStatusResponse:
        """The leader's status; with shards, every shard's summed where the checks read it
        (PENDING objects, leases, the counters)."""
        replies = self.admin_all("ClusterStatus", pb.ClusterStatusRequest())
        if self.shards == 1:
            return replies[0]
        counters: dict[str, float] = {}
        for r in replies:
            for name, v in json.loads(r.counters_json or "{}").items():
                if isinstance(v, int | float):
                    counters[name] = counters.get(name, 0) + v
        return pb.ClusterStatusResponse(
            objects_complete=sum(r.objects_complete for r in replies),
            objects_pending=sum(r.objects_pending for r in replies),
            active_leases=sum(r.active_leases for r in replies),
            counters_json=json.dumps(counters), shards=self.shards)

    def node_list(self) -> list[pb.NodeInfo]:
        """The nodes the leader lists; with shards, one entry per node over every shard's
        leader: alive only where every shard has it alive (a node serves every shard),
        its objects and objects lost summed (each shard counts its own)."""
        lists = [list(r.nodes) for r in self.admin_all("NodeList", pb.NodeListRequest())]
        if self.shards == 1:
            return lists[0]
        merged: dict[str, pb.NodeInfo] = {}
        seen: dict[str, int] = {}
        for nodes in lists:
            for n in nodes:
                seen[n.node_id] = seen.get(n.node_id, 0) + 1
                m = merged.get(n.node_id)
                if m is None:
                    merged[n.node_id] = pb.NodeInfo(node_id=n.node_id, state=n.state,
                                                    objects=n.objects,
                                                    objects_lost=n.objects_lost)
                    continue
                m.objects += n.objects
                m.objects_lost += n.objects_lost
                if n.state != "alive":
                    m.state = n.state
        for node_id, m in merged.items():
            if seen[node_id] < self.shards and m.state == "alive":
                m.state = "mounting"  # not (yet) mounted at every shard's leader
        return list(merged.values())

    def alive_nodes(self) -> set[str]:
        return {n.node_id for n in self.node_list() if n.state == "alive"}

    def placement(self, keys: list[bytes]) -> dict[bytes, frozenset[Copy]]:
        """Where the leader (of each key's shard) says each key's copies are; keys it does
        not index are absent."""
        out: dict[bytes, frozenset[Copy]] = {}
        for shard, pos in enumerate(positions_by_shard(keys, self.shards)):
            of_shard = [keys[i] for i in pos]
            for lo in range(0, len(of_shard), 500):
                part = of_shard[lo:lo + 500]
                reply = self.admin("Inspect", pb.KeysRequest(keys=part), shard=shard)
                for key, item in zip(part, reply.items, strict=True):
                    if item.code == 0 and item.object.replicas:
                        out[key] = frozenset(Copy(r.node_id, r.tier or "dram")
                                             for r in item.object.replicas)
        return out

    def full_strength(self) -> bool:
        """Every daemon runs, a live master of ours leads (each shard), and the three
        current store incarnations are mounted and alive at it (at each shard's)."""
        if not all(d.alive() for d in self.sup.daemons):
            return False
        for k in range(self.shards):
            self.leader(k)
        ids = {self.node_id(d) for d in self.stores}
        return "" not in ids and ids <= self.alive_nodes()

    def wait(self, what: str, cond: Callable[[], bool], timeout: float) -> float:
        """Poll `cond` (errors count as False) until true; seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            with contextlib.suppress(*TRANSIENT):
                if cond():
                    return time.monotonic() - t0
            time.sleep(0.1)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s")

    def master_log_sizes(self) -> dict[str, int]:
        return {d.name: _size(d.log) for d in self.masters}

    def objects_gone(self, since: dict[str, int]) -> dict[str, int]:
        """Per node id: the objects the masters logged as gone with it ("node X is gone
        (etcd lease ended); N objects went with it") after the log sizes `since`."""
        out: dict[str, int] = {}
        for d in self.masters:
            with contextlib.suppress(OSError), open(d.log, "rb") as f:
                f.seek(since.get(d.name, 0))
                for node, n in _GONE.findall(f.read().decode(errors="replace")):
                    out[node] = out.get(node, 0) + int(n)
        return out

    def logs(self, tail: int = 2500) -> str:
        out = []
        for d in self.sup.daemons:
            with contextlib.suppress(OSError):
                out.append(f"--- {d.name} ---\n" + d.log.read_text(errors="replace")[-tail:])
        return "\n".join(out)

    def resume_all(self) -> None:
        """SIGCONT every live process (an event interrupted while one was stopped)."""
        for d in self.sup.daemons:
            if d.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(d.pid, signal.SIGCONT)


@contextlib.contextmanager
def chaos_cluster(workdir: Path, shards: int = 1) -> Iterator[ChaosCluster]:
    c = ChaosCluster(workdir, shards)
    try:
        c.start()
        yield c
    finally:
        c.stop()
