"""Which master shard a key belongs to (docs/scaling.md, "Keys to shards").

A key's shard is XXH3-64 of the key modulo the cluster's shard count: a prefix's blocks
(each a different hash-chain value) spread over every shard, so one hot prefix does not
land on one. Python's `hash()` is salted per process and cannot be used: a client and
every master must agree. The count is fixed per cluster (`shards/count` in etcd).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from kvstore.errors import InvalidArgument

MAX_SHARDS = 1024
PART_ALIGN = 4096  # a shard's part of a segment starts on a page


def shard_of(key: bytes, shards: int) -> int:
    """The shard of `key` in a cluster of `shards` shards (0 when there is one)."""
    if shards <= 1:
        return 0
    return xxhash.xxh3_64_intdigest(key) % shards


def positions_by_shard(keys: Sequence[bytes], shards: int) -> list[list[int]]:
    """For each shard, the positions in `keys` of its keys, in the batch's order."""
    out: list[list[int]] = [[] for _ in range(max(shards, 1))]
    if shards <= 1:
        out[0] = list(range(len(keys)))
        return out
    h = xxhash.xxh3_64_intdigest
    for i, key in enumerate(keys):
        out[h(key) % shards].append(i)
    return out


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One master's place in the cluster: shard `index` of `count`."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        """`K/N` (shard K of N, counted from 0), as `kvstore master --shard` takes it."""
        k, sep, n = text.partition("/")
        try:
            if not sep:
                raise ValueError
            spec = cls(int(k), int(n))
        except ValueError:
            raise InvalidArgument(
                f"--shard {text!r} is not K/N: give this master's shard and the cluster's "
                "shard count, such as 0/2 for the first of two shards") from None
        spec.check()
        return spec

    def check(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise InvalidArgument(f"a cluster has 1 to {MAX_SHARDS} shards, not {self.count}")
        if not 0 <= self.index < self.count:
            raise InvalidArgument(
                f"shard {self.index} does not exist in a cluster of {self.count} shard(s): "
                f"shards count from 0 to {self.count - 1}")

    def owns(self, key: bytes) -> bool:
        return shard_of(key, self.count) == self.index

    def part(self, size: int) -> tuple[int, int]:
        """This shard's part of a node segment of `size` bytes: (start offset, length).
        Each shard owns a fixed 1/N of every node's segment (docs/scaling.md)."""
        step = size // self.count // PART_ALIGN * PART_ALIGN
        start = self.index * step
        end = size if self.index == self.count - 1 else start + step
        return start, end - start

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
