"""Random operation sequences against the core, checking its invariants after each step.

The invariants are the ones every other module relies on: no two replicas share a byte,
the allocators' books match the objects, pin counts match the live leases, a pinned
object is never taken by anything but a node loss, PENDING objects are invisible, and
the LRU holds exactly the evictable objects. And every object moves only as the
lifecycle table says (lifecycle.py): Watched checks each call's moves against it.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvstore.errors import Code, LeaseExpired
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.core.lifecycle import (
    COMPLETE,
    TRANSITIONS,
    Change,
    State,
    changes_between,
    state_of,
)
from kvstore.master.core.objects import SLOT_BITS

KiB = 1 << 10
ALIGN = 64


def round_up(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


# -- the lifecycle table, watched -------------------------------------------------------

# What an object is, as the table sees it: its state, pins, replicas and key.
Seen = tuple[State, int, tuple[int, ...], bytes]
# Verbs that change no object (MasterCore's read-only methods, and the queues' takers).
READ_ONLY = frozenset({
    "exists", "inspect", "keys", "stats", "node_list", "node_ids", "eviction_stats",
    "tier_counters", "tenant_usage", "draining", "moving", "take_events",
    "take_tier_moves", "take_replica_changes", "renew_lease", "set_quotas",
    "set_draining", "set_adopting", "hold_eviction_until", "reconfigure",
})


def objects_now(core: MasterCore) -> dict[int, Seen]:
    """Every live object, by token (slot and generation: a slot reused is another object)."""
    state = core._state
    t = state.objects
    out: dict[int, Seen] = {}
    for key, s in t.index.items():
        pins = t.pins[s] if t.phase[s] == COMPLETE else 0
        out[s | t.gen[s] << SLOT_BITS] = (state_of(t.phase[s], pins, s in state.moves), pins,
                                          t.handles(s), key)
    return out


class Watched:
    """A MasterCore whose every call is held to the lifecycle table: each object's move
    (from its state before the call to its state after) must be a row of TRANSITIONS
    that names the verb (or a path of such rows: one call may make several moves); a
    change of its pins or replicas must be one those rows list; a key journaled must be
    an object whose rows list the journal. `seen` collects the rows observed with the
    verb that made each, for the test that the table holds nothing that never happens."""

    def __init__(self, core: MasterCore) -> None:
        self.core = core
        self.seen: set[tuple[State, State, str]] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.core, name)
        if name.startswith("_") or name in READ_ONLY or not callable(attr):
            return attr

        def watched(*args: Any, **kw: Any) -> Any:
            before = objects_now(self.core)
            journal = self.core._state.journal
            at = len(journal) if journal is not None else 0
            try:
                return attr(*args, **kw)
            finally:
                self.check(name, before, objects_now(self.core),
                           journal[at:] if journal is not None else [])

        return watched

    def check(self, verb: str, before: dict[int, Seen], after: dict[int, Seen],
              journaled: list[Any]) -> None:
        gone: Seen = (State.GONE, 0, (), b"")
        journal_ok: set[bytes] = set()
        for token in before.keys() | after.keys():
            src, pins0, handles0, key0 = before.get(token, gone)
            dst, pins1, handles1, key1 = after.get(token, gone)
            if src == dst and pins0 == pins1 and handles0 == handles1:
                continue  # nothing happened to it
            changes = changes_between(src, dst, verb)
            assert changes is not None, \
                f"{verb} took {key0 or key1!r} {src} -> {dst}: the table has no way there for it"
            if src != State.GONE and dst != State.GONE:
                assert pins0 == pins1 or Change.PINS in changes, (verb, src, dst)
                assert handles0 == handles1 or Change.REPLICAS in changes, (verb, src, dst)
            if Change.JOURNAL in changes:
                journal_ok |= {key0, key1}
            row = TRANSITIONS.get((src, dst))
            if row is not None and verb in row.verbs:
                self.seen.add((src, dst, verb))
        for change in journaled:
            # A demotion's file whose object went while it moved is dropped by the node's
            # answer, with no object left to move.
            assert change.key in journal_ok or verb == "finish_tier_move", (verb, change)


@dataclass
class Model:
    incarnation: dict[bytes, int] = field(default_factory=dict)  # live objects
    pending: dict[bytes, str] = field(default_factory=dict)  # key -> writer
    leases: dict[int, tuple[list[tuple[bytes, int]], float]] = field(default_factory=dict)
    next_inc: int = 1


def check(core: MasterCore, model: Model, now: float, nodes_lost: bool) -> None:
    keys = core.keys(limit=10**9)
    infos = {k: core.inspect(k) for k in keys}
    # Objects that went away since the last step leave the model.
    for k in list(model.incarnation):
        if k not in infos:
            del model.incarnation[k]
            model.pending.pop(k, None)
    assert set(infos) == set(model.incarnation)
    assert {k for k, i in infos.items() if i is not None and i.state == "pending"} == set(model.pending)

    ranges: dict[str, list[tuple[int, int]]] = {}
    pinned_space = pending_space = 0
    expected_pins: dict[bytes, int] = {}
    for positions, _ in model.leases.values():
        for k, inc in positions:
            if model.incarnation.get(k) == inc:
                expected_pins[k] = expected_pins.get(k, 0) + 1
            else:
                # A pinned object may only vanish with its node.
                assert nodes_lost, f"pinned object {k!r} disappeared"
    evictable = 0
    for k, info in infos.items():
        assert info is not None
        space = round_up(info.size) * len(info.locations)
        assert len({loc.node_id for loc in info.locations}) == len(info.locations)
        for loc in info.locations:
            ranges.setdefault(loc.node_id, []).append((loc.addr, round_up(info.size)))
        if info.state == "pending":
            pending_space += space
            assert info.pins == 0
        else:
            assert info.pins == expected_pins.get(k, 0), k
            if info.pins:
                pinned_space += space
            else:
                evictable += 1
    # Ranges a writer may still be writing into after its object went stay allocated
    # (quarantine.py): no replica may share a byte with them either.
    for seg, off, n in core._state.quarantine.ranges():
        ranges.setdefault(seg.node_id, []).append((seg.base_addr + off, round_up(n)))
    st = core.stats()
    for node, spans in ranges.items():
        spans.sort()
        for (a, n), (b, _) in itertools.pairwise(spans):
            assert a + n <= b, f"overlapping replicas on {node}"
        assert st.nodes[node].used == sum(n for _, n in spans)
    assert st.pool_used == sum(n for spans in ranges.values() for _, n in spans)
    assert st.pool_pinned == pinned_space
    assert st.pool_pending == pending_space
    assert st.objects_pending + st.objects_complete == len(infos)
    assert len(core._state.lru) == evictable
    complete = [k for k, i in infos.items() if i is not None and i.state == "complete"]
    pending = [k for k, i in infos.items() if i is not None and i.state == "pending"]
    assert core.exists(complete) == [True] * len(complete)
    assert core.exists(pending) == [False] * len(pending)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_operations_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    watched = Watched(MasterCore(CoreConfig(put_timeout=20.0, max_lease_ttl=60.0), clock))
    watched.core.journal = []  # so that the journal's rows are checked too
    core: MasterCore = watched  # type: ignore[assignment]  # every call checked (Watched)
    for i in range(3):
        core.mount_segment(f"n{i}", f"h:{i}", (i + 1) << 32, 64 * KiB)
    pool = [b"key-%03d" % i for i in range(150)]
    writers = ["", "w1", "w2"]
    model = Model()

    def pick(n: int) -> list[bytes]:
        return [rng.choice(pool) for _ in range(n)]

    def complete() -> list[bytes]:
        return sorted(k for k in model.incarnation if k not in model.pending)

    for _ in range(1500):
        op = rng.random()
        now = clock.now()
        if op < 0.25:
            keys = pick(rng.randint(1, 5))
            writer = rng.choice(writers)
            rs = core.put_start(
                keys,
                [rng.randint(1, 8 * KiB) for _ in keys],
                [rng.getrandbits(64)] * len(keys),
                rng.randint(1, 3),
                writer,
            )
            for k, r in zip(keys, rs, strict=True):
                # OK for a key the model holds COMPLETE means this very batch evicted
                # it to make room and then wrote it anew.
                if r.code == Code.OK and k not in model.pending:
                    model.incarnation[k] = model.next_inc
                    model.pending[k] = writer
                    model.next_inc += 1
                assert r.code in (Code.OK, Code.ALREADY_EXISTS, Code.IN_PROGRESS, Code.STORE_FULL)
        elif op < 0.45:
            keys = rng.sample(sorted(model.pending), min(len(model.pending), 4)) + pick(1)
            writer = rng.choice(writers)
            for k, code in zip(keys, core.put_end(keys, writer), strict=True):
                if code == Code.OK:
                    model.pending.pop(k, None)  # a repeated key answers OK twice
        elif op < 0.5:
            keys = rng.sample(sorted(model.pending), min(len(model.pending), 2))
            core.put_revoke(keys, rng.choice(writers))
        elif op < 0.65:
            have = complete()
            keys = rng.sample(have, min(len(have), rng.randint(1, 8)))
            if rng.random() < 0.3:
                keys.insert(rng.randint(0, len(keys)), rng.choice(pool))
            ttl = rng.uniform(1, 60)
            hit = core.lookup(keys, lease_ttl=ttl)
            if hit.count:
                model.leases[hit.lease_id] = (
                    [(k, model.incarnation[k]) for k in keys[: hit.count]],
                    hit.expires_at,
                )
        elif op < 0.7:
            keys = rng.sample(complete(), min(len(complete()), 3)) + pick(1)
            g = core.get_replicas(keys, lease_ttl=rng.uniform(1, 60))
            found = [k for k, res in zip(keys, g.results, strict=True) if res.code == Code.OK]
            for k, res in zip(keys, g.results, strict=True):
                if res.code == Code.OK:
                    info = core.inspect(k)
                    assert info is not None and info.locations == res.locations
            if g.lease_id:
                model.leases[g.lease_id] = ([(k, model.incarnation[k]) for k in found], g.expires_at)
            else:
                assert not found
        elif op < 0.74 and model.leases:
            lease_id = rng.choice(sorted(model.leases))
            positions, expires = model.leases[lease_id]
            keys = [k for k, _ in positions] + pick(1)
            try:
                g = core.get_replicas(keys, lease_id=lease_id)
            except LeaseExpired:
                assert now >= expires
                continue
            held = {k for k, _ in positions}
            for k, res in zip(keys, g.results, strict=True):
                if k in held:
                    assert res.code == Code.OK
                    info = core.inspect(k)
                    assert info is not None and info.locations == res.locations
                else:
                    assert res.code == Code.LEASE_NOT_FOUND
        elif op < 0.8 and model.leases:
            lease_id = rng.choice(sorted(model.leases))
            positions, expires = model.leases[lease_id]
            keep = rng.choice([None, 0, 1, 2, 5])
            try:
                core.release_lease(lease_id, keep)
            except LeaseExpired:
                assert now >= expires
                continue
            if keep is None:
                del model.leases[lease_id]
            else:
                del positions[keep:]
        elif op < 0.85 and model.leases:
            lease_id = rng.choice(sorted(model.leases))
            positions, expires = model.leases[lease_id]
            try:
                new_exp = core.renew_lease(lease_id, rng.uniform(1, 60))
            except LeaseExpired:
                assert now >= expires
                continue
            model.leases[lease_id] = (positions, new_exp)
        elif op < 0.88:
            core.remove(pick(2))
        elif op < 0.9:
            core.evict_to(rng.random())
        else:
            clock.advance(rng.uniform(0, 4))
            core.tick()
            now = clock.now()
            for lease_id in [i for i, (_, exp) in model.leases.items() if exp <= now]:
                del model.leases[lease_id]
        check(core, model, clock.now(), nodes_lost=False)

    st = core.stats()
    # The mix reached every corner: evictions, store-full refusals, expiries, pins.
    assert st.evictions and st.put_failures.get("store_full") and st.leases_expired
    assert st.hit_keys > st.lookups
    # Lose a node: the books must still balance, and replicas elsewhere survive.
    core.unmount_node("n1")
    check(core, model, clock.now(), nodes_lost=True)
    assert "n1" not in core.stats().nodes
