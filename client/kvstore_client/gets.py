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
from typing import Any, NamedTuple

from kvstore.errors import (
    Code,
    CorruptObject,
    InvalidArgument,
    KVStoreError,
    LeaseExpired,
    NotFound,
    error_for,
)
from kvstore.rpc.columns import READS as COLUMNS
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore_client import early
from kvstore_client.buffers import Dest, checked_keys
from kvstore_client.datapath import Plan, Target, Ticket, Xfer
from kvstore_client.placements import Seen
from kvstore_client.staging import Staging
from kvstore_client.state import ClientState, Lease
from kvstore_client.steps import Finish, Flow, Move, Release, Start

# One read sent: (index into its part, target node, the transfer).
_Sent = tuple[int, Target, Xfer]


def get_many(st: ClientState, keys: Sequence[bytes],
             staging: Staging | None = None) -> Flow[list[bytes | KVStoreError]]:
    """Per key: the bytes or the error (NotFound for a miss). One retry for keys whose
    read failed in a way a second look may fix (lease lapsed, replica unreachable).
    Through `staging` (default: the client's staging buffer)."""
    checked = checked_keys(keys)
    stg = st.staging if staging is None else staging
    out: list[bytes | KVStoreError] = [NotFound("not in the store")] * len(checked)
    pending = list(range(len(checked)))
    for _attempt in range(2):
        if not pending:
            break
        pending = yield from _get_once(st, stg, checked, pending, out)
    return out


def _get_once(st: ClientState, stg: Staging, keys: list[bytes], todo: list[int],
              out: list[bytes | KVStoreError]) -> Flow[list[int]]:
    """One attempt at keys[i] for i in todo, into the staging buffer; the i to try again."""
    sent = st.now()
    asked = [keys[i] for i in todo]
    request = pb.GetReplicasRequest(keys=asked, holder=st.writer_id, columns=True,
                                    columns_version=COLUMNS)
    seen = st.placements.recall(asked)
    read_early, early_dests = _early_staging(st, stg, seen)
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
        got = (_kept_early(st, keys[i], got_early, p, reply.epoch, item)
               if got_early is not None and in_time else None)
        if got is None:
            found.append((i, item))
            continue
        out[i] = got
        if isinstance(got, KVStoreError):
            retry.append(i)
        else:
            kept += 1
    if got_early is not None:
        got_early.count(st, kept)
    try:
        yield from _read_staged(st, stg, keys, found, deadline, out, retry)
    except KVStoreError:
        if reply.lease_id:
            yield Release(reply.lease_id)
        raise
    if reply.lease_id:
        yield Release(reply.lease_id)
    st.stats.gets += len(todo)
    return retry


def _early_staging(st: ClientState, stg: Staging,
                   seen: list[Seen] | None) -> tuple[list[Seen] | None, list[Dest]]:
    """What an attempt of get_many reads early, and into where: all of `seen` when its
    nodes answered lately and it fits in the staging buffer at once; else nothing."""
    if seen is None or not early.reachable(st, seen):
        return None, []
    sizes = [s.size for s in seen]
    if len(list(stg.slices(sizes))) != 1:  # (may grow the buffer)
        return None, []
    return seen, [Dest(stg.addr + off, stg.view[off:off + n])
                  for off, n in zip(stg.layout(sizes), sizes, strict=True)]


def _kept_early(st: ClientState, key: bytes, got_early: early.Early, p: int, epoch: int,
                item: pb.ReadItem) -> bytes | KVStoreError | None:
    """The outcome of object p's early read into the staging buffer, if the reply confirms
    it: the verified bytes, or the failure of its node (the key then tries again, and
    asks first: the node may be gone); None when it is still to be read."""
    confirmed = got_early.confirmed(p, epoch, item)
    if confirmed is None:
        return None
    target, x = confirmed
    if target in got_early.failed:
        # As a first read failing there: another attempt tries the other replicas.
        st.placements.forget(key)
        return got_early.failed[target]
    if not x.ok:
        return None
    assert x.view is not None
    st.stats.hits += 1
    st.stats.bytes_read += item.size
    return bytes(x.view)


