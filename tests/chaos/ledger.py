"""Every acknowledged object of a chaos run and the rule that explains its loss.

No I/O here: the driver feeds acknowledgements, placements (from the leader's `Inspect`),
the DRAM losses the events caused and the outcome of each check, and asks which lost
objects are explained. Time is whatever monotonic clock the caller uses.

The rule (docs/architecture.md, "Durability of what was acknowledged"): an object whose put
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
    # Keys whose put is under way, and where the leader said they (PENDING) are: a put
    # may return OK just after its node went, too late to ask then.
    _writing: set[bytes] = field(default_factory=set, repr=False)
    _early: dict[bytes, tuple[frozenset[Copy], float]] = field(default_factory=dict, repr=False)
    # Traffic threads ack and retire while the driver iterates: one lock, held briefly.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- what happened ---------------------------------------------------------------

    def writing(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            self._writing.update(keys)

    def written(self, keys: Iterable[bytes]) -> None:
        """The put returned (each key acked or not)."""
        with self._lock:
            for key in keys:
                self._writing.discard(key)
                self._early.pop(key, None)

    def acked(self, key: bytes, at: float, replicas: int, cold: bool = False) -> None:
        with self._lock:
            if key not in self.records:
                rec = self.records[key] = Record(key, at, replicas, cold)
                if key in self._early:
                    rec.placement, rec.placed_at = self._early[key]

    def placed(self, key: bytes, copies: Iterable[Copy], at: float) -> None:
        """The leader reported these copies at `at`; an empty report (NOT_FOUND) keeps
        the last one, which is what the object was lost from."""
        rec = self.records.get(key)
        copies = frozenset(copies)
        if not copies:
            return
        if rec is None:
            with self._lock:
                if key in self._writing:
                    self._early[key] = (copies, at)
        elif at >= rec.placed_at:
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
        """Acknowledged keys never placed, and keys being written (not placed yet)."""
        with self._lock:
            records = list(self.records.values())
            writing = [k for k in self._writing if k not in self._early]
        return [r.key for r in records if r.state == "live" and r.placed_at < 0] + writing

    def judge(self, key: bytes, origin: float = 0.0) -> Verdict:
        """Why `key`, found missing, is gone, if the rule explains it; times in the
        sentence are seconds from `origin` (the event's start)."""
        rec = self.records[key]
        acked = f"acked at {rec.acked_at - origin:+.2f} s"
        if not rec.placement:
            return Verdict(key, False, f"placement never seen ({acked}, {rec.replicas} "
                           "replica(s) asked)")
        causes = []
        for copy in sorted(rec.placement, key=lambda c: (c.node_id, c.tier)):
            if copy.tier != DRAM:
                return Verdict(key, False, f"its {copy.tier} copy on {copy.node_id} is gone "
                               f"({acked})")
            loss = next((x for x in self.losses
                         if x.node_id == copy.node_id
                         and x.at >= rec.acked_at - ACK_SLACK), None)
            if loss is None:
                before = [x.at - origin for x in self.losses if x.node_id == copy.node_id]
                return Verdict(key, False, f"its DRAM copy on {copy.node_id} is gone ({acked}, "
                               f"placement seen at {rec.placed_at - origin:+.2f} s), and that "
                               "node's DRAM did not die after the ack"
                               + (f" (it last died at {max(before):+.2f} s)" if before else ""))
            causes.append(loss.cause)
        return Verdict(key, True, " + ".join(sorted(set(causes))))

    def lose(self, key: bytes, origin: float = 0.0) -> Verdict:
        verdict = self.judge(key, origin)
        self.records[key].state = "lost"
        return verdict

    def found_again(self, key: bytes) -> None:
        """A key counted lost read back later (e.g. an SSD tier adopted late)."""
        rec = self.records.get(key)
        if rec is not None and rec.state == "lost":
            rec.state = "live"
