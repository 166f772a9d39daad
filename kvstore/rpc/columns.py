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
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate
from typing import Any

from kvstore.errors import Internal

VERSION = 1


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

    def __init__(self, code: int, size: int, checksum: int, placement: int,
                 locations: list[Location]) -> None:
        self.code, self.size, self.checksum, self.placement, self.locations = (
            code, size, checksum, placement, locations)

    def __repr__(self) -> str:
        return (f"ReadItem(code={self.code}, size={self.size}, checksum={self.checksum:#x}, "
                f"placement={self.placement}, locations={self.locations})")


def fill(columns: Any, results: Iterable[Any]) -> None:
    """Write `results` (the core's per-key answers, in request order: code, size,
    checksum, placement, locations of node_id, segment, addr, size, tier) into a
    `ReadColumns` message."""
    codes: list[int] = []
    sizes: list[int] = []
    checksums: list[int] = []
    placements: list[int] = []
    counts: list[int] = []
    loc_ranges: list[int] = []
    loc_addrs: list[int] = []
    loc_sizes: list[int] = []
    table: dict[tuple[str, str, str], int] = {}
    for r in results:
        codes.append(int(r.code))
        sizes.append(r.size)
        checksums.append(r.checksum)
        placements.append(r.placement)
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
    columns.version = VERSION
    columns.codes.extend(codes)
    columns.sizes.extend(sizes)
    columns.checksums.extend(checksums)
    columns.placements.extend(placements)
    columns.location_counts.extend(counts)
    columns.location_ranges.extend(loc_ranges)
    columns.location_addrs.extend(loc_addrs)
    columns.location_sizes.extend(loc_sizes)
    add = columns.ranges.add
    for node_id, segment, tier in table:
        add(node_id=node_id, segment=segment, tier=tier)


def fill_lists(columns: Any, lists: Any) -> None:
    """Write the core's answers already in columns (`core.ReadColumns`: the same fields
    as `fill` builds, one list each) into a `ReadColumns` message."""
    columns.version = VERSION
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


def decode(columns: Any) -> list[ReadItem]:
    """`ReadColumns` -> one `ReadItem` per key; MalformedReply if it does not add up."""
    if columns.version != VERSION:
        raise MalformedReply(
            f"the master answered GetReplicas in columns of version {columns.version}, and "
            f"this client reads version {VERSION} only: upgrade the client to the master's "
            "release")
    codes = list(columns.codes)
    n = len(codes)
    sizes, checksums = list(columns.sizes), list(columns.checksums)
    placements, counts = list(columns.placements), list(columns.location_counts)
    if not (len(sizes) == len(checksums) == len(placements) == len(counts) == n):
        raise MalformedReply(
            f"the master's GetReplicas columns disagree on the number of keys (codes {n}, "
            f"sizes {len(sizes)}, checksums {len(checksums)}, placements {len(placements)}, "
            f"location counts {len(counts)})")
    loc_ranges, loc_addrs = list(columns.location_ranges), list(columns.location_addrs)
    loc_sizes = list(columns.location_sizes)
    total = sum(counts)
    if not (len(loc_ranges) == len(loc_addrs) == len(loc_sizes) == total):
        raise MalformedReply(
            f"the master's GetReplicas columns count {total} locations but carry "
            f"{len(loc_ranges)} ranges, {len(loc_addrs)} addresses and {len(loc_sizes)} sizes")
    table = [(r.node_id, r.segment, r.tier) for r in columns.ranges]
    if loc_ranges and max(loc_ranges) >= len(table):
        raise MalformedReply(
            f"a location of the master's GetReplicas columns names range {max(loc_ranges)} "
            f"of {len(table)}")
    locs = [Location(where[0], where[1], addr, size, where[2])
            for where, addr, size in zip(map(table.__getitem__, loc_ranges), loc_addrs,
                                         loc_sizes, strict=True)]
    ends = list(accumulate(counts))
    return [ReadItem(code, size, checksum, placement, locs[end - count:end])
            for code, size, checksum, placement, count, end
            in zip(codes, sizes, checksums, placements, counts, ends, strict=True)]
