"""The leader's inventory deltas in columns: the delta channel's APPLY_COLUMNS frame.

Every put costs its store node at least two delta rows (the intent, then the commit or
a drop). As an `ApplyRequest` each row is a `Change` message holding a `Replica`
message: the leader builds two protobuf objects per row and the node reads them back,
attribute by attribute. In columns a batch is one header and one packed array per
field, built from the leader's row tuples by `zip` and `array` and read back the same
way: the leader queues each row with its flags already set (`row`), so packing a batch
runs no Python loop over its rows. No I/O here.

The frame's payload, little-endian:

    header   version u8, flags-width u8 (1), reserved u16, shard u32, epoch u64, rows u32
    lengths  rows x u32        each key's length
    offsets  rows x u64
    sizes    rows x u64
    sums     rows x u64        checksums
    flags    rows x u8         DROP | PENDING | RECORD | SSD
    keys     the keys, concatenated

A node that predates the frame answers its tag with INVALID_ARGUMENT; the leader then
sends that node `ApplyRequest`s again (rpc/deltas.py). A `version` this node does not
know, or arrays that do not add up to the payload, raise `MalformedDeltas`: the node
applies nothing of it and says why.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from kvstore.errors import InvalidArgument

VERSION = 1
HEAD = struct.Struct("<BBHIQI")
DROP, PENDING, RECORD, SSD = 1, 2, 4, 8
_ALL = DROP | PENDING | RECORD | SSD
_LITTLE = sys.byteorder == "little"

# key, offset, size, checksum, flags (DROP | PENDING | RECORD | SSD): the leader's
# queued row (kvstore.master.nodes), built by `row` or with the constants below.
Row = tuple[bytes, int, int, int, int]
_TIER_FLAG = {"dram": 0, "ssd": SSD}
INTENT = PENDING  # an intent in DRAM: committed if its bytes verify
INTENT_RECORD = PENDING | RECORD  # a placeholder's intent: key and checksum in its record
DRAM_DROP = DROP


class MalformedDeltas(InvalidArgument):
    """A columnar delta frame this node cannot read: a newer version than it knows, or
    arrays whose lengths do not fit the payload."""


class Columns(NamedTuple):
    """A decoded frame: per-row lists, in the leader's order."""

    shard: int
    epoch: int
    keys: list[bytes]
    offsets: list[int]
    sizes: list[int]
    checksums: list[int]
    flags: bytes


def _u(typecode: str, values: Sequence[int]) -> bytes:
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def tier_flag(tier: str) -> int:
    """A tier's flag bit (SSD or none); ValueError for a tier other than "dram" and
    "ssd" (a bug in the caller)."""
    try:
        return _TIER_FLAG[tier]
    except KeyError:
        raise ValueError(f"a delta row names tier {tier!r}; only dram and ssd") from None


def row(key: bytes, offset: int, size: int, checksum: int, tier: str, pending: bool = False,
        record: bool = False, drop: bool = False) -> Row:
    """One row, its flags set from the tier and the three booleans. The hot paths (an
    intent, a commit, a drop per put) build theirs with the constants instead."""
    return (key, offset, size, checksum,
            tier_flag(tier) | drop * DROP | pending * PENDING | record * RECORD)


def fields(flags: int) -> tuple[str, bool, bool, bool]:
    """A row's flags as (tier, pending, record, drop): an ApplyRequest's fields."""
    return ("ssd" if flags & SSD else "dram", bool(flags & PENDING), bool(flags & RECORD),
            bool(flags & DROP))


def encode(epoch: int, shard: int, rows: Sequence[Row]) -> bytes:
    """The payload carrying `rows`, in order. Raises ValueError for flags outside
    DROP | PENDING | RECORD | SSD, or a field out of its column's range (a bug in the
    caller)."""
    n = len(rows)
    head = HEAD.pack(VERSION, 1, 0, shard, epoch, n)
    if not n:
        return head
    keys, offsets, sizes, sums, flags = zip(*rows, strict=True)
    if max(flags) > _ALL or min(flags) < 0:
        bad = sorted({f for f in flags if not 0 <= f <= _ALL})
        raise ValueError(f"delta row flags {bad} are not DROP | PENDING | RECORD | SSD")
    try:
        parts = [head, _u("I", list(map(len, keys))), _u("Q", offsets), _u("Q", sizes),
                 _u("Q", sums), bytes(flags), b"".join(keys)]
    except OverflowError as exc:
        raise ValueError(f"a delta row's field does not fit its column ({exc})") from None
    return b"".join(parts)


def decode(payload: bytes | memoryview) -> Columns:
    """The rows of one frame; MalformedDeltas if it is not a frame of a known version
    whose arrays fit together."""
    view = memoryview(payload)
    if len(view) < HEAD.size:
        raise MalformedDeltas(f"a columnar delta frame of {len(view)} bytes is shorter "
                              f"than its {HEAD.size}-byte header")
    version, width, _, shard, epoch, n = HEAD.unpack_from(view)
    if version != VERSION or width != 1:
        raise MalformedDeltas(
            f"columnar deltas of version {version} (flag width {width}); this store node "
            f"reads version {VERSION}: upgrade the node, or run a master of its version")
    pos = HEAD.size
    fixed = n * (4 + 8 * 3 + 1)
    if len(view) < pos + fixed:
        raise MalformedDeltas(f"a columnar delta frame says {n} rows but holds "
                              f"{len(view) - pos} bytes after its header (want at least {fixed})")

    def column(typecode: str, size: int) -> list[int]:
        nonlocal pos
        a = array(typecode)
        a.frombytes(view[pos:pos + n * size])
        if not _LITTLE:
            a.byteswap()
        pos += n * size
        return a.tolist()

    lengths = column("I", 4)
    offsets = column("Q", 8)
    sizes = column("Q", 8)
    sums = column("Q", 8)
    flags = bytes(view[pos:pos + n])
    pos += n
    blob = bytes(view[pos:])
    if sum(lengths) != len(blob):
        raise MalformedDeltas(f"a columnar delta frame's key lengths add up to "
                              f"{sum(lengths)} bytes but it carries {len(blob)}")
    ends = list(accumulate(lengths))
    keys = [blob[e - k:e] for k, e in zip(lengths, ends, strict=True)]
    return Columns(shard, epoch, keys, offsets, sizes, sums, flags)
