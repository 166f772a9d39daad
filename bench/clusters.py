"""The two systems under test, started on free loopback ports and stopped by pid.

- `ours()`: etcd + our master + N store nodes, through `kvstore.devcluster.DevCluster`
  (the code behind `kvstore up`), waiting until every node's segment is mounted.
- `mooncake()`: `mooncake_master` with its HTTP metadata server, plus one store-node
  process (`python -m bench.clusters mooncake-node ...`) that mounts a global segment
  through `MooncakeDistributedStore.setup` and stays alive (with `ssd_bytes`, also its SSD
  offload: see `mooncake_offload_env`). Clients are other processes
  that call `mooncake_client(...)` with no segment of their own, so every byte they put
  or get crosses the Transfer Engine, as ours do.

Both must run inside a private network namespace (see bench/netns.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kvstore.devcluster import DevCluster, UpOptions, free_port, wait_for_port
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

# The Transfer Engine's settings for every process of either system that runs one (the
# benchmarks pass these to Mooncake's node and clients and to our clients; our store node
# inherits the orchestrator's environment, see `engine_pool`). Its TCP transport binds
# here when told; the namespace is the real fence. Connection reuse is on for both by
# default, like with like: our engine turns it on unless the operator set it
# (kvstore/transfer.py), Mooncake's default opens a connection per transfer.
POOL_ENV = "MC_TCP_ENABLE_CONNECTION_POOL"
MOONCAKE_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", POOL_ENV: "1"}


def engine_pool(on: bool) -> None:
    """Both systems' engines reuse their TCP connections (on) or open one per transfer
    (off, the engine's own default), whoever starts them from this process from now on."""
    value = "1" if on else "0"
    MOONCAKE_ENV[POOL_ENV] = value
    os.environ[POOL_ENV] = value  # our store node and clients: the operator's value wins


class _Signals:
    stopping = 0   # nesting depth of `uninterrupted` blocks
    pending = 0    # a signal that arrived during one, delivered when the last one ends


def raise_on_sigterm() -> None:
    """Turn SIGTERM and SIGINT into SystemExit so that `finally` blocks stop what we
    started; inside `uninterrupted()` the exit waits until the cleanup is done."""
    def handler(signum: int, _frame: object) -> None:
        if _Signals.stopping:
            _Signals.pending = signum
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A cleanup that a signal (handled by raise_on_sigterm) must not cut short."""
    _Signals.stopping += 1
    try:
        yield
    finally:
        _Signals.stopping -= 1
        if not _Signals.stopping and _Signals.pending:
            signum, _Signals.pending = _Signals.pending, 0
            raise SystemExit(128 + signum)


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return f"--- {path.name} ---\n" + path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"--- {path.name}: no log ---"


# -- ours ---------------------------------------------------------------------------------


@dataclass
class OursCluster:
    etcd: str
    master: str
    logs: Path
    pids: dict[str, int] = field(default_factory=dict)  # process name -> pid
    masters: list[str] = field(default_factory=list)  # each shard's master, shard order


def wait_mounted(master: str, nodes: int, procs: list[subprocess.Popen[bytes]],
                 timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    seen = -1
    with grpc.insecure_channel(master) as ch:
        stub = pbg.MasterStub(ch)
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a kvstore process exited while the cluster started")
            with contextlib.suppress(grpc.RpcError):
                st = stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=2)
                seen = len(st.nodes)
                if seen >= nodes and not st.error.code:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{nodes} store node(s) not mounted within {timeout:.0f} s (saw {seen})")


@contextlib.contextmanager
def ours(tmp: Path, dram: str = "2GiB", nodes: int = 1,
         master_args: list[str] | None = None,
         store_args: list[str] | None = None, shards: int = 1) -> Iterator[OursCluster]:
    # Open (no TLS, no tokens), like Mooncake Store, which has neither: the comparison
    # is of the data and control paths. It also writes no credentials file.
    opts = UpOptions(data_dir=tmp / "ours", nodes=nodes, dram=dram, etcd_port=free_port(),
                     master_port=free_port(), extra_master_args=list(master_args or []),
                     extra_store_args=list(store_args or []),
                     secure=False, shards=shards)
    dev = DevCluster(opts)
    logs = opts.data_dir / "logs"
    try:
        dev.start()
        masters = [f"127.0.0.1:{port}" for port in dev.master_ports()]
        master = masters[0]
        try:
            # A node with an SSD tier mounts two segments.
            segments = nodes * (2 if "--ssd-dir" in (store_args or []) else 1)
            for address in masters:
                wait_mounted(address, segments, [p for _, p in dev.procs])
        except RuntimeError as exc:
            tails = "\n".join(log_tail(logs / f"{name}.log") for name, _ in dev.procs)
            raise RuntimeError(f"{exc}\n{tails}") from None
        yield OursCluster(etcd=f"127.0.0.1:{opts.etcd_port}", master=master, logs=logs,
                          pids={name: p.pid for name, p in dev.procs}, masters=masters)
    finally:
        with uninterrupted():
            dev.stop()


# -- Mooncake -----------------------------------------------------------------------------


class MooncakeSSDUnavailable(RuntimeError):
    """Mooncake Store's SSD offload cannot be turned on with the wheel installed here."""


# The master flag that turns offload on; a wheel whose `mooncake_master --help` lacks it
# has no offload to compare with.
OFFLOAD_FLAG = "enable_offload"


def mooncake_offload_env(ssd_dir: Path, ssd_bytes: int) -> dict[str, str]:
    """The store node's settings for Mooncake's SSD offload (its FileStorage with the
    bucket backend, in 0.3.13), read by the C++ client at setup.

    The bucket backend writes a bucket file once it holds BUCKET_KEYS_LIMIT objects or
    BUCKET_SIZE_LIMIT_BYTES; with its defaults a replay of small blocks never fills one and
    nothing reaches the disk, so both are set small. Its heartbeat (which ships the
    objects the master asks it to offload) is 10 s by default; 1 s keeps DRAM from filling
    with objects still waiting for their copy on disk, which Mooncake will not evict."""
    return {
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(ssd_dir),
        "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(ssd_bytes),   # the capacity it reports
        "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(ssd_bytes),
        "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "16",
        "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": str(1 << 20),
        "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1",
        # Its staging buffer, 1.25 GiB by default: more than this machine should lend.
        "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES": str(64 << 20),
    }


def check_mooncake_offload(help_text: str, setup_doc: str) -> None:
    """Raise MooncakeSSDUnavailable unless both halves of Mooncake's SSD offload are
    there: the master's `--enable_offload` flag and setup's `enable_ssd_offload`."""
    if OFFLOAD_FLAG not in help_text:
        raise MooncakeSSDUnavailable(
            f"Mooncake's SSD offload cannot be turned on here: this mooncake_master has no "
            f"--{OFFLOAD_FLAG} flag (see `mooncake_master --help`); the Mooncake +SSD run is "
            "skipped")
    if "enable_ssd_offload" not in setup_doc:
        raise MooncakeSSDUnavailable(
            "Mooncake's SSD offload cannot be turned on here: this wheel's "
            "MooncakeDistributedStore.setup takes no enable_ssd_offload setting; the Mooncake "
            "+SSD run is skipped")


def probe_mooncake_offload() -> None:
    """Check this wheel for SSD offload (MooncakeSSDUnavailable when it has none)."""
    try:
        out = subprocess.run([mooncake_master_binary(), "--help"], capture_output=True,
                             text=True, timeout=30, check=False)
        from mooncake.store import MooncakeDistributedStore
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ImportError) as exc:
        raise MooncakeSSDUnavailable(f"Mooncake's SSD offload cannot be turned on here: "
                                     f"{exc}; the Mooncake +SSD run is skipped") from None
    check_mooncake_offload(out.stdout + out.stderr, MooncakeDistributedStore.setup.__doc__ or "")


