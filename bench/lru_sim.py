"""Offline cache simulation of a Mooncake-format trace, and the trace reader.

Pure: no process, no network, no clock. The replay benchmark (bench/replay.py) compares
what the store did with what this module says a cache of the same capacity must do, and
tests/unit/test_replay_sim.py pins its semantics.

The trace (Mooncake FAST'25 format, one JSON object per line): `timestamp` (ms),
`input_length` and `output_length` (tokens), `hash_ids` (chained hashes of the prompt's
512-token blocks; equal ids mean equal prefixes up to that block).

`StoreSim` mirrors the master's policy (kvstore/master/core/core.py) for one replayer
that, per request, does lookup -> read the hit prefix -> put the rest -> release:

1. Lookup: the hits are the longest contiguous prefix of the request's keys that is
   present; those objects are pinned (taken off the LRU list) until the release.
2. Put of every key after the prefix, in order, as one PutStart batch: a key already
   present is left alone (ALREADY_EXISTS, recency not touched); a new key takes one
   slot (PENDING, not evictable). When no slot is free, the least recently used
   evictable object is evicted first (`_evict_for`); with nothing evictable the put
   fails (STORE_FULL) and the key stays absent.
   After the batch, when occupancy is above the high watermark, objects are evicted
   oldest first until it is at or below the low watermark, at most `batch`
   (evict_batch) of them in one round (`_evict_to_watermark`).
3. PutEnd commits the new keys: they join the most-recent end of the LRU, in order.
4. Release unpins the prefix: it rejoins the most-recent end, in order, after the
   new keys.
5. The master's tick (every ~100 ms): the same watermark eviction. It only matters when
   step 2 could not get below the high mark because what was left was PENDING or
   pinned (one request's blocks larger than the gap between the watermarks); the sim
   runs it after the release. When it really runs is timing, so in that corner the
   store and the sim may differ by when, not by what.

Every block object has the same size, so space is counted in slots of one aligned
object: the allocator packs equal sizes without fragmentation, and the watermark tests
`used > high * capacity` become `count > floor(high * capacity / aligned size)`.

`StoreSim.lru(n)` is the same request semantics with plain LRU eviction at n objects
(evict one when inserting into a full cache), and `StoreSim.infinite()` never evicts:
the hit rate of a cache that keeps everything it has seen.
"""

from __future__ import annotations

import gzip
import json
import lzma
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 512
ALIGNMENT = 64
EVICT_HIGH = 0.98   # CoreConfig's defaults
EVICT_LOW = 0.97
EVICT_BATCH = 1024


# -- the trace ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def hit_tokens(self, hit_blocks: int, block_tokens: int = BLOCK_TOKENS) -> int:
        """Prompt tokens covered by the first `hit_blocks` blocks (the last block of a
        prompt may be partial)."""
        return min(hit_blocks * block_tokens, self.input_length)


def parse_request(obj: dict[str, Any], where: str = "") -> Request:
    """One trace record; ValueError naming `where` (file:line) when it is malformed."""
    at = f"{where}: " if where else ""
    try:
        ts, inp, out, ids = (obj["timestamp"], obj["input_length"], obj.get("output_length", 0),
                             obj["hash_ids"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{at}a trace record needs timestamp, input_length and hash_ids "
                         f"(missing {exc})") from None
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                            for h in ids):
        raise ValueError(f"{at}hash_ids must be a list of integers")
    for name, v in (("timestamp", ts), ("input_length", inp), ("output_length", out)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{at}{name} must be a non-negative number, got {v!r}")
    return Request(int(ts), int(inp), int(out), tuple(ids))


def iter_trace(lines: Iterable[str], limit: int | None = None, name: str = "trace") -> Iterator[Request]:
    """Requests from JSON lines (blank lines skipped), at most `limit` of them."""
    n = 0
    for lineno, line in enumerate(lines, 1):
        if limit is not None and n >= limit:
            return
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}:{lineno}: not JSON ({exc.msg})") from None
        yield parse_request(obj, f"{name}:{lineno}")
        n += 1


def read_trace(path: str | Path, limit: int | None = None) -> list[Request]:
    """A trace file's requests; a `.xz` or `.gz` file is read as it is (the shipped trace,
    bench/data/, is compressed)."""
    suffix = Path(path).suffix
    opener = lzma.open if suffix == ".xz" else gzip.open if suffix == ".gz" else open
    with opener(path, "rt") as f:
        return list(iter_trace(f, limit, name=str(path)))


# -- capacity -----------------------------------------------------------------------------


def aligned(size: int, alignment: int = ALIGNMENT) -> int:
    return (size + alignment - 1) // alignment * alignment


