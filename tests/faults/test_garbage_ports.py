"""Bad input at the daemons' ports, through real processes: random bytes, and a valid
HTTP/2 preface followed by garbage, at the master's gRPC port, at a store node's gRPC
port and at the master's fast port (plus random bytes at a node's Transfer Engine ports).
After each stream the daemon must still be alive, answer correctly, and have logged no
traceback.

(Structured garbage inside well-formed requests, per RPC, is tests/unit/test_fuzz_master.py;
more fast-channel framing cases are in tests/integration/test_fast_rpc.py.)
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import struct
import time
from collections.abc import Iterator

import grpc
import pytest

from kvstore.addresses import split_address
from kvstore.coord.etcd import read_key_sync, read_prefix_sync
from kvstore.coord.layout import Layout, MasterRecord, NodeRecord
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg
from kvstore_client import KVStoreClient
from tests.conftest import Cluster

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame


def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman coding."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def grpc_headers(path: bytes) -> bytes:
    block = b"".join(literal(k, v) for k, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
        (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    return frame(1, 0x4, 1, block)  # HEADERS, END_HEADERS, stream 1


def http2_garbage(path: bytes, seed: int) -> list[bytes]:
    """A valid preface (and often more) followed by what no server should accept."""
    rng = random.Random(seed)
    start = PREFACE + SETTINGS
    return [
        PREFACE + rng.randbytes(4096),
        start + rng.randbytes(4096),
        start + b"".join(frame(rng.randrange(256), rng.randrange(256), rng.randrange(1 << 31),
                               rng.randbytes(rng.randrange(64))) for _ in range(50)),
        start + frame(1, 0x4, 1, rng.randbytes(200)),  # HEADERS with a garbage HPACK block
        start + frame(0, 0, 1, b"", length=16 << 20),  # announces 16 MiB, sends nothing
        start + frame(1, 0x4, 0, b""),  # HEADERS on stream 0
        start + frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"),  # SETTINGS window size too large
        # a well-formed call whose message announces 4 GiB
        start + grpc_headers(path) + frame(0, 0x1, 1, b"\x00\xff\xff\xff\xff" + rng.randbytes(64)),
        # a well-formed call whose message is not a protobuf of its type
        start + grpc_headers(path) + frame(0, 0x1, 1, b"\x00\x00\x00\x00\x0a" + b"\xff" * 10),
        # compressed flag set, no compression negotiated
        start + grpc_headers(path) + frame(0, 0x1, 1, b"\x01\x00\x00\x00\x03abc"),
        start + grpc_headers(b"/no.such.Service/Method") + frame(0, 0x1, 1, b"\x00" * 5),
    ]


def raw_garbage(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [
        rng.randbytes(65536),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(500),  # a TLS hello
        PREFACE[:10],  # half a preface, then hang up
        *(rng.randbytes(rng.randrange(1, 200)) for _ in range(20)),
    ]


def send(address: str, blob: bytes) -> None:
    """Send `blob`, half-close, read whatever comes back until the server closes (or 2 s
    pass: a server may wait for more from a peer that never sends it)."""
    with socket.create_connection(split_address(address), timeout=5) as sock:
        sock.settimeout(2.0)
        # The server may hang up (or reset) before it has read it all: fine.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError, TimeoutError, OSError):
            sock.sendall(blob)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass


def hold_open(address: str, n: int, blob: bytes) -> list[socket.socket]:
    """`n` connections that sent `blob` and then nothing (slow clients)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(split_address(address), timeout=5)
        s.sendall(blob)
        socks.append(s)
    return socks


def leader(c: Cluster) -> MasterRecord:
    raw = read_key_sync(c.etcd, Layout().leader)
    assert raw is not None
    return MasterRecord.decode(raw)


def node_records(c: Cluster) -> list[NodeRecord]:
    return [NodeRecord.decode(r) for r in read_prefix_sync(c.etcd, Layout().nodes)]


def inventory_keys(address: str, epoch: int) -> set[bytes]:
    with grpc.insecure_channel(address) as ch:
        reply = spbg.StoreNodeStub(ch).Inventory(spb.InventoryRequest(epoch=epoch), timeout=5)
    assert not reply.error.code, reply.error.message
    return {r.key for r in reply.replicas}


# A traceback through our code (kvstore, kvstore_client), quoted or escaped in a log line.
OUR_FRAME = re.compile(r'File \\?"[^"\\]*/kvstore(?:_client)?/')


def no_traceback(c: Cluster) -> None:
    """Every daemon alive, none logged a traceback through our code. (grpc's aio server
    logs an ERROR with its own traceback when a request does not deserialize, and again
    if the peer is gone before the error status is sent: grpc's, and allowed.)"""
    for p in c.procs:
        assert p.alive(), f"{p.name} died:\n{c.logs()}"
        text = p.log.read_text(errors="replace")
        assert not OUR_FRAME.search(text), f"{p.name}:\n{c.logs()}"


