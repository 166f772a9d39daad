"""One control round trip, and its floor on this machine.

    python -m bench.control_rtt [--calls 3000]

A single get costs one GetReplicas round trip before any byte moves, so its latency
can be no lower than this. Prints p10/p50/p99 of:
- a bare uvloop echo server in another process, 40-byte messages over loopback TCP
  (the floor for any Python server here: two process wake-ups and four syscalls);
- the master's fast channel: GetConfig (no keys), Exists of 1 key, Lookup of 1 missing
  key, GetReplicas of 1 present key (a lease granted, then released one-way), and
  GetConfig again with 1 ms of idleness before each call (a master whose CPU went idle);
- the client's own share of one more message, what a call fanned out to several masters
  (docs/scaling.md) pays per further shard: sending an Exists of 1 key (`ask` alone),
  and reading its reply once it is already there (`answer` after 0.5 ms asleep).
Re-executes itself in a private network namespace (it starts a store node).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.clusters import ours
from bench.netns import ensure_private_netns
from bench.stats import format_table
from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.rpc.client import FastChannel
from kvstore.v1 import master_pb2 as pb
from kvstore_client import KVStoreClient


def _echo_server(ports: mp.Queue) -> None:  # type: ignore[type-arg]
    import uvloop

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        ports.put(server.sockets[0].getsockname()[1])
        await asyncio.sleep(3600)

    uvloop.run(main())


def percentiles(samples: list[float]) -> list[str]:
    samples.sort()
    return [f"{samples[int(len(samples) * q)] * 1e6:.0f} µs" for q in (0.1, 0.5, 0.99)]


def timed(calls: int, fn: Callable[[], object], idle: float = 0.0) -> list[float]:
    """Latency of each of `calls` calls; with `idle`, that long asleep before each (not
    counted), so that the master's CPU has gone idle when the request comes."""
    out = []
    for _ in range(calls):
        if idle:
            time.sleep(idle)
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def echo_row(calls: int, name: str) -> list[str]:
    ports: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    echo = mp.Process(target=_echo_server, args=(ports,), daemon=True)
    echo.start()
    try:
        with socket.create_connection(("127.0.0.1", ports.get(timeout=10))) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def ping() -> None:
                s.sendall(b"x" * 40)
                s.recv(100)

            return [name, *percentiles(timed(calls, ping))]
    finally:
        echo.terminate()


def client_share(channel: FastChannel, calls: int) -> list[list[str]]:
    """The client's time to send one request, and to read one reply already arrived."""
    request = pb.KeysRequest(keys=[b"present"])
    send: list[float] = []
    read: list[float] = []
    for _ in range(calls):
        t0 = time.perf_counter()
        asked = channel.ask("Exists", request, 5.0)
        send.append(time.perf_counter() - t0)
        time.sleep(0.0005)  # the reply is in the socket by then
        t0 = time.perf_counter()
        channel.answer(asked, spin=False)
        read.append(time.perf_counter() - t0)
    return [["client: send Exists, 1 key (ask alone)", *percentiles(send)],
            ["client: read a reply already there", *percentiles(read)]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    ensure_private_netns("bench.control_rtt")
    rows = [echo_row(args.calls, "uvloop echo (the floor), before")]
    with tempfile.TemporaryDirectory(prefix="kvstore-rtt-") as tmp, \
            ours(Path(tmp), dram="256MiB") as cluster:
        raw = read_key_sync(cluster.etcd, Layout().leader)
        assert raw is not None
        channel = FastChannel(MasterRecord.decode(raw).fast)
        with KVStoreClient(etcd=cluster.etcd) as client:
            client.put(b"present", b"x" * 65536)

        def call(method: str, request: object) -> Callable[[], object]:
            return lambda: channel.call(method, request, 5.0)  # type: ignore[arg-type]

        def replicas() -> None:
            r = channel.call("GetReplicas", pb.GetReplicasRequest(keys=[b"present"], holder="b"), 5.0)
            channel.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(
                lease_id=r.lease_id), 5.0)  # type: ignore[attr-defined]

        for name, fn in (("GetConfig", call("GetConfig", pb.GetConfigRequest())),
                         ("Exists, 1 key", call("Exists", pb.KeysRequest(keys=[b"present"]))),
                         ("Lookup, 1 missing key", call("Lookup", pb.LookupRequest(keys=[b"no"]))),
                         ("GetReplicas, 1 key + release", replicas)):
            fn()  # connect
            rows.append([f"fast channel: {name}", *percentiles(timed(args.calls, fn))])
        # A call that finds the master idle: on a VM, waking a vCPU that halted costs
        # more than the call itself (what a put's PutEnd meets after its transfer).
        get_config = call("GetConfig", pb.GetConfigRequest())
        rows.append(["fast channel: GetConfig, 1 ms after the last",
                     *percentiles(timed(max(1, args.calls // 3), get_config, idle=0.001))])
        rows += client_share(channel, args.calls)
        channel.close()
    # Again after: the floor itself moves with the machine's load (a shared VM).
    rows.append(echo_row(args.calls, "uvloop echo (the floor), after"))
    print(f"{args.calls} calls each, one at a time")
    print(format_table(["call", "p10", "p50", "p99"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
