"""The put flows: `put_many` (bytes, through the staging buffer) and `put_from`
(straight from registered memory).

A put is two-phase: PutStart (the master allocates space), the transfers, PutEnd (the
objects become visible) or PutRevoke for what did not land; a large batch in pipelined
groups (datapath.groups), the next group's PutStart and the previous one's PutEnd
running while a group's bytes move. When the client holds space started ahead for every
object of a batch (reservations.py), the bytes go there and one PutCommit makes them
visible; the PutStart that refills that space is a `Later` step, answered while the
caller does something else. Where each committed object sits is remembered for early
reads (placements.py).
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xxhash import xxh3_64_intdigest

from kvstore.checksum import checksum
from kvstore.errors import Code, InvalidArgument, KVStoreError, Unavailable, Unsettled, error_for
from kvstore.put_record import encode as encode_record
from kvstore.put_record import record_bytes, room_for
from kvstore.rpc.columns import READS as COLUMNS
from kvstore.rpc.columns import start_items
from kvstore.v1 import master_pb2 as pb
from kvstore_client.buffers import Dest, byte_view, checked_keys
from kvstore_client.control import backoff
from kvstore_client.datapath import Plan, Target, Ticket, Xfer
from kvstore_client.placements import Seen
from kvstore_client.reservations import Reservations, Reserved
from kvstore_client.staging import Staging
from kvstore_client.state import ClientState
from kvstore_client.steps import Finish, Flow, Later, Rpc, Settle, Start, Wait

# How long a put keeps asking while the master makes room (BUSY) before giving up.
BUSY_BUDGET = 5.0
# One-call puts of fewer bytes than this checksum their values before the transfer, so
# that the put records travel in the values' batch; larger ones checksum while their
# bytes move and send the records in a second batch.
SUM_FIRST_BELOW = 256 << 10
# One-call puts of at most this many objects carry put records. A record is a transfer
# of its own, and the record room after each placeholder keeps a batch's values from
# merging into one engine transfer: each object then costs a submission or two, which a
# larger batch pays more for than for the store node's round trip its commit waits for
# without records (figures: docs/perf-notes.md).
RECORDS_UP_TO = 4


def checked_values(keys: Sequence[bytes],
                   values: Sequence[Any]) -> tuple[list[bytes], list[memoryview]]:
    """put_many's keys and values, checked: InvalidArgument for the first bad one."""
    checked = checked_keys(keys)
    if len(checked) != len(values):
        raise InvalidArgument(f"put_many got {len(checked)} keys but {len(values)} values")
    views = [byte_view(v) for v in values]
    if not all(v.nbytes for v in views):
        for key, view in zip(checked, views, strict=True):
            if view.nbytes == 0:
                raise InvalidArgument("empty value: store at least one byte", key=key)
    return checked, views


def put_many(st: ClientState, keys: Sequence[bytes], values: Sequence[Any],
             staging: Staging | None = None, shard: int = 0) -> Flow[list[KVStoreError | None]]:
    """Per key: None once stored (or already stored: same key, same bytes), else the
    error. Through `staging` (default: the client's staging buffer). `shard`: the master
    shard every key is of (a part of a batch over several shards, sharded.py), whose
    pool of space started ahead the put takes from."""
    checked, views = checked_values(keys, values)
    stg = st.staging if staging is None else staging
    results: list[KVStoreError | None] = [None] * len(checked)
    # A put small enough to carry put records leaves room for each after its value in
    # the staging buffer: the record then moves with the value, as one transfer.
    tails = ([record_bytes(len(k)) for k in checked]
             if st.reservations_of(shard) is not None and len(checked) <= RECORDS_UP_TO
             else [0] * len(checked))
    # Batches larger than the staging buffer go in slices that fit; each group's values
    # are copied in just before its PutStart (while the group before it moves).
    need = [v.nbytes + t for v, t in zip(views, tails, strict=True)]
    for lo, hi in stg.slices(need):
        offsets = stg.layout(need[lo:hi] if lo or hi < len(need) else need)
        base, whole = stg.addr, stg.view
        srcs = [Dest(base + off, whole[off:off + view.nbytes], tail)
                for off, view, tail in zip(offsets, views[lo:hi], tails[lo:hi], strict=True)]

        def fill(a: int, b: int, srcs: list[Dest] = srcs, base: int = lo) -> None:
            for dest, view in zip(srcs[a:b], views[base + a:base + b], strict=True):
                dest.view[:] = view

        part = yield from _put(st, checked[lo:hi], srcs, fill, shard)
        results[lo:hi] = part
    return results


