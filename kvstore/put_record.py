"""The put record: what a one-call put writes after its value, in the same transfer.

A one-call put writes into space started ahead under a placeholder key, then PutCommit
renames the placeholder to its key. The leader sent the node an intent for the
placeholder when it started it, but that intent knows neither the key nor the checksum.
So the writer appends a small record to its value, into room the leader set aside after
the placeholder (`PutStartRequest.record_room`): the key, the value's size and checksum,
and which placeholder it was written for. The node then holds the whole commit the
moment the transfer completes, and the PutCommit reply waits for nothing but the
placeholder's intent, long since applied (docs/durability.md, section 1).

A record counts only if it is intact (its own checksum), was written for this very
placeholder (a record left in the range by an earlier placement names another one) and
the value before it verifies against the checksum it names: a torn, stale or abandoned
write is a miss, never wrong bytes.

Layout, little-endian: magic, key length, placeholder length, value size, value
checksum, leader epoch of the placement, placeholder hash (XXH3-64 of the placeholder as
the writer named it), key bytes, then XXH3-64 of everything before. Keys are named as
the writer named them; the node puts back the tenant prefix the leader gave the
placeholder (`resolve`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

MAGIC = b"KVR1"
_HEAD = struct.Struct("<4sHHQQQQ")
_SUM = struct.Struct("<Q")
HEADER_BYTES = _HEAD.size + _SUM.size  # a record is this plus its key's bytes
ROOM_ALIGN = 64  # record rooms are asked in these steps, so a stream of keys shares one


def record_bytes(key_len: int) -> int:
    """The bytes a record of a key of this length takes."""
    return HEADER_BYTES + key_len


def room_for(key_len: int) -> int:
    """The record room to ask for keys up to this length."""
    return (record_bytes(key_len) + ROOM_ALIGN - 1) // ROOM_ALIGN * ROOM_ALIGN


def placeholder_hash(placeholder: bytes) -> int:
    return xxhash.xxh3_64_intdigest(placeholder)


def encode(placeholder: bytes, key: bytes, size: int, checksum: int, epoch: int) -> bytes:
    """The record of `key` (size bytes, checksum) written into `placeholder`'s room."""
    head = _HEAD.pack(MAGIC, len(key), len(placeholder), size, checksum, epoch,
                      placeholder_hash(placeholder)) + key
    return head + _SUM.pack(xxhash.xxh3_64_intdigest(head))


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes  # as the node stores it (the placeholder's tenant prefix put back)
    size: int
    checksum: int
    epoch: int


def resolve(room: memoryview | bytes, placeholder: bytes, size: int) -> Record | None:
    """The record in `room` (the bytes after a placeholder's value of `size` bytes, as
    many as the segment has there) if it is intact and was written for `placeholder`
    (the key the node holds the intent under, tenant prefix included) and `size`; else
    None. Checks the record only: the caller verifies the value against its checksum."""
    if len(room) < HEADER_BYTES:
        return None
    magic, key_len, ph_len, rec_size, checksum, epoch, ph_hash = _HEAD.unpack_from(room, 0)
    end = _HEAD.size + key_len
    if magic != MAGIC or end + _SUM.size > len(room) or rec_size != size:
        return None
    if ph_len > len(placeholder) or key_len == 0:
        return None
    head = bytes(room[:end])
    if _SUM.unpack_from(room, end)[0] != xxhash.xxh3_64_intdigest(head):
        return None
    prefix_len = len(placeholder) - ph_len
    if placeholder_hash(placeholder[prefix_len:]) != ph_hash:
        return None
    return Record(placeholder[:prefix_len] + head[_HEAD.size:], rec_size, checksum, epoch)
