"""The client's data path against an in-memory master and store node.

The flows (flows.py, puts.py, gets.py) and both drivers run for real; only the master (its replies), the
Transfer Engine and the node's memory are fakes, so the pipelining, the per-piece
verification and the "nothing still moves when the call returns" rule are tested
deterministically, without processes or sockets.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvstore.checksum import checksum
from kvstore.errors import Code, CorruptObject, LeaseExpired, NotFound, Unavailable
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore_client import AsyncKVStoreClient, KVStoreClient, datapath, placements
from kvstore_client.datapath import Xfer
from kvstore_client.local import LocalSegment
from kvstore_client.ops import Sleep
from kvstore_client.staging import Staging
from kvstore_client.state import ClientState

KiB = 1 << 10
SEGMENT, NODE = "127.0.0.1:1", "node-a"


class FakeNode:
    """A store node's segment: plain memory the fake engine copies to and from."""

    def __init__(self, size: int = 4 << 20) -> None:
        self.mem = np.zeros(size, dtype=np.uint8)
        self.base = int(self.mem.ctypes.data)
        self.next = 0

    def allocate(self, size: int) -> int:
        addr = self.base + self.next
        self.next += (size + 63) & ~63
        return addr

    def byte(self, addr: int) -> int:
        return int(self.mem[addr - self.base])

    def flip(self, addr: int) -> None:
        self.mem[addr - self.base] ^= 0xFF


