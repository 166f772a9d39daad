"""Failover: how long from `kill -9` of the leader to the first successful write, and
how much of the cache is still readable afterwards.

    python -m bench.failover [--rounds 3] [--objects 1000] [--etcd-lease-ttl 2]

Starts etcd, two masters and two store nodes (in a private network namespace), writes
a burst of objects one acknowledged put at a time, kills the leader as soon as the
last put returned, and measures through a client that keeps trying: the
time until the standby holds the leader key, the time until a write succeeds, and the
fraction of the objects read back byte-identical. The killed master comes back as the
next standby, so each round fails over in the other direction.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.clusters import wait_mounted
from bench.netns import ensure_private_netns
from bench.stats import format_table
from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.devcluster import etcd_command, free_port, wait_for_port
from kvstore_client import KVStoreClient, KVStoreError


def value(i: int) -> bytes:
    return i.to_bytes(4, "little") * 1024


def leader(etcd: str) -> str:
    raw = read_key_sync(etcd, Layout().leader)
    return MasterRecord.decode(raw).address if raw else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--objects", type=int, default=1000)
    p.add_argument("--etcd-lease-ttl", type=int, default=2)
    args = p.parse_args(argv)
    ensure_private_netns("bench.failover")
    tmp = Path(tempfile.mkdtemp(prefix="kvstore-failover-"))
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, stdout=open(tmp / f"{name}.log", "ab"),  # noqa: SIM115
                                stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    kv = [sys.executable, "-m", "kvstore"]
    etcd_port = free_port()
    etcd = f"127.0.0.1:{etcd_port}"
    ttl = str(args.etcd_lease_ttl)
    masters: dict[str, subprocess.Popen[bytes]] = {}

    def start_master() -> str:
        port = free_port()
        address = f"127.0.0.1:{port}"
        masters[address] = spawn(f"master-{port}", [*kv, "master", "--etcd", etcd, "--listen",
                                                    address, "--etcd-lease-ttl", ttl])
        wait_for_port(port, masters[address], "master")
        return address

    headers = ["round", "takeover s", "first write s", "readable", "objects"]
    rows: list[list[str]] = []
    try:
        wait_for_port(etcd_port, spawn("etcd", etcd_command(tmp / "etcd", etcd_port,
                                                              free_port())), "etcd")
        first = start_master()
        for i in range(2):
            spawn(f"store-{i}", [*kv, "store", "--etcd", etcd, "--dram", "256MiB",
                                 "--node-id", f"node-{i}"])
        wait_mounted(first, 2, procs)
        start_master()
        keys: list[bytes] = []
        with KVStoreClient(etcd=etcd, timeout=30) as client:
            for rnd in range(1, args.rounds + 1):
                # Each round's burst is acknowledged one put at a time and the kill
                # follows the last reply at once: no pause for the nodes to catch up.
                for i in range(args.objects):
                    key = f"fo-{rnd}-{i}".encode()
                    client.put(key, value(i))
                    keys.append(key)
                old = leader(etcd)
                t0 = time.monotonic()
                masters.pop(old).send_signal(signal.SIGKILL)
                while leader(etcd) in ("", old):
                    time.sleep(0.01)
                takeover = time.monotonic() - t0
                while True:
                    try:
                        client.put(f"probe-{rnd}".encode(), b"x")
                        break
                    except KVStoreError:
                        time.sleep(0.01)
                first_write = time.monotonic() - t0
                got = client.get_many(keys)
                readable = sum(g == value(i % args.objects)
                               for i, g in enumerate(got)) / len(keys)
                rows.append([str(rnd), f"{takeover:.2f}", f"{first_write:.2f}",
                             f"{readable:.1%}", str(len(keys))])
                start_master()  # the next standby
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"failover with the masters' etcd lease TTL = {ttl} s "
          "(kill -9 of the leader; times from the kill)")
    print(format_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
