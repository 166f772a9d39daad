"""The quick single read (quick.py) against the in-memory master, engine and node.

The real synchronous driver runs in front of the fake master (as in
test_client_reservations). Every case that is not the quick path's own business must
end in the full flow with the same result, so each scenario runs twice, on two rigs set
up alike: once with the quick path and once with it turned off, and the outcomes (value,
miss or error type, leases left, transfers still moving) must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from kvstore.checksum import checksum
from kvstore.errors import InvalidArgument, NotFound
from kvstore.v1 import master_pb2 as pb
from kvstore_client import quick
from kvstore_client.local import LocalSegment
from tests.unit.test_client_data_path import NODE, DriverRig, KiB, _move, small_thresholds

SIZE = 4 * KiB  # under SYNC_MAX below: the quick path's size


@pytest.fixture(autouse=True)
def thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    small_thresholds(monkeypatch, sync_max=8 * KiB)


@pytest.fixture
def rig() -> Iterator[DriverRig]:
    yield DriverRig()


def _value(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


def test_a_known_object_is_read_in_one_round_trip_without_the_flow(
        rig: DriverRig, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _value(1)
    rig.put(b"k", value)

    def no_flow(_flow: Any) -> Any:
        raise AssertionError("the quick path fell back to the flow")

    monkeypatch.setattr(rig.client, "_run", no_flow)
    assert rig.client.get(b"k") == value
    # Submitted before the question; the spin sees the reply there before the bytes
    # land; the answer read, then the bytes in. No lease was granted, none released.
    assert rig.kinds() == ["start", "asked", "rpc", "ready?", "done"]
    stats = rig.client.stats
    assert (stats.gets, stats.hits, stats.early_reads, stats.bytes_read) == (1, 1, 1, SIZE)
    assert not rig.master.leases and not rig.transfer.moving
    assert next(rig.master.lease_ids) == 100  # the first id: none granted


def test_the_spin_watches_the_transfer_and_the_reply_together(rig: DriverRig) -> None:
    value = _value(11)
    rig.put(b"k", value)
    rig.master.reply_polls = 3  # the reply comes after the bytes have landed
    assert rig.client.get(b"k") == value
    assert rig.kinds() == ["start", "asked", "rpc", "ready?", "done", "ready?", "ready?",
                           "ready?"]
    # Bytes still moving when the reply is there: the spin ends on the reply, and the
    # transfer is then awaited alone.
    rig.trace.clear()
    rig.transfer.polls = 3
    assert rig.client.get(b"k") == value
    assert rig.kinds() == ["start", "asked", "rpc", "ready?", "done"]


def test_a_slow_reply_is_waited_for_asleep_once_the_bytes_are_in(
        rig: DriverRig, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _value(12)
    rig.put(b"k", value)
    monkeypatch.setattr(quick, "SPIN_AFTER", 0.0)
    rig.master.reply_polls = 10**9  # never seen by the spin
    assert rig.client.get(b"k") == value  # answer() then waits for it
    assert rig.kinds().count("ready?") <= 3 and rig.client.stats.early_reads == 1


def test_a_master_that_grants_a_lease_anyway_gets_it_back(rig: DriverRig) -> None:
    value = _value(13)
    rig.put(b"k", value)
    rig.master.knows_unpinned = False  # older than GetReplicasRequest.unpinned
    assert rig.client.get(b"k") == value
    assert rig.kinds() == ["start", "asked", "rpc", "ready?", "done", "release"]
    assert not rig.master.leases and rig.client.stats.early_reads == 1


@pytest.mark.parametrize("same_bytes", [False, True], ids=["other bytes", "same bytes"])
def test_bytes_rewritten_after_the_answer_are_never_returned(rig: DriverRig,
                                                             same_bytes: bool) -> None:
    """Nothing pins the object the quick read asks about: after the master answered,
    the object may go and its range be reused while the bytes are still moving. What
    lands then fails the checksum, and the flow decides (here: the key is gone). Bytes
    that still match are the object's value at the answer, and returned."""
    value = _value(14)
    rig.put(b"k", value)
    m = rig.master
    answer = m.GetReplicas

    def evict_after_answering(req: pb.GetReplicasRequest) -> pb.GetReplicasResponse:
        reply = answer(req)
        if req.unpinned and b"k" in m.objects:
            addr, size, _ = m.objects.pop(b"k")
            if not same_bytes:
                off = addr - rig.node.base  # the range reused by another object:
                rig.node.mem[off:off + size] = np.frombuffer(_value(15)[:size], np.uint8)
        return reply

    m.GetReplicas = evict_after_answering  # type: ignore[method-assign]
    rig.transfer.polls = 2  # the bytes land after the answer
    got = rig.client.get(b"k")
    if same_bytes:
        assert got == value and m.calls["GetReplicas"] == 1
    else:
        assert got is None and m.calls["GetReplicas"] == 2  # the flow asked again
        assert rig.client.stats.hits == 0
    assert not m.leases and not rig.transfer.moving


