"""The fast channel's server and clients in one process, over loopback.

The server runs a real `MasterService` (core, metrics, leadership check) on an event
loop in a background thread; the tests call it through the blocking and the asyncio
channels and through raw sockets.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kvstore.addresses import join_address, split_address
from kvstore.errors import Code, InvalidArgument
from kvstore.master.core import CoreConfig, MasterCore, MonotonicClock
from kvstore.master.metrics import MasterMetrics
from kvstore.master.service import MasterService
from kvstore.rpc import AsyncFastChannel, FastChannel, FastServer
from kvstore.rpc.framing import (
    HEADER,
    HEADER_SIZE,
    REPLY_ERROR,
    REPLY_OK,
    FrameDecoder,
    encode,
)
from kvstore.rpc.methods import METHODS
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from tests.unit.polling import wait_until, wait_until_async


@dataclass
class FakeLeadership:
    is_leader: bool = True
    epoch: int = 7
    leader_address: str = "10.0.0.1:50051"


@dataclass
class Served:
    address: str
    server: FastServer
    service: MasterService
    leadership: FakeLeadership
    loop: asyncio.AbstractEventLoop

    def on_loop(self, fn: Any) -> Any:
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":  # what the master runs on
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


@pytest.fixture(params=["uvloop", "asyncio"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    core = MasterCore(CoreConfig(), MonotonicClock())
    core.mount_segment("n0", "127.0.0.1:15000", 1 << 32, 64 << 20)
    leadership = FakeLeadership()
    service = MasterService(core, leadership, MasterMetrics())
    server = FastServer(service.handle, max_frame=1 << 20)
    loop = new_loop(request.param)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    address = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1:0"), loop).result(5)
    try:
        yield Served(address, server, service, leadership, loop)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def run_on(served: Served, main: Any) -> None:
    """Run the client side on the same kind of loop as the server (a loop of its own)."""
    loop = new_loop("uvloop" if "uvloop" in type(served.loop).__module__ else "asyncio")
    try:
        loop.run_until_complete(main)
    finally:
        loop.close()


def put(ch: FastChannel, keys: list[bytes]) -> None:
    r: Any = ch.call("PutStart", pb.PutStartRequest(keys=keys, sizes=[100] * len(keys),
                                                     checksums=[1] * len(keys)), 5)
    assert [i.code for i in r.items] == [0] * len(keys)
    r = ch.call("PutEnd", pb.KeysRequest(keys=keys), 5)
    assert list(r.codes) == [0] * len(keys)


def raw_connection(address: str) -> socket.socket:
    sock = socket.create_connection(split_address(address), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_frames(sock: socket.socket, n: int) -> list[tuple[int, int, bytes]]:
    d = FrameDecoder()
    got: list[tuple[int, int, bytes]] = []
    while len(got) < n:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        got += d.feed(chunk)
    return got


def test_addresses() -> None:
    assert split_address("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert split_address("[::1]:7") == ("::1", 7)
    assert join_address("::1", 7) == "[::1]:7"
    with pytest.raises(ValueError):
        split_address("nohost")


def test_calls_reach_the_same_handler_as_grpc(served: Served) -> None:
    ch = FastChannel(served.address)
    keys = [b"a", b"b", b"c"]
    put(ch, keys)
    r: Any = ch.call("Exists", pb.KeysRequest(keys=[b"a", b"zz", b"c"]), 5)
    assert list(r.exists) == [True, False, True] and r.epoch == 7
    lease: Any = ch.call("Lookup", pb.LookupRequest(keys=[*keys, b"zz"], holder="t"), 5)
    assert lease.count == 3 and lease.lease_id
    direct: Any = served.on_loop(lambda: served.service.handle(
        "Exists", pb.KeysRequest(keys=[b"a", b"zz", b"c"])))
    assert direct == r
    assert ch.connects == 1
    ch.close()


def test_typed_errors_travel_in_the_reply(served: Served) -> None:
    ch = FastChannel(served.address)
    r: Any = ch.call("RenewLease", pb.RenewLeaseRequest(lease_id=12345), 5)
    assert r.error.code == Code.LEASE_NOT_FOUND and r.epoch == 7
    served.leadership.is_leader = False
    r = ch.call("Exists", pb.KeysRequest(keys=[b"a"]), 5)
    assert r.error.code == Code.NOT_LEADER and "10.0.0.1:50051" in r.error.message
    ch.close()


def test_metrics_count_fast_calls(served: Served) -> None:
    ch = FastChannel(served.address)
    ch.call("Exists", pb.KeysRequest(keys=[b"a"]), 5)
    ch.call("RenewLease", pb.RenewLeaseRequest(lease_id=1), 5)
    reg = served.service.metrics.registry
    assert reg.get_sample_value("kvstore_master_rpc_seconds_count", {"method": "Exists"}) == 1
    assert reg.get_sample_value("kvstore_master_rpc_errors_total",
                                {"method": "RenewLease", "code": "LEASE_NOT_FOUND"}) == 1
    ch.close()


def test_unknown_method_id_gets_a_typed_error_reply(served: Served) -> None:
    bad = next(i for i in range(1, 1 << 16) if i not in {m.id for m in METHODS.values()})
    with raw_connection(served.address) as sock:
        sock.sendall(encode(99, bad, b"whatever") + encode(100, METHODS["Exists"].id,
                                                           pb.KeysRequest(keys=[b"k"]).SerializeToString()))
        (rid, tag, body), (rid2, tag2, body2) = read_frames(sock, 2)
    assert (rid, tag) == (99, REPLY_ERROR)
    err = cpb.Error.FromString(body)
    assert err.code == Code.INVALID_ARGUMENT and f"method id {bad}" in err.message
    assert (rid2, tag2) == (100, REPLY_OK)  # the connection keeps serving
    assert list(pb.ExistsResponse.FromString(body2).exists) == [False]


def test_unknown_method_raises_typed_error_in_the_client(served: Served,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import kvstore.rpc.client as client_mod
    from kvstore.rpc.methods import Method

    fake = dict(METHODS)
    fake["Nope"] = Method("Nope", 1, pb.KeysRequest, pb.KeysRequest)
    monkeypatch.setattr(client_mod, "METHODS", fake)
    ch = FastChannel(served.address)
    with pytest.raises(InvalidArgument, match="names no RPC"):
        ch.call("Nope", pb.KeysRequest(), 5)
    ch.close()


def test_unparsable_payload_gets_a_typed_error_reply(served: Served) -> None:
    with raw_connection(served.address) as sock:
        sock.sendall(encode(5, METHODS["Lookup"].id, b"\xff\xff\xff\xff"))
        [(rid, tag, body)] = read_frames(sock, 1)
    assert (rid, tag) == (5, REPLY_ERROR)
    assert "not a kvstore.v1.LookupRequest" in cpb.Error.FromString(body).message


def test_pipelined_requests_on_one_connection(served: Served) -> None:
    put(FastChannel(served.address), [b"p0", b"p2"])
    exists = METHODS["Exists"].id
    with raw_connection(served.address) as sock:
        sock.sendall(b"".join(
            encode(1000 + i, exists, pb.KeysRequest(keys=[b"p%d" % i]).SerializeToString())
            for i in range(50)))
        got = read_frames(sock, 50)
    assert [rid for rid, _, _ in got] == [1000 + i for i in range(50)]
    assert [list(pb.ExistsResponse.FromString(b).exists) for _, _, b in got] == \
        [[i in (0, 2)] for i in range(50)]


def test_garbage_and_oversized_frames_close_only_that_connection(served: Served) -> None:
    ch = FastChannel(served.address)
    for garbage in (b"\xff" * 64, b"GET / HTTP/1.1\r\n\r\n", HEADER.pack(2 << 20, 1, 1)):
        with raw_connection(served.address) as sock:
            sock.sendall(garbage)
            assert sock.recv(100) == b""  # closed by the server
        r: Any = ch.call("Exists", pb.KeysRequest(keys=[b"x"]), 5)
        assert list(r.exists) == [False]
    assert ch.connects == 1
    ch.close()


def test_one_way_requests_get_no_reply(served: Served) -> None:
    ch = FastChannel(served.address)
    put(ch, [b"ow"])
    lease: Any = ch.call("Lookup", pb.LookupRequest(keys=[b"ow"], holder="t"), 5)
    assert ch.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease.lease_id), 5)
    # The next call's reply is the very next frame: nothing came back for the one-way.
    r: Any = ch.call("RenewLease", pb.RenewLeaseRequest(lease_id=lease.lease_id), 5)
    assert r.error.code == Code.LEASE_NOT_FOUND
    with raw_connection(served.address) as sock:  # even a failing one-way stays silent
        sock.sendall(encode(0, 1, b"junk") + encode(3, METHODS["Exists"].id, b""))
        assert [rid for rid, _, _ in read_frames(sock, 1)] == [3]
    ch.close()


def test_a_lone_one_way_request_still_arrives(served: Served) -> None:
    # Queued with MSG_MORE, it waits for the next call, but not forever: the kernel sends
    # it on its own within ~200 ms.
    ch = FastChannel(served.address)
    put(ch, [b"lone"])
    lease: Any = ch.call("Lookup", pb.LookupRequest(keys=[b"lone"], holder="t"), 5)
    active = lambda: served.on_loop(lambda: served.service.core.stats().active_leases)  # noqa: E731
    assert active() == 1
    assert ch.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease.lease_id), 5)
    # Nothing is sent after it: left queued, it would never arrive.
    wait_until(lambda: active() == 0, what="the lone one-way release reached the master")
    ch.close()


def test_sync_channel_reconnects_after_the_server_drops_it(served: Served) -> None:
    ch = FastChannel(served.address)
    ch.call("Exists", pb.KeysRequest(keys=[b"x"]), 5)
    served.on_loop(lambda: [c.close() for c in list(served.server._connections)])
    wait_until(lambda: served.on_loop(lambda: served.server.connections) == 0,
               what="the server closed its end")
    with pytest.raises(OSError):
        ch.call("Exists", pb.KeysRequest(keys=[b"x"]), 5)
    assert not ch.connected
    ch.call("Exists", pb.KeysRequest(keys=[b"x"]), 5)
    assert ch.connects == 2
    ch.close()


def test_sync_channel_times_out_and_refused_is_oserror() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    address = join_address("127.0.0.1", listener.getsockname()[1])
    ch = FastChannel(address)
    t0 = time.monotonic()
    # The listener never answers: a call that did not apply its timeout would hang here
    # (until pytest's own timeout) instead of raising.
    with pytest.raises(TimeoutError):
        ch.call("Exists", pb.KeysRequest(keys=[b"x"]), 0.2)
    assert time.monotonic() - t0 > 0.15  # it waited for a reply, until the timeout
    assert not ch.connected
    listener.close()
    with pytest.raises(OSError):
        FastChannel(address).call("Exists", pb.KeysRequest(), 1)


def test_large_replies_arrive_whole(served: Served) -> None:
    ch = FastChannel(served.address)
    keys = [b"big-%05d" % i for i in range(4000)]
    for lo in range(0, len(keys), 1000):
        put(ch, keys[lo:lo + 1000])
    r: Any = ch.call("GetReplicas", pb.GetReplicasRequest(keys=keys, holder="t"), 5)
    assert len(r.items) == 4000 and r.ByteSize() > HEADER_SIZE + (1 << 16)
    ch.close()


def test_async_channel_multiplexes_concurrent_calls(served: Served) -> None:
    put(FastChannel(served.address), [b"m%d" % i for i in range(0, 101, 2)])

    async def main() -> None:
        ch = AsyncFastChannel(served.address)
        replies = await asyncio.gather(*(
            ch.call("Exists", pb.KeysRequest(keys=[b"m%d" % i, b"m%d" % (i + 1)]), 5)
            for i in range(100)))
        assert [list(r.exists) for r in replies] == [[i % 2 == 0, i % 2 == 1] for i in range(100)]
        assert ch.connects == 1
        assert ch.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=1))
        r: Any = await ch.call("Exists", pb.KeysRequest(keys=[b"m0"]), 5)
        assert list(r.exists) == [True]
        await ch.close()

    run_on(served, main())
    assert served.server.accepted == 2  # the put's channel and the async one


def test_async_channel_timeout_and_lost_connection(served: Served) -> None:
    async def main() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        silent = AsyncFastChannel(join_address("127.0.0.1", listener.getsockname()[1]))
        with pytest.raises(TimeoutError):
            await silent.call("Exists", pb.KeysRequest(), 0.1)
        listener.close()
        await silent.close()

        ch = AsyncFastChannel(served.address)
        await ch.call("Exists", pb.KeysRequest(), 5)
        served.on_loop(lambda: [c.close() for c in list(served.server._connections)])
        await wait_until_async(lambda: not ch.connected, what="the client saw the close")
        r: Any = await ch.call("Exists", pb.KeysRequest(keys=[b"q"]), 5)  # reconnects
        assert list(r.exists) == [False] and ch.connects == 2
        await ch.close()

    run_on(served, main())


def test_ask_then_answer_is_a_call_in_two_halves(served: Served) -> None:
    ch = FastChannel(served.address)
    put(ch, [b"a"])
    asked = ch.ask("GetReplicas", pb.GetReplicasRequest(keys=[b"a"]), 5)
    # the master answers while the caller does something else; a one-way frame may go out
    # in between (it gets no reply, so it cannot be mistaken for this one's)
    ch.send_oneway("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=12345), 5)
    reply: Any = ch.answer(asked)
    assert reply.items[0].code == 0 and reply.items[0].placement > 0 and reply.lease_id
    assert reply.items[0].locations[0].addr >= 1 << 32
    # the connection is in step afterwards: the next call gets its own reply
    again: Any = ch.call("GetReplicas", pb.GetReplicasRequest(keys=[b"a"]), 5)
    assert again.items[0].placement == reply.items[0].placement
    assert again.lease_id != reply.lease_id
    ch.close()


def test_ready_says_whether_the_reply_is_there_without_waiting(served: Served) -> None:
    gate = threading.Event()
    real = served.server.handle

    def held(method: str, request: Any, caller: Any) -> Any:
        if method == "Exists":
            gate.wait(600)  # the master is busy: the reply cannot have come yet
        return real(method, request, caller)

    served.server.handle = held  # connections made from now on call it
    ch = FastChannel(served.address)
    put(ch, [b"r"])
    try:
        # A poll, not a wait: the reply comes only once the gate opens, and the call's
        # own deadline is 10 minutes away; a ready() that waited for either would hang
        # here until pytest's timeout (or return True once the reply came).
        asked = ch.ask("Exists", pb.KeysRequest(keys=[b"r"]), 600)
        assert not ch.ready(asked)
        gate.set()
        wait_until(lambda: ch.ready(asked), what="ready() once the reply came")
        assert list(ch.answer(asked).exists) == [True]  # type: ignore[attr-defined]
    finally:
        gate.set()
        served.server.handle = real
    # A connection gone under the caller is "ready": answer reports it at once.
    asked = ch.ask("Exists", pb.KeysRequest(keys=[b"r"]), 5)
    ch.close()
    assert ch.ready(asked)
    with pytest.raises(ConnectionError):
        ch.answer(asked)
    ch.close()


def count_polls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one on each reply poll (select) of the fast channel."""
    import kvstore.rpc.client as rpc_client

    polls: list[int] = []
    real_select = rpc_client.select.select

    def counted(*args: Any) -> Any:
        polls.append(1)
        return real_select(*args)

    monkeypatch.setattr(rpc_client.select, "select", counted)
    return polls


