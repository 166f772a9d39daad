"""Acknowledged means recorded outside the leader.

A new leader rebuilds its index from the store nodes' inventories, so a commit (or a
removal) the leader has only in memory dies with it. The handlers of the calls that
change what a node holds (PutEnd, PutCommit, Remove) therefore hand their reply to
`Recorder.record` before it leaves: the journal entries of that call are queued on the
node links at once, and the reply waits until every node that holds one of the call's
new replicas has applied them. docs/durability.md says why this is enough.

Handlers run one at a time on the event loop and take the core's journal right after
their core call, so the entries a call takes are its own (plus, at most, replicas an
eviction inside the same call freed: waiting for those too costs nothing extra, they
go in the same Apply).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from kvstore.errors import Code
from kvstore.master.core import ReplicaChange
from kvstore.master.nodes import Applied, NodeLinks
from kvstore.v1 import store_pb2 as spb

# Calls whose OK promises a change a new leader must find (PutStart: only where it
# found the key already stored, see `record`).
RECORDED_CALLS = frozenset({"PutStart", "PutEnd", "PutCommit", "Remove"})


def queue_changes(links: NodeLinks, changes: list[ReplicaChange]) -> None:
    for c in changes:
        links.queue(c.node_id, spb.Replica(key=c.key, offset=c.offset, size=c.size,
                                           checksum=c.checksum, tier=c.tier), c.added)


class Recorder:
    def __init__(self, take_changes: Callable[[], list[ReplicaChange]], links: NodeLinks,
                 timeout: float) -> None:
        self._take = take_changes
        self._links = links
        self.timeout = timeout
        self.held = 0  # replies that waited for a node
        self.refused = 0  # replies turned into UNAVAILABLE: not recorded in time

    def record(self, method: str, reply: Any,
               stored: dict[bytes, set[str]] | None = None) -> asyncio.Future[None] | None:
        """Queue what the call just changed; None if its reply may leave now, else a
        future resolved once it may (having set `reply.error` if the change could not be
        recorded in time). `stored`: keys the call found already stored, with the nodes
        holding them; their record is waited for too, so that a retry of a write whose
        reply said "not recorded" is not acknowledged before the record lands."""
        changes = self._take()
        if not changes and not stored:
            return None
        queue_changes(self._links, changes)
        if method not in RECORDED_CALLS or reply.error.code:
            self._links.kick({c.node_id for c in changes})
            return None
        added: dict[bytes, set[str]] = {k: set(ns) for k, ns in (stored or {}).items()}
        dropped: set[str] = set()
        for c in changes:
            if c.added:
                added.setdefault(c.key, set()).add(c.node_id)
            elif method == "Remove":  # an eviction inside a put is no promise
                dropped.add(c.node_id)
        if not added and not dropped:
            self._links.kick({c.node_id for c in changes})
            return None
        nodes = {n for ns in added.values() for n in ns} | dropped
        marks = {n: m for n in nodes if (m := self._links.mark(n)) is not None}
        self._links.kick(marks)
        if not any(link.stale or link.applied < seq for link, seq in marks.values()):
            return None  # all recorded already (a stored key whose record has landed)
        self.held += 1
        return self._settle(reply, added, dropped, marks)

    def _settle(self, reply: Any, added: dict[bytes, set[str]], dropped: set[str],
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

    def _judge(self, reply: Any, added: dict[bytes, set[str]], dropped: set[str],
               got: dict[str, Applied]) -> None:
        # A node the leader has no link to cannot be told anything: nothing to wait for.
        if any(a is Applied.STALE for a in got.values()):
            self._refuse(reply, Code.NOT_LEADER, "a newer leader has taken over the store "
                         "nodes; retry, the client finds the new leader")
            return
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
