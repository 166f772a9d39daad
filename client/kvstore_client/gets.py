"""The get flows: `get_many` (bytes, through the staging buffer) and `get_into`
(straight into registered memory).

A get is GetReplicas (which pins the objects under a short lease so nothing evicts them
mid-read; early.py reads known objects meanwhile), the reads, a checksum check of every
object as soon as it lands (datapath.py), and a release once every byte is in. Replica r
of each object is tried in round r; most reads finish in round 0. A read whose lease ran
out before the bytes arrived is not trusted. A large get_into goes in pipelined groups
(datapath.groups): one group's GetReplicas runs while the bytes of another move.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from kvstore.errors import (
    Code,
    CorruptObject,
    InvalidArgument,
    KVStoreError,
    LeaseExpired,
    NotFound,
    error_for,
)
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore_client import early
from kvstore_client.buffers import Dest, checked_keys
from kvstore_client.datapath import Plan, Target, Ticket, Xfer
from kvstore_client.state import ClientState, Lease
from kvstore_client.steps import Finish, Flow, Move, Release, Start

# One read sent: (index into its part, target node, the transfer).
_Sent = tuple[int, Target, Xfer]


def get_many(st: ClientState, keys: Sequence[bytes]) -> Flow[list[bytes | KVStoreError]]:
    """Per key: the bytes or the error (NotFound for a miss). One retry for keys whose
    read failed in a way a second look may fix (lease lapsed, replica unreachable)."""
    checked = checked_keys(keys)
    out: list[bytes | KVStoreError] = [NotFound("not in the store")] * len(checked)
    pending = list(range(len(checked)))
    for _attempt in range(2):
        if not pending:
            break
        pending = yield from _get_once(st, checked, pending, out)
    return out


def _get_once(st: ClientState, keys: list[bytes], todo: list[int],
              out: list[bytes | KVStoreError]) -> Flow[list[int]]:
    """One attempt at keys[i] for i in todo, into the staging buffer; the i to try again."""
    sent = st.now()
    asked = [keys[i] for i in todo]
    request = pb.GetReplicasRequest(keys=asked, holder=st.writer_id)
    seen = st.placements.recall(asked)
    read_early = None  # what is read early: all of it, into the staging buffer, or none
    early_dests: list[Dest] = []
    if seen is not None and early.reachable(st, seen):
        sizes = [s.size for s in seen]
        if len(list(st.staging.slices(sizes))) == 1:  # (may grow the buffer)
            read_early = seen
            early_dests = [Dest(st.staging.addr + off, st.staging.view[off:off + n])
                           for off, n in zip(st.staging.layout(sizes), sizes, strict=True)]
    reply, got_early = yield from early.ask(st, request, read_early, early_dests)
    deadline = sent + reply.ttl_remaining
    items = yield from early.answered(st, asked, reply, deadline, seen)
    found: list[tuple[int, pb.ReadItem]] = []
    retry: list[int] = []
    in_time = st.now() <= deadline
    kept = 0
    for p, (i, item) in enumerate(zip(todo, items, strict=True)):
        if item.code != Code.OK or not item.locations:
            continue
        if got_early is not None and in_time:
            confirmed = got_early.confirmed(p, reply.epoch, item)
            if confirmed is not None:
                target, x = confirmed
                if target in got_early.failed:
                    # As a first read failing there: another attempt asks first (the
                    # node may be gone) and tries the other replicas.
                    out[i] = got_early.failed[target]
                    st.placements.forget(keys[i])
                    retry.append(i)
                    continue
                if x.ok:
                    assert x.view is not None
                    out[i] = bytes(x.view)
                    st.stats.hits += 1
                    st.stats.bytes_read += item.size
                    kept += 1
                    continue
        found.append((i, item))
    if got_early is not None:
        got_early.count(st, kept)
    try:
        for lo, hi in st.staging.slices([item.size for _, item in found]):
            part = found[lo:hi]
            offsets = st.staging.layout([item.size for _, item in part])
            dests = [Dest(st.staging.addr + off, st.staging.view[off:off + item.size])
                     for off, (_, item) in zip(offsets, part, strict=True)]
            errs = yield from _read_into(st, keys, part, dests)
            if st.now() > deadline:
                # The lease lapsed before the bytes were in: the objects may have been
                # evicted and their space reused, so what arrived is not trusted.
                for i, _ in found[lo:]:
                    out[i] = LeaseExpired("the read lease expired before the transfer "
                                          "finished", key=keys[i])
                    retry.append(i)
                break
            for (i, _), dest, err in zip(part, dests, errs, strict=True):
                out[i] = err if err is not None else bytes(dest.view)
                if isinstance(err, KVStoreError) and not isinstance(err, CorruptObject):
                    retry.append(i)
    except KVStoreError:
        if reply.lease_id:
            yield Release(reply.lease_id)
        raise
    if reply.lease_id:
        yield Release(reply.lease_id)
    st.stats.gets += len(todo)
    return retry


def get_into(st: ClientState, keys: Sequence[bytes], buffers: Sequence[Any],
             lease: Lease | None) -> Flow[list[KVStoreError | None]]:
    """GetReplicas (pins under a short lease, or checks the caller's), read, verify,
    release; a large batch in pipelined groups (see datapath.groups): each group's
    GetReplicas runs while the groups before it move. When every object's placement is
    known, they are read while GetReplicas is asked (see early.py); a buffer whose key
    then fails may have been written."""
    checked = checked_keys(keys)
    if len(checked) != len(buffers):
        raise InvalidArgument(f"get_into got {len(checked)} keys but {len(buffers)} buffers")
    dests = [st.dest(b) for b in buffers]
    out: list[KVStoreError | None] = [None] * len(checked)
    leases: list[int] = []  # the short leases taken here, released at the end
    inflight: list[tuple[float, list[tuple[int, pb.ReadItem]], list[_Sent], Ticket,
                         list[_Sent], dict[Target, KVStoreError]]] = []
    expired = False
    spans = st.pipelined([d.view.nbytes for d in dests])
    seen = st.placements.recall(checked) if len(spans) == 1 else None
    if seen is not None and (any(s.size > d.view.nbytes for s, d in zip(seen, dests, strict=True))
                             or not early.reachable(st, seen)):
        seen = None
    try:
        for lo, hi in spans:
            sent_at = st.now()
            request = pb.GetReplicasRequest(keys=checked[lo:hi], lease_id=lease.id if lease else 0,
                                            holder=st.writer_id)
            reply, got_early = yield from early.ask(st, request, seen, dests)
            if reply.lease_id and lease is None:
                leases.append(reply.lease_id)
            deadline = lease.expires_at if lease else sent_at + reply.ttl_remaining
            items = yield from early.answered(st, checked[lo:hi], reply, deadline, seen)
            found: list[tuple[int, pb.ReadItem]] = []
            kept: list[_Sent] = []  # early reads the reply confirmed
            rest: list[int] = []  # indexes into found still to read
            for i, item in enumerate(items, lo):
                if item.code != Code.OK or not item.locations:
                    missing = item.code in (Code.OK, Code.NOT_FOUND)
                    out[i] = error_for(item.code or Code.NOT_FOUND,
                                       "not in the store" if missing else
                                       "not pinned by this lease", key=checked[i])
                elif item.size > dests[i].view.nbytes:
                    out[i] = InvalidArgument(f"buffer of {dests[i].view.nbytes} bytes is smaller "
                                             f"than the object ({item.size} bytes)",
                                             key=checked[i])
                else:
                    confirmed = (got_early.confirmed(i, reply.epoch, item)
                                 if got_early is not None else None)
                    if confirmed is not None:
                        kept.append((len(found), *confirmed))
                    else:
                        rest.append(len(found))
                    found.append((i, item))
            if got_early is not None:
                got_early.count(st, len(kept))
            plan, sent = _read_plan(found, [dests[i] for i, _ in found], rest, 0)
            inflight.append((deadline, found, sent, (yield Start(plan, write=False)), kept,
                             got_early.failed if got_early is not None else {}))
        while inflight:
            deadline, found, sent, ticket, kept, early_failed = inflight[0]
            failed = yield Finish(ticket)
            inflight.pop(0)
            group_dests = [dests[i] for i, _ in found]
            errs: list[KVStoreError | None] = [None] * len(found)
            still = _read_check(st, checked, found, sent, failed, errs)
            if kept:
                still += _read_check(st, checked, found, kept, early_failed, errs)
            yield from _read_rounds(st, checked, found, group_dests, errs, sorted(still), 1)
            for (i, _), err in zip(found, errs, strict=True):
                out[i] = err
            if (found or lease is not None) and st.now() > deadline:
                expired = True
        if expired:
            raise LeaseExpired("the read lease expired before the transfer finished; "
                               "the bytes are not trusted (look the keys up again)")
    except KVStoreError:
        # Pins hold until the bytes are in: finish what moves, then release.
        for _, _, _, ticket, _, _ in inflight:
            yield Finish(ticket)
        for lease_id in leases:
            yield Release(lease_id)
        raise
    for lease_id in leases:
        yield Release(lease_id)
    st.stats.gets += len(checked)
    return out


def _read_plan(part: list[tuple[int, pb.ReadItem]], dests: list[Dest], which: Sequence[int],
               rnd: int) -> tuple[Plan, list[_Sent]]:
    """Round `rnd` of reading part[j] for j in `which`: replica number rnd of each."""
    plan: Plan = defaultdict(list)
    sent: list[_Sent] = []
    for j in which:
        item = part[j][1]
        if rnd < len(item.locations):
            loc: cpb.Location = item.locations[rnd]
            target = (loc.segment, loc.node_id)
            x = Xfer(dests[j].addr, loc.addr, item.size, dests[j].view[:item.size],
                     item.checksum)
            plan[target].append(x)
            sent.append((j, target, x))
    return plan, sent


def _read_check(st: ClientState, keys: list[bytes], part: list[tuple[int, pb.ReadItem]],
                sent: list[_Sent], failed: dict[Target, KVStoreError],
                errs: list[KVStoreError | None]) -> list[int]:
    """Record each sent read's outcome in errs; the j whose read must try another replica."""
    still: list[int] = []
    for j, target, x in sent:
        i, item = part[j]
        if target in failed:
            errs[j] = failed[target]
            still.append(j)
        elif not x.ok:
            st.stats.corrupt_reads += 1
            st.local.forget(*target)
            errs[j] = CorruptObject(f"object read from {target[0]} does not match its "
                                    "checksum; it is treated as missing", key=keys[i])
            still.append(j)
        else:
            errs[j] = None
            st.stats.hits += 1
            st.stats.bytes_read += item.size
    return still


def _read_rounds(st: ClientState, keys: list[bytes], part: list[tuple[int, pb.ReadItem]],
                 dests: list[Dest], errs: list[KVStoreError | None], remaining: list[int],
                 first: int) -> Flow[None]:
    """Rounds `first`, first + 1, ... of reading part[j] for j in `remaining`, until each
    read once verified or out of replicas; errors counted in the stats."""
    rounds = max((len(item.locations) for _, item in part), default=0)
    for rnd in range(first, rounds):
        if not remaining:
            break
        plan, sent = _read_plan(part, dests, remaining, rnd)
        failed: dict[Target, KVStoreError] = yield Move(plan, write=False)
        remaining = _read_check(st, keys, part, sent, failed, errs)
    for j in remaining:
        err = errs[j]
        if err is not None:
            name = type(err).__name__
            st.stats.errors[name] = st.stats.errors.get(name, 0) + 1


def _read_into(st: ClientState, keys: list[bytes], part: list[tuple[int, pb.ReadItem]],
               dests: list[Dest]) -> Flow[list[KVStoreError | None]]:
    """Read each object of `part` into its dest and verify it; per object the error."""
    errs: list[KVStoreError | None] = [None] * len(part)
    yield from _read_rounds(st, keys, part, dests, errs, list(range(len(part))), 0)
    return errs
