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
    # Submitted before the question, the answer read, the bytes in, then the release.
    assert rig.kinds() == ["start", "asked", "rpc", "done", "release"]
    stats = rig.client.stats
    assert (stats.gets, stats.hits, stats.early_reads, stats.bytes_read) == (1, 1, 1, SIZE)
    assert not rig.master.leases and not rig.transfer.moving


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
    rig.client._send_later("GetReplicas", pb.GetReplicasRequest(keys=[b"k"]), then.append)
    assert rig.client.get(b"k") == value
    assert calls == [] and len(then) == 1 and rig.client._later is None
    assert rig.client.get(b"k") == value
    assert len(calls) == 1 and rig.client.stats.early_reads == 2


def test_same_host_the_copy_runs_while_the_master_answers(rig: DriverRig) -> None:
    node = rig.node
    rig.local.segment = LocalSegment(NODE, node.base, node.mem.nbytes, node.base, None)  # type: ignore[arg-type]
    value = _value(10)
    rig.put(b"k", value)  # learns that the node is reached by memcpy
    assert rig.client.get(b"k") == value
    assert rig.kinds() == ["asked", "rpc", "release"]  # no engine transfer at all
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
    assert runs[0] == runs[1]
    assert runs[0][2:4] == ([], 0)
    assert runs[0][0] == EXPECTED[name](value, into)


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
