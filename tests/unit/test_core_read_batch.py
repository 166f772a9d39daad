"""get_replicas's batch scan (Reads.read_batch, reads.py) against the per-key path.

Without a lease id, get_replicas reads every key and pins the ones found under one new
lease. The batch scan handles the common case (valid bytes keys, objects in DRAM) in one
loop; it must be indistinguishable from the per-key path: the same results (codes, sizes,
checksums, locations in order, placements), the same lease (keys, tokens, deadline,
holder, owner), and afterwards the same pins, LRU order, touch times, promotions queued,
counters and events. These tests drive three cores through the same random operations,
one with the batch scan switched off and one asking for its answers in columns
(Reads.read_columns: no object per key), and compare everything after every call.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvstore.errors import Code, KVStoreError
from kvstore.master.core import CoreConfig, ManualClock, MasterCore

KiB = 1024


def per_key(core: MasterCore) -> MasterCore:
    core._reads.read_batch = lambda keys: None  # type: ignore[method-assign]
    return core


def make(rng: random.Random, nodes: int, ssd: bool) -> MasterCore:
    core = MasterCore(CoreConfig(evict_high=0.9, evict_low=0.8), ManualClock())
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"seg{i}", (i + 1) << 32, 200 * KiB)
        if ssd:
            core.mount_segment(f"n{i}", f"ssd:n{i}", 0, 4000 * KiB, tier="ssd")
    return core


def from_columns(c: Any) -> list[Any]:
    """ReadColumns as result_of's per-key tuples."""
    out = []
    at = 0
    for code, size, checksum, placement, n in zip(c.codes, c.sizes, c.checksums,
                                                  c.placements, c.counts, strict=True):
        locs = [(*c.ranges[c.loc_ranges[j]][:2], c.loc_addrs[j], c.loc_sizes[j],
                 c.ranges[c.loc_ranges[j]][2]) for j in range(at, at + n)]
        at += n
        out.append((code, size, checksum, locs, placement))
    assert at == len(c.loc_ranges) == len(c.loc_addrs) == len(c.loc_sizes)
    return out


def result_of(r: Any) -> Any:
    if r.columns is not None:
        assert not r.results
        return (r.lease_id, r.expires_at, from_columns(r.columns))
    return (r.lease_id, r.expires_at,
            [(int(i.code), i.size, i.checksum, [(loc.node_id, loc.segment, loc.addr, loc.size,
                                                loc.tier) for loc in i.locations], i.placement)
             for i in r.results])


def state(core: MasterCore) -> dict[str, Any]:
    t = core._state.objects
    return {
        "index": dict(t.index),
        "cols": [list(c) for c in (t.size, t.checksum, t.where, t.space, t.pins, t.gen,
                                   t.placed, t.created, t.touched)],
        "extra": dict(t.extra),
        "lru": (list(core._state.lru.prev), list(core._state.lru.next), len(core._state.lru)),
        "ssd_lru": {n: (list(lru.prev), list(lru.next), len(lru))
                    for n, lru in core._state.ssd_lru.items()},
        "space": (core._state.ledger.pending, core._state.ledger.pending_size,
                  core._state.ledger.complete_size, core._state.ledger.pinned),
        "leases": [(i, lease.holder, lease.owner, list(lease.keys), list(lease.tokens),
                    lease.granted_at, lease.expires_at)
                   for i, lease in core._state.leases._leases.items()],
        "next_lease": core._state.leases._next_id,
        "moves": {s: (m.kind, m.token, m.dest) for s, m in core._state.moves.items()},
        "move_queue": list(core._state.move_queue),
        "counters": (core._state.counts.leases_granted, core._state.counts.leases_released,
                     core._state.counts.lookups, core._state.counts.lookup_keys,
                     core._state.counts.hit_keys),
        "events": [(e.kind, list(e.keys), e.bytes) for e in core.take_events()],
        "stats": core.stats(),
    }


