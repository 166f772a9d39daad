"""The on-disk format of one SSD-tier object file, and nothing else.

This module knows bytes and names, never directories, locks or capacity: `ssd_files.py`
owns the directory and its lock, `ssd_index.py` the capacity. Keeping the format in one
small file makes it easy to read in full before changing it, and easy to test without
touching a disk.

One object is one file::

    offset 0    header, HEADER_SIZE (64) bytes, little endian:
                  magic        4s   b"KVS1"
                  version      H    FORMAT_VERSION
                  flags        H    0 (reserved; a reader rejects unknown bits)
                  key_len      I    1 .. MAX_KEY_BYTES
                  data_len     Q    object size in bytes
                  checksum     Q    xxh3_64 of the data (the project-wide object checksum)
                  reserved     28x  zeros
                  header_sum   Q    xxh3_64 of bytes [0, 56) of this header
    offset 64   the key (key_len bytes)
    then        the data (data_len bytes)
    then        zeros up to the next multiple of BLOCK (4096)

Pack files hold many objects: `<root>/packs/<unique>.kvp` is a run of records, each
exactly one object file as above, back to back (so every record starts on a BLOCK
boundary). A record in a pack has flag KEY_SUM set and the first 8 reserved bytes hold
xxh3_64 of its key (covered by the header sum): no file name vouches for the key there.
A removed record's blocks are punched out (they read back as zeros, which no header
matches), so a reader of a pack walks it record by record and skips a block that holds
no valid header.

The padding makes a file's length equal to the space it occupies on a 4 KiB-block
filesystem, so "bytes on disk" is simply the file length (see `ssd.py`). The header sum
catches a damaged header before its lengths are trusted; the key is checked against the
file name (a hash of the key); the data against `checksum`.

File names: `<root>/<hh>/<32 hex>.kvs`, where the 32 hex digits are BLAKE2b-128 of the key
and `hh` their first two, which spreads files over 256 shard directories. A cryptographic
hash, because keys come from clients and two keys must never share a file. Files being
written are `.<32 hex>.<unique>.tmp` in the same shard directory, so the final rename
stays inside one directory.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import xxhash

from kvstore.errors import MAX_KEY_BYTES

MAGIC = b"KVS1"
FORMAT_VERSION = 1
HEADER_SIZE = 64
BLOCK = 4096
OBJECT_SUFFIX = ".kvs"
PACK_SUFFIX = ".kvp"
PACK_DIR = "packs"
TEMP_SUFFIX = ".tmp"
KEY_SUM = 1  # header flag: the key's xxh3_64 is in the first reserved bytes (pack records)
NAME_HEX_DIGITS = 32
SHARD_HEX_DIGITS = 2

_FIELDS = struct.Struct("<4sHHIQQQ20x")  # everything the header sum covers (56 bytes)
_HEADER_SUM = struct.Struct("<Q")
assert _FIELDS.size + _HEADER_SUM.size == HEADER_SIZE


class FormatError(ValueError):
    """A file that is not a valid object file. `ssd_files.py` turns it into a dropped file."""


@dataclass(frozen=True, slots=True)
class Header:
    key_len: int
    data_len: int
    checksum: int
    flags: int = 0
    key_sum: int = 0  # with KEY_SUM: xxh3_64 of the key

    @property
    def file_len(self) -> int:
        """The exact length of a complete file holding this object, padding included."""
        return file_length(self.key_len, self.data_len)


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The header's own checksum (XXH3-64; the data's is kvstore.checksum's)."""
    return xxhash.xxh3_64_intdigest(data)


def file_length(key_len: int, data_len: int) -> int:
    raw = HEADER_SIZE + key_len + data_len
    return -(-raw // BLOCK) * BLOCK


def pack_header(header: Header) -> bytes:
    fields = _FIELDS.pack(
        MAGIC, FORMAT_VERSION, header.flags, header.key_len, header.data_len, header.checksum,
        header.key_sum if header.flags & KEY_SUM else 0,
    )
    return fields + _HEADER_SUM.pack(checksum(fields))


def unpack_header(raw: bytes | bytearray | memoryview) -> Header:
    """Parse and validate a header; raise FormatError with the reason if it is not one."""
    if len(raw) < HEADER_SIZE:
        raise FormatError(f"header truncated: {len(raw)} of {HEADER_SIZE} bytes")
    fields = bytes(raw[: _FIELDS.size])
    (stored_sum,) = _HEADER_SUM.unpack_from(raw, _FIELDS.size)
    magic, version, flags, key_len, data_len, data_sum, key_sum = _FIELDS.unpack(fields)
    if magic != MAGIC:
        raise FormatError(f"bad magic {magic!r}")
    if checksum(fields) != stored_sum:
        raise FormatError("header checksum mismatch")
    if version != FORMAT_VERSION:
        raise FormatError(f"unsupported format version {version}")
    if flags & ~KEY_SUM:
        raise FormatError(f"unknown flags {flags:#x}")
    if not 0 < key_len <= MAX_KEY_BYTES:
        raise FormatError(f"key length {key_len} out of range")
    return Header(key_len=key_len, data_len=data_len, checksum=data_sum, flags=flags,
                  key_sum=key_sum if flags & KEY_SUM else 0)


def pack_record(key: bytes, data: bytes | bytearray | memoryview,
                data_sum: int) -> list[bytes | bytearray | memoryview]:
    """The parts of one pack record (header with the key's sum, key, data, padding)."""
    header = Header(key_len=len(key), data_len=len(data), checksum=data_sum, flags=KEY_SUM,
                    key_sum=checksum(key))
    return [pack_header(header), key, data, padding(len(key), len(data))]


def object_name(key: bytes) -> str:
    """The hex file stem of `key` (also names its shard: the first two digits)."""
    return hashlib.blake2b(key, digest_size=NAME_HEX_DIGITS // 2).hexdigest()


def shard_names() -> list[str]:
    return [f"{i:0{SHARD_HEX_DIGITS}x}" for i in range(16**SHARD_HEX_DIGITS)]


def relative_path(key: bytes) -> str:
    stem = object_name(key)
    return f"{stem[:SHARD_HEX_DIGITS]}/{stem}{OBJECT_SUFFIX}"


def temp_name(stem: str, unique: str) -> str:
    return f".{stem}.{unique}{TEMP_SUFFIX}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def stem_of(name: str) -> str | None:
    """The hash stem of an object file name, or None if `name` is not one."""
    if not name.endswith(OBJECT_SUFFIX):
        return None
    stem = name[: -len(OBJECT_SUFFIX)]
    if len(stem) != NAME_HEX_DIGITS or any(c not in "0123456789abcdef" for c in stem):
        return None
    return stem


def padding(key_len: int, data_len: int) -> bytes:
    return bytes(file_length(key_len, data_len) - HEADER_SIZE - key_len - data_len)