def test_a_miss_the_answer_reports_is_final_and_forgets_the_placement(rig: DriverRig) -> None:
    rig.put(b"k", _value(2))
    del rig.master.objects[b"k"]  # removed by another client; its bytes still sit there
    assert rig.client.get(b"k") is None
    assert rig.kinds().count("rpc") == 1  # no second question from a flow
    assert rig.state.placements.recall_one(b"k") is None
    assert rig.client.stats.gets == 1 and rig.client.stats.hits == 0


def test_get_into_one_registered_slice(rig: DriverRig) -> None:
    value = _value(3)
    rig.put(b"k", value)
    buf = np.zeros(2 * SIZE, dtype=np.uint8)
    rig.client.register(buf)
    assert rig.client.get_into([b"k"], [buf[SIZE:]]) == [None]
    assert buf[SIZE:].tobytes() == value and not buf[:SIZE].any()
    assert rig.client.stats.early_reads == 1 and rig.kinds().count("rpc") == 1
    del rig.master.objects[b"k"]
    got = rig.client.get_into([b"k"], [buf[SIZE:]])
    assert isinstance(got[0], NotFound) and got[0].key == b"k"
    with pytest.raises(InvalidArgument, match="registered"):
        rig.client.get_into([b"k"], [np.zeros(SIZE, dtype=np.uint8)])


