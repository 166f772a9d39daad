"""An object's lifecycle, as one table: its states, the moves between them, who makes
each and what each changes.

    GONE --put_start--> PENDING --put_end / put_commit--> COMPLETE <--> PINNED
                                                             |  ^          |
                                                             v  |          v
                                                             MOVING <------+
    and from every state but GONE back to GONE (revoked, reclaimed, evicted, removed,
    lost with its node).

The object table stores only the *phase* of a slot (ObjectTable.phase: GONE, PENDING,
COMPLETE); PINNED and MOVING are a COMPLETE object with lease pins (ObjectTable.pins,
kept by pins.py) or with a move in flight between tiers (CoreState.moves, tiers.py;
a move also holds one pin of its own, so nothing evicts the object meanwhile). state_of
derives the state of this table from those three facts.

TRANSITIONS lists every move an object makes, as (from, to) -> Transition: the public
verbs (MasterCore methods) that may make it, the module that makes it, and what it
changes. A row from a state to itself is a change that leaves the state as it was
(more pins, a replica fewer). Nothing else may happen to an object, and one call
makes only moves its verb is listed for (changes_between):
tests/unit/test_core_invariants.py and the twin tests (test_core_batch_alloc.py)
watch every object through every call and fail on a move, or a verb making it, that
is not here. The mechanisms stay where their reasons to change are (writes.py,
pins.py, tiers.py, membership.py, CoreState.drop): the hot paths move whole batches
and could not afford a lookup per object, so the table is the rule they are held to,
not a dispatcher they call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# A slot's phase (ObjectTable.phase). Module constants: a hot loop reads a global (or
# a local copy) faster than an enum attribute.
GONE = 0  # a free slot (slot 0, the LRU's sentinel, is never anything else)
PENDING = 1  # written: invisible to readers, its ranges its writer's
COMPLETE = 2  # committed: readable, pinned or not, moving or not


class State(enum.Enum):
    GONE = "gone"
    PENDING = "pending"
    COMPLETE = "complete"  # unpinned, on its tier's LRU: evictable
    PINNED = "pinned"  # pinned by leases, off the LRU
    MOVING = "moving"  # a tier move in flight (pinned by it, leases or not)


def state_of(phase: int, pins: int, moving: bool) -> State:
    """The state of this table of an object of `phase` with `pins` (tier moves' own
    included), `moving` when a tier move of it is in flight."""
    if phase == GONE:
        return State.GONE
    if phase == PENDING:
        return State.PENDING
    if moving:
        return State.MOVING
    return State.PINNED if pins > 0 else State.COMPLETE


class Change(enum.Enum):
    """What a transition may change besides the state."""

    SPACE_TAKEN = "replica ranges taken (Segment.take)"
    SPACE_GIVEN = "replica ranges given back (Segment.give)"
    SPACE_HELD = "replica ranges held in the quarantine until their copier is done"
    PINS = "pin counts (pins.py), and with them the LRU lists and the pinned space"
    REPLICAS = "the object's set of replicas, and with it its placement"
    LEDGER = "the space counters (SpaceLedger)"
    JOURNAL = "the replica journal (CoreState.journal_replicas / journal_range)"


@dataclass(frozen=True, slots=True)
class Transition:
    verbs: frozenset[str]  # MasterCore methods that may make it
    by: str  # the module (or verb) that makes it
    changes: frozenset[Change]
    why: str


def _row(verbs: str, by: str, changes: set[Change], why: str) -> Transition:
    return Transition(frozenset(verbs.split()), by, frozenset(changes), why)


C = Change
# Verbs that can drop objects of any state: a segment remounted with new geometry or
# a node gone takes its replicas (membership.py), a forced remove takes anything.
_LOSS = "unmount_node mount_segment"
# Verbs that evict (Eviction.evict): a put making room or over its quota, the watermark
# in tick, the admin's evict_to; and demotion's own SSD eviction, which promotion (and
# a read that starts one) can set off when it demotes to make DRAM room.
_EVICT = "put_start tick evict_to promote lookup get_replicas"
# Verbs that start a tier move: promotion (asked, or a read of an SSD object), and
# demotion instead of eviction where the node has an SSD tier.
_MOVE = "promote lookup get_replicas put_start tick evict_to"
# Verbs that change lease pins.
_PIN = "lookup get_replicas"
_UNPIN = "release_lease tick"

TRANSITIONS: dict[tuple[State, State], Transition] = {
    (State.GONE, State.PENDING): _row(
        "put_start", "writes.py, batch_put.py (ObjectTable.new)",
        {C.SPACE_TAKEN, C.LEDGER},
        "a writer starts a new object: its ranges are taken and handed to the writer"),
    (State.PENDING, State.COMPLETE): _row(
        "put_end put_commit", "pins.py (Pins.commit)",
        {C.PINS, C.LEDGER, C.JOURNAL},
        "the writer is done: readable, unpinned, at the recent end of the LRU, and its "
        "replicas journaled for the nodes' inventories"),
    (State.PENDING, State.GONE): _row(
        f"put_revoke tick remove {_LOSS}", "state.py (CoreState.drop)",
        {C.SPACE_GIVEN, C.SPACE_HELD, C.LEDGER},
        "revoked, reclaimed past put_timeout, force-removed or lost with a node: ranges "
        "its writer may still write into are held (quarantine.py), the rest given back"),
    (State.GONE, State.COMPLETE): _row(
        "adopt_replica", "membership.py (Pins.adopt)",
        {C.SPACE_TAKEN, C.PINS, C.LEDGER},
        "a node's inventory replayed to a new leader: the node holds it already, so "
        "nothing is journaled"),
    (State.COMPLETE, State.COMPLETE): _row(
        f"drain adopt_replica {_LOSS}", "membership.py",
        {C.SPACE_TAKEN, C.SPACE_GIVEN, C.REPLICAS, C.LEDGER, C.JOURNAL},
        "a replica more (adopted) or fewer (drained, lost with its node; drain's "
        "removals journaled)"),
    (State.COMPLETE, State.PINNED): _row(
        _PIN, "pins.py (Pins.pin)", {C.PINS, C.LEDGER},
        "a lease pins it: off the LRU, its DRAM counted as pinned"),
    (State.PINNED, State.PINNED): _row(
        f"{_PIN} {_UNPIN} adopt_replica {_LOSS}", "pins.py, membership.py",
        {C.PINS, C.SPACE_TAKEN, C.SPACE_GIVEN, C.REPLICAS, C.LEDGER},
        "pins added or taken while others remain; a replica adopted or lost"),
    (State.PINNED, State.COMPLETE): _row(
        _UNPIN, "pins.py (Pins.unpin)", {C.PINS, C.LEDGER},
        "its last lease let go (released, trimmed, expired): back at the recent end of "
        "its LRU"),
    (State.COMPLETE, State.MOVING): _row(
        _MOVE, "tiers.py (Pins.hold)", {C.SPACE_TAKEN, C.PINS, C.LEDGER},
        "a promotion or demotion starts: the destination is taken, a move's pin holds "
        "the object where it is while the node copies it"),
    (State.PINNED, State.MOVING): _row(
        "promote lookup get_replicas", "tiers.py (Pins.hold)",
        {C.SPACE_TAKEN, C.PINS, C.LEDGER},
        "a pinned object on SSD starts its promotion (demotion takes unpinned ones only)"),
    (State.MOVING, State.MOVING): _row(
        f"{_PIN} {_UNPIN} adopt_replica {_LOSS}", "pins.py, membership.py",
        {C.PINS, C.SPACE_TAKEN, C.SPACE_GIVEN, C.REPLICAS, C.LEDGER},
        "leases pin or unpin it while it moves; a replica adopted or lost"),
    (State.MOVING, State.COMPLETE): _row(
        "finish_tier_move", "tiers.py (Tiers.finish_tier_move)",
        {C.SPACE_GIVEN, C.PINS, C.REPLICAS, C.LEDGER, C.JOURNAL},
        "the node answered: done (the replica swapped, the source given back, both "
        "journaled) or failed (the destination given back)"),
    (State.MOVING, State.PINNED): _row(
        "finish_tier_move", "tiers.py (Tiers.finish_tier_move)",
        {C.SPACE_GIVEN, C.PINS, C.REPLICAS, C.LEDGER, C.JOURNAL},
        "as to COMPLETE, for an object leases still pin"),
    (State.COMPLETE, State.GONE): _row(
        f"{_EVICT} remove {_LOSS}", "eviction.py, writes.py, membership.py (CoreState.drop)",
        {C.SPACE_GIVEN, C.LEDGER, C.JOURNAL},
        "evicted, removed, or lost with its last replica's node"),
    (State.PINNED, State.GONE): _row(
        f"remove {_LOSS}", "writes.py, membership.py (CoreState.drop)",
        {C.SPACE_GIVEN, C.LEDGER, C.JOURNAL},
        "only a forced remove or its node's loss takes a pinned object: its leases then "
        "answer NOT_FOUND for it"),
    (State.MOVING, State.GONE): _row(
        f"finish_tier_move remove {_LOSS}", "tiers.py, writes.py, membership.py (CoreState.drop)",
        {C.SPACE_GIVEN, C.SPACE_HELD, C.LEDGER, C.JOURNAL},
        "a failed demotion ends as the eviction it was, a promotion's bad copy drops it; "
        "removed or lost while moving, its destination is held until the node answers"),
}
del C


def _reach(edges: list[tuple[State, State]], start: State, forward: bool) -> set[State]:
    """The states reachable from `start` (or, not `forward`, that reach it) along edges."""
    found = {start}
    todo = [start]
    while todo:
        at = todo.pop()
        for a, b in edges:
            nxt = b if forward else a
            if (a if forward else b) == at and nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return found


def changes_between(source: State, target: State, verb: str) -> frozenset[Change] | None:
    """What one call of `verb` may have changed in an object it took from `source` to
    `target` (the same state again: it changed it without moving it), or None when
    the table gives `verb` no way there. One call may make several moves (a tick
    expires a lease and then evicts the object): any path of the verb's rows counts,
    and its changes are those of every row on such a path."""
    edges = [edge for edge, row in TRANSITIONS.items() if verb in row.verbs]
    after_source = set()
    for a, b in edges:
        if a == source:
            after_source |= _reach(edges, b, True)
    if target not in after_source:
        return None
    before_target = _reach(edges, target, False)
    ahead = _reach(edges, source, True)
    out: set[Change] = set()
    for (a, b), row in TRANSITIONS.items():
        if verb in row.verbs and a in ahead and b in before_target:
            out |= row.changes
    return frozenset(out)