def slots_below(fraction: float, capacity: int, asize: int) -> int:
    """The largest k with k * asize <= fraction * capacity, computed with the very float
    comparison the master uses (`used > high * capacity`)."""
    limit = fraction * capacity
    k = int(limit // asize)
    while (k + 1) * asize <= limit:
        k += 1
    while k > 0 and k * asize > limit:
        k -= 1
    return k


@dataclass(frozen=True)
class Sizing:
    """How big to make the DRAM of `nodes` store nodes so that the store holds
    `capacity_blocks` block objects in steady state.

    Between evictions the store's occupancy climbs from the low watermark to the high
    one, then an eviction takes it back to the low one: a sawtooth whose mean is the
    midpoint. So `capacity_blocks` is defined as the mean number of blocks held in
    steady state, and the pool gets capacity_blocks / ((high + low) / 2) slots of one
    aligned object (rounded up to a whole number of slots per node).
    """

    capacity_blocks: int
    object_bytes: int
    nodes: int = 1
    alignment: int = ALIGNMENT
    high: float = EVICT_HIGH
    low: float = EVICT_LOW

    @property
    def asize(self) -> int:
        return aligned(self.object_bytes, self.alignment)

    @property
    def slots_per_node(self) -> int:
        total = math.ceil(self.capacity_blocks / ((self.high + self.low) / 2))
        return max(1, math.ceil(total / self.nodes))

    @property
    def dram_per_node(self) -> int:
        return self.slots_per_node * self.asize

    @property
    def pool_bytes(self) -> int:
        return self.dram_per_node * self.nodes


# -- the simulator ------------------------------------------------------------------------


@dataclass
class SimStats:
    requests: int = 0
    blocks: int = 0
    hit_blocks: int = 0
    tokens: int = 0
    hit_tokens: int = 0
    inserted: int = 0
    evictions: int = 0
    put_failures: int = 0
    per_request: list[int] = field(default_factory=list)   # hit blocks of each request
    # occupancy after each request, once the first eviction has happened
    held_sum: int = 0
    held_n: int = 0
    held_min: int = 0
    held_max: int = 0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0

    @property
    def held_mean(self) -> float | None:
        return self.held_sum / self.held_n if self.held_n else None


class StoreSim:
    """A cache of equal-size objects with the store's request semantics (module doc).

    `slots`: objects that fit at all (None: unbounded). `evict_above`/`evict_to`: the
    watermarks in objects (evict when more than evict_above are held, down to evict_to);
    None for no watermark eviction. `batch`: most objects one watermark round evicts.
    """

    def __init__(self, slots: int | None, evict_above: int | None = None,
                 evict_to: int | None = None, batch: int | None = None) -> None:
        if slots is not None and slots < 1:
            raise ValueError(f"a cache needs at least one slot, got {slots}")
        if (evict_above is None) != (evict_to is None):
            raise ValueError("give both watermarks or neither")
        if evict_above is not None and evict_to is not None and not 0 <= evict_to <= evict_above:
            raise ValueError(f"need 0 <= evict_to ({evict_to}) <= evict_above ({evict_above})")
        if batch is not None and batch < 1:
            raise ValueError(f"an eviction round takes at least one object, got {batch}")
        self.slots = slots
        self.batch = batch
        self.evict_above = evict_above
        self.evict_to = evict_to
        self._lru: OrderedDict[Hashable, None] = OrderedDict()  # evictable, oldest first
        self._present: set[Hashable] = set()                    # COMPLETE, pinned or not
        self.count = 0                                          # slots used (incl. PENDING)
        self.stats = SimStats()
        self._evicted_once = False
        self._unfinished = False

    # constructors

    @classmethod
    def watermark(cls, segment_bytes: Sequence[int], object_bytes: int, *,
                  alignment: int = ALIGNMENT, high: float = EVICT_HIGH,
                  low: float = EVICT_LOW, batch: int = EVICT_BATCH) -> StoreSim:
        """The store's policy over DRAM segments of these sizes (bytes, per node)."""
        asize = aligned(object_bytes, alignment)
        caps = [s // alignment * alignment for s in segment_bytes]  # the allocator's capacity
        pool = sum(caps)
        return cls(sum(c // asize for c in caps), slots_below(high, pool, asize),
                   slots_below(low, pool, asize), batch)

    @staticmethod
    def pool_slots(segment_bytes: Sequence[int], object_bytes: int,
                   alignment: int = ALIGNMENT) -> int:
        """Objects of `object_bytes` the segments hold when full: the capacity a plain
        LRU of the full pool gets."""
        asize = aligned(object_bytes, alignment)
        return sum(s // alignment * alignment // asize for s in segment_bytes)

    @classmethod
    def lru(cls, capacity: int) -> StoreSim:
        return cls(capacity)

    @classmethod
    def infinite(cls) -> StoreSim:
        return cls(None)

    # the model

    def __contains__(self, key: Hashable) -> bool:
        return key in self._present

    def __len__(self) -> int:
        return len(self._present)

    def lookup(self, keys: Sequence[Hashable]) -> int:
        """The longest contiguous present prefix (no state change)."""
        n = 0
        present = self._present
        for k in keys:
            if k not in present:
                break
            n += 1
        return n

    def _evict_oldest(self) -> bool:
        if not self._lru:
            return False
        key, _ = self._lru.popitem(last=False)
        self._present.discard(key)
        self.count -= 1
        self.stats.evictions += 1
        self._evicted_once = True
        return True

    def request(self, keys: Sequence[Hashable], input_length: int | None = None,
                block_tokens: int = BLOCK_TOKENS) -> int:
        """Replay one request; returns its hit blocks."""
        hits = self.lookup(keys)
        lru = self._lru
        pinned = keys[:hits]
        for k in pinned:
            lru.pop(k, None)
        new: list[Hashable] = []
        seen: set[Hashable] = set()
        present = self._present
        for k in keys[hits:]:
            if k in seen or k in present:
                continue
            seen.add(k)
            if self.slots is not None and self.count >= self.slots and not self._make_room():
                self.stats.put_failures += 1
                continue
            self.count += 1
            new.append(k)
        self._evict_to_watermark()
        for k in new:
            present.add(k)
            lru[k] = None
        for k in pinned:
            lru[k] = None
            lru.move_to_end(k)
        # The master's periodic tick: when the batch could not get below the high mark
        # because what was left was PENDING or pinned, the next tick evicts now that
        # it is committed and released.
        self._evict_to_watermark()
        st = self.stats
        st.requests += 1
        st.blocks += len(keys)
        st.hit_blocks += hits
        st.inserted += len(new)
        st.per_request.append(hits)
        if input_length is not None:
            st.tokens += input_length
            st.hit_tokens += min(hits * block_tokens, input_length)
        if self._evicted_once:
            st.held_sum += self.count
            st.held_min = self.count if not st.held_n else min(st.held_min, self.count)
            st.held_max = max(st.held_max, self.count)
            st.held_n += 1
        return hits

    def _evict_to_watermark(self) -> None:
        if self.evict_above is not None and (self.count > self.evict_above or self._unfinished):
            assert self.evict_to is not None
            n = 0
            while (self.count > self.evict_to and (self.batch is None or n < self.batch)
                   and self._evict_oldest()):
                n += 1
            # A round cut short by the batch goes on next time, even below the high mark.
            self._unfinished = self.count > self.evict_to and n == self.batch

    def _make_room(self) -> bool:
        """`_evict_for`: evict the oldest evictable object so that one more fits."""
        return self._evict_oldest()


def simulate(requests: Iterable[Request], cache: StoreSim, key: Any = None) -> SimStats:
    """Replay `requests` in order through `cache`; `key(hash_id)` maps ids to keys."""
    for r in requests:
        keys: Sequence[Hashable] = r.hash_ids if key is None else [key(h) for h in r.hash_ids]
        cache.request(keys, r.input_length)
    return cache.stats


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.lru_sim",
                                description="offline hit rates of a trace (no store needed)")
    p.add_argument("--trace", required=True)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--capacity-blocks", type=int, default=10000,
                   help="mean blocks held in steady state (see Sizing)")
    p.add_argument("--block-bytes", type=int, default=64 << 10)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--plain-lru", action="store_true",
                   help="only plain LRU at --capacity-blocks (no watermark mirror)")
    args = p.parse_args(argv)
    reqs = read_trace(args.trace, args.limit)
    sims: list[tuple[str, StoreSim]] = []
    if not args.plain_lru:
        sz = Sizing(args.capacity_blocks, args.block_bytes, args.nodes)
        sims.append((f"store policy, {args.nodes} x {sz.dram_per_node} B",
                     StoreSim.watermark([sz.dram_per_node] * args.nodes, args.block_bytes)))
    sims += [(f"plain LRU, {args.capacity_blocks} blocks", StoreSim.lru(args.capacity_blocks)),
             ("infinite cache", StoreSim.infinite())]
    print(f"{len(reqs)} requests, {sum(len(r.hash_ids) for r in reqs)} blocks")
    for name, sim in sims:
        st = simulate(reqs, sim)
        held = f"{st.held_mean:.0f}" if st.held_mean is not None else "-"
        print(f"{name:<40} blocks {100 * st.block_hit_rate:6.2f}%  tokens "
              f"{100 * st.token_hit_rate:6.2f}%  evictions {st.evictions:>7}  held (mean) {held}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