def test_unknown_keys_and_unread_replies_go_through_the_flow(
        rig: DriverRig, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _value(4)
    rig.put(b"k", value)
    rig.state.placements.forget(b"k")
    assert rig.client.get(b"k") == value
    assert rig.client.stats.early_reads == 0  # asked first, then read
    # A Later call's reply still unread (a put's refill of placeholders): the flow
    # reads it before its own, so the quick path stays out of the way.
    calls: list[Any] = []
    real = quick.read_one

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(quick, "read_one", spy)
    then: list[Any] = []
    rig.client._drive(rig.client._send_later("GetReplicas", pb.GetReplicasRequest(keys=[b"k"]),
                                             then.append))
    assert rig.client.get(b"k") == value
    assert calls == [] and len(then) == 1 and rig.client._later == {}
    assert rig.client.get(b"k") == value
    assert len(calls) == 1 and rig.client.stats.early_reads == 2


def test_same_host_the_copy_runs_while_the_master_answers(rig: DriverRig) -> None:
    node = rig.node
    rig.local.segment = LocalSegment(NODE, node.base, node.mem.nbytes, node.base, None)  # type: ignore[arg-type]
    value = _value(10)
    rig.put(b"k", value)  # learns that the node is reached by memcpy
    assert rig.client.get(b"k") == value
    assert rig.kinds() == ["asked", "rpc"]  # no engine transfer, no spin, no release
    assert rig.client.stats.early_reads == 1 and rig.client.stats.local_transfers == 2
    # The mapping went away (the node restarted elsewhere): the flow finds out.
    rig.local.segment = None
    assert quick.read_one(rig.state, rig.client._control, b"k", None, 5.0) is quick.SLOW
    assert rig.client.get(b"k") == value


def test_an_object_too_large_to_wait_for_spinning_goes_through_the_flow(
        rig: DriverRig, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _value(9) * 4  # 16 KiB, over SYNC_MAX: the flow polls it in pieces
    rig.put(b"big", value)
    assert quick.read_one(rig.state, rig.client._control, b"big", None, 5.0) is quick.SLOW
    assert rig.kinds() == []  # decided before anything was sent or started
    assert rig.client.get(b"big") == value
    assert rig.client.stats.early_reads == 1 and rig.kinds().count("start") == 4


# -- the same outcome either way ---------------------------------------------------------


def _moved(rig: DriverRig, value: bytes) -> None:
    _move(rig, b"k", value)


def _removed(rig: DriverRig, value: bytes) -> None:
    del rig.master.objects[b"k"]


def _rewritten_in_place(rig: DriverRig, value: bytes) -> None:
    m = rig.master
    addr, size, _ = m.objects[b"k"]
    new = bytes(reversed(value))
    rig.node.mem[addr - rig.node.base:addr - rig.node.base + size] = np.frombuffer(new, np.uint8)
    m.objects[b"k"] = (addr, size, checksum(new))
    m.placement[b"k"] = next(m.placements)


def _rewritten_elsewhere(rig: DriverRig, value: bytes) -> None:
    # Removed and written again with other bytes at another address: the old range
    # still holds the old bytes, which pass the checksum the client remembers. Only
    # the answer's placement tells them apart.
    m = rig.master
    new = bytes(reversed(value))
    addr = rig.node.allocate(len(new))
    rig.node.mem[addr - rig.node.base:addr - rig.node.base + len(new)] = np.frombuffer(new, np.uint8)
    m.objects[b"k"] = (addr, len(new), checksum(new))
    m.placement[b"k"] = next(m.placements)


def _new_leader(rig: DriverRig, value: bytes) -> None:
    rig.master.epoch = 2


def _corrupt(rig: DriverRig, value: bytes) -> None:
    addr, _, _ = rig.master.objects[b"k"]
    rig.node.flip(addr + 9)


def _lease_lapses(rig: DriverRig, value: bytes) -> None:
    rig.master.ttl = 0.0


def _node_fails(rig: DriverRig, value: bytes) -> None:
    addr, _, _ = rig.master.objects[b"k"]
    rig.transfer.fail_remote = {addr}


def _nothing(rig: DriverRig, value: bytes) -> None:
    pass


SCENARIOS: dict[str, Callable[[DriverRig, bytes], None]] = {
    "unchanged": _nothing, "moved": _moved, "removed": _removed,
    "rewritten in place": _rewritten_in_place, "rewritten elsewhere": _rewritten_elsewhere,
    "new leader": _new_leader,
    "corrupt byte": _corrupt, "lease lapses": _lease_lapses, "node fails": _node_fails,
}


def _outcome(rig: DriverRig, into: bool) -> Any:
    try:
        if into:
            buf = np.zeros(SIZE, dtype=np.uint8)
            rig.client.register(buf)
            err = rig.client.get_into([b"k"], [buf])[0]
            return type(err).__name__ if err is not None else buf.tobytes()
        return rig.client.get(b"k")
    except Exception as exc:  # the outcome is compared, whatever it is
        return type(exc).__name__


@pytest.mark.parametrize("into", [False, True], ids=["get", "get_into"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_quick_path_and_the_flow_agree(name: str, into: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    value = _value(5)
    runs = []
    for quick_on in (True, False):
        rig = DriverRig()
        rig.put(b"k", value)
        SCENARIOS[name](rig, value)
        if not quick_on:
            monkeypatch.setattr(quick, "read_one", lambda *_a: quick.SLOW)
        first = _outcome(rig, into)
        # Whatever it decided, a second get (the placement now learned again, or
        # forgotten) must agree as well; then nothing is pinned and nothing moves.
        runs.append((first, _outcome(rig, into), sorted(rig.master.leases),
                     len(rig.transfer.moving), rig.client.stats.hits))
        monkeypatch.undo()
    quick_run, flow_run = runs
    assert flow_run[0] == EXPECTED[name](value, into)
    assert quick_run[0] == QUICK_EXPECTED.get(name, EXPECTED[name])(value, into)
    if name not in QUICK_EXPECTED:
        assert quick_run == flow_run
    assert quick_run[2:4] == flow_run[2:4] == ([], 0)


EXPECTED: dict[str, Callable[[bytes, bool], Any]] = {
    "unchanged": lambda v, into: v,
    "moved": lambda v, into: v,
    "removed": lambda v, into: "NotFound" if into else None,
    "rewritten in place": lambda v, into: bytes(reversed(v)),
    "rewritten elsewhere": lambda v, into: bytes(reversed(v)),
    "new leader": lambda v, into: v,
    "corrupt byte": lambda v, into: "CorruptObject",
    "lease lapses": lambda v, into: "LeaseExpired",
    "node fails": lambda v, into: "Unavailable",
}

# Where the quick read rightly differs: it holds no lease, so none can lapse; its bytes,
# read from the placement the answer confirmed and matching the checksum, are returned.
QUICK_EXPECTED: dict[str, Callable[[bytes, bool], Any]] = {
    "lease lapses": lambda v, into: v,
}


def test_a_failed_control_call_leaves_nothing_moving_or_pinned(rig: DriverRig) -> None:
    value = _value(8)
    rig.put(b"k", value)
    rig.master.fail.add(("GetReplicas", 1))
    assert quick.read_one(rig.state, rig.client._control, b"k", None, 5.0) is quick.SLOW
    assert not rig.transfer.moving and not rig.master.leases
    assert rig.client.get(b"k") == value  # and the next call reads it


def test_a_corrupt_early_read_is_never_returned(rig: DriverRig) -> None:
    value = _value(6)
    rig.put(b"k", value)
    _corrupt(rig, value)
    got = quick.read_one(rig.state, rig.client._control, b"k", None, 5.0)
    assert got is quick.SLOW
    assert not rig.master.leases  # given back before the flow takes its own


def test_a_failed_transfer_marks_the_node_as_not_answering(rig: DriverRig) -> None:
    value = _value(7)
    rig.put(b"k", value)
    _node_fails(rig, value)
    assert quick.read_one(rig.state, rig.client._control, b"k", None, 5.0) is quick.SLOW
    seen = rig.state.placements.recall_one(b"k")
    assert seen is not None
    assert not rig.state.answering([(seen.segment, seen.node_id)])
    assert not rig.transfer.moving and not rig.master.leases
    assert rig.master.calls.get("GetReplicas") == 1
