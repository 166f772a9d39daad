"""Frames of the fast control channel; no I/O here.

Every frame, in both directions, is a 10-byte header and a payload:

    u32 length       bytes of payload after the header (little-endian, as all fields)
    u32 request id   chosen by the caller; a reply carries its request's id.
                     0 marks a one-way request: the server runs it and sends nothing back.
    u16 tag          in a request: the method id (methods.py);
                     in a reply: REPLY_OK (payload = the RPC's response message) or
                     REPLY_ERROR (payload = a kvstore.v1.Error: the call was not run)
    payload          protobuf bytes: the same messages the gRPC service takes and returns

Failures of the call itself (not the leader, stale epoch, bad keys) travel inside the
response message's `error` field exactly as over gRPC; REPLY_ERROR only says that the
frame named no known method or held no parsable request. A length above the receiver's
limit means the peer speaks something else: the receiver drops the connection.
"""

from __future__ import annotations

import struct

from kvstore.v1 import common_pb2 as cpb

HEADER = struct.Struct("<IIH")
HEADER_SIZE = HEADER.size
MAX_FRAME = 64 << 20  # the gRPC channels' message limit too

ONE_WAY = 0
REPLY_OK = 0
REPLY_ERROR = 1

Frame = tuple[int, int, bytes]  # (request id, tag, payload)


class FrameError(Exception):
    """The byte stream is not a sequence of frames this side accepts; drop the connection."""


def error_frame(request_id: int, code: int, message: str) -> bytes:
    """A REPLY_ERROR frame: the request was not run, and why."""
    payload = cpb.Error(code=code, message=message).SerializeToString()  # type: ignore[arg-type]
    return HEADER.pack(len(payload), request_id, REPLY_ERROR) + payload


def encode(request_id: int, tag: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), request_id, tag) + payload


class FrameDecoder:
    """Turns a byte stream, in chunks of any size, into whole frames.

    `feed` returns every frame completed by the chunk (none, one or many) and keeps the
    rest for the next chunk. It raises FrameError for a frame longer than `max_frame`,
    before buffering any of it.
    """

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self._buf:
            self._buf += data
            view: bytes | bytearray | memoryview = self._buf
        else:
            view = data  # the usual case: whole frames in one chunk, nothing copied
        frames: list[Frame] = []
        pos, end = 0, len(view)
        unpack = HEADER.unpack_from
        while end - pos >= HEADER_SIZE:
            length, request_id, tag = unpack(view, pos)
            if length > self.max_frame:
                self._buf = bytearray()
                raise FrameError(f"a frame of {length} bytes exceeds the {self.max_frame}-byte "
                                 "limit (not a kvstore fast-channel peer?)")
            stop = pos + HEADER_SIZE + length
            if stop > end:
                break
            frames.append((request_id, tag, bytes(view[pos + HEADER_SIZE:stop])))
            pos = stop
        if view is self._buf:
            del self._buf[:pos]
        elif pos < end:
            self._buf = bytearray(view[pos:])
        return frames