def _read_staged(st: ClientState, stg: Staging, keys: list[bytes],
                 found: list[tuple[int, pb.ReadItem]],
                 deadline: float, out: list[bytes | KVStoreError],
                 retry: list[int]) -> Flow[None]:
    """Read the found objects through the staging buffer, as many at a time as it holds.
    Per object, its bytes or its error in out[i]; added to `retry`, each i worth another
    attempt (a read failed other than by a checksum mismatch, or the lease lapsed)."""
    for lo, hi in stg.slices([item.size for _, item in found]):
        part = found[lo:hi]
        offsets = stg.layout([item.size for _, item in part])
        dests = [Dest(stg.addr + off, stg.view[off:off + item.size])
                 for off, (_, item) in zip(offsets, part, strict=True)]
        errs = yield from _read_into(st, keys, part, dests)
        if st.now() > deadline:
            # The lease lapsed before the bytes were in: the objects may have been
            # evicted and their space reused, so what arrived is not trusted.
            for i, _ in found[lo:]:
                out[i] = LeaseExpired("the read lease expired before the transfer "
                                      "finished", key=keys[i])
                retry.append(i)
            return
        for (i, _), dest, err in zip(part, dests, errs, strict=True):
            out[i] = err if err is not None else bytes(dest.view)
            if isinstance(err, KVStoreError) and not isinstance(err, CorruptObject):
                retry.append(i)


def get_into(st: ClientState, keys: Sequence[bytes], buffers: Sequence[Any],
             lease: Lease | None) -> Flow[list[KVStoreError | None]]:
    """GetReplicas (pins under a short lease, or checks the caller's), read, verify,
    release; a large batch in pipelined groups (see datapath.groups): each group's
    GetReplicas runs while the groups before it move. When every object's placement is
    known, they are read while GetReplicas is asked (see early.py); a buffer whose key
    then fails may have been written."""
    checked, dests = checked_dests(st, keys, buffers)
    return (yield from read_into(st, checked, dests, lease))


def checked_dests(st: ClientState, keys: Sequence[bytes],
                  buffers: Sequence[Any]) -> tuple[list[bytes], list[Dest]]:
    """get_into's keys and buffers, checked (each buffer registered memory)."""
    checked = checked_keys(keys)
    if len(checked) != len(buffers):
        raise InvalidArgument(f"get_into got {len(checked)} keys but {len(buffers)} buffers")
    return checked, [st.dest(b) for b in buffers]


def read_into(st: ClientState, checked: list[bytes], dests: list[Dest],
              lease: Lease | None) -> Flow[list[KVStoreError | None]]:
    """get_into of keys and buffers already checked (`checked_dests`)."""
    out: list[KVStoreError | None] = [None] * len(checked)
    leases: list[int] = []  # the short leases taken here, released at the end
    inflight: list[_Moving] = []
    expired = False
    spans = st.pipelined([d.view.nbytes for d in dests])
    seen = _early_into(st, checked, dests) if len(spans) == 1 else None
    try:
        for lo, hi in spans:
            sent_at = st.now()
            request = pb.GetReplicasRequest(keys=checked[lo:hi], lease_id=lease.id if lease else 0,
                                            holder=st.writer_id, columns=True,
                                            columns_version=COLUMNS)
            reply, got_early = yield from early.ask(st, request, seen, dests)
            if reply.lease_id and lease is None:
                leases.append(reply.lease_id)
            deadline = lease.expires_at if lease else sent_at + reply.ttl_remaining
            items = yield from early.answered(st, checked[lo:hi], reply, deadline, seen)
            found, kept, rest = _sort_items(checked, dests, items, lo, got_early, reply.epoch,
                                            out)
            if got_early is not None:
                got_early.count(st, len(kept))
            plan, sent = _read_plan(found, [dests[i] for i, _ in found], rest, 0)
            inflight.append(_Moving(deadline, found, sent, (yield Start(plan, write=False)), kept,
                                    got_early.failed if got_early is not None else {}))
        while inflight:
            group = inflight[0]
            failed = yield Finish(group.ticket)
            inflight.pop(0)
            yield from _check_group(st, checked, dests, group, failed, out)
            if (group.found or lease is not None) and st.now() > group.deadline:
                expired = True
        if expired:
            raise LeaseExpired("the read lease expired before the transfer finished; "
                               "the bytes are not trusted (look the keys up again)")
    except KVStoreError:
        # Pins hold until the bytes are in: finish what moves, then release.
        for group in inflight:
            yield Finish(group.ticket)
        for lease_id in leases:
            yield Release(lease_id)
        raise
    for lease_id in leases:
        yield Release(lease_id)
    st.stats.gets += len(checked)
    return out


