"""Every acknowledged object of a chaos run and the rule that explains its loss.

No I/O here: the driver feeds acknowledgements, placements (from the leader's `Inspect`),
the DRAM losses the events caused and the outcome of each check, and asks which lost
objects are explained. Time is whatever monotonic clock the caller uses.

The rule (DESIGN.md, "Durability of what was acknowledged"): an object whose put
returned OK stays readable unless every copy of it was in the DRAM of a store-node
process that died (kill -9, SIGTERM) or that the master dropped (stopped or cut off past
its etcd lease) after the object was acknowledged. "Every copy" is the last placement
the leader reported for it; a copy on an SSD tier survives its process. A master holds
no bytes, so no master or etcd event explains a loss. An object whose placement was never
seen cannot be explained either: the driver asks for placements right after each event,
before any restarted node can mount, so this only happens when the leader lost it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

DRAM = "dram"
# A put may return OK just after the node holding its bytes died (they were written, then
# PutEnd reached the master before the node's lease ended): a DRAM loss this long before
# the ack still explains it. Shorter than any restart of a node, so a loss of an earlier
# incarnation under the same node id never explains an object of the next one.
ACK_SLACK = 2.0


@dataclass(frozen=True)
class Copy:
    node_id: str
    tier: str


@dataclass
class Record:
    key: bytes
    acked_at: float
    replicas: int  # asked for
    cold: bool = False  # demoted to SSD at set-up; checked with Exists until the end
    placement: frozenset[Copy] = frozenset()
    placed_at: float = -1.0  # when `placement` was reported; -1: never
    state: str = "live"  # live, lost, retired (read back OK, then removed by its writer)


@dataclass(frozen=True)
class DramLoss:
    """The DRAM of `node_id` was gone from `at` on (its process died or the master
    dropped the node), because of `cause` (an event's description)."""

    node_id: str
    at: float
    cause: str


@dataclass
class Verdict:
    key: bytes
    explained: bool
    why: str


@dataclass
class Ledger:
    records: dict[bytes, Record] = field(default_factory=dict)
    losses: list[DramLoss] = field(default_factory=list)
    # Traffic threads ack and retire while the driver iterates: one lock, held briefly.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- what happened ---------------------------------------------------------------

    def acked(self, key: bytes, at: float, replicas: int, cold: bool = False) -> None:
        with self._lock:
            if key not in self.records:
                self.records[key] = Record(key, at, replicas, cold)

    def placed(self, key: bytes, copies: Iterable[Copy], at: float) -> None:
        """The leader reported these copies at `at`; an empty report (NOT_FOUND) keeps
        the last one, which is what the object was lost from."""
        rec = self.records.get(key)
        copies = frozenset(copies)
        if rec is not None and copies and at >= rec.placed_at:
            rec.placement, rec.placed_at = copies, at

    def dram_lost(self, node_id: str, at: float, cause: str) -> None:
        self.losses.append(DramLoss(node_id, at, cause))

    def retired(self, key: bytes) -> None:
        rec = self.records.get(key)
        if rec is not None and rec.state == "live":
            rec.state = "retired"

    def state(self, key: bytes) -> str:
        rec = self.records.get(key)
        return rec.state if rec is not None else ""

    # -- questions ----------------------------------------------------------------------

    def live(self, before: float | None = None) -> list[Record]:
        with self._lock:
            records = list(self.records.values())
        return [r for r in records if r.state == "live" and (before is None or r.acked_at < before)]

    def unplaced(self) -> list[bytes]:
        with self._lock:
            records = list(self.records.values())
        return [r.key for r in records if r.state == "live" and r.placed_at < 0]

    def judge(self, key: bytes) -> Verdict:
        """Why `key`, found missing, is gone, if the rule explains it."""
        rec = self.records[key]
        if not rec.placement:
            return Verdict(key, False, "placement never seen (acked "
                           f"{rec.acked_at:.3f}, {rec.replicas} replica(s) asked)")
        causes = []
        for copy in sorted(rec.placement, key=lambda c: (c.node_id, c.tier)):
            if copy.tier != DRAM:
                return Verdict(key, False, f"its {copy.tier} copy on {copy.node_id} is gone")
            loss = next((x for x in self.losses
                         if x.node_id == copy.node_id
                         and x.at >= rec.acked_at - ACK_SLACK), None)
            if loss is None:
                return Verdict(key, False, f"its DRAM copy on {copy.node_id} is gone, and "
                               "that node's DRAM did not die after the ack")
            causes.append(loss.cause)
        return Verdict(key, True, " + ".join(sorted(set(causes))))

    def lose(self, key: bytes) -> Verdict:
        verdict = self.judge(key)
        self.records[key].state = "lost"
        return verdict

    def found_again(self, key: bytes) -> None:
        """A key counted lost read back later (e.g. an SSD tier adopted late)."""
        rec = self.records.get(key)
        if rec is not None and rec.state == "lost":
            rec.state = "live"
