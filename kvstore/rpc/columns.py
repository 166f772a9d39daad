"""GetReplicas' answer in columns (`ReadColumns` in master.proto); no I/O here.

A batch answered as one `ReadItem` message per key, each with its own `Location`
messages, costs the master a protobuf object per key and per location to build and the
client as many to read, and repeats the node, segment and tier strings of every
location. In columns each field is one packed array, filled from a Python list in one
call, and the (node, segment, tier) of the locations is a small table indexed per
location.

The client asks for columns (`GetReplicasRequest.columns`); a master that predates them
ignores the flag and answers in `items`, and `read_items` reads whichever came, so old
and new on either side keep working. A `version` this reader does not know, or arrays
whose lengths or indexes do not fit together, raise `MalformedReply`: a typed error,
never a guess at what the bytes meant.

Version 2 carries the same arrays packed into one `bytes` field (`PACKED_KEY`
and `PACKED_LOCATION` bytes per key and per location): protobuf takes in a repeated
integer field one integer at a time, and `array` packs a list in one call. The client
says the highest version it reads (`columns_version`, `READS`); a master answers in the
highest both read, and one that predates the field answers in version 1.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from types import SimpleNamespace
from typing import Any

from kvstore.errors import Internal

VERSION = 1  # repeated integer fields
PACKED = 2  # the same arrays in `packed`
READS = PACKED  # the highest version this module writes and reads
PACKED_KEY = 4 + 8 + 8 + 8 + 4  # code, size, checksum, placement, location count
PACKED_LOCATION = 4 + 8 + 8  # range index, address, size
_LITTLE = sys.byteorder == "little"


class MalformedReply(Internal):
    """A master's reply that this client cannot read: a newer wire version than it
    knows, or fields that contradict each other."""


class Location:
    """One replica range of a read answer, with a `common_pb2.Location`'s fields."""

    __slots__ = ("addr", "node_id", "segment", "size", "tier")

    def __init__(self, node_id: str, segment: str, addr: int, size: int, tier: str) -> None:
        self.node_id, self.segment, self.addr, self.size, self.tier = (
            node_id, segment, addr, size, tier)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and _loc_key(self) == _loc_key(other)

    def __hash__(self) -> int:
        return hash(_loc_key(self))

    def __repr__(self) -> str:
        return (f"Location({self.node_id!r}, {self.segment!r}, {self.addr:#x}, {self.size}, "
                f"{self.tier!r})")


def _loc_key(loc: Any) -> tuple[str, str, int, int, str]:
    return (loc.node_id, loc.segment, loc.addr, loc.size, loc.tier)


class ReadItem:
    """One key of a read answer, with a `master_pb2.ReadItem`'s fields."""

    __slots__ = ("checksum", "code", "locations", "placement", "size")
    message = ""  # PutStartItem's: a batch in columns holds no refusal to explain

    def __init__(self, code: int, size: int, checksum: int, placement: int,
                 locations: list[Location]) -> None:
        self.code, self.size, self.checksum, self.placement, self.locations = (
            code, size, checksum, placement, locations)

    def __repr__(self) -> str:
        return (f"ReadItem(code={self.code}, size={self.size}, checksum={self.checksum:#x}, "
                f"placement={self.placement}, locations={self.locations})")


def version_for(asked: int) -> int:
    """The version to answer a client that reads up to `asked` (0: it did not say)."""
    return max(VERSION, min(asked, READS))


def fill(columns: Any, results: Iterable[Any], version: int = VERSION) -> None:
    """Write `results` (the core's per-key answers, in request order: code, size,
    checksum, placement, locations of node_id, segment, addr, size, tier) into a
    `ReadColumns` message, in `version`."""
    results = list(results)
    _fill_results(columns, results, [int(r.code) for r in results], [r.size for r in results],
                  [r.checksum for r in results], version)


def fill_placed(columns: Any, results: Sequence[Any], sizes: Sequence[int],
                version: int = PACKED) -> None:
    """Write PutStart's answers (the core's, every one OK: locations of node_id, segment,
    addr, size, tier, and a placement) for keys of `sizes` into a `ReadColumns` message,
    in `version`; checksums are 0 (a placement has none yet)."""
    n = len(results)
    _fill_results(columns, results, [0] * n, sizes, [0] * n, version)


