"""Acknowledged means recorded outside the leader, with no round trip added in sequence.

A new leader rebuilds its index from the store nodes' inventories, so a commit (or a
removal) the leader has only in memory dies with it. docs/durability.md (section 1) says
why the following is enough:

- PutStart: the leader sends each node it placed a replica on an *intent* (key, offset,
  size, checksum; `Replica.pending`), queued right after the call and sent at once, in
  parallel with the reply. Deltas no reply waits for (commits acknowledged on their
  intents, drops) may wait `nodes.DEFER` to share an Apply. The node holds an intent as
  "committed if its bytes verify".
- PutEnd: the reply waits until each node has applied the key's intent, which has had
  the whole transfer to arrive (normally it has: nothing to wait for). The commit delta
  is queued and sent, not waited for: the intent plus the bytes the client wrote before
  its PutEnd already tell a new leader the object is there.
- PutStart of space started ahead (placeholders) with record room: an intent per
  placeholder with no key or checksum yet (`Replica.record`); its writer appends a put
  record (kvstore/put_record.py) to the value it writes there. PutCommit with
  `records`: the reply waits only for the placeholder's intent (long since applied),
  as PutEnd does; the commit is queued, then the drop of the placeholder's intent.
- PutCommit without records, a commit with no intent of this term, Remove: the reply
  waits until the nodes applied the call's own deltas (one leader-to-node round trip).
- A PENDING object that goes (revoked, reclaimed, its other node lost, removed): the
  intents of its attempt are dropped, in the same per-node order, before its ranges can
  be placed again; a Remove also waits for the drop of any intent of the key still in
  flight, so no intent outlives a removal.

Handlers run one at a time on the event loop and take the core's journal right after
their core call, so the entries a call takes are its own (plus, at most, replicas an
eviction inside the same call freed: waiting for those too costs nothing extra, they
go in the same Apply). The journal's entries are queued before the call's intents: a
range an eviction freed reaches the node as freed before the intent placed over it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from kvstore.errors import Code
from kvstore.master.core import Location, ReplicaChange
from kvstore.master.nodes import Applied, NodeLinks
from kvstore.rpc.delta_columns import DRAM_DROP, DROP, INTENT, INTENT_RECORD, tier_flag

# Calls whose OK promises a change a new leader must find (PutStart: only where it
# found the key already stored, see `record`).
RECORDED_CALLS = frozenset({"PutStart", "PutEnd", "PutCommit", "Remove"})

Mark = tuple[Any, int]  # NodeLinks.mark: (the link, a place in its queue)
# What a held reply promised, for its judgement: the keys the call found stored (with
# their nodes) and its journal (ReplicaChange.added: committed). Kept as is and read
# only when a node did not answer YES.
_Added = tuple["dict[bytes, set[str]] | None", "list[ReplicaChange]"]


class Placed(NamedTuple):
    """A put PutStart placed: its key (as the core stores it), checksum and replicas.
    A NamedTuple, not a frozen dataclass: PutStart makes one per key, and this builds
    in about half the time."""

    key: bytes
    checksum: int
    locations: Sequence[Location]
    record: bool = False  # a placeholder: key and checksum come in its put record


def queue_changes(links: NodeLinks, changes: list[ReplicaChange]) -> None:
    queue_row = links.queue_row
    for c in changes:
        queue_row(c.node_id, (c.key, c.offset, c.size, c.checksum,
                              tier_flag(c.tier) | (0 if c.added else DROP)))


class Recorder:
    def __init__(self, take_changes: Callable[[], list[ReplicaChange]], links: NodeLinks,
                 timeout: float, base_of: Callable[[str], int | None] | None = None) -> None:
        """`base_of`: a node's DRAM segment base address (None: unknown, and a put
        placed there is recorded the old way, its PutEnd waiting for the commit)."""
        self._take = take_changes
        self._links = links
        self.timeout = timeout
        self._base_of = base_of or (lambda _node: None)
        # Intents sent and not yet replaced by their commit or dropped: key -> node ->
        # (offset, mark). Cleared with the term (`reset`): marks name this term's links.
        self._intents: dict[bytes, dict[str, tuple[int, Mark]]] = {}
        # Intent drops queued, per key, not yet known applied: a Remove waits for them.
        self._dropping: dict[bytes, list[tuple[str, Mark]]] = {}
        self.held = 0  # replies that waited for a node
        self.refused = 0  # replies turned into UNAVAILABLE: not recorded in time
        self.intents = 0  # intents sent
        self.early = 0  # commits acknowledged on their intent (no wait for the commit)

    def counters(self) -> dict[str, int]:
        """For ClusterStatus: how the write replies of this process were recorded."""
        return {"durable_intents": self.intents, "durable_early": self.early,
                "durable_held": self.held, "durable_refused": self.refused}

    def reset(self) -> None:
        """A new term: this leader's links start over, and so does what was sent."""
        self._intents.clear()
        self._dropping.clear()

    def record(self, method: str, reply: Any,
               stored: dict[bytes, set[str]] | None = None,
               placed: Sequence[Placed] = (),
               released: Iterable[bytes] = (),
               renamed: dict[bytes, bytes] | None = None,
               records: bool = False) -> asyncio.Future[None] | None:
        """Queue what the call just changed; None if its reply may leave now, else a
        future resolved once it may (having set `reply.error` if the change could not be
        recorded in time). `stored`: keys the call found already stored, with the nodes
        holding them; their record is waited for too, so that a retry of a write whose
        reply said "not recorded" is not acknowledged before the record lands.
        `placed`: the puts PutStart placed (their intents go out now); `released`: keys
        whose PENDING attempt the call ended without a commit (revoked, removed);
        `renamed`: PutCommit's keys and the placeholders they were written into, whose
        intents the commits replace (`records`: each carries its put record, so the
        commit is acknowledged on the placeholder's intent)."""
        changes = self._take()
        kick, waits, late, any_added = self._queue(changes, placed, released, renamed or {},
                                                   records)
        if not changes and not stored and not kick:
            return None
        # Intents go at once: a PutEnd's reply waits for them and they have only its
        # transfer's time to land. What else is queued may wait a little for company.
        urgent = bool(placed)
        if method not in RECORDED_CALLS or reply.error.code:
            self._links.kick(kick, now=urgent)
            return None
        dropped: set[str] = set()
        if method == "Remove":  # an eviction inside a put is no promise
            dropped = {c.node_id for c in changes if not c.added}
            if self._dropping:
                for key in released:  # intent drops still in flight: no intent outlives it
                    for node, m in self._dropping.pop(key, ()):
                        if m[0].applied < m[1]:
                            dropped.add(node)
        if stored:
            any_added = True
            for ns in stored.values():
                late.update(ns)
        if not any_added and not dropped:
            self._links.kick(kick, now=urgent)
            return None
        # Per node, the place in its queue the reply waits for: a commit on its intent's
        # (`waits`, from _queue), anything else on the call's own last delta there.
        for n in late | dropped:
            if (end := self._links.mark(n)) is not None:
                _later(waits, n, end)
        self._links.kick(kick, now=urgent)
        if not any(link.stale or link.applied < seq for link, seq in waits.values()):
            return None  # all recorded already (normally: the intents have landed)
        self.held += 1
        return self._settle(reply, (stored, changes), dropped, waits)

    def _queue(self, changes: list[ReplicaChange], placed: Sequence[Placed],
               released: Iterable[bytes], renamed: dict[bytes, bytes],
               records: bool) -> tuple[set[str], dict[str, Mark], set[str], bool]:
        """Queue a call's journal, then the drops of the intents it made moot, then its
        new intents. Returns the nodes to kick; per node, the furthest mark of an intent
        that a commit of this call was made on (the commit is acknowledged on it); the
        nodes of the other commits (they wait for the call's own last delta there); and
        whether the journal committed anything."""
        kick: set[str] = set()
        waits: dict[str, Mark] = {}
        late: set[str] = set()
        any_added = False
        intents = self._intents
        queue_row = self._links.queue_row
        for c in changes:
            node = c.node_id
            added = c.added
            queue_row(node, (c.key, c.offset, c.size, c.checksum,
                             tier_flag(c.tier) | (0 if added else DROP)))
            kick.add(node)
            if not added:
                continue
            any_added = True
            mark = self._replaced(c, renamed, records, kick) if intents else None
            if mark is None:
                late.add(node)
            else:
                self.early += 1
                have = waits.get(node)  # _later, inlined: once per object
                if have is None or have[0] is not mark[0] or have[1] < mark[1]:
                    waits[node] = mark
        for key in released:
            sent = intents.pop(key, None)
            if sent:
                kick |= self._drop_intents(key, sent)
        if placed:
            kick |= self._send_intents(placed)
        return kick, waits, late, any_added

    def _replaced(self, c: ReplicaChange, renamed: dict[bytes, bytes], records: bool,
                  kick: set[str]) -> Mark | None:
        """Forget the intent commit `c` replaces (queueing the drops it makes moot, their
        nodes added to `kick`); its mark if the commit is acknowledged on it."""
        intents = self._intents
        node = c.node_id
        if renamed and (ph := renamed.get(c.key)) is not None:
            # A placeholder's intent, replaced by this commit: dropped after it.
            sent = intents.get(ph)
            mine = sent.pop(node, None) if sent is not None else None
            if sent is not None and not sent:
                del intents[ph]
            if mine is None:
                return None
            kick |= self._drop_intents(ph, {node: mine})
            return mine[1] if records and mine[0] == c.offset else None
        sent = intents.pop(c.key, None)
        if sent is None:
            return None
        mine = sent.pop(node, None)
        if sent:  # an earlier attempt's intent on another node
            kick |= self._drop_intents(c.key, sent)
        return mine[1] if mine is not None and mine[0] == c.offset else None

    def forget(self, keys: Iterable[bytes]) -> None:
        """PENDING objects the core dropped on its own (reclaimed at the put timeout,
        gone with a node): their intents are dropped from the nodes, in order."""
        if not self._intents:
            return
        kick: set[str] = set()
        for key in keys:
            sent = self._intents.pop(key, None)
            if sent:
                kick |= self._drop_intents(key, sent)
        self._links.kick(kick)

    def _send_intents(self, placed: Sequence[Placed]) -> set[str]:
        out: set[str] = set()
        intents = self._intents
        queue_row = self._links.queue_row
        base_of = self._base_of
        bases: dict[str, int | None] = {}  # per call: one look-up per node, not per key
        for p in placed:
            key = p.key
            mine: dict[str, tuple[int, Mark]] = {}
            old = intents.pop(key, None)
            for loc in p.locations:
                node = loc.node_id
                if node in bases:
                    base = bases[node]
                else:
                    base = bases[node] = base_of(node)
                if base is None or loc.tier != "dram":
                    continue
                offset = loc.addr - base
                if old is not None and (was := old.get(node)) is not None and was[0] == offset:
                    mine[node] = old.pop(node)  # the same placement, started again
                    continue
                m = queue_row(node, (key, offset, loc.size, p.checksum,
                                     INTENT_RECORD if p.record else INTENT))
                if m is not None:
                    mine[node] = (offset, m)
                    out.add(node)
                    self.intents += 1
            if old:
                out |= self._drop_intents(key, old)
            if mine:
                intents[key] = mine
        return out

    def _drop_intents(self, key: bytes, sent: dict[str, tuple[int, Mark]]) -> set[str]:
        dropping = self._dropping.get(key)
        for node, (offset, _m) in sent.items():
            m = self._links.queue_row(node, (key, offset, 0, 0, DRAM_DROP))
            if m is not None:
                if dropping is None:
                    dropping = self._dropping[key] = []
                dropping.append((node, m))
        if len(self._dropping) > _MAX_DROPPING:
            self._prune_dropping()
        return set(sent)

    def _prune_dropping(self) -> None:
        for key in list(self._dropping):
            left = [(n, m) for n, m in self._dropping[key] if m[0].applied < m[1]]
            if left:
                self._dropping[key] = left
            else:
                del self._dropping[key]

    def _settle(self, reply: Any, added: _Added, dropped: set[str],
                marks: dict[str, Any]) -> asyncio.Future[None]:
        """A future resolved once every node answered (or the timeout passed), with the
        reply's error set if the change is not recorded. Callbacks only: no task per
        write, since every put waits here."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        got: dict[str, Applied] = {}
        waiters = {n: self._links.waiter(m) for n, m in marks.items()}

        def finish() -> None:
            if done.done():
                return
            timer.cancel()
            for n, w in waiters.items():
                if n not in got:
                    got[n] = w.result() if w.done() else Applied.LATE
            self._judge(reply, added, dropped, got)
            done.set_result(None)

        def answered(name: str, w: asyncio.Future[Applied]) -> None:
            got[name] = w.result()
            if len(got) == len(waiters):
                finish()

        timer = loop.call_later(self.timeout, finish)
        for n, w in waiters.items():
            w.add_done_callback(functools.partial(answered, n))
        if not waiters:
            finish()
        return done

    def _judge(self, reply: Any, what: _Added, dropped: set[str],
               got: dict[str, Applied]) -> None:
        if all(a is Applied.YES for a in got.values()):
            return  # the usual case: no need to know which key was where
        # A node the leader has no link to cannot be told anything: nothing to wait for.
        if any(a is Applied.STALE for a in got.values()):
            self._refuse(reply, Code.NOT_LEADER, "a newer leader has taken over the store "
                         "nodes; retry, the client finds the new leader")
            return
        stored, changes = what
        added: dict[bytes, set[str]] = {k: set(ns) for k, ns in (stored or {}).items()}
        for c in changes:
            if c.added:
                added.setdefault(c.key, set()).add(c.node_id)
        unrecorded = [k for k, ns in added.items()
                      if not any(got.get(n, Applied.YES) is Applied.YES for n in ns)]
        late = sorted(n for n in dropped if got.get(n) is Applied.LATE)
        if unrecorded:
            nodes = sorted({n for k in unrecorded for n in added[k]})
            self._refuse(reply, Code.UNAVAILABLE, (
                f"{len(unrecorded)} object(s) were committed but store node(s) "
                f"{', '.join(nodes)} did not record them within {self.timeout:g} s (slow, "
                "unreachable or gone); put them again (a put of the same key and bytes is "
                "idempotent)"))
        elif late:
            self._refuse(reply, Code.UNAVAILABLE, (
                f"store node(s) {', '.join(late)} did not record the removal within "
                f"{self.timeout:g} s; remove again to be sure it holds after a failover"))

    def _refuse(self, reply: Any, code: Code, message: str) -> None:
        self.refused += 1
        reply.error.code = int(code)
        reply.error.message = message


# Keys with intent drops in flight before the applied ones are pruned (a bound on memory:
# a drop normally lands within a round trip).
_MAX_DROPPING = 10_000


def _later(waits: dict[str, Mark], node: str, m: Mark) -> None:
    """Keep, per node, the furthest mark to wait for."""
    have = waits.get(node)
    if have is None or have[0] is not m[0] or have[1] < m[1]:
        waits[node] = m  # a link replaced meanwhile (the node restarted): the newer one