def call(core: MasterCore, name: str, *args: Any, **kw: Any) -> Any:
    try:
        out = getattr(core, name)(*args, **kw)
    except KVStoreError as exc:
        return ("raised", type(exc).__name__, exc.message)
    if name == "get_replicas":
        return result_of(out)
    return out


def run(seed: int, nodes: int, replicas: int, ssd: bool, steps: int = 120) -> int:
    rng = random.Random(seed)
    fast = make(rng, nodes, ssd)
    slow = per_key(make(rng, nodes, ssd))
    cols = make(rng, nodes, ssd)
    answered_in_columns = 0
    universe = [f"k{i}".encode() for i in range(60)]
    bad: list[Any] = [b"", "str-key", bytearray(b"k1"), b"x" * 2000, 17]
    for _ in range(steps):
        op = rng.random()
        now = fast.clock.now()
        if op < 0.25:
            keys = rng.sample(universe, rng.randrange(1, 12))
            sizes = [rng.choice([1, 100, 4 * KiB, 10 * KiB]) for _ in keys]
            sums = [rng.randrange(1 << 64) for _ in keys]
            a = call(fast, "put_start", keys, sizes, sums, replicas=replicas)
            b = call(slow, "put_start", keys, sizes, sums, replicas=replicas)
            assert a == b == call(cols, "put_start", keys, sizes, sums, replicas=replicas)
            if rng.random() < 0.9:
                assert (call(fast, "put_end", keys) == call(slow, "put_end", keys)
                        == call(cols, "put_end", keys))
        elif op < 0.6:
            n = rng.randrange(0, 40)
            keys = [rng.choice(universe) for _ in range(n)]  # repeats, missing keys
            if rng.random() < 0.15:
                keys.insert(rng.randrange(len(keys) + 1), rng.choice(bad))
            holder = rng.choice(["", "h1", "h2"])
            owner = rng.choice([None, "", "team-a"])
            ttl = rng.choice([None, 0.5, 3.0])
            a = call(fast, "get_replicas", keys, None, ttl, holder, owner)
            b = call(slow, "get_replicas", keys, None, ttl, holder, owner)
            raw = cols.get_replicas(keys, None, ttl, holder, owner, columns=True) if not any(
                isinstance(k, (str, int)) for k in keys) else None
            c = call(cols, "get_replicas", keys, None, ttl, holder, owner) if raw is None \
                else result_of(raw)
            answered_in_columns += raw is not None and raw.columns is not None
            assert a == b == c
            if rng.random() < 0.3 and a[0]:
                # The with-lease path on the lease just granted.
                sub = [*keys[:rng.randrange(len(keys) + 1)], rng.choice(universe)]
                assert (call(fast, "get_replicas", sub, a[0], None, "", owner)
                        == call(slow, "get_replicas", sub, a[0], None, "", owner)
                        == call(cols, "get_replicas", sub, a[0], None, "", owner, columns=True))
        elif op < 0.75:
            ids = [i for i in fast._state.leases._leases] + [10_000]
            lid = rng.choice(ids)
            keep = rng.choice([None, None, 0, 1, 3])
            owner = rng.choice([None, "", "team-a"])
            assert (call(fast, "release_lease", lid, keep, owner)
                    == call(slow, "release_lease", lid, keep, owner)
                    == call(cols, "release_lease", lid, keep, owner))
        elif op < 0.85:
            keys = rng.sample(universe, rng.randrange(1, 6))
            force = rng.random() < 0.3
            assert (call(fast, "remove", keys, force) == call(slow, "remove", keys, force)
                    == call(cols, "remove", keys, force))
        elif op < 0.95:
            dt = rng.choice([0.01, 0.3, 1.0, 4.0])
            fast.clock.advance(dt)  # type: ignore[attr-defined]
            slow.clock.advance(dt)  # type: ignore[attr-defined]
            cols.clock.advance(dt)  # type: ignore[attr-defined]
            assert call(fast, "tick") == call(slow, "tick") == call(cols, "tick")
        else:
            a = fast.take_tier_moves()
            b = slow.take_tier_moves()
            c_moves = cols.take_tier_moves()
            assert a == b == c_moves
            for m, mc in zip(a, c_moves, strict=True):
                code = Code.OK if rng.random() < 0.9 else Code.INTERNAL
                fast.finish_tier_move(m, code)
                slow.finish_tier_move(m, code)
                cols.finish_tier_move(mc, code)
        assert fast.clock.now() == slow.clock.now() == now or op >= 0.85
        assert state(fast) == state(slow) == state(cols)
    return answered_in_columns