def _fill_results(columns: Any, results: Sequence[Any], codes: Sequence[int],
                  sizes: Sequence[int], checksums: Sequence[int], version: int) -> None:
    """`fill_lists` of the per-key columns given and of `results`' placements and
    locations, flattened, the (node, segment, tier) of each an index into a table."""
    table: dict[tuple[str, str, str], int] = {}
    loc_ranges: list[int] = []
    loc_addrs: list[int] = []
    loc_sizes: list[int] = []
    counts: list[int] = []
    for r in results:
        locs = r.locations
        counts.append(len(locs))
        for loc in locs:
            where = (loc.node_id, loc.segment, loc.tier)
            index = table.get(where)
            if index is None:
                index = table[where] = len(table)
            loc_ranges.append(index)
            loc_addrs.append(loc.addr)
            loc_sizes.append(loc.size)
    fill_lists(columns, SimpleNamespace(
        codes=codes, sizes=sizes, checksums=checksums,
        placements=[r.placement for r in results], counts=counts, loc_ranges=loc_ranges,
        loc_addrs=loc_addrs, loc_sizes=loc_sizes, ranges=list(table)), version)


def _packed(typecode: str, values: Any) -> bytes:
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def fill_lists(columns: Any, lists: Any, version: int = VERSION) -> None:
    """Write answers already in columns (`core.ReadColumns`, or `fill`'s lists: one list
    per field) into a `ReadColumns` message, in `version`."""
    columns.version = version
    if version >= PACKED:
        columns.keys = len(lists.codes)
        columns.locations = len(lists.loc_addrs)
        columns.packed = b"".join((
            _packed("I", lists.codes), _packed("Q", lists.sizes),
            _packed("Q", lists.checksums), _packed("Q", lists.placements),
            _packed("I", lists.counts), _packed("I", lists.loc_ranges),
            _packed("Q", lists.loc_addrs), _packed("Q", lists.loc_sizes)))
    else:
        columns.codes.extend(lists.codes)
        columns.sizes.extend(lists.sizes)
        columns.checksums.extend(lists.checksums)
        columns.placements.extend(lists.placements)
        columns.location_counts.extend(lists.counts)
        columns.location_ranges.extend(lists.loc_ranges)
        columns.location_addrs.extend(lists.loc_addrs)
        columns.location_sizes.extend(lists.loc_sizes)
    add = columns.ranges.add
    for node_id, segment, tier in lists.ranges:
        add(node_id=node_id, segment=segment, tier=tier)


def read_items(reply: Any) -> list[Any]:
    """The per-key answers of a GetReplicasResponse, in request order: its `items` as
    they are (a master without columns), or its `columns` decoded into `ReadItem`s."""
    if not reply.HasField("columns"):
        return list(reply.items)
    if len(reply.items):
        raise MalformedReply("the master's GetReplicas reply holds both items and columns")
    return decode(reply.columns)


def start_items(reply: Any, keys: int) -> list[Any]:
    """The per-key answers of a PutStartResponse to a batch of `keys` keys, in request
    order: its `items` as they are, or its `columns` decoded into `ReadItem`s."""
    if not reply.HasField("columns"):
        return list(reply.items)
    if len(reply.items):
        raise MalformedReply("the master's PutStart reply holds both items and columns")
    items = decode(reply.columns)
    if len(items) != keys:
        raise MalformedReply(f"the master's PutStart columns answer {len(items)} keys of "
                             f"{keys} asked")
    return items


def decode(columns: Any) -> list[ReadItem]:
    """`ReadColumns` -> one `ReadItem` per key; MalformedReply if it does not add up."""
    codes, sizes, checksums, placements, counts, loc_ranges, loc_addrs, loc_sizes, table = (
        _checked(columns))
    locs = [Location(where[0], where[1], addr, size, where[2])
            for where, addr, size in zip(map(table.__getitem__, loc_ranges), loc_addrs,
                                         loc_sizes, strict=True)]
    ends = list(accumulate(counts))
    return [ReadItem(code, size, checksum, placement, locs[end - count:end])
            for code, size, checksum, placement, count, end
            in zip(codes, sizes, checksums, placements, counts, ends, strict=True)]


Where = tuple[tuple[str, str], int]  # ((segment, node id), addr): one replica's range