def put_from(st: ClientState, keys: Sequence[bytes],
             buffers: Sequence[Any]) -> Flow[list[KVStoreError | None]]:
    checked, srcs = checked_sources(st, keys, buffers)
    return (yield from _put(st, checked, srcs))


def checked_sources(st: ClientState, keys: Sequence[bytes],
                    buffers: Sequence[Any]) -> tuple[list[bytes], list[Dest]]:
    """put_from's keys and buffers, checked (each buffer registered memory)."""
    checked = checked_keys(keys)
    if len(checked) != len(buffers):
        raise InvalidArgument(f"put_from got {len(checked)} keys but {len(buffers)} buffers")
    return checked, [st.dest(b) for b in buffers]


def put_sources(st: ClientState, keys: list[bytes], srcs: list[Dest],
                shard: int = 0) -> Flow[list[KVStoreError | None]]:
    """put_from of keys and sources already checked (`checked_sources`), all of them
    shard `shard`'s (see put_many)."""
    return (yield from _put(st, keys, srcs, None, shard))


def _put(st: ClientState, keys: list[bytes], srcs: list[Dest],
         fill: Callable[[int, int], None] | None = None,
         shard: int = 0) -> Flow[list[KVStoreError | None]]:
    """Into space started ahead (one control call, see reservations.py) when the client
    holds it for every object, else the plain way; then ask for space for the next
    batch of this shape. A batch large enough to be pipelined goes the plain way: its
    control calls already overlap its transfers, and moving it all at once is slower
    over the engine than in pipelined groups (figures: docs/client-internals.md).
    Every key is shard `shard`'s: its pool, and that shard's leader epoch (the steps
    carry no shard: sharded.fan_out sends them to the part's)."""
    rs = st.reservations_of(shard)
    sizes = [d.view.nbytes for d in srcs]
    if rs is None or len(st.pipelined(sizes)) > 1:
        return (yield from _put_plain(st, keys, srcs, fill))
    taken = rs.take(sizes, st.replicas, st.epoch_of(shard))
    if taken is None and rs.asking():
        # The space asked for after the last put: wait for it this once. (Settle reads
        # every shard's Later reply in flight, so this pool's too.)
        yield Settle()
        taken = rs.take(sizes, st.replicas, st.epoch_of(shard))
    if taken is not None:
        if st.answering({target for r in taken for target, _ in r.locations}):
            results = yield from _put_reserved(st, rs, keys, srcs, fill, taken)
        else:
            for r in taken:
                rs.give_back(r, st.replicas)
            taken = None
    if taken is None:
        results = yield from _put_plain(st, keys, srcs, fill)
    yield from _reserve(st, rs, sizes, max(map(len, keys), default=0))
    return results


def _reserve(st: ClientState, rs: Reservations, sizes: list[int], key_len: int) -> Flow[None]:
    """Revoke placeholders past their age; ask (without waiting) for what the pool lacks
    to cover a batch of these sizes again."""
    stale = rs.expired()
    if stale:
        yield Later("PutRevoke", pb.KeysRequest(keys=stale, writer=st.writer_id), _ignore)
    unsettled = rs.take_unsettled()
    if unsettled:
        yield Later("PutRevoke", pb.KeysRequest(keys=unsettled, writer=st.writer_id,
                                                unsettled=True), _ignore)
    asked = rs.wanted(sizes, st.replicas)
    if asked:
        sent, replicas = st.now(), st.replicas

        def granted(reply: Any) -> None:
            rs.granted(asked, replicas, reply, sent)

        yield Later("PutStart", pb.PutStartRequest(
            keys=[k for k, _ in asked], sizes=[z for _, z in asked], checksums=[0] * len(asked),
            replicas=replicas, writer=st.writer_id, ahead=True,
            record_room=room_for(key_len) if len(sizes) <= RECORDS_UP_TO else 0,
            columns_version=COLUMNS), granted)