class _Moving(NamedTuple):
    """A group of get_into whose reads were started (the early ones too)."""

    deadline: float  # of the lease: bytes that arrive later are not trusted
    found: list[tuple[int, pb.ReadItem]]  # (index into the call's keys, its item)
    sent: list[_Sent]  # the reads started for it
    ticket: Ticket
    kept: list[_Sent]  # early reads the reply confirmed
    early_failed: dict[Target, KVStoreError]  # per node, the failure of the early reads


def _early_into(st: ClientState, keys: list[bytes], dests: list[Dest]) -> list[Seen] | None:
    """Where get_into reads early: every object's known placement, if each fits in its
    buffer and their nodes answered lately; else None (nothing is read early)."""
    seen = st.placements.recall(keys)
    if seen is None or any(s.size > d.view.nbytes for s, d in zip(seen, dests, strict=True)) \
            or not early.reachable(st, seen):
        return None
    return seen


def _sort_items(keys: list[bytes], dests: list[Dest], items: list[pb.ReadItem], lo: int,
                got_early: early.Early | None, epoch: int, out: list[KVStoreError | None]
                ) -> tuple[list[tuple[int, pb.ReadItem]], list[_Sent], list[int]]:
    """The GetReplicas items of the group from keys[lo]: each object not there (or not
    pinned by the caller's lease) or larger than its buffer gets its error in out; the
    others are found (index, item), and of those, early reads the reply confirmed are
    kept, the rest (indexes into found) still to read."""
    found: list[tuple[int, pb.ReadItem]] = []
    kept: list[_Sent] = []
    rest: list[int] = []
    for i, item in enumerate(items, lo):
        if item.code != Code.OK or not item.locations:
            missing = item.code in (Code.OK, Code.NOT_FOUND)
            out[i] = error_for(item.code or Code.NOT_FOUND,
                               "not in the store" if missing else
                               "not pinned by this lease", key=keys[i])
        elif item.size > dests[i].view.nbytes:
            out[i] = InvalidArgument(f"buffer of {dests[i].view.nbytes} bytes is smaller "
                                     f"than the object ({item.size} bytes)", key=keys[i])
        else:
            confirmed = got_early.confirmed(i, epoch, item) if got_early is not None else None
            if confirmed is not None:
                kept.append((len(found), *confirmed))
            else:
                rest.append(len(found))
            found.append((i, item))
    return found, kept, rest


def _check_group(st: ClientState, keys: list[bytes], dests: list[Dest], group: _Moving,
                 failed: dict[Target, KVStoreError], out: list[KVStoreError | None]) -> Flow[None]:
    """A finished group of get_into: verify its reads (and the early ones kept), try the
    next replica of each that failed, and put each object's outcome in out."""
    found = group.found
    errs: list[KVStoreError | None] = [None] * len(found)
    still = _read_check(st, keys, found, group.sent, failed, errs)
    if group.kept:
        still += _read_check(st, keys, found, group.kept, group.early_failed, errs)
    yield from _read_rounds(st, keys, found, [dests[i] for i, _ in found], errs, sorted(still), 1)
    for (i, _), err in zip(found, errs, strict=True):
        out[i] = err


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