class FakeTransfer:
    """The Transfer Engine's client side: bytes land when a transfer completes, after
    `polls` status checks (random per transfer when `shuffle`)."""

    timeout = None  # no probing: every node answers
    batch_timeout = 30.0

    def __init__(self, trace: list[tuple[Any, ...]]) -> None:
        self.trace = trace
        self.moving: dict[int, tuple[int, int, int, bool, int]] = {}
        self.ids = itertools.count(1)
        self.polls = 1
        self.rng: random.Random | None = None
        self.fail_remote: set[int] = set()  # transfers touching these addresses fail
        self.hang = False
        self.blocking_calls = 0

    def ready(self, segment: str) -> bool:
        return True

    def register(self, addr: int, length: int) -> None:
        pass

    def unregister(self, addr: int) -> None:
        pass

    def _copy(self, local: int, remote: int, n: int, write: bool) -> None:
        if write:
            ctypes.memmove(remote, local, n)
        else:
            ctypes.memmove(local, remote, n)

    def _fails(self, remote: int, n: int) -> bool:
        return any(remote <= a < remote + n for a in self.fail_remote)

    def read(self, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> None:
        self._blocking(local, remote, lengths, write=False)

    def write(self, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> None:
        self._blocking(local, remote, lengths, write=True)

    def _blocking(self, local: list[int], remote: list[int], lengths: list[int],
                  write: bool) -> None:
        self.blocking_calls += 1
        if any(self._fails(r, n) for r, n in zip(remote, lengths, strict=True)):
            raise Unavailable("node down (fake)")
        for a, r, n in zip(local, remote, lengths, strict=True):
            self._copy(a, r, n, write)

    def start(self, segment: str, local: int, remote: int, length: int, write: bool) -> int:
        tid = next(self.ids)
        polls = self.rng.randint(0, 3) if self.rng else self.polls
        self.moving[tid] = (local, remote, length, write, polls)
        self.trace.append(("start", tid))
        return tid

    def status(self, tid: int) -> int:
        local, remote, n, write, polls = self.moving[tid]
        if self.hang:
            return 0
        if polls > 0:
            self.moving[tid] = (local, remote, n, write, polls - 1)
            return 0
        del self.moving[tid]
        self.trace.append(("done", tid))
        if self._fails(remote, n):
            return -1
        self._copy(local, remote, n, write)
        return 1

    def close(self) -> None:
        pass


class FakeLocal:
    """No same-host segment (everything goes through the fake engine), or with `segment`
    set, the node's memory mapped here: memcpy."""

    segment: LocalSegment | None = None

    def get(self, segment: str, node_id: str) -> LocalSegment | None:
        return self.segment

    def forget(self, segment: str, node_id: str) -> None:
        pass

    def close(self) -> None:
        pass


class FakeMaster:
    """Answers the control calls the data path makes, and records them."""

    def __init__(self, node: FakeNode, transfer: FakeTransfer,
                 trace: list[tuple[Any, ...]]) -> None:
        self.node = node
        self.transfer = transfer
        self.trace = trace
        self.objects: dict[bytes, tuple[int, int, int]] = {}  # key -> addr, size, checksum
        self.pending: dict[bytes, tuple[int, int, int]] = {}
        # As the real master: each set of ranges gets a placement of its own.
        self.epoch = 1
        self.placement: dict[bytes, int] = {}
        self.placements = itertools.count(1)
        self.leases: dict[int, list[bytes]] = {}
        self.lease_ids = itertools.count(100)
        self.calls: dict[str, int] = {}
        self.fail: set[tuple[str, int]] = set()  # (method, n-th call) that raise Unavailable
        self.ttl = 30.0
        self.moving_at_release: list[int] = []
        self.knows_unpinned = True  # False: a master older than GetReplicas.unpinned
        self.reply_polls = 0  # FakeControl.ready says no this many times per reply
        self.revoked_unsettled: list[bool] = []  # PutRevoke's flag, per call

    def call(self, method: str, request: Any) -> Any:
        n = self.calls[method] = self.calls.get(method, 0) + 1
        self.trace.append(("rpc", method, list(request.keys)))
        if (method, n) in self.fail:
            raise Unavailable(f"{method} failed (fake)")
        return getattr(self, method)(request)

    def PutStart(self, req: pb.PutStartRequest) -> pb.PutStartResponse:
        reply = pb.PutStartResponse()
        for key, size, ck in zip(req.keys, req.sizes, req.checksums, strict=True):
            item = reply.items.add()
            if key in self.objects:
                item.code = Code.ALREADY_EXISTS
                continue
            addr = self.node.allocate(size)
            self.pending[key] = (addr, size, ck)
            item.placement = self.placement[key] = next(self.placements)
            item.locations.append(cpb.Location(node_id=NODE, segment=SEGMENT, addr=addr,
                                               size=size))
        reply.epoch = self.epoch
        return reply

    def PutEnd(self, req: pb.KeysRequest) -> pb.CodesResponse:
        for key in req.keys:
            self.objects[key] = self.pending.pop(key)
        return pb.CodesResponse(codes=[Code.OK] * len(req.keys), epoch=self.epoch)

    def PutRevoke(self, req: pb.KeysRequest) -> pb.CodesResponse:
        self.revoked_unsettled.append(req.unsettled)
        codes = []
        for key in req.keys:
            codes.append(Code.OK if self.pending.pop(key, None) else Code.NOT_FOUND)
        return pb.CodesResponse(codes=codes, epoch=self.epoch)

    def PutCommit(self, req: pb.PutCommitRequest) -> pb.CodesResponse:
        # As the real master: a placeholder this writer started becomes the key.
        codes = []
        for p, key, size, ck in zip(req.placeholders, req.keys, req.sizes, req.checksums,
                                    strict=True):
            if p not in self.pending:
                codes.append(Code.NOT_FOUND)
            elif key in self.objects or key in self.pending:
                codes.append(Code.ALREADY_EXISTS if key in self.objects else Code.IN_PROGRESS)
            elif self.pending[p][1] != size:
                codes.append(Code.INVALID_ARGUMENT)
            else:
                addr, _, _ = self.pending.pop(p)
                self.objects[key] = (addr, size, ck)
                self.placement[key] = self.placement.pop(p)
                codes.append(Code.OK)
        return pb.CodesResponse(codes=codes, epoch=self.epoch)

    def GetReplicas(self, req: pb.GetReplicasRequest) -> pb.GetReplicasResponse:
        reply = pb.GetReplicasResponse(ttl_remaining=self.ttl, epoch=self.epoch)
        found = []
        for key in req.keys:
            item = reply.items.add()
            if key not in self.objects or (req.lease_id and key not in self.leases[req.lease_id]):
                item.code = Code.NOT_FOUND
                continue
            addr, size, ck = self.objects[key]
            item.size, item.checksum = size, ck
            item.placement = self.placement[key]
            item.locations.append(cpb.Location(node_id=NODE, segment=SEGMENT, addr=addr,
                                               size=size))
            found.append(key)
        if req.lease_id:
            reply.lease_id = req.lease_id
        elif found and not (req.unpinned and self.knows_unpinned):
            reply.lease_id = next(self.lease_ids)
            self.leases[reply.lease_id] = found
        return reply

    def release(self, lease_id: int) -> None:
        self.trace.append(("release", lease_id))
        self.moving_at_release.append(len(self.transfer.moving))
        self.leases.pop(lease_id, None)


def io(fn: Any) -> Any:
    """`fn` as a generator function that yields nothing: a seam of the shared client
    layer (session.py), answered in place."""

    def steps(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
        yield

    return steps


class Rig:
    def __init__(self) -> None:
        self.trace: list[tuple[Any, ...]] = []
        self.node = FakeNode()
        self.transfer = FakeTransfer(self.trace)
        self.master = FakeMaster(self.node, self.transfer, self.trace)
        self.local = FakeLocal()
        self.state = ClientState(self.transfer, Staging(self.transfer, 1 << 20),  # type: ignore[arg-type]
                                 self.local, "writer-1", 0)  # type: ignore[arg-type]
        self.client = KVStoreClient.__new__(KVStoreClient)
        self.client._state = self.state
        # The shared layer's seams (session.py) are generators of I/O steps; these answer
        # at once, with no step.
        self.client._rpc = io(self.call)  # type: ignore[method-assign]
        self.client._ask = io(self.ask)  # type: ignore[method-assign]
        self.client._answer = io(self.answer)  # type: ignore[method-assign]
        self.client._release = io(self.master.release)  # type: ignore[method-assign]
        # No control channel: single gets run the flow too (quick.py has its own tests).
        self.client._control = None
        self.client._later = {}

        # Per control reply waited for: (method or "answer", whether it may be polled for).
        self.spins: list[tuple[str, bool]] = []

    def call(self, method: str, request: Any, spin: bool = True) -> Any:
        self.spins.append((method, spin))
        return self.master.call(method, request)

    # The master answers when asked (as a real one does when the request arrives); the
    # client reads the reply later.
    def ask(self, method: str, request: Any) -> Any:
        self.trace.append(("ask", method))
        return self.master.call(method, request)

    def answer(self, reply: Any, spin: bool = True) -> Any:
        self.trace.append(("answer",))
        self.spins.append(("answer", spin))
        return reply

    def rpcs(self) -> list[str]:
        return [e[1] for e in self.trace if e[0] == "rpc"]


def small_thresholds(monkeypatch: pytest.MonkeyPatch, sync_max: int = 2 * KiB) -> None:
    """Thresholds small enough that a few KiB exercise pieces, polling and pipelining."""
    monkeypatch.setattr(datapath, "SYNC_MAX", sync_max)
    monkeypatch.setattr(datapath, "PIECE", 4 * KiB)
    monkeypatch.setattr(datapath, "PIPELINE_MIN", 16 * KiB)
    monkeypatch.setattr(datapath, "POLL_MIN", 1e-5)
    monkeypatch.setattr(datapath, "POLL_MAX", 1e-4)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    small_thresholds(monkeypatch)
    yield Rig()


class FakeControl:
    """The sync driver's control channel, answered by the fake master: a request is
    answered when it arrives, its reply read when the driver asks for it."""

    transport = "fast"
    address = "fake-master"

    def __init__(self, master: Any) -> None:
        self.master = master
        self.spins: list[tuple[str, bool]] = []  # per reply waited for: may it be polled for?

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> Any:
        self.spins.append((method, spin))
        return self.master.call(method, request)

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        self.master.trace.append(("asked", method))
        try:
            return self.master.call(method, request)
        except Unavailable as exc:
            return exc

    def answer(self, asked: Any, method: str, spin: bool = True) -> Any:
        self.spins.append((method, spin))
        if isinstance(asked, Unavailable):
            raise asked
        return asked

    def ready(self, asked: Any) -> bool:
        m = self.master
        m.trace.append(("ready?",))
        if m.reply_polls > 0:  # the reply is still on its way
            m.reply_polls -= 1
            return False
        return True

    def release(self, lease_id: int, timeout: float) -> None:
        self.master.release(lease_id)

    def close(self) -> None:
        pass


class DriverRig(Rig):
    """The data-path Rig with the real synchronous driver and a control channel."""

    def __init__(self) -> None:
        super().__init__()
        c = self.client
        for patched in ("_rpc", "_ask", "_answer", "_release"):
            delattr(c, patched)
        c._control = FakeControl(self.master)  # type: ignore[assignment]
        c.timeout = 5.0
        c._later = {}
        c.master_address = FakeControl.address

    def put(self, key: bytes, value: bytes) -> None:
        assert self.client.put_many([key], [value]) == [None]
        self.trace.clear()

    def kinds(self) -> list[str]:
        return [e[0] for e in self.trace]


def _values(n: int, size: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(n)]


def _buffers(rig: Rig, values: list[bytes], size: int) -> tuple[np.ndarray, np.ndarray]:
    src = np.frombuffer(b"".join(values), dtype=np.uint8).copy()
    dst = np.zeros(len(values) * size, dtype=np.uint8)
    rig.client.register(src)
    rig.client.register(dst)
    return src, dst


def _slices(buf: np.ndarray, n: int, size: int) -> list[np.ndarray]:
    return [buf[i * size:(i + 1) * size] for i in range(n)]


# -- pure helpers ------------------------------------------------------------------------


def test_pieces_merge_adjacent_transfers_and_cut_large_ones() -> None:
    a = Xfer(1000, 5000, 100)
    b = Xfer(1100, 5100, 100)   # adjacent to a on both sides
    c = Xfer(1200, 9000, 100)   # adjacent here, not on the node
    d = Xfer(2000, 9100, 250)   # larger than a piece
    got = datapath.pieces([a, b, c, d], piece=200)
    assert [(lo, r, n, len(xs)) for lo, r, n, xs in got] == [
        (1000, 5000, 200, 2), (1200, 9000, 100, 1),
        (2000, 9100, 200, 1), (2200, 9300, 50, 1)]
    assert (a.left, b.left, c.left, d.left) == (1, 1, 1, 2)
    # a run never grows past one piece
    runs = datapath.pieces([Xfer(i * 10, i * 10, 10) for i in range(7)], piece=30)
    assert [n for _, _, n, _ in runs] == [30, 30, 10]


def test_groups_split_in_order_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datapath, "PIPELINE_MIN", 100)
    monkeypatch.setattr(datapath, "PIPELINE_GROUPS", 4)
    assert datapath.groups([50] * 3) == [(0, 3)]            # under 2 x PIPELINE_MIN: one group
    assert datapath.groups([100] * 8) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert datapath.groups([100] * 3) == [(0, 1), (1, 2), (2, 3)]
    assert datapath.groups([1000, 1, 1, 1]) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    for sizes in ([7, 300, 5, 90, 400, 2, 2], [100] * 33, [250, 250]):
        got = datapath.groups(sizes)
        assert got[0][0] == 0 and got[-1][1] == len(sizes)
        assert all(lo < hi for lo, hi in got)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(got))


# -- pipelined puts and gets -----------------------------------------------------------------


def test_large_batch_round_trip_is_pipelined(rig: Rig) -> None:
    n, size = 8, 8 * KiB  # 64 KiB: 4 groups of 2 objects, each object in 2 pieces
    keys = [f"k{i}".encode() for i in range(n)]
    values = _values(n, size)
    src, dst = _buffers(rig, values, size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    # The next group's PutStart goes out before the previous group's PutEnd: control
    # calls overlap transfers.
    assert rig.rpcs() == ["PutStart", "PutStart", "PutEnd", "PutStart", "PutEnd", "PutStart",
                          "PutEnd", "PutEnd"]
    assert all(rig.node.mem[addr - rig.node.base:addr - rig.node.base + sz].tobytes() == values[i]
               for i, (addr, sz, _) in enumerate(rig.master.objects[k] for k in keys))
    rig.trace.clear()
    assert rig.client.get_into(keys, _slices(dst, n, size)) == [None] * n
    assert dst.tobytes() == b"".join(values)
    assert rig.rpcs() == ["GetReplicas"] * 4
    # every short lease is released, and only once nothing is moving any more
    assert [e[0] for e in rig.trace[-4:]] == ["release"] * 4
    assert rig.master.moving_at_release == [0] * 4 and not rig.transfer.moving
    assert rig.client.stats.hits == n and rig.transfer.blocking_calls == 0


def test_replies_are_waited_for_asleep_while_transfers_move(rig: Rig) -> None:
    n, size = 8, 8 * KiB  # 4 pipelined groups, as above
    keys = [f"k{i}".encode() for i in range(n)]
    values = _values(n, size)
    src, dst = _buffers(rig, values, size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    # Only the first PutStart (nothing moving yet) and the last PutEnd (everything in)
    # may poll for their replies; the others wait while a group's bytes move.
    assert rig.spins == [("PutStart", True), ("PutStart", False), ("PutEnd", False),
                         ("PutStart", False), ("PutEnd", False), ("PutStart", False),
                         ("PutEnd", False), ("PutEnd", True)]
    rig.spins.clear()
    # Gets in groups: each group's GetReplicas but the first goes while a group moves.
    assert rig.client.get_into(keys, _slices(dst, n, size)) == [None] * n
    assert dst.tobytes() == b"".join(values)
    assert rig.spins == [("GetReplicas", True)] + [("GetReplicas", False)] * 3


def test_the_driver_hands_the_wait_to_the_control_channel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    small_thresholds(monkeypatch)
    d = DriverRig()
    n, size = 8, 8 * KiB
    keys = [f"k{i}".encode() for i in range(n)]
    values = _values(n, size)
    src, _ = _buffers(d, values, size)
    assert d.client.put_from(keys, _slices(src, n, size)) == [None] * n
    control: Any = d.client._control
    assert control.spins == [("PutStart", True), ("PutStart", False), ("PutEnd", False),
                             ("PutStart", False), ("PutEnd", False), ("PutStart", False),
                             ("PutEnd", False), ("PutEnd", True)]


def test_an_early_read_waits_for_its_answer_asleep(rig: Rig) -> None:
    keys, values, _, dst = _put_small(rig)
    rig.spins.clear()
    assert rig.client.get_into(keys, _slices(dst, 3, SMALL)) == [None] * 3
    assert dst.tobytes() == b"".join(values)
    assert rig.client.stats.early_reads == 3
    assert rig.spins == [("answer", False)]  # the reads were moving when it was read


def test_pieces_landing_in_any_order_are_each_verified(rig: Rig) -> None:
    rig.transfer.rng = random.Random(5)
    n, size = 12, 6 * KiB
    keys = [f"r{i}".encode() for i in range(n)]
    values = _values(n, size, seed=2)
    src, dst = _buffers(rig, values, size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    assert rig.client.get_into(keys, _slices(dst, n, size)) == [None] * n
    assert dst.tobytes() == b"".join(values)


def test_a_corrupt_byte_in_one_piece_fails_only_its_object(rig: Rig) -> None:
    n, size = 8, 8 * KiB
    keys = [f"c{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=3), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    addr = rig.master.objects[keys[5]][0]
    rig.node.flip(addr + size - 10)  # in the object's second piece
    errs = rig.client.get_into(keys, _slices(dst, n, size))
    assert isinstance(errs[5], CorruptObject)
    assert [e for i, e in enumerate(errs) if i != 5] == [None] * (n - 1)
    assert rig.client.stats.corrupt_reads == 1


def test_a_failed_node_fails_its_group_and_is_not_tried_again(rig: Rig) -> None:
    n, size = 8, 8 * KiB
    keys = [f"f{i}".encode() for i in range(n)]
    src, _ = _buffers(rig, _values(n, size, seed=4), size)
    # The node fails the writes of the third object: its group (objects 2 and 3) fails.
    # Group 3 was already moving meanwhile and lands; group 4 starts after the failure was
    # seen and goes nowhere: the node is given up for the rest of the call.
    rig.transfer.fail_remote = {rig.node.base + 2 * size + 100}
    errs = rig.client.put_from(keys, _slices(src, n, size))
    # A failure after the bytes were sent is unsettled (they may still land): the
    # revoke says so, and the master holds the space until its put timeout.
    assert [type(e).__name__ if e else None for e in errs] == \
        [None, None, "Unsettled", "Unsettled", None, None, "Unsettled", "Unsettled"]
    assert all(isinstance(e, Unavailable) for e in errs if e)
    revoked = [e[2] for e in rig.trace if e[:2] == ("rpc", "PutRevoke")]
    assert revoked == [[keys[2], keys[3]], [keys[6], keys[7]]]
    assert rig.master.revoked_unsettled == [True, True]
    assert sorted(rig.master.objects) == sorted(keys[:2] + keys[4:6])
    assert sum(e[0] == "start" for e in rig.trace) == 3 * 2 * 2  # 3 groups x 2 objects x 2 pieces
    assert not rig.master.pending and not rig.transfer.moving


def test_a_control_failure_mid_pipeline_waits_for_what_moves(rig: Rig) -> None:
    n, size = 8, 8 * KiB
    keys = [f"m{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=6), size)
    rig.transfer.polls = 3
    rig.master.calls.clear()
    rig.master.fail = {("PutStart", 2)}
    with pytest.raises(Unavailable):
        rig.client.put_from(keys, _slices(src, n, size))
    assert not rig.transfer.moving  # group 1's bytes were in before the call ended
    rig.master.fail = set()
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.master.calls.clear()
    rig.master.fail = {("GetReplicas", 2)}
    rig.trace.clear()
    with pytest.raises(Unavailable):
        rig.client.get_into(keys, _slices(dst, n, size))
    # group 1's lease is released, but only after its bytes stopped moving
    assert [e[0] for e in rig.trace if e[0] == "release"] == ["release"]
    assert rig.master.moving_at_release == [0] and not rig.transfer.moving


def test_a_hung_transfer_is_abandoned_after_the_timeout(rig: Rig) -> None:
    rig.transfer.batch_timeout = 0.05
    n, size = 4, 8 * KiB
    keys = [f"h{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=7), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.transfer.hang = True
    # The transfers never finish: a client that did not give up on them at the timeout
    # would hang here (until pytest's timeout) instead of returning the errors.
    errs = rig.client.get_into(keys, _slices(dst, n, size))
    assert all(isinstance(e, Unavailable) and "did not finish in time" in str(e) for e in errs)


def test_a_lease_that_lapses_during_a_polled_read_raises(rig: Rig) -> None:
    n, size = 4, 8 * KiB
    keys = [f"l{i}".encode() for i in range(n)]
    src, dst = _buffers(rig, _values(n, size, seed=8), size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.master.ttl = 0.001
    rig.transfer.polls = 20  # >= 20 polls with sleeps in between: past the lease
    with pytest.raises(LeaseExpired):
        rig.client.get_into(keys, _slices(dst, n, size))
    assert not rig.transfer.moving


def test_get_into_of_missing_keys_without_a_lease_is_not_found(rig: Rig) -> None:
    dst = np.zeros(64, dtype=np.uint8)
    rig.client.register(dst)
    errs = rig.client.get_into([b"nope", b"nada"], [dst[:32], dst[32:]])
    assert all(isinstance(e, NotFound) for e in errs)


def test_small_batches_take_one_blocking_engine_call(rig: Rig) -> None:
    rig.state.placements = placements.Placements(0)  # no early reads (they are polled)
    keys = [b"s0", b"s1"]
    src, dst = _buffers(rig, _values(2, 512, seed=9), 512)
    assert rig.client.put_from(keys, _slices(src, 2, 512)) == [None, None]
    assert rig.client.get_into(keys, _slices(dst, 2, 512)) == [None, None]
    assert rig.transfer.blocking_calls == 2 and not any(e[0] == "start" for e in rig.trace)
    assert dst.tobytes() == src.tobytes()


def test_put_many_and_get_many_through_staging(rig: Rig) -> None:
    values = _values(6, 10 * KiB, seed=10)
    keys = [f"b{i}".encode() for i in range(6)]
    assert rig.client.put_many(keys, values) == [None] * 6
    assert rig.rpcs().count("PutStart") == 3  # 60 KiB: pipelined in 3 groups
    assert rig.client.get_many([*keys, b"missing"]) == [*values, None]
    assert rig.master.objects[keys[0]][2] == checksum(values[0])


def test_async_client_pipelines_and_waits_the_same_way(rig: Rig) -> None:
    client = AsyncKVStoreClient.__new__(AsyncKVStoreClient)
    client._later = {}
    client._state = rig.state

    def call(method: str, request: Any, spin: bool = True) -> Any:
        return rig.master.call(method, request)

    client._rpc = io(call)  # type: ignore[method-assign]
    client._release = io(rig.master.release)  # type: ignore[method-assign]
    n, size = 8, 8 * KiB
    keys = [f"a{i}".encode() for i in range(n)]
    values = _values(n, size, seed=11)
    src, dst = _buffers(rig, values, size)
    rig.transfer.polls = 2

    async def main() -> None:
        assert await client.put_from(keys, _slices(src, n, size)) == [None] * n
        assert await client.get_into(keys, _slices(dst, n, size)) == [None] * n
        rig.master.calls.clear()
        rig.master.fail = {("GetReplicas", 3)}
        with pytest.raises(Unavailable):
            await client.get_into(keys, _slices(dst, n, size))

    asyncio.run(main())
    assert dst.tobytes() == b"".join(values)
    assert rig.rpcs().count("PutStart") == 4
    assert set(rig.master.moving_at_release) == {0} and not rig.transfer.moving


def test_same_host_batches_are_not_pipelined_once_the_node_is_known(rig: Rig) -> None:
    node = rig.node
    rig.local.segment = LocalSegment(NODE, node.base, node.mem.nbytes, node.base, None)  # type: ignore[arg-type]
    n, size = 8, 8 * KiB
    keys = [f"s{i}".encode() for i in range(n)]
    values = _values(n, size, seed=12)
    src, dst = _buffers(rig, values, size)
    # The first call cannot know yet that the node is local: pipelined.
    warm = [f"w{i}".encode() for i in range(n)]
    assert rig.client.put_from(warm, _slices(src, n, size)) == [None] * n
    assert rig.rpcs().count("PutStart") == 4
    rig.trace.clear()
    # memcpy runs in the caller's thread and overlaps nothing: one group, two control calls
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    assert rig.rpcs() == ["PutStart", "PutEnd"]
    assert rig.client.get_into(keys, _slices(dst, n, size)) == [None] * n
    assert rig.rpcs() == ["PutStart", "PutEnd", "GetReplicas"]
    assert dst.tobytes() == b"".join(values)
    assert rig.client.stats.local_transfers >= 2 * n and not any(e[0] == "start" for e in rig.trace)


# -- early reads: reading where an object was seen while asking where it is -----------------


SMALL = 512  # three of them move in one blocking engine call (SYNC_MAX is 2 KiB here)


def _put_small(rig: Rig, n: int = 3, size: int = SMALL, seed: int = 20,
               prefix: str = "e") -> tuple[list[bytes], list[bytes], np.ndarray, np.ndarray]:
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    values = _values(n, size, seed=seed)
    src, dst = _buffers(rig, values, size)
    assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
    rig.trace.clear()
    rig.transfer.blocking_calls = 0
    return keys, values, src, dst


def _move(rig: Rig, key: bytes, data: bytes) -> None:
    """The master moves `key` (holding `data`) elsewhere under a new placement; another
    object's bytes now fill its old range."""
    m = rig.master
    addr, size, _ = m.objects[key]
    base = rig.node.base
    rig.node.mem[addr - base:addr - base + size] = 0x5A
    new = rig.node.allocate(size)
    rig.node.mem[new - base:new - base + size] = np.frombuffer(data, np.uint8)
    m.objects[key] = (new, size, checksum(data))
    m.placement[key] = next(m.placements)


def test_a_known_object_is_read_while_its_location_is_asked(rig: Rig) -> None:
    keys, values, _, dst = _put_small(rig)
    assert rig.client.get_into(keys, _slices(dst, 3, SMALL)) == [None] * 3
    assert dst.tobytes() == b"".join(values)
    # The reads submitted, then the question sent, then the answer read, then the bytes
    # in (polled without sleeping), and only then the lease released.
    kinds = [e[0] for e in rig.trace]
    assert kinds == ["start", "ask", "rpc", "answer", "done", "release"]
    assert rig.transfer.blocking_calls == 0
    assert rig.client.stats.early_reads == 3 and rig.client.stats.early_wasted == 0
    # The same through the staging buffer (get_many), learned from get_into's answer too.
    assert rig.client.get_many(keys) == values
    assert rig.client.stats.early_reads == 6


def test_an_object_moved_meanwhile_is_read_again_where_the_answer_says(rig: Rig) -> None:
    keys, values, _, dst = _put_small(rig)
    _move(rig, keys[1], values[1])  # same bytes, elsewhere: the old range holds junk now
    assert rig.client.get_into(keys, _slices(dst, 3, SMALL)) == [None] * 3
    assert dst.tobytes() == b"".join(values)
    assert rig.client.stats.early_reads == 2 and rig.client.stats.early_wasted == 1
    assert rig.transfer.blocking_calls == 1  # after the early batch, the one re-read
    # Next time the new place is known.
    assert rig.client.get_into(keys, _slices(dst, 3, SMALL)) == [None] * 3
    assert rig.client.stats.early_reads == 5


def test_an_object_removed_meanwhile_is_a_miss_not_the_bytes_still_there(rig: Rig) -> None:
    # Another client removed it; its bytes still sit in the freed range, and they would
    # pass the checksum. Only the answer can say it is gone.
    keys, values, _, dst = _put_small(rig)
    del rig.master.objects[keys[0]]
    got = rig.client.get_into(keys, _slices(dst, 3, SMALL))
    assert isinstance(got[0], NotFound) and got[1:] == [None, None]
    assert rig.client.get_many(keys) == [None, values[1], values[2]]
    assert rig.client.stats.early_wasted == 1  # the second time it was not even tried


def test_an_object_rewritten_in_place_under_a_new_placement_is_read_again(rig: Rig) -> None:
    # Removed and written again with other bytes at the very same address: the early
    # read gets the new bytes but does not match what was seen (placement, checksum),
    # so it is not kept; the re-read returns the new value.
    keys, values, _, _ = _put_small(rig)
    m = rig.master
    addr, size, _ = m.objects[keys[2]]
    new = bytes(reversed(values[2]))
    rig.node.mem[addr - rig.node.base:addr - rig.node.base + size] = np.frombuffer(new, np.uint8)
    m.objects[keys[2]] = (addr, size, checksum(new))
    m.placement[keys[2]] = next(m.placements)
    assert rig.client.get_many(keys) == [values[0], values[1], new]
    assert rig.client.stats.early_wasted == 1


def test_answers_from_a_new_leader_throw_early_bytes_away(rig: Rig) -> None:
    keys, values, _, dst = _put_small(rig)
    rig.master.epoch = 2  # failover: placements of epoch 1 mean nothing now
    assert rig.client.get_into(keys, _slices(dst, 3, SMALL)) == [None] * 3
    assert dst.tobytes() == b"".join(values)
    assert rig.client.stats.early_reads == 0 and rig.client.stats.early_wasted == 3


def test_a_corrupt_byte_is_caught_on_an_early_read_too(rig: Rig) -> None:
    keys, _, _, dst = _put_small(rig)
    addr, _, _ = rig.master.objects[keys[1]]
    rig.node.flip(addr + 7)
    got = rig.client.get_into(keys, _slices(dst, 3, SMALL))
    assert got[0] is None and got[2] is None and isinstance(got[1], CorruptObject)
    assert rig.client.get_many(keys)[1] is None
    assert rig.client.stats.corrupt_reads >= 2


def test_unknown_or_partly_known_batches_ask_first(rig: Rig) -> None:
    keys, values, _, _ = _put_small(rig)
    assert rig.client.get_many([*keys, b"never-seen"]) == [*values, None]
    assert "ask" not in [e[0] for e in rig.trace]
    assert rig.client.stats.early_reads == 0


def test_remembering_nothing_turns_early_reads_off(rig: Rig) -> None:
    rig.state.placements = placements.Placements(0)
    keys, values, _, _ = _put_small(rig)
    assert rig.client.get_many(keys) == values
    assert "ask" not in [e[0] for e in rig.trace] and rig.client.stats.early_reads == 0


def test_a_removed_key_is_forgotten(rig: Rig) -> None:
    keys, _, _, _ = _put_small(rig)
    rig.master.Remove = lambda req: pb.CodesResponse(codes=[Code.OK] * len(req.keys))  # type: ignore[attr-defined]
    rig.client.remove_many(keys[:1])
    assert len(rig.state.placements) == 2


def test_the_async_client_reads_early_the_same_way(rig: Rig) -> None:
    client = AsyncKVStoreClient.__new__(AsyncKVStoreClient)
    client._later = {}
    client._state = rig.state
    asked: list[str] = []

    def call(method: str, request: Any, spin: bool = True) -> Any:
        asked.append(method)
        yield Sleep(0.01)  # the reply comes while the bytes move
        return rig.master.call(method, request)

    client._rpc = call  # type: ignore[method-assign]
    client._release = io(rig.master.release)  # type: ignore[method-assign]
    keys, values, _, dst = _put_small(rig, prefix="x")
    _move(rig, keys[0], values[0])

    async def main() -> None:
        client._staging_turn = asyncio.Lock()
        assert await client.get_into(keys, _slices(dst, 3, SMALL)) == [None] * 3
        assert await client.get_many(keys) == values

    asyncio.run(main())
    assert dst.tobytes() == b"".join(values)
    assert rig.client.stats.early_reads == 2 + 3 and rig.client.stats.early_wasted == 1
    assert not rig.transfer.moving and set(rig.master.moving_at_release) == {0}


def test_nodes_silent_for_a_while_are_asked_about_first(rig: Rig,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A node the master may already have dropped (frozen, cut off) must not be read
    # early: the read would wait out the transfer timeout for a certain miss.
    keys, values, _, _ = _put_small(rig)
    monkeypatch.setattr(datapath, "EARLY_FRESH", 0.0)
    assert rig.client.get_many(keys) == values
    assert "ask" not in [e[0] for e in rig.trace] and rig.client.stats.early_reads == 0
    monkeypatch.setattr(datapath, "EARLY_FRESH", 60.0)  # it just moved bytes: early again
    assert rig.client.get_many(keys) == values
    assert rig.client.stats.early_reads == 3


def test_an_early_read_from_a_failing_node_is_not_repeated_there(rig: Rig) -> None:
    keys, values, _, _ = _put_small(rig)
    addr, _, _ = rig.master.objects[keys[0]]
    rig.transfer.fail_remote = {addr}  # the node fails every transfer that touches it
    assert rig.client.get_many(keys) == [None, None, None]
    kinds = [e[0] for e in rig.trace]
    # early batch + question, then the second attempt asks first (no early read)
    assert kinds.count("ask") == 1 and kinds.count("rpc") == 2
    assert kinds.index("rpc", kinds.index("rpc") + 1) > kinds.index("answer")
    assert rig.client.stats.early_reads == 0
    rig.transfer.fail_remote = set()  # back, but not heard from since it failed
    rig.trace.clear()
    assert rig.client.get_many(keys) == values
    assert "ask" not in [e[0] for e in rig.trace]
    assert rig.client.get_many(keys) == values  # it just answered: early again
    assert rig.client.stats.early_reads == 3
