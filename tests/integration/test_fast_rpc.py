"""The fast control channel against real processes: same answers as gRPC, robust to
garbage, leader-aware, multiplexed."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from typing import Any

import pytest

from kvstore.addresses import split_address
from kvstore.coord.etcd import read_key_sync, read_prefix_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, KVStoreError
from kvstore.rpc import FastChannel
from kvstore.rpc.framing import HEADER, encode
from kvstore.rpc.methods import METHODS
from kvstore.v1 import master_pb2 as pb
from kvstore_client import AsyncKVStoreClient, InvalidArgument, KVStoreClient
from kvstore_client.control import AsyncFastControl, FastControl, GrpcControl
from tests.conftest import Cluster


def leader_record(c: Cluster) -> MasterRecord:
    raw = read_key_sync(c.etcd, Layout().leader)
    assert raw is not None
    return MasterRecord.decode(raw)


def outcome(x: Any) -> Any:
    """Errors compare by type: their sentences name keys, which differ per run."""
    if isinstance(x, KVStoreError):
        return type(x).__name__
    if isinstance(x, list):
        return [outcome(i) for i in x]
    return x


def no_leases(cluster: Cluster) -> None:
    deadline = time.monotonic() + 5
    while cluster.status().active_leases and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.status().active_leases == 0


def scenario(c: KVStoreClient, p: bytes, cluster: Cluster) -> list[Any]:
    """Every client operation, on keys under prefix `p`; returns what each one said."""
    keys = [p + b"-%d" % i for i in range(10)]
    vals = [bytes([i]) * (1000 + 7919 * i) for i in range(10)]
    missing = p + b"-missing"
    out: list[Any] = []
    out.append(c.put_many(keys[:8], vals[:8]))
    out.append(c.put_many(keys[:2], vals[:2]))  # stored already: success
    c.put(keys[8], vals[8])
    out.append(c.exists([*keys, missing]))
    out.append(c.get_many([missing, *keys[::-1]]))
    out.append([c.get(keys[0]), c.get(missing)])
    lease = c.lookup([*keys, missing])
    out.append(lease.count)
    c.renew(lease, ttl=5)
    c.release(lease, keep_first=2)
    c.release(lease)
    try:
        c.renew(lease)
    except KVStoreError as exc:
        out.append(exc)
    bufs = [bytearray(len(vals[i])) for i in range(4)]
    for b in bufs:
        c.register(b)
    out.append(c.get_into([keys[0], keys[1], missing, keys[3]], bufs))
    out.append([bytes(b) for b in bufs])
    with c.lookup(keys[:4]) as lease2:
        out.append(c.get_into(keys[:4], bufs, lease=lease2))
    for b in bufs:
        c.unregister(b)
    # gets release their leases without waiting (over gRPC from another thread, so
    # possibly after the next call); a pinned object would refuse the remove.
    no_leases(cluster)
    out.append(c.remove_many([keys[0], keys[1], missing]))
    out.append(c.exists(keys[:3]))
    return [outcome(o) for o in out]


def test_fast_and_grpc_give_identical_results(cluster: Cluster) -> None:
    with KVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20) as fast, \
            KVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20, transport="grpc") as slow:
        assert isinstance(fast._control, FastControl)
        assert isinstance(slow._control, GrpcControl)
        record = leader_record(cluster)
        assert fast.master_address == record.fast and slow.master_address == record.address
        assert scenario(fast, b"f", cluster) == scenario(slow, b"g", cluster)
        assert fast._control.channel.connects == 1


def test_an_unreachable_fast_port_falls_back_to_grpc(cluster: Cluster,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import kvstore_client.session

    closed = socket.create_server(("127.0.0.1", 0))  # a port nobody will answer on
    dead = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    real = leader_record(cluster)

    def firewalled(*_: Any) -> MasterRecord:
        return MasterRecord(real.master_id, real.address, real.pid, real.metrics, fast=dead)

    # Both drivers learn the leader through the shared layer's one seam.
    monkeypatch.setattr(kvstore_client.session, "discover_record", firewalled)
    with KVStoreClient(etcd=cluster.etcd, timeout=10) as c:
        assert c.master_address == dead
        c.put(b"fw", b"through grpc")
        assert isinstance(c._control, GrpcControl) and c.master_address == real.address
        assert c.get(b"fw") == b"through grpc"

    async def main() -> None:
        async with AsyncKVStoreClient(etcd=cluster.etcd, timeout=10) as a:
            assert await a.get(b"fw") == b"through grpc"
            assert a.master_address == real.address

    asyncio.run(main())


def test_unknown_transport_is_refused(cluster: Cluster) -> None:
    with pytest.raises(InvalidArgument, match="transport"):
        KVStoreClient(etcd=cluster.etcd, transport="carrier-pigeon")


def garbage_streams() -> list[bytes]:
    rng = random.Random(11)
    exists = METHODS["Exists"].id
    return [
        rng.randbytes(4096),
        b"GET /metrics HTTP/1.1\r\nHost: master\r\n\r\n",
        HEADER.pack(0xFFFFFFFF, 1, exists),  # 4 GiB frame announced
        encode(1, exists, b"\xff" * 33),  # a frame, but no KeysRequest in it
        encode(2, 0xFFFF, b""),  # no such method
        encode(0, METHODS["Remove"].id, b"\x0a"),  # one-way, truncated protobuf
        HEADER.pack(1000, 3, exists) + b"x" * 10,  # then hang up mid-frame
        *(rng.randbytes(rng.randrange(1, 64)) for _ in range(20)),
    ]


def test_garbage_on_the_fast_port_does_not_hurt_the_master(cluster: Cluster) -> None:
    record = leader_record(cluster)
    master = cluster.masters[0][0]
    with KVStoreClient(etcd=cluster.etcd) as c:
        c.put(b"survivor", b"still here")
        for blob in garbage_streams():
            with socket.create_connection(split_address(record.fast), timeout=5) as sock:
                sock.sendall(blob)
                sock.shutdown(socket.SHUT_WR)
                # Error-frame replies, then a close (a reset is as good), never a hang.
                with contextlib.suppress(ConnectionResetError):
                    while sock.recv(65536):
                        pass
            assert c.get(b"survivor") == b"still here"
            assert master.alive()
    assert "Traceback" not in master.log.read_text(errors="replace")


def test_a_standby_answers_not_leader_over_the_fast_channel(cluster_factory: Cluster) -> None:
    c = cluster_factory
    a = c.start_master()
    c.start_store("128MiB")
    c.wait_nodes(1, address=a)
    b = c.start_master()
    deadline = time.monotonic() + 10
    records: dict[str, MasterRecord] = {}
    while len(records) < 2 and time.monotonic() < deadline:
        records = {r.address: r for r in map(MasterRecord.decode,
                                              read_prefix_sync(c.etcd, Layout().masters))}
        time.sleep(0.05)
    standby = records[b]
    assert standby.fast and standby.fast != records[a].fast
    ch = FastChannel(standby.fast)
    reply: Any = ch.call("Exists", pb.KeysRequest(keys=[b"k"]), 5)
    assert reply.error.code == Code.NOT_LEADER and reply.epoch > 0
    assert a in reply.error.message  # it names the leader
    ch.close()
    with KVStoreClient(etcd=c.etcd) as client:  # clients are sent to the leader
        client.put(b"k", b"v")
        assert client.master_address == records[a].fast
        assert client.get(b"k") == b"v"


def test_async_client_multiplexes_concurrent_calls_on_one_connection(cluster: Cluster) -> None:
    keys = [b"mx-%02d" % i for i in range(50)]

    async def main() -> None:
        async with AsyncKVStoreClient(etcd=cluster.etcd, buffer_size=1 << 20) as a:
            assert isinstance(a._control, AsyncFastControl)
            assert await a.put_many(keys, [k * 100 for k in keys]) == [None] * 50
            exists, leases = await asyncio.gather(
                asyncio.gather(*(a.exists([keys[i], b"nope-%d" % i, keys[49 - i]])
                                 for i in range(50))),
                asyncio.gather(*(a.lookup([*keys[:i], b"nope"]) for i in range(50))),
            )
            assert exists == [[True, False, True]] * 50
            assert [lease.count for lease in leases] == list(range(50))
            assert len({lease.id for lease in leases if lease.id}) == 49
            got = await asyncio.gather(*(a.get(k) for k in keys))
            assert got == [k * 100 for k in keys]
            await asyncio.gather(*(a.release(lease) for lease in leases if lease.id))
            assert a._control.channel.connects == 1

    asyncio.run(main())
    no_leases(cluster)  # the gets' one-way releases arrived too
