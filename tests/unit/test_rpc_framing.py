"""Frames of the fast control channel, and its method table, with no sockets."""

from __future__ import annotations

import random

import pytest

from kvstore.rpc.framing import HEADER, HEADER_SIZE, FrameDecoder, FrameError, encode
from kvstore.rpc.methods import BY_ID, METHODS, method_id, method_table
from kvstore.v1 import master_pb2 as pb


def frames(n: int, seed: int = 1) -> list[tuple[int, int, bytes]]:
    rng = random.Random(seed)
    return [(i + 1, rng.randrange(1 << 16), rng.randbytes(rng.choice([0, 1, 9, 10, 300, 70_000])))
            for i in range(n)]


def test_one_frame_in_one_chunk() -> None:
    d = FrameDecoder()
    assert d.feed(encode(7, 3, b"abc")) == [(7, 3, b"abc")]
    assert d.buffered == 0


def test_empty_payload() -> None:
    assert FrameDecoder().feed(encode(1, 2, b"")) == [(1, 2, b"")]


def test_several_frames_in_one_read() -> None:
    want = frames(20)
    d = FrameDecoder()
    assert d.feed(b"".join(encode(*f) for f in want)) == want
    assert d.buffered == 0


@pytest.mark.parametrize("chunk", [1, 2, 7, 10, 11, 4096])
def test_partial_frames_any_chunking(chunk: int) -> None:
    want = frames(12, seed=chunk)
    stream = b"".join(encode(*f) for f in want)
    d = FrameDecoder()
    got = []
    for lo in range(0, len(stream), chunk):
        got += d.feed(stream[lo:lo + chunk])
    assert got == want
    assert d.buffered == 0


def test_a_split_header_waits_for_the_rest() -> None:
    d = FrameDecoder()
    data = encode(5, 9, b"payload") + encode(6, 9, b"x")
    assert d.feed(data[:HEADER_SIZE - 3]) == []
    assert d.feed(data[HEADER_SIZE - 3:HEADER_SIZE + 2]) == []
    assert d.feed(data[HEADER_SIZE + 2:]) == [(5, 9, b"payload"), (6, 9, b"x")]


def test_memoryview_and_bytearray_chunks() -> None:
    data = encode(1, 1, b"abc") + encode(2, 1, b"de")
    assert FrameDecoder().feed(memoryview(data)) == [(1, 1, b"abc"), (2, 1, b"de")]
    assert FrameDecoder().feed(bytearray(data)) == [(1, 1, b"abc"), (2, 1, b"de")]


def test_oversized_frame_rejected_before_buffering() -> None:
    d = FrameDecoder(max_frame=1000)
    assert d.feed(encode(1, 1, b"x" * 1000)) == [(1, 1, b"x" * 1000)]
    with pytest.raises(FrameError, match="exceeds the 1000-byte limit"):
        d.feed(HEADER.pack(1001, 2, 1))
    assert d.buffered == 0


def test_garbage_is_an_oversized_frame() -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_methods_cover_the_service_with_stable_ids() -> None:
    service = pb.DESCRIPTOR.services_by_name["Master"]
    assert list(METHODS) == [m.name for m in service.methods]
    assert len(BY_ID) == len(METHODS)
    lookup = METHODS["Lookup"]
    assert lookup.id == method_id("kvstore.v1.Master.Lookup")
    assert lookup.request is pb.LookupRequest and lookup.response is pb.LookupResponse
    assert BY_ID[lookup.id] is lookup


def test_method_id_collisions_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvstore.rpc.methods as methods

    monkeypatch.setattr(methods, "method_id", lambda name: 42)
    with pytest.raises(RuntimeError, match="collide"):
        method_table(pb.DESCRIPTOR.services_by_name["Master"])