def placed(columns: Any, keys: int) -> tuple[list[int], list[list[Where]]]:
    """PutStart's answer in columns, for a batch of `keys` keys all placed: per key its
    placement and its replicas' ranges, as a writer needs them (no object per range);
    MalformedReply if it does not add up or names another number of keys, or a key not
    placed (such a batch is answered in items)."""
    codes, _sizes, _sums, placements, counts, loc_ranges, loc_addrs, _lsizes, table = (
        _checked(columns))
    if len(codes) != keys:
        raise MalformedReply(f"the master's PutStart columns answer {len(codes)} keys of "
                             f"{keys} asked")
    if any(codes):
        raise MalformedReply("the master's PutStart columns hold a key that was not placed")
    targets = [(segment, node_id) for node_id, segment, _tier in table]
    ranges = list(zip(map(targets.__getitem__, loc_ranges), loc_addrs, strict=True))
    if all(c == 1 for c in counts):  # one replica each, the default: a slice per key
        return placements, [[r] for r in ranges]
    ends = accumulate(counts)
    return placements, [ranges[end - count:end] for count, end in zip(counts, ends, strict=True)]


def _checked(columns: Any) -> tuple[list[int], list[int], list[int], list[int], list[int],
                                     list[int], list[int], list[int],
                                     list[tuple[str, str, str]]]:
    """The eight arrays of `columns` and its range table, checked to fit together."""
    if columns.version == PACKED:
        codes, sizes, checksums, placements, counts, loc_ranges, loc_addrs, loc_sizes = (
            _unpack(columns))
    elif columns.version == VERSION:
        codes = list(columns.codes)
        sizes, checksums = list(columns.sizes), list(columns.checksums)
        placements, counts = list(columns.placements), list(columns.location_counts)
        loc_ranges, loc_addrs = list(columns.location_ranges), list(columns.location_addrs)
        loc_sizes = list(columns.location_sizes)
    else:
        raise MalformedReply(
            f"the master answered in columns of version {columns.version}, and this "
            f"client reads versions {VERSION} to {READS} only: upgrade the client to the "
            "master's release")
    n = len(codes)
    if not (len(sizes) == len(checksums) == len(placements) == len(counts) == n):
        raise MalformedReply(
            f"the master's columns disagree on the number of keys (codes {n}, sizes "
            f"{len(sizes)}, checksums {len(checksums)}, placements {len(placements)}, "
            f"location counts {len(counts)})")
    total = sum(counts)
    if not (len(loc_ranges) == len(loc_addrs) == len(loc_sizes) == total):
        raise MalformedReply(
            f"the master's columns count {total} locations but carry {len(loc_ranges)} "
            f"ranges, {len(loc_addrs)} addresses and {len(loc_sizes)} sizes")
    table = [(r.node_id, r.segment, r.tier) for r in columns.ranges]
    if loc_ranges and max(loc_ranges) >= len(table):
        raise MalformedReply(
            f"a location of the master's columns names range {max(loc_ranges)} of "
            f"{len(table)}")
    return (codes, sizes, checksums, placements, counts, loc_ranges, loc_addrs, loc_sizes,
            table)


def _unpack(columns: Any) -> list[list[int]]:
    """Version 2's `packed`, as the eight lists version 1 carries; MalformedReply if its
    length is not what its counts say, or it carries version 1's fields as well."""
    n, m = columns.keys, columns.locations
    blob = columns.packed
    want = n * PACKED_KEY + m * PACKED_LOCATION
    if len(blob) != want:
        raise MalformedReply(
            f"the master's columns (version {PACKED}) say {n} keys and {m} "
            f"locations, {want} packed bytes, but carry {len(blob)}")
    if len(columns.codes) or len(columns.location_addrs):
        raise MalformedReply(f"the master's columns (version {PACKED}) carry "
                             "version 1's arrays as well as packed ones")
    out: list[list[int]] = []
    pos = 0
    for typecode, count in (("I", n), ("Q", n), ("Q", n), ("Q", n), ("I", n), ("I", m),
                            ("Q", m), ("Q", m)):
        a = array(typecode)
        end = pos + count * a.itemsize
        a.frombytes(blob[pos:end])
        if not _LITTLE:
            a.byteswap()
        out.append(a.tolist())
        pos = end
    return out