def _put_reserved(st: ClientState, rs: Reservations, keys: list[bytes], srcs: list[Dest],
                  fill: Callable[[int, int], None] | None,
                  taken: list[Reserved]) -> Flow[list[KVStoreError | None]]:
    """Write each value into its placeholder (taken from `rs`; checksums computed while
    the bytes move), then PutCommit. What did not land, or what the master no longer
    holds for us, is put again the plain way."""
    n = len(keys)
    if fill is not None:
        fill(0, n)
    plan: Plan = defaultdict(list)
    for d, r in zip(srcs, taken, strict=True):
        for target, addr in r.locations:
            plan[target].append(Xfer(d.addr, addr, r.size))
    sums, failed, records = yield from _write_reserved(st, keys, srcs, taken, plan)
    again: list[int] = []
    if failed:
        commit: list[int] = []
        for i, r in enumerate(taken):
            bad = [failed[t] for t, _ in r.locations if t in failed]
            if bad:
                rs.lost(r, unsettled=any(isinstance(e, Unsettled) for e in bad))
                again.append(i)
            else:
                commit.append(i)
        placeholders = [taken[i].key for i in commit]
        ckeys, csizes = [keys[i] for i in commit], [taken[i].size for i in commit]
        csums = [sums[i] for i in commit]
    else:  # the usual case: all of them, in order
        commit = list(range(n))
        placeholders = [r.key for r in taken]
        ckeys, csizes, csums = keys, [r.size for r in taken], sums
    results: list[KVStoreError | None] = [None] * n
    if commit:
        reply = yield Rpc("PutCommit", pb.PutCommitRequest(
            placeholders=placeholders, keys=ckeys, sizes=csizes, checksums=csums,
            writer=st.writer_id, records=records))
        again += _committed(st, rs, keys, taken, sums, commit, reply, records)
    if again:
        again.sort()
        redo = yield from _put_plain(st, [keys[i] for i in again], [srcs[i] for i in again])
        for i, res in zip(again, redo, strict=True):
            results[i] = res
    return results


def _committed(st: ClientState, rs: Reservations, keys: list[bytes], taken: list[Reserved],
               sums: list[int], commit: list[int], reply: Any, records: bool) -> list[int]:
    """Take in PutCommit's answer for the objects `commit` indexes (counted, their
    placements learned); returns those to put again the plain way."""
    now = st.now()
    ok, exists = Code.OK, Code.ALREADY_EXISTS
    stored = written = committed = 0
    learned: list[tuple[bytes, Seen]] = []
    again: list[int] = []
    epoch = reply.epoch
    for i, code in zip(commit, reply.codes, strict=True):
        r = taken[i]
        if code == ok:
            stored += 1
            committed += 1
            written += r.size
            if epoch == r.epoch:
                (segment, node_id), addr = r.locations[0]
                learned.append((keys[i], Seen(r.epoch, r.placement, r.size, sums[i],
                                              segment, node_id, addr, now)))
        elif code == exists:
            stored += 1
            written += r.size
            rs.give_back(r, st.replicas)  # still PENDING and ours
        else:
            # The placeholder is gone (reclaimed, its node lost, a new leader) or the
            # key is refused here: the plain way gives the canonical answer. A
            # placeholder still there is given up (revoked with the next put).
            if code != Code.NOT_FOUND:
                rs.lost(r)
            again.append(i)
    stats = st.stats
    stats.puts += stored
    stats.bytes_written += written
    stats.one_call_puts += committed
    if records:
        stats.recorded_puts += committed
    if learned:
        st.placements.learn_many(learned)
    return again


