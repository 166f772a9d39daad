"""Shared fixtures: real etcd, master and store-node processes on loopback.

Processes that start a Mooncake Transfer Engine listen on every interface, whatever
address they are given. `make test` therefore runs the suite inside a private network
namespace that holds only loopback (`unshare -n`); the `cluster` fixture refuses to
start outside one, so nothing a test starts is ever reachable from another host.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from kvstore.devcluster import etcd_command, free_port, wait_for_port
from kvstore.errors import Unavailable
from kvstore.security.access import new_token, token_hash
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, vLLM, ...) lives as long as the session: keep it
    out of the collector's full passes. With it, one pass takes ~0.3 s (580,000 objects
    after importing vLLM) and lands inside whichever test is running, timed or not;
    frozen, ~5 µs."""
    gc.collect()
    gc.freeze()


def in_private_netns() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def require_private_netns() -> None:
    if not in_private_netns():
        pytest.fail(
            "this test starts Transfer Engines, which listen on all interfaces; run it "
            "through `make test` (a private network namespace) or under "
            "`unshare -n sh -c 'ip link set lo up && pytest ...'`",
            pytrace=False,
        )


@dataclass
class Proc:
    name: str
    cmd: list[str]
    log: Path
    popen: subprocess.Popen[bytes]
    signalled: bool = False  # a test stopped or paused it on purpose

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.signalled = True
        if self.alive():
            os.kill(self.popen.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                try:
                    self.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.kill(self.popen.pid, signal.SIGKILL)
                    self.popen.wait()


@dataclass
class Cluster:
    """A running test cluster; every process is ours and stopped by pid.

    `masters` holds every master started, in order; with a sharded control plane
    (`start_masters(shards=N)`) `by_shard[k]` holds shard k's, and `status` and
    `wait_nodes` take `shard=` (wait_nodes without one waits for every shard)."""

    tmp: Path
    etcd_port: int = 0
    procs: list[Proc] = field(default_factory=list)
    masters: list[tuple[Proc, str]] = field(default_factory=list)
    stores: list[Proc] = field(default_factory=list)
    shards: int = 1  # the control plane's shard count (1: no --shard flag, as before shards)
    by_shard: dict[int, list[tuple[Proc, str]]] = field(default_factory=dict)

    @property
    def etcd(self) -> str:
        return f"127.0.0.1:{self.etcd_port}"

    def spawn(self, name: str, cmd: list[str]) -> Proc:
        log = self.tmp / f"{name}.log"
        fh = open(log, "ab")  # noqa: SIM115
        popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        proc = Proc(name, cmd, log, popen)
        self.procs.append(proc)
        return proc

    def start_etcd(self) -> None:
        # A port found free can be taken before etcd binds it (the Transfer Engines of
        # other tests pick ports of their own): etcd then exits at once saying so, and
        # is started again on other ports.
        for attempt in range(3):
            self.etcd_port = free_port()
            proc = self.spawn("etcd", etcd_command(self.tmp / "etcd", self.etcd_port, free_port()))
            try:
                wait_for_port(self.etcd_port, proc.popen, "etcd")
                return
            except Unavailable:
                self.procs.remove(proc)
                if attempt == 2 or b"address already in use" not in proc.log.read_bytes():
                    raise

    def start_master(self, *extra: str, shard: int | None = None) -> str:
        """One master; `shard=k` starts it for shard k of `self.shards` (`--shard k/N`,
        only when there is more than one shard)."""
        port = free_port()
        address = f"127.0.0.1:{port}"
        flag = ["--shard", f"{shard}/{self.shards}"] if shard is not None and self.shards > 1 else []
        proc = self.spawn(f"master-{len(self.masters)}", [
            sys.executable, "-m", "kvstore", "master", "--etcd", self.etcd,
            "--listen", address, *flag, *extra])
        wait_for_port(port, proc.popen, "master")
        self.masters.append((proc, address))
        self.by_shard.setdefault(shard or 0, []).append((proc, address))
        return address

    def start_masters(self, *extra: str, shards: int = 1, per_shard: int = 1) -> list[str]:
        """`per_shard` masters for each of `shards` shards (leader first, then standbys),
        shard by shard; with one shard, `start_master(*extra)` as before shards."""
        self.shards = shards
        return [self.start_master(*extra, shard=k if shards > 1 else None)
                for k in range(shards) for _ in range(per_shard)]

    def master_of(self, shard: int = 0) -> str:
        """The address of the first master started for `shard`."""
        return self.by_shard[shard][0][1]

    def start_store(self, dram: str = "64MiB", *extra: str, node_id: str | None = "") -> Proc:
        """node_id None: no --node-id flag (the node's data dirs, or chance, pick its id)."""
        flag = [] if node_id is None else ["--node-id", node_id or f"node-{len(self.stores)}"]
        proc = self.spawn(f"store-{flag[-1] if flag else len(self.stores)}", [
            sys.executable, "-m", "kvstore", "store", "--etcd", self.etcd, "--dram", dram,
            *flag, *extra])
        self.stores.append(proc)
        return proc

    def status(self, address: str | None = None, shard: int | None = None) -> pb.ClusterStatusResponse:
        address = address or (self.master_of(shard) if shard is not None else self.masters[0][1])
        with grpc.insecure_channel(address) as ch:
            return pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=5)

    def statuses(self) -> list[pb.ClusterStatusResponse]:
        """Each shard's first master's status, in shard order."""
        return [self.status(shard=k) for k in range(self.shards)]

    def wait_nodes(self, n: int, timeout: float = 30.0, address: str | None = None,
                   shard: int | None = None) -> None:
        """Until `n` nodes are mounted at `address` (or shard `shard`'s first master, or
        the first master); on a sharded control plane without either, at every shard's
        (each shard's leader mounts its part of every node)."""
        if address is None and shard is None and self.shards > 1:
            deadline = time.monotonic() + timeout
            for k in range(self.shards):
                self.wait_nodes(n, max(deadline - time.monotonic(), 0.1), shard=k)
            return
        if address is None and shard is not None:
            address = self.master_of(shard)
        deadline = time.monotonic() + timeout
        last = -1
        while time.monotonic() < deadline:
            dead = [p.name for p in self.procs if not p.alive() and not p.signalled]
            if dead:
                raise AssertionError(f"{dead} exited while the cluster started:\n" + self.logs())
            try:
                st = self.status(address)
                last = len(st.nodes)
                if last == n and not st.error.code:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{n} nodes not mounted within {timeout}s (saw {last}); logs:\n"
                             + self.logs())

    def logs(self) -> str:
        out = []
        for p in self.procs:
            with contextlib.suppress(OSError):
                out.append(f"--- {p.name} ---\n" + p.log.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.kill(signal.SIGTERM)


def tenant_access(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """Tokens for a client of tenant "a" ("alice"), an admin ("ops") and the store nodes
    ("nodes"), written as an access file and a node token file under `tmp_path`; the
    tokens by name, and the flags that give masters and store nodes those files."""
    tokens = {name: new_token() for name in ("alice", "ops", "nodes")}
    access = {"tenants": {"a": {}}, "tokens": [
        {"name": "alice", "role": "client", "tenant": "a", "sha256": token_hash(tokens["alice"])},
        {"name": "ops", "role": "admin", "sha256": token_hash(tokens["ops"])},
        {"name": "nodes", "role": "node", "sha256": token_hash(tokens["nodes"])}]}
    (tmp_path / "access.json").write_text(json.dumps(access))
    (tmp_path / "node.token").write_text(tokens["nodes"])
    return tokens, ["--auth-file", str(tmp_path / "access.json"),
                    "--token-file", str(tmp_path / "node.token")]


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Cluster]:
    """An empty cluster with etcd started; the test adds masters and store nodes."""
    require_private_netns()
    c = Cluster(tmp_path)
    c.start_etcd()
    try:
        yield c
    finally:
        c.stop()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module's `SHARD_COUNTS = [1, 2]` runs each of its tests on `cluster` (anything
    that uses the `shards` fixture) once per shard count; its other tests run once."""
    counts = getattr(metafunc.module, "SHARD_COUNTS", None)
    if counts and "shards" in metafunc.fixturenames:
        metafunc.parametrize("shards", counts, indirect=True)


@pytest.fixture
def shards(request: pytest.FixtureRequest) -> int:
    """The control plane's shard count for `cluster`: 1 unless a suite parametrizes it,
    e.g. `pytestmark = pytest.mark.parametrize("shards", [1, 2], indirect=True)` (test
    ids then end in [1] and [2]; without it they are unchanged)."""
    return int(getattr(request, "param", 1))


@pytest.fixture
def cluster(cluster_factory: Cluster, shards: int) -> Cluster:
    """etcd + one master (per shard) + two 512 MiB store nodes, all mounted."""
    cluster_factory.start_masters(shards=shards)
    cluster_factory.start_store("512MiB")
    cluster_factory.start_store("512MiB")
    cluster_factory.wait_nodes(2)
    return cluster_factory
