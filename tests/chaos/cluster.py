"""The chaos cluster: etcd, two masters, three store nodes, all under one `Supervisor`.

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
"""

from __future__ import annotations

import contextlib
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
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.sup = Supervisor()
        self.etcd_port = 0
        self.etcd: Daemon | None = None
        self.masters: list[Daemon] = []
        self.stores: list[Daemon] = []
        self.specs: dict[str, StoreSpec] = {}
        self.layout = Layout()
        self.host_end = ""  # our end of node-2's veth pair
        self._holder: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.ExitStack()
        self.data_dir_flag = False
        self._last_leader = ""

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
        for i in range(2):
            self._start_master(i)
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

    def _start_master(self, i: int) -> None:
        cmd = [sys.executable, "-m", "kvstore", "master", "--etcd", self.endpoint,
               "--listen", f"{SERVICE_HOST}:{free_port()}", "--insecure"]
        self.masters.append(self.sup.add(f"master-{i}", cmd, self.dir / "logs" / f"master-{i}.log"))

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

    def leader_record(self) -> MasterRecord:
        raw = read_key_sync(self.endpoint, self.layout.leader, timeout=ADMIN_TIMEOUT)
        if raw is None:
            raise LookupError("no leader in etcd")
        return MasterRecord.decode(raw)

    def leader(self) -> Daemon:
        """The master daemon whose process etcd names as leader."""
        rec = self.leader_record()
        for d in self.masters:
            if d.pid == rec.pid and d.alive():
                return d
        raise LookupError(f"the leader in etcd (pid {rec.pid}) is not a live master of ours")

    def standby(self) -> Daemon:
        lead = self.leader()
        return next(d for d in self.masters if d is not lead)

    def isolated(self) -> Daemon:
        return next(d for d in self.stores if self.specs[d.name].isolated)

    def cut(self, down: bool) -> None:
        link(self.host_end, not down)

    # -- calls at the leader -------------------------------------------------------------

    def admin(self, method: str, request: Any, timeout: float = ADMIN_TIMEOUT) -> Any:
        # While etcd is down the last leader seen is asked: it may still serve, and the
        # placements of what was written just before the outage are wanted then.
        try:
            address = self._last_leader = self.leader_record().address
        except KVStoreError:
            if not self._last_leader:
                raise
            address = self._last_leader
        with grpc.insecure_channel(address) as ch:
            reply = getattr(pbg.MasterStub(ch), method)(request, timeout=timeout)
        if reply.error.code:
            raise LookupError(f"{method} at {address}: {reply.error.message}")
        return reply

    def status(self) -> pb.ClusterStatusResponse:
        return self.admin("ClusterStatus", pb.ClusterStatusRequest())

    def node_list(self) -> list[pb.NodeInfo]:
        return list(self.admin("NodeList", pb.NodeListRequest()).nodes)

    def alive_nodes(self) -> set[str]:
        return {n.node_id for n in self.node_list() if n.state == "alive"}

    def placement(self, keys: list[bytes]) -> dict[bytes, frozenset[Copy]]:
        """Where the leader says each key's copies are; keys it does not index are absent."""
        out: dict[bytes, frozenset[Copy]] = {}
        for lo in range(0, len(keys), 500):
            part = keys[lo:lo + 500]
            reply = self.admin("Inspect", pb.KeysRequest(keys=part))
            for key, item in zip(part, reply.items, strict=True):
                if item.code == 0 and item.object.replicas:
                    out[key] = frozenset(Copy(r.node_id, r.tier or "dram")
                                         for r in item.object.replicas)
        return out

    def full_strength(self) -> bool:
        """Every daemon runs, a live master of ours leads, and the three current store
        incarnations are mounted and alive at it."""
        if not all(d.alive() for d in self.sup.daemons):
            return False
        self.leader()
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
def chaos_cluster(workdir: Path) -> Iterator[ChaosCluster]:
    c = ChaosCluster(workdir)
    try:
        c.start()
        yield c
    finally:
        c.stop()