def _write_reserved(st: ClientState, keys: list[bytes], srcs: list[Dest],
                    taken: list[Reserved], plan: Plan,
                    ) -> Flow[tuple[list[int], dict[Target, KVStoreError], bool]]:
    """Move the values into their placeholders with their put records where every
    placeholder has room for one and the record area a free chunk; returns the
    checksums, the failures per target and whether the records went."""
    area = st.records
    fits = len(keys) <= RECORDS_UP_TO and all(
        r.room >= record_bytes(len(k)) for k, r in zip(keys, taken, strict=True))
    chunk = area.take(sum(record_bytes(len(k)) for k in keys)) if fits else None
    try:
        if chunk is not None and sum(r.size for r in taken) < SUM_FIRST_BELOW:
            # Small values: checksum first, and the records go in the values' batch.
            sums = _checksums(srcs)
            _add_records(plan, area.view, area.addr, chunk, keys, taken, sums, srcs)
            ticket = yield Start(plan, write=True, at_once=True)
            failed: dict[Target, KVStoreError] = yield Finish(ticket)
            return sums, failed, True
        ticket = yield Start(plan, write=True, at_once=True)
        sums = _checksums(srcs)  # while the bytes move
        more: Ticket | None = None
        if chunk is not None:
            records: Plan = defaultdict(list)
            _add_records(records, area.view, area.addr, chunk, keys, taken, sums)
            more = yield Start(records, write=True, at_once=True)
        failed = yield Finish(ticket)
        if more is not None:
            late: dict[Target, KVStoreError] = yield Finish(more)
            failed = {**late, **failed} if late else failed
        return sums, failed, chunk is not None
    finally:
        if chunk is not None:
            area.give(chunk)


def _add_records(plan: Plan, view: memoryview, base: int, at: int, keys: list[bytes],
                 taken: list[Reserved], sums: list[int],
                 srcs: list[Dest] | None = None) -> None:
    """Write each value's put record and plan its copy to just after the value in every
    replica (the room its placeholder has there): from the value's own tail, its
    transfer lengthened to carry it (`srcs`, already in the plan), else from the record
    area at `at`."""
    for i, (key, r, total) in enumerate(zip(keys, taken, sums, strict=True)):
        rec = encode_record(r.key, key, r.size, total, r.epoch)
        n = len(rec)
        d = srcs[i] if srcs is not None else None
        if d is not None and d.tail >= n:
            ctypes.memmove(d.addr + r.size, rec, n)
            for target, addr in r.locations:
                for x in plan[target]:
                    if x.local == d.addr and x.remote == addr:
                        x.size += n
            continue
        view[at:at + n] = rec
        for target, addr in r.locations:
            plan[target].append(Xfer(base + at, addr + r.size, n))
        at += n


def _put_plain(st: ClientState, keys: list[bytes], srcs: list[Dest],
               fill: Callable[[int, int], None] | None = None) -> Flow[list[KVStoreError | None]]:
    """The plain way (`_put_once`), and once more for the objects whose transfer failed:
    a node killed or cut off fails its transfers (an engine write fails on its own, a
    same-host copy checks that the node's process lives), and the master has stopped
    placing there by then (its intent to that node failed: MasterCore.set_unresponsive),
    so the second try goes elsewhere and the caller sees OK while any node has room."""
    failed: dict[Target, KVStoreError] = {}
    results = yield from _put_once(st, keys, srcs, fill, failed)
    # Only where a node looks down: a node that failed one transfer and still answers
    # keeps the failure's answer (the caller decides, as before).
    again = ([i for i, r in enumerate(results) if isinstance(r, Unavailable)]
             if any(st.down(t) for t in failed) else [])
    if again:
        st.stats.put_retries += len(again)
        redo = yield from _put_once(st, [keys[i] for i in again], [srcs[i] for i in again])
        for i, res in zip(again, redo, strict=True):
            results[i] = res
    return results