def hold_exists(served: Served, gate: threading.Event,
                which: Any = lambda request: True) -> Any:
    """Make the server answer the Exists calls `which` picks only once `gate` is set;
    returns the real handler, to put back."""
    real = served.server.handle

    def held(method: str, request: Any, caller: Any) -> Any:
        if method == "Exists" and which(request):
            gate.wait(5)
        return real(method, request, caller)

    served.server.handle = held
    return real


def test_a_spinning_channel_polls_for_the_reply_then_sleeps(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    polls = count_polls(monkeypatch)
    gate = threading.Event()
    real = hold_exists(served, gate)
    gate.set()
    try:
        quiet = FastChannel(served.address)
        put(quiet, [b"s"])
        polls.clear()
        assert list(quiet.call("Exists", pb.KeysRequest(keys=[b"s"]), 5).exists) == [True]  # type: ignore[attr-defined]
        assert polls == []  # spin=0: straight to recv

        spinning = FastChannel(served.address, spin=0.02)
        spinning.call("Exists", pb.KeysRequest(keys=[b"s"]), 5)  # connected
        gate.clear()
        polls.clear()
        threading.Timer(0.15, gate.set).start()  # the reply comes after the spin gave up
        t0 = time.monotonic()
        reply: Any = spinning.call("Exists", pb.KeysRequest(keys=[b"s"]), 5)
        assert list(reply.exists) == [True] and time.monotonic() - t0 >= 0.1
        assert len(polls) > 10  # it polled, then slept in recv until the reply came
        polls.clear()
        assert list(spinning.call("Exists", pb.KeysRequest(keys=[b"s"]), 5).exists) == [True]  # type: ignore[attr-defined]
        assert polls  # a prompt reply: found by the poll
        # A caller whose transfers are moving asks with spin=False: never polled for.
        gate.clear()
        polls.clear()
        threading.Timer(0.05, gate.set).start()
        asked = spinning.ask("Exists", pb.KeysRequest(keys=[b"s"]), 5)
        assert list(spinning.answer(asked, spin=False).exists) == [True]  # type: ignore[attr-defined]
        assert list(spinning.call("Exists", pb.KeysRequest(keys=[b"s"]), 5,
                                  spin=False).exists) == [True]  # type: ignore[attr-defined]
        assert polls == []
        quiet.close()
        spinning.close()
    finally:
        served.server.handle = real


def test_a_kind_of_request_answered_late_is_waited_for_asleep(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling pays only for a reply that comes within the spin: a kind of request
    (method and size) whose replies keep coming later stops polling, other kinds poll
    on, and it polls again once its replies come promptly."""
    import kvstore.rpc.client as rpc_client

    polls = count_polls(monkeypatch)
    gate = threading.Event()
    gate.set()
    real = hold_exists(served, gate, lambda request: len(request.keys) == 1)
    ch = FastChannel(served.address, spin=0.005)
    try:
        put(ch, [b"s"])
        one, many = pb.KeysRequest(keys=[b"s"]), pb.KeysRequest(keys=[b"s"] * 40)
        gate.clear()
        late = 0
        while ch.guide.polls(rpc_client.SpinGuide.kind(METHODS["Exists"].id,
                                                       one.ByteSize())):
            threading.Timer(0.03, gate.set).start()  # after the spin gave up
            assert list(ch.call("Exists", one, 5).exists) == [True]  # type: ignore[attr-defined]
            gate.clear()
            late += 1
            assert late < 20
        assert late > 1  # one late reply is not enough to stop polling
        polls.clear()
        threading.Timer(0.03, gate.set).start()
        assert list(ch.call("Exists", one, 5).exists) == [True]  # type: ignore[attr-defined]
        assert polls == []  # slept in recv at once
        polls.clear()
        assert len(ch.call("Exists", many, 5).exists) == 40  # type: ignore[attr-defined]
        assert polls  # another size: still polled for
        gate.set()
        for _ in range(3):  # prompt replies again (found asleep as well)
            ch.call("Exists", one, 5)
        polls.clear()
        ch.call("Exists", one, 5)
        assert polls  # polled for again
    finally:
        gate.set()
        served.server.handle = real
        ch.close()


def test_an_unpinned_get_replicas_grants_no_lease(served: Served) -> None:
    ch = FastChannel(served.address)
    put(ch, [b"u"])
    pinned: Any = ch.call("GetReplicas", pb.GetReplicasRequest(keys=[b"u"]), 5)
    free: Any = ch.call("GetReplicas", pb.GetReplicasRequest(keys=[b"u"], unpinned=True), 5)
    assert pinned.lease_id and pinned.ttl_remaining > 0
    assert (free.lease_id, free.ttl_remaining) == (0, 0.0)
    assert free.items == pinned.items and free.epoch == 7
    ch.close()


def test_several_asks_are_answered_in_the_order_asked(served: Served) -> None:
    # What the client does with a Later call still unread: it sends the next request,
    # then reads the earlier reply, then its own (the master answers in order).
    ch = FastChannel(served.address)
    put(ch, [b"x"])
    first = ch.ask("Exists", pb.KeysRequest(keys=[b"x", b"nope"]), 5)
    second = ch.ask("GetReplicas", pb.GetReplicasRequest(keys=[b"x"]), 5)
    a: Any = ch.answer(first)
    b: Any = ch.answer(second)
    assert list(a.exists) == [True, False] and b.items[0].code == 0 and b.lease_id
    # Out of order is a protocol violation: the connection is dropped, not misread.
    third = ch.ask("Exists", pb.KeysRequest(keys=[b"x"]), 5)
    fourth = ch.ask("Exists", pb.KeysRequest(keys=[b"nope"]), 5)
    with pytest.raises(ConnectionError):
        ch.answer(fourth)
    with pytest.raises(ConnectionError):
        ch.answer(third)
    again: Any = ch.call("Exists", pb.KeysRequest(keys=[b"x"]), 5)
    assert list(again.exists) == [True]
    ch.close()


def test_an_answer_whose_connection_closed_raises_and_the_next_call_reconnects(
        served: Served) -> None:
    ch = FastChannel(served.address)
    put(ch, [b"b"])
    asked = ch.ask("Exists", pb.KeysRequest(keys=[b"b"]), 5)
    ch.close()
    with pytest.raises(ConnectionError):
        ch.answer(asked)
    reply: Any = ch.call("Exists", pb.KeysRequest(keys=[b"b"]), 5)
    assert list(reply.exists) == [True] and ch.connects == 2
    ch.close()