def dir_bytes(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path` now."""
    files = size = 0
    for f in path.rglob("*"):
        with contextlib.suppress(OSError):
            if f.is_file():
                files += 1
                size += f.stat().st_size
    return files, size


def mooncake_master_binary() -> str:
    here = Path(sys.executable).parent / "mooncake_master"
    found = str(here) if here.exists() else shutil.which("mooncake_master")
    if not found:
        raise RuntimeError("mooncake_master not found next to this Python or on PATH; install "
                           "mooncake-transfer-engine-non-cuda into the venv (pip install -e '.[te]')")
    return found


@dataclass
class MooncakeCluster:
    master: str          # RPC address of mooncake_master
    metadata: str        # URL of its HTTP metadata server
    logs: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    metrics: str = ""    # URL of its Prometheus metrics (master_key_count, ...evicted_key_count)
    ssd_dir: Path | None = None   # the node's SSD offload directory, when it has one


def _spawn(procs: list[tuple[str, subprocess.Popen[bytes]]], logs: Path, name: str,
           cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    fh = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})
    procs.append((name, proc))
    return proc


def stop_procs(procs: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    """SIGTERM each of our children by pid, newest first; SIGKILL what lingers."""
    for _name, proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    procs.clear()


@contextlib.contextmanager
def mooncake(tmp: Path, segment_bytes: int, ssd_bytes: int = 0) -> Iterator[MooncakeCluster]:
    """With `ssd_bytes`, the master offloads (objects are written to the node's SSD
    directory after their put and evicted from DRAM only once they are there) and the
    node mounts a local-disk segment of that capacity under `tmp`; MooncakeSSDUnavailable
    when this wheel cannot."""
    logs = tmp / "mooncake"
    logs.mkdir(parents=True, exist_ok=True)
    if ssd_bytes:
        probe_mooncake_offload()
    rpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    mc = MooncakeCluster(master=f"127.0.0.1:{rpc_port}",
                         metadata=f"http://127.0.0.1:{http_port}/metadata", logs=logs,
                         metrics=f"http://127.0.0.1:{metrics_port}/metrics")
    node_args: list[str] = []
    offload: list[str] = []
    if ssd_bytes:
        mc.ssd_dir = tmp / "mooncake-ssd"
        mc.ssd_dir.mkdir(parents=True, exist_ok=True)
        node_args = ["--ssd-dir", str(mc.ssd_dir), "--ssd-bytes", str(ssd_bytes)]
        offload = [f"--{OFFLOAD_FLAG}=true"]
    try:
        master = _spawn(mc.procs, logs, "mooncake_master", [
            mooncake_master_binary(), "--rpc_address=127.0.0.1", f"--rpc_port={rpc_port}",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={http_port}", "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics_port}", *offload])
        wait_for_port(rpc_port, master, "mooncake_master")
        wait_for_port(http_port, master, "mooncake_master's metadata server")
        ready = logs / "node.ready"
        node = _spawn(mc.procs, logs, "mooncake-node", [
            sys.executable, "-m", "bench.clusters", "mooncake-node", "--metadata", mc.metadata,
            "--master", mc.master, "--segment", str(segment_bytes), "--ready", str(ready),
            *node_args], env=MOONCAKE_ENV)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if node.poll() is not None or time.monotonic() > deadline:
                error = MooncakeSSDUnavailable if ssd_bytes else RuntimeError
                what = ("Mooncake's SSD offload cannot be turned on here: its store node did "
                        "not mount its segment and local disk" if ssd_bytes else
                        "the Mooncake store node did not mount its segment")
                raise error(f"{what}\n"
                                   + log_tail(logs / "mooncake-node.log")
                                   + "\n" + log_tail(logs / "mooncake_master.log"))
            time.sleep(0.05)
        yield mc
    finally:
        with uninterrupted():
            stop_procs(mc.procs)


def mooncake_client(mc: MooncakeCluster, local_buffer_bytes: int, segment_bytes: int = 0,
                    ssd_dir: Path | None = None, ssd_bytes: int = 0) -> Any:
    """A MooncakeDistributedStore set up against `mc`; call in a process of its own. With
    `ssd_dir`, it also mounts a local-disk segment there (Mooncake's SSD offload)."""
    os.environ.update(MOONCAKE_ENV)
    if ssd_dir is not None:
        os.environ.update(mooncake_offload_env(ssd_dir, ssd_bytes))
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    config: dict[str, Any] = {
        "local_hostname": "127.0.0.1", "metadata_server": mc.metadata,
        "global_segment_size": segment_bytes, "local_buffer_size": local_buffer_bytes,
        "protocol": "tcp", "rdma_devices": "", "master_server_addr": mc.master}
    if ssd_dir is not None:
        config.update(enable_ssd_offload=True, ssd_offload_path=str(ssd_dir))
    rc = store.setup(config)
    if rc != 0:
        if ssd_dir is not None:
            raise MooncakeSSDUnavailable(f"Mooncake's SSD offload cannot be turned on here: "
                                         f"setup with enable_ssd_offload at {ssd_dir} failed "
                                         f"(rc={rc})")
        raise RuntimeError(f"MooncakeDistributedStore.setup failed (rc={rc})")
    return store


def _mooncake_node(args: argparse.Namespace) -> int:
    stop = {"sig": 0}

    def handler(signum: int, _frame: object) -> None:
        stop["sig"] = signum

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    mc = MooncakeCluster(master=args.master, metadata=args.metadata, logs=Path("."))
    store = mooncake_client(mc, 16 << 20, segment_bytes=args.segment,
                            ssd_dir=Path(args.ssd_dir) if args.ssd_dir else None,
                            ssd_bytes=args.ssd_bytes)
    Path(args.ready).write_text(str(os.getpid()))
    try:
        while not stop["sig"]:
            time.sleep(0.2)
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clusters",
                                description="helper processes of the benchmarks")
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("mooncake-node", help="mount a Mooncake global segment and stay alive")
    n.add_argument("--metadata", required=True)
    n.add_argument("--master", required=True)
    n.add_argument("--segment", type=int, required=True, help="bytes")
    n.add_argument("--ready", required=True, help="file written once the segment is mounted")
    n.add_argument("--ssd-dir", default="", help="also offload to SSD in this directory")
    n.add_argument("--ssd-bytes", type=int, default=0, help="capacity of that SSD tier, bytes")
    args = p.parse_args(argv)
    return _mooncake_node(args)


if __name__ == "__main__":
    sys.exit(main())