def _put_once(st: ClientState, keys: list[bytes], srcs: list[Dest],
              fill: Callable[[int, int], None] | None = None,
              dead: dict[Target, KVStoreError] | None = None) -> Flow[list[KVStoreError | None]]:
    """PutStart, transfer, PutEnd; a large batch in pipelined groups (see datapath.groups): at most
    two groups are in flight, the next one's PutStart and the previous one's PutEnd run
    while a group moves."""
    results: list[KVStoreError | None] = [None] * len(keys)
    inflight: list[tuple[_Started, Ticket | None]] = []
    if dead is None:
        dead = {}  # nodes that failed a group: later groups skip them
    deadline = st.now() + st.timeout  # for waiting until a store node can take the put
    try:
        for lo, hi in st.pipelined([d.view.nbytes for d in srcs]):
            if fill is not None:
                fill(lo, hi)
            group, plan = yield from _put_start(st, keys, srcs, lo, hi, results, deadline)
            ticket = (yield Start(plan, write=True, dead=dead)) if plan else None
            inflight.append((group, ticket))
            if len(inflight) > 1:
                yield from _put_end(st, keys, srcs, *inflight.pop(0), results, dead)
        while inflight:
            yield from _put_end(st, keys, srcs, *inflight.pop(0), results, dead)
    except KVStoreError:
        # Nothing may still be moving from the caller's memory when the call ends.
        for _, ticket in inflight:
            if ticket is not None:
                yield Finish(ticket)
        raise
    return results


@dataclass(slots=True)
class _Started:
    """A put group after PutStart: keys[lo:lo + len(items)], the master's answer per key
    (and the epoch it came in), their checksums, and the indexes that got space."""

    lo: int
    items: list[Any]  # PutStartItem, or columns.ReadItem from a reply in columns
    epoch: int
    sums: list[int]
    started: list[int]


def _put_start(st: ClientState, keys: list[bytes], srcs: list[Dest], lo: int, hi: int,
               results: list[KVStoreError | None],
               deadline: float) -> Flow[tuple[_Started, Plan]]:
    """PutStart for keys[lo:hi] (asking again while the master answers BUSY, and while
    no store node can take them until `deadline`); the group and the plan that writes
    it."""
    sizes = [d.view.nbytes for d in srcs[lo:hi]]
    sums = _checksums(srcs[lo:hi])
    reply = yield Rpc("PutStart", pb.PutStartRequest(
        keys=keys[lo:hi], sizes=sizes, checksums=sums, replicas=st.replicas,
        writer=st.writer_id, columns_version=COLUMNS))
    items = start_items(reply, hi - lo)
    epoch = reply.epoch

    def ask_again(which: list[int]) -> Flow[None]:
        nonlocal reply, epoch
        again = yield Rpc("PutStart", pb.PutStartRequest(
            keys=[keys[lo + j] for j in which], sizes=[sizes[j] for j in which],
            checksums=[sums[j] for j in which], replicas=st.replicas, writer=st.writer_id,
            columns_version=COLUMNS))
        for j, item in zip(which, start_items(again, len(which)), strict=True):
            items[j] = item
        # Placements are only compared within one epoch: a retry answered by a new
        # leader makes the earlier answers' placements unknown.
        if again.epoch != reply.epoch:
            reply = again
            epoch = 0

    # BUSY: the master is demoting objects to SSD to make room; ask again shortly.
    budget = st.now() + BUSY_BUDGET
    # Demotions free DRAM within a few ms: ask again soon rather than doubling towards
    # 100 ms (which made a put behind a 20 ms demotion wait 35-75 ms).
    delay = 0.001
    busy = [j for j, item in enumerate(items) if item.code == Code.BUSY]
    while busy and st.now() < budget:
        yield Wait(delay)
        delay = min(delay * 1.5, 0.02)
        yield from ask_again(busy)
        busy = [j for j in busy if items[j].code == Code.BUSY]
    # UNAVAILABLE: no store node has mounted yet (a cluster starting, every node
    # restarting) or none answers the master; retryable, so the put waits for one
    # within the client's timeout, as a control call waits for a leader, rather than
    # failing a program started a moment before its nodes. StoreFull and the rest are
    # answers, not waited out.
    waiting = [j for j, item in enumerate(items) if item.code == Code.UNAVAILABLE]
    attempt = 0
    while waiting and (left := deadline - st.now()) > 0:
        yield Wait(backoff(attempt, left))
        attempt += 1
        yield from ask_again(waiting)
        waiting = [j for j in waiting if items[j].code == Code.UNAVAILABLE]
    plan: Plan = defaultdict(list)
    started: list[int] = []
    for j, item in enumerate(items):
        i = lo + j
        if item.code == Code.ALREADY_EXISTS:
            continue
        if item.code != Code.OK:
            results[i] = error_for(item.code, item.message, key=keys[i])
            continue
        started.append(i)
        for loc in item.locations:
            plan[(loc.segment, loc.node_id)].append(Xfer(srcs[i].addr, loc.addr, loc.size))
    return _Started(lo, items, epoch, sums, started), plan


