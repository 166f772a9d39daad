"""`kvstore up`: a whole local cluster in the foreground, for development.

Starts a private etcd (the `etcd` binary, data under --data-dir), one master and N store
nodes, all on loopback, prints the endpoints and stops everything, in reverse order, on
Ctrl-C or SIGTERM. If any process dies on its own, the rest are stopped too and the exit
code says so.

Secure by default: the master and the nodes serve TLS with a CA made for this data
directory, and check tokens (kvstore.security.devca). The client and admin tokens and the
CA are written to the credentials file (~/.config/kvstore/credentials.json, or
$KVSTORE_CREDENTIALS) under "127.0.0.1:ETCD_PORT/CLUSTER", where clients and the admin
CLI pointed at this etcd find them without any setting. `--insecure` starts it open, and
removes that entry: a secure run's CA left there would have every client try TLS against
the plaintext master.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kvstore.errors import InvalidArgument, Unavailable
from kvstore.security.credentials import Credentials, credentials_path
from kvstore.security.devca import (
    DEV_TENANT,
    ensure_dev_secrets,
    remove_credentials,
    write_credentials,
)


@dataclass
class UpOptions:
    data_dir: Path = Path(".kvstore")
    nodes: int = 1
    dram: str = "1GiB"
    etcd_port: int = 2379
    master_port: int = 50051
    metrics_port: int = 0
    cluster: str = "default"
    # Masters: one per shard, shard k on master_port + k (and metrics_port + k); one
    # shard starts today's single master, without --shard.
    shards: int = 1
    extra_master_args: list[str] = field(default_factory=list)
    extra_store_args: list[str] = field(default_factory=list)
    secure: bool = True
    removed_credentials: bool = False  # set by start(): --insecure removed a stale entry


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def etcd_command(data_dir: Path, client_port: int, peer_port: int, name: str = "kvstore") -> list[str]:
    binary = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if binary is None:
        raise Unavailable("the `etcd` binary is not installed; on Debian/Ubuntu run "
                          "`apt-get install etcd-server` (or `make run`, which does it)")
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        binary, "--name", name, "--data-dir", str(data_dir),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{name}={peer}",
        "--heartbeat-interval=50", "--election-timeout=500", "--log-level=warn",
    ]


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"{what} exited with code {proc.returncode} while starting")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise Unavailable(f"{what} did not open port {port} within {timeout:.0f} s")


class DevCluster:
    def __init__(self, opts: UpOptions) -> None:
        self.opts = opts
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self) -> None:
        o = self.opts
        if o.shards < 1:
            raise InvalidArgument(f"--shards must be >= 1, got {o.shards}")
        ports = ((o.etcd_port, "etcd (--etcd-port)"),
                 *((p, "the master (--master-port)" if o.shards == 1
                    else f"shard {k}'s master (--master-port + {k})")
                   for k, p in enumerate(self.master_ports())))
        for port, what in ports:
            if not port_is_free(port):
                raise InvalidArgument(f"port {port} for {what} is in use; choose another port "
                                      "or stop what holds it")
        # Absolute: the credentials file names the CA under it, and a client started in
        # another directory (a second terminal, a notebook) must find it.
        o.data_dir = o.data_dir.resolve()
        o.data_dir.mkdir(parents=True, exist_ok=True)
        etcd = f"127.0.0.1:{o.etcd_port}"
        logs = o.data_dir / "logs"
        logs.mkdir(exist_ok=True)
        proc = self._spawn("etcd", etcd_command(o.data_dir / "etcd", o.etcd_port, free_port()), logs)
        wait_for_port(o.etcd_port, proc, "etcd")
        kv = [sys.executable, "-m", "kvstore"]
        secure: list[str] = []
        if o.secure:
            sec = ensure_dev_secrets(o.data_dir)
            secure = ["--tls-cert", str(sec.cert), "--tls-key", str(sec.key), "--tls-ca", str(sec.ca),
                      "--auth-file", str(sec.access), "--token-file", str(sec.node_token_file)]
            write_credentials(credentials_path(), f"{etcd}/{o.cluster}", sec.client_credentials())
        else:
            o.removed_credentials = remove_credentials(credentials_path(), f"{etcd}/{o.cluster}")
        for k, port in enumerate(self.master_ports()):
            master = [*kv, "master", "--etcd", etcd, "--listen", f"127.0.0.1:{port}",
                      "--cluster", o.cluster, *secure, *o.extra_master_args]
            if o.shards > 1:
                master += ["--shard", f"{k}/{o.shards}"]
            if o.metrics_port:
                master += ["--metrics-port", str(o.metrics_port + k)]
            name = "master" if o.shards == 1 else f"master-{k}"
            proc = self._spawn(name, master, logs)
            wait_for_port(port, proc, "the master" if o.shards == 1 else f"shard {k}'s master")
        for i in range(o.nodes):
            self._spawn(f"store-{i}", [*kv, "store", "--etcd", etcd, "--dram", o.dram,
                                       "--cluster", o.cluster, "--node-id", f"node-{i}",
                                       *secure,
                                       # "{node}" in an argument: this node's number
                                       *[a.replace("{node}", str(i)) for a in o.extra_store_args]],
                        logs)
        # What this run wrote, not what the environment says: KVSTORE_TLS_CA set for
        # another cluster must not stop this one from coming up.
        self.wait_for_nodes(Credentials(token=sec.admin_token, tls_ca=str(sec.ca))
                            if o.secure else Credentials())

    def master_ports(self) -> list[int]:
        return [self.opts.master_port + k for k in range(self.opts.shards)]

    def wait_for_nodes(self, creds: Credentials, timeout: float = 120.0) -> None:
        """Return once every shard's leader has mounted every node's DRAM segment: "up"
        means a put succeeds now. A node prefaults its DRAM before it mounts (about 0.5 s
        per GiB), so this can take a while with a large --dram."""
        deadline = time.monotonic() + timeout
        for port in self.master_ports():
            self._wait_mounted(creds, f"127.0.0.1:{port}", deadline, timeout)

    def _wait_mounted(self, creds: Credentials, address: str, deadline: float,
                      timeout: float) -> None:
        from kvstore.v1 import master_pb2 as pb
        from kvstore.v1 import master_pb2_grpc as pbg

        o = self.opts
        mounted: set[str] = set()
        with creds.grpc_channel(address, o.secure, []) as channel:
            stub = pbg.MasterStub(channel)
            while time.monotonic() < deadline:
                for name, proc in self.procs:
                    if proc.poll() is not None:
                        raise Unavailable(f"{name} exited with code {proc.returncode} while "
                                          f"starting (see {o.data_dir / 'logs' / (name + '.log')})")
                try:
                    reply = stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=2.0,
                                               metadata=creds.metadata())
                except grpc.RpcError:
                    reply = None  # not elected yet
                if reply is not None and not reply.error.code:
                    mounted = {n.node_id for n in reply.nodes if n.tier == "dram"}
                    if len(mounted) >= o.nodes:
                        return
                time.sleep(0.05)
        on = f" on the master at {address}" if o.shards > 1 else ""
        raise Unavailable(f"{o.nodes - len(mounted)} of {o.nodes} store node(s) did not mount"
                          f"{on} within {timeout:.0f} s (see {o.data_dir / 'logs'})")

    def _spawn(self, name: str, cmd: list[str], logs: Path) -> subprocess.Popen[bytes]:
        log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def wait(self) -> int:
        """Block until a signal or until a child dies; return the exit code to use."""
        stop = {"sig": 0}

        def handler(signum: int, _frame: object) -> None:
            stop["sig"] = signum

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        while not stop["sig"]:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    print(f"kvstore up: {name} exited with code {proc.returncode}; stopping "
                          f"the cluster (see {self.opts.data_dir / 'logs' / (name + '.log')})",
                          file=sys.stderr)
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


def run_up(opts: UpOptions) -> int:
    cluster = DevCluster(opts)
    try:
        cluster.start()
        etcd = f"127.0.0.1:{opts.etcd_port}"
        print(f"kvstore dev cluster is up (data in {opts.data_dir}, logs in {opts.data_dir / 'logs'})")
        print(f"  etcd        {etcd} (loopback only, etcd's auth off: a dev cluster; "
              "production runs `kvstore etcd-setup`)")
        if opts.shards == 1:
            print(f"  master      127.0.0.1:{opts.master_port}")
        for k, port in enumerate(cluster.master_ports() if opts.shards > 1 else []):
            print(f"  master      127.0.0.1:{port} (shard {k}/{opts.shards})")
        print(f"  store nodes {opts.nodes} x {opts.dram} DRAM")
        if opts.metrics_port:
            print(f"  metrics     http://127.0.0.1:{opts.metrics_port}/metrics")
        print(f'  client      KVStoreClient(etcd="{etcd}")')
        if opts.secure:
            print(f"  security    TLS + tokens; tenant {DEV_TENANT!r}; credentials for this cluster "
                  f"in {credentials_path()}")
        else:
            print("  security    none (--insecure): anyone on this host can read and write")
            if opts.removed_credentials:
                print(f"              (removed this cluster's entry from {credentials_path()}: "
                      "it held a secure run's CA and tokens)")
        print("Ctrl-C stops everything.", flush=True)
        return cluster.wait()
    finally:
        cluster.stop()