@pytest.mark.parametrize("seed", range(40))
def test_batch_scan_matches_per_key_dram(seed: int) -> None:
    assert run(seed, nodes=1 + seed % 2, replicas=1, ssd=False) > 0  # columns were taken


@pytest.mark.parametrize("seed", range(30))
def test_batch_scan_matches_per_key_two_replicas(seed: int) -> None:
    assert run(seed, nodes=2, replicas=2, ssd=False) > 0


@pytest.mark.parametrize("seed", range(40))
def test_batch_scan_matches_per_key_with_ssd(seed: int) -> None:
    run(seed, nodes=1 + seed % 2, replicas=1, ssd=True, steps=200)


def test_batch_scan_is_taken_and_declines_ssd_and_bad_keys() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    keys = [b"a", b"b"]
    core.put_start(keys, [10, 20], [1, 2])
    core.put_end(keys)
    got = core._reads.read_batch([b"a", b"zz", b"a"])
    assert got is not None
    results, found, slots = got
    assert [r.code for r in results] == [Code.OK, Code.NOT_FOUND, Code.OK]
    assert found == [b"a", b"a"] and slots[0] == slots[1]
    assert core._reads.read_batch([b"a", "b"]) is None  # type: ignore[list-item]
    assert core._reads.read_batch([b"a", b""]) is None
    assert core._reads.read_batch([]) is None
    r = core.get_replicas([b"a", b"", b"b", b"a"])
    assert [i.code for i in r.results] == [Code.OK, Code.INVALID_ARGUMENT, Code.OK, Code.OK]
    assert core._state.leases._leases[r.lease_id].keys == [b"a", b"b", b"a"]
    assert core._state.objects.pins[slots[0]] == 2


def test_columns_are_taken_whole_or_key_by_key_and_decline_ssd_and_bad_keys() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    core.mount_segment("n1", "seg1", 2 << 32, 1 << 20)
    core.put_start([b"a", b"b"], [10, 20], [1, 2])
    core.put_end([b"a", b"b"])
    core.put_start([b"two"], [30], [3], replicas=2)
    core.put_end([b"two"])
    reads = core._reads
    whole = reads._all_found([b"b", b"a", b"b"])  # every key found, one replica each
    assert whole is not None and whole[0].codes == [Code.OK] * 3 and whole[0].counts == [1] * 3
    assert reads._all_found([b"a", b"zz"]) is None  # a miss: key by key
    assert reads._all_found([b"two"]) is None  # two replicas: key by key
    got = reads.read_columns([b"a", b"zz", b"two"])
    assert got is not None
    cols, found, _slots = got
    assert cols.codes == [Code.OK, Code.NOT_FOUND, Code.OK] and cols.counts == [1, 0, 2]
    assert sorted(cols.ranges) == [("n0", "seg0", "dram"), ("n1", "seg1", "dram")]
    assert found == [b"a", b"two"]
    assert reads.read_columns([b"a", b""]) is None
    r = core.get_replicas([b"a", b""], columns=True)  # declined: answered per key
    assert r.columns is None and [i.code for i in r.results] == [Code.OK, Code.INVALID_ARGUMENT]