def _put_end(st: ClientState, keys: list[bytes], srcs: list[Dest], group: _Started,
             ticket: Ticket | None, results: list[KVStoreError | None],
             dead: dict[Target, KVStoreError]) -> Flow[None]:
    """Wait for a group's bytes, then commit what arrived (PutEnd) and revoke the rest;
    remember where the committed objects sit (for early reads)."""
    lo, items, started = group.lo, group.items, group.started
    failed: dict[Target, KVStoreError] = (yield Finish(ticket)) if ticket is not None else {}
    dead.update(failed)
    commit: list[int] = started
    revoke: list[int] = []
    if failed:
        commit = []
        for i in started:
            bad = [failed[t] for loc in items[i - lo].locations
                   if (t := (loc.segment, loc.node_id)) in failed]
            if bad:
                revoke.append(i)
                results[i] = bad[0]
            else:
                commit.append(i)
    if revoke:
        # Bytes of a write that ended without the engine's answer may still land: the
        # master then holds the space until its put timeout (see Unsettled).
        unsettled = any(isinstance(results[i], Unsettled) for i in revoke)
        yield Rpc("PutRevoke", pb.KeysRequest(keys=[keys[i] for i in revoke], writer=st.writer_id,
                                              unsettled=unsettled))
    if commit:
        end = yield Rpc("PutEnd", pb.KeysRequest(keys=[keys[i] for i in commit],
                                                 writer=st.writer_id))
        # Learned only if PutEnd came from the leader that placed them.
        learn = st.placements.learn if end.epoch == group.epoch else _ignore
        now = st.now()
        for i, code in zip(commit, end.codes, strict=True):
            if code not in (Code.OK, Code.ALREADY_EXISTS):
                results[i] = error_for(code, "the write was not committed (it timed out at the "
                                       "master or its node was lost); put it again", key=keys[i])
            else:
                st.stats.puts += 1
                st.stats.bytes_written += srcs[i].view.nbytes
                item = items[i - lo]
                if code == Code.OK and group.epoch and item.locations:
                    loc = item.locations[0]
                    learn(keys[i], group.epoch, item.placement, loc.size,
                          group.sums[i - lo], loc.segment, loc.node_id, loc.addr, now)


def _checksums(srcs: list[Dest]) -> list[int]:
    """Each source's checksum: XXH3 of a host view straight away, the checksum module's
    choice (a GPU tensor's page sum) for anything else."""
    xxh = xxh3_64_intdigest
    return [xxh(v) if type(v := d.view) is memoryview else checksum(v) for d in srcs]


def _ignore(*_args: Any) -> None:
    pass

