"""Asking where objects are, reading them early meanwhile: the first half of every get.

Both gets (gets.py: `get_many` into the staging buffer, `get_into` into registered
memory) and the quick single get (quick.py) start the same way: GetReplicas, which pins
the objects under a short lease. When the client knows where every object of the get
sat (it wrote or read them lately, see placements.py) and those nodes answered lately,
it reads them there while it asks (`ask`), and keeps those bytes only if the answer
names the same placement in the same leader epoch (`Early.confirmed`); otherwise they
are read where the answer says. Objects the master is bringing back from SSD are asked
about again until readable (`answered`), and what the answer says of each object's
placement is remembered for the next get.

What each get does with a confirmed early read differs and stays in gets.py: get_many
keeps verified bytes and asks again for a read that failed; get_into checks the early
reads with the others and tries the next replica for one that failed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.errors import Code, KVStoreError
from kvstore.rpc.columns import READS as COLUMNS
from kvstore.rpc.columns import read_items
from kvstore.v1 import master_pb2 as pb
from kvstore_client.buffers import Dest
from kvstore_client.datapath import Plan, Target, Xfer
from kvstore_client.placements import Seen
from kvstore_client.state import ClientState
from kvstore_client.steps import Answer, Ask, Finish, Flow, Rpc, Start, Wait


@dataclass(slots=True)
class Early:
    """The reads started while GetReplicas was asked: per object of the request, where
    it was seen and the read from there, and per node the reads' failure."""

    seen: list[Seen]
    reads: list[tuple[Target, Xfer]]
    failed: dict[Target, KVStoreError]

    def confirmed(self, p: int, epoch: int, item: pb.ReadItem) -> tuple[Target, Xfer] | None:
        """Object p's early read, if the answer says it read the object; else None."""
        return self.reads[p] if confirmed(self.seen[p], epoch, item) else None

    def count(self, st: ClientState, kept: int) -> None:
        """`kept` of the early reads were kept, the rest thrown away."""
        st.stats.early_reads += kept
        st.stats.early_wasted += len(self.reads) - kept


def reachable(st: ClientState, seen: list[Seen]) -> bool:
    """Whether every node these objects were seen on answered lately: an early read goes
    only there (see DataPath.answering)."""
    return st.answering({(s.segment, s.node_id) for s in seen})


def ask(st: ClientState, request: pb.GetReplicasRequest, seen: list[Seen] | None,
        dests: Sequence[Dest]) -> Flow[tuple[Any, Early | None]]:
    """GetReplicas; with `seen`, each object read early into its dest meanwhile (the reply
    and the early reads); without, a plain control call (and None)."""
    if seen is None:
        return (yield Rpc("GetReplicas", request)), None
    plan: Plan = defaultdict(list)
    reads: list[tuple[Target, Xfer]] = []
    for s, d in zip(seen, dests, strict=True):
        target = (s.segment, s.node_id)
        x = Xfer(d.addr, s.addr, s.size, d.view[:s.size], s.checksum)
        plan[target].append(x)
        reads.append((target, x))
    reply, failed = yield from _read_while_asking(request, plan)
    return reply, Early(seen, reads, failed)


def _read_while_asking(request: pb.GetReplicasRequest,
                       plan: Plan) -> Flow[tuple[Any, dict[Target, KVStoreError]]]:
    """GetReplicas, with the plan's reads moving while the master answers: the reply and
    the reads' failures per node. The reads are submitted before the request is sent
    (sending wakes the master, which is not free on a small VM), and the caller sleeps
    in the socket for the reply before it polls the reads, so that the master and the
    engine's threads have the CPU meanwhile (the orders measured against each other are
    in docs/client-internals.md)."""
    ticket = yield Start(plan, write=False, at_once=True)
    asked = yield Ask("GetReplicas", request)
    if ticket.local and not (ticket.pending or ticket.small):
        # Same-host only: the copies run in this thread, so they go first.
        failed: dict[Target, KVStoreError] = yield Finish(ticket)
        return (yield Answer(asked)), failed
    reply = yield Answer(asked)
    failed = yield Finish(ticket)
    return reply, failed


def confirmed(seen: Seen, epoch: int, item: pb.ReadItem) -> bool:
    """Whether the reply says the object sits where it was seen (so an early read of its
    first replica read the object; see placements.py)."""
    if not seen.matches(epoch, item):
        return False
    loc = item.locations[0]
    return loc.addr == seen.addr and loc.segment == seen.segment and loc.node_id == seen.node_id


def answered(st: ClientState, keys: list[bytes], reply: Any, deadline: float,
             seen: list[Seen] | None) -> Flow[list[pb.ReadItem]]:
    """The reply's items once settled (see `settle`); where each object sits is
    remembered, and the ones the reply says are gone forgotten."""
    items = yield from settle(st, keys, read_items(reply), reply.lease_id, deadline)
    note_placements(st, keys, reply.epoch, items, seen)
    return items


def settle(st: ClientState, keys: list[bytes], items: list[pb.ReadItem], lease_id: int,
           deadline: float) -> Flow[list[pb.ReadItem]]:
    """Ask again, under the same lease, for objects the master is bringing back from
    SSD into DRAM (IN_PROGRESS), until they are readable or the lease runs out."""
    # A promotion takes a few ms (one Move to the node, one SSD read): ask again soon
    # and often rather than doubling towards 50 ms, which made a 10 ms promotion cost
    # 14-30 ms; a GetReplicas under a lease costs the master microseconds.
    delay = 0.001
    waiting = [j for j, item in enumerate(items) if item.code == Code.IN_PROGRESS]
    st.stats.ssd_waits += len(waiting)
    while waiting and lease_id and st.now() + delay < deadline:
        yield Wait(delay)
        delay = min(delay * 1.5, 0.01)
        again = yield Rpc("GetReplicas", pb.GetReplicasRequest(
            keys=[keys[j] for j in waiting], lease_id=lease_id, columns=True,
            columns_version=COLUMNS))
        for j, item in zip(waiting, read_items(again), strict=True):
            items[j] = item
        waiting = [j for j in waiting if items[j].code == Code.IN_PROGRESS]
    return items


def note_placements(st: ClientState, keys: list[bytes], epoch: int,
                    items: list[pb.ReadItem], seen: list[Seen] | None) -> None:
    """Remember where each object of a reply sits; forget the ones it says are gone."""
    placements = st.placements
    if not placements.capacity:
        return
    fresh = st.now() - placements.max_age / 2
    for p, (k, item) in enumerate(zip(keys, items, strict=True)):
        code = item.code
        if code == Code.OK:
            if seen is not None:
                s = seen[p]
                if s.placement == item.placement and s.epoch == epoch and s.at > fresh:
                    continue  # known, and learned recently enough
            placements.learn_item(k, epoch, item)
        elif code == Code.NOT_FOUND:
            placements.forget(k)