@pytest.fixture
def served(cluster: Cluster) -> Iterator[tuple[Cluster, KVStoreClient, dict[bytes, bytes]]]:
    client = KVStoreClient(etcd=cluster.etcd, transport="grpc", same_host=False, timeout=10)
    values = {b"survivor-%d" % i: bytes([i]) * (1000 + i) for i in range(8)}
    assert client.put_many(list(values), list(values.values())) == [None] * 8
    yield cluster, client, values
    client.close()


def still_serves(c: Cluster, client: KVStoreClient, values: dict[bytes, bytes], n: int) -> None:
    assert client.get_many(list(values)) == list(values.values())
    key = b"after-garbage-%d" % n
    client.put(key, key * 10)
    assert client.get(key) == key * 10


def test_garbage_at_the_master_grpc_port(
        served: tuple[Cluster, KVStoreClient, dict[bytes, bytes]]) -> None:
    c, client, values = served
    address = leader(c).address
    blobs = raw_garbage(1) + http2_garbage(b"/kvstore.v1.Master/Exists", 2)
    for n, blob in enumerate(blobs):
        send(address, blob)
        still_serves(c, client, values, n)
    slow = hold_open(address, 50, PREFACE + SETTINGS)
    try:
        still_serves(c, client, values, len(blobs))
    finally:
        for s in slow:
            s.close()
    no_traceback(c)


def test_garbage_at_a_store_node_grpc_port(
        served: tuple[Cluster, KVStoreClient, dict[bytes, bytes]]) -> None:
    c, client, values = served
    epoch = c.status().epoch
    node = node_records(c)[0]
    blobs = raw_garbage(3) + http2_garbage(b"/kvstore.v1.StoreNode/Apply", 4)
    for n, blob in enumerate(blobs):
        send(node.service, blob)
        inventory_keys(node.service, epoch)  # the node answers its leader
        still_serves(c, client, values, n)
    slow = hold_open(node.service, 50, PREFACE + SETTINGS)
    try:
        inventory_keys(node.service, epoch)
    finally:
        for s in slow:
            s.close()
    # The leader's inventory deltas still reach the nodes: what was written between the
    # garbage streams is in their inventories.
    written = {*values, *(b"after-garbage-%d" % n for n in range(len(blobs)))}
    held = set().union(*(inventory_keys(n.service, epoch) for n in node_records(c)))
    deadline = time.monotonic() + 10
    while not written <= held and time.monotonic() < deadline:
        time.sleep(0.1)
        held = set().union(*(inventory_keys(n.service, epoch) for n in node_records(c)))
    assert written <= held, sorted(written - held)
    no_traceback(c)


def test_garbage_at_the_master_fast_port(
        served: tuple[Cluster, KVStoreClient, dict[bytes, bytes]]) -> None:
    c, _client, values = served
    fast = leader(c).fast
    assert fast
    blobs = raw_garbage(5) + http2_garbage(b"/kvstore.v1.Master/Exists", 6)
    with KVStoreClient(etcd=c.etcd, same_host=False, timeout=10) as fast_client:
        for n, blob in enumerate(blobs):
            send(fast, blob)
            still_serves(c, fast_client, values, n)
        slow = hold_open(fast, 50, b"\x00\x00")
        try:
            still_serves(c, fast_client, values, len(blobs))
        finally:
            for s in slow:
                s.close()
    no_traceback(c)


def test_random_bytes_at_a_store_node_transfer_engine_ports(
        served: tuple[Cluster, KVStoreClient, dict[bytes, bytes]]) -> None:
    """The data plane: the engine's handshake port (the segment name's port) and its TCP
    transport port. Random bytes there must not take the node down (the engine checks
    remote-supplied addresses against registered memory)."""
    c, _client, values = served
    node = node_records(c)[0]
    proc = next(p for p in c.stores if str(node.pid) == str(p.popen.pid))
    found = re.search(r"TcpTransport: listen on port (\d+)", proc.log.read_text(errors="replace"))
    assert found, "the store node's log does not name its Transfer Engine TCP port"
    host, handshake = split_address(node.segment)
    rng = random.Random(7)
    with KVStoreClient(etcd=c.etcd, same_host=False, timeout=10) as te_client:
        for n, port in enumerate([handshake, int(found.group(1))] * 15):
            send(f"{host}:{port}", rng.randbytes(rng.choice([1, 8, 64, 4096, 65536])))
            assert proc.alive(), c.logs()
            still_serves(c, te_client, values, n)
    no_traceback(c)
