"""The lifecycle table (lifecycle.py) against the core: every verb, tiers and nodes
included, moves objects only as a row of the table says (Watched checks each call),
and every row of the table happens (a row nothing makes is a rule nobody keeps)."""

from __future__ import annotations

import random

import pytest

from kvstore.errors import Code, KVStoreError
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.core.lifecycle import GONE, TRANSITIONS, State, changes_between, state_of
from tests.unit.test_core_invariants import Watched

KiB = 1024


def drive(seed: int, steps: int = 1500) -> Watched:
    rng = random.Random(seed)
    clock = ManualClock()
    watched = Watched(MasterCore(CoreConfig(evict_high=0.8, evict_low=0.6, put_timeout=20.0,
                                            max_lease_ttl=60.0), clock))
    watched.core.journal = []
    core: MasterCore = watched  # type: ignore[assignment]  # every call checked
    geometry = {f"n{i}": 64 * KiB for i in range(3)}

    def mount(node: str) -> None:
        core.mount_segment(node, f"{node}:dram", (int(node[1:]) + 1) << 36, geometry[node])
        if node != "n2":  # n2 has no SSD tier
            core.mount_segment(node, f"{node}:ssd", 0, 128 * KiB, tier="ssd")

    for node in geometry:
        mount(node)
    keys = [b"k%02d" % i for i in range(40)]
    leases: list[int] = []
    for _ in range(steps):
        op = rng.random()
        try:
            if op < 0.22:
                batch = rng.sample(keys, rng.randint(1, 4))
                ahead = rng.random() < 0.1
                if ahead:
                    batch = [b"ph/" + k for k in batch]
                size = 4 * KiB if ahead else rng.choice([4, 6, 9]) * KiB
                core.put_start(batch, [size] * len(batch),
                               [7] * len(batch), rng.randint(1, 2), "w", ahead=ahead)
            elif op < 0.36:
                core.put_end(rng.sample(keys, 6), "w")
            elif op < 0.4:
                holders = core.keys(b"ph/", 3)
                core.put_commit(holders, rng.sample(keys, len(holders)),
                                [4 * KiB] * len(holders), [7] * len(holders), "w")
            elif op < 0.43:
                core.put_revoke(rng.sample(keys, 2), "w", unsettled=rng.random() < 0.5)
            elif op < 0.47:
                core.remove(rng.sample(keys, 2), force=rng.random() < 0.5)
            elif op < 0.57:
                hit = core.lookup(rng.sample(keys, 3), lease_ttl=rng.uniform(1, 30))
                if hit.count:
                    leases.append(hit.lease_id)
            elif op < 0.63:
                got = core.get_replicas(rng.sample(keys, 3), lease_ttl=rng.uniform(1, 30),
                                        pin=rng.random() < 0.8)
                if got.lease_id:
                    leases.append(got.lease_id)
            elif op < 0.68 and leases:
                core.release_lease(leases.pop(rng.randrange(len(leases))))
            elif op < 0.72:
                core.promote(rng.sample(keys, 3))
            elif op < 0.8:
                moves = core.take_tier_moves()
                rng.shuffle(moves)
                for m in moves[:rng.randint(0, len(moves))]:
                    code = rng.choice([Code.OK, Code.OK, Code.OK, Code.STORE_FULL, Code.CORRUPT])
                    core.finish_tier_move(m, code)
                for m in moves:  # the rest stay in flight a while longer
                    core._state.move_queue.append(m)
            elif op < 0.83:
                core.evict_to(rng.uniform(0.2, 0.7))
            elif op < 0.86:
                # A node replays an inventory: a replica more of an object, or a new one.
                node = rng.choice(sorted(geometry))
                k = rng.choice(keys)
                info = core.inspect(k)
                size = info.size if info is not None else 4 * KiB
                checksum = info.checksum if info is not None else 7
                core.adopt_replica(k, size, checksum, node,
                                   rng.randrange(0, geometry[node] - size, 4 * KiB) // 64 * 64)
            elif op < 0.88:
                core.drain(rng.choice(sorted(geometry)), limit=rng.randint(1, 4))
                core.set_draining(rng.choice(sorted(geometry)), False)
            elif op < 0.9:
                node = rng.choice(sorted(geometry))
                if rng.random() < 0.5:
                    core.unmount_node(node)
                else:
                    geometry[node] = rng.choice([64, 80]) * KiB  # new geometry: a new segment
                mount(node)
            else:
                clock.advance(rng.uniform(0, 8))
                core.tick()
        except KVStoreError:
            pass  # an expired lease, a node not mounted: refused, nothing changed
    return watched


@pytest.mark.parametrize("seed", [13, 14, 16])
def test_every_call_moves_objects_only_as_the_table_says(seed: int) -> None:
    drive(seed)  # Watched fails the call that does otherwise


def ssd_pressure(verb: str) -> Watched:
    """DRAM and SSD full, then `verb` on the oldest SSD object: its promotion demotes a
    DRAM object, whose SSD room comes from evicting an SSD one (the reads pin theirs
    first, so that is another one; promote pins nothing)."""
    watched = Watched(MasterCore(CoreConfig(evict_high=1.0, evict_low=0.9), ManualClock()))
    core: MasterCore = watched  # type: ignore[assignment]
    core.mount_segment("n0", "seg0", 1 << 32, 30 * KiB)
    core.mount_segment("n0", "ssd:n0", 0, 32 * KiB, tier="ssd")  # room for two files
    for k in (b"a", b"b", b"c", b"d", b"f"):
        core.put_start([k], [10 * KiB], [1])
        core.put_end([k])
        if k == b"b":
            state = watched.core._state
            for old in (b"a", b"b"):
                assert watched.core._tiers.start_demotion(state.objects.index[old])
            for m in core.take_tier_moves():
                core.finish_tier_move(m, Code.OK)
    if verb == "promote":
        core.promote([b"a"])
    else:
        getattr(core, verb)([b"a"])
    return watched


def test_every_row_of_the_table_happens_with_every_verb_it_names() -> None:
    seen: set[tuple[State, State, str]] = set()
    for seed in (11, 12, 15):
        seen |= drive(seed).seen
    for verb in ("lookup", "get_replicas", "promote"):
        seen |= ssd_pressure(verb).seen
    listed = {(a, b, verb) for (a, b), row in TRANSITIONS.items() for verb in row.verbs}
    assert sorted((a.value, b.value, v) for a, b, v in listed - seen) == []


def test_the_table_answers_what_a_call_may_do() -> None:
    assert changes_between(State.GONE, State.PENDING, "put_start") is not None
    assert changes_between(State.GONE, State.PENDING, "lookup") is None
    assert changes_between(State.PINNED, State.GONE, "evict_to") is None  # the promise
    assert changes_between(State.PENDING, State.PINNED, "lookup") is None
    # One call, two moves: a tick expires the lease, then evicts the object.
    assert changes_between(State.PINNED, State.GONE, "tick") is not None
    assert state_of(GONE, 3, True) is State.GONE
