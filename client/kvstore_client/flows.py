"""What the client does, free of I/O: every operation is a generator of steps.

Each operation (put, get, lookup, ...) is written once, as a generator that yields
`Rpc` (a control call to the master), `Start` (submit a batch of data transfers, go on)
and `Finish` (wait for it), `Move` (both at once), `Release` (a lease release nobody
waits for) or `Wait`, and receives each step's result. The synchronous client and the
asyncio client are thin drivers that run these steps their own way, so both behave
identically by construction (the idea of h11's sans-I/O state machine).

A put is two-phase: PutStart (the master allocates space), the transfers, PutEnd (the
objects become visible) or PutRevoke; or, when the client holds space started ahead for
every object (reservations.py), the transfers into it and one PutCommit. A get is
GetReplicas (which pins the objects under a short lease so nothing evicts them
mid-read), the reads into registered memory, a checksum check of every object as soon
as it lands, and a release once every byte is in.
A read whose lease ran out before the bytes arrived is not trusted. When the client
knows where every object of a get sat (it wrote or read them lately), it reads there
while it asks (`Ask`, the transfers, `Answer`) and keeps those bytes only if the
master's answer names the same placement (see placements.py). A large batch goes
in pipelined groups: one group's control call (and a put's checksums) runs while the
bytes of another move. Whatever ends a call, nothing it started still moves when it
returns (the drivers finish every started batch).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from kvstore.checksum import checksum
from kvstore.coord.layout import Layout
from kvstore.errors import (
    Code,
    CorruptObject,
    InvalidArgument,
    KVStoreError,
    LeaseExpired,
    NotFound,
    Unavailable,
    check_key,
    error_for,
)
from kvstore.transfer import Transfer
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore_client.control import from_stale_leader
from kvstore_client.local import LocalSegment, LocalSegments
from kvstore_client.placements import DEFAULT_CAPACITY, Placements, Seen
from kvstore_client.reservations import DEFAULT_BUDGET, Reservations, Reserved
from kvstore_client.staging import Staging

DEFAULT_PLACEMENTS = DEFAULT_CAPACITY  # objects whose placement a client remembers
DEFAULT_RESERVE = DEFAULT_BUDGET  # bytes of space a client starts ahead for its puts

T = TypeVar("T")

# How long a put keeps asking while the master makes room (BUSY) before giving up.
BUSY_BUDGET = 5.0

# A store node as a transfer target: (Transfer Engine segment name, node id).
Target = tuple[str, str]


@dataclass(slots=True)
class Xfer:
    """One object's transfer. A read carries the view its bytes land in and the checksum
    they must have: the data path verifies each object as soon as it has landed, while
    the rest of the batch is still moving, and sets `ok`."""

    local: int
    remote: int
    size: int
    view: memoryview | None = None
    checksum: int = 0
    ok: bool = False
    left: int = 0  # pieces of it still moving (see pieces())


Plan = dict[Target, list[Xfer]]


class Ticket:
    """A started batch: its transfers in flight over the engine (id, target, what each
    carries, bytes) and what is left to do when it is finished (same-host copies, a
    small batch's one blocking call). Finishing it twice is harmless."""

    __slots__ = ("deadline", "done", "failed", "local", "lock", "pending", "small", "spin",
                 "total", "write")

    def __init__(self, write: bool) -> None:
        self.write = write
        self.deadline = 0.0
        self.pending: list[tuple[int, Target, list[Xfer], int]] = []
        self.local: list[tuple[LocalSegment, list[Xfer]]] = []
        self.small: list[tuple[Target, list[Xfer]]] = []
        self.failed: dict[Target, KVStoreError] = {}
        self.total = 0
        self.spin = False  # poll without sleeping: a small batch submitted at once
        self.done = False
        self.lock = threading.Lock()


@dataclass(slots=True)
class Rpc:
    method: str
    request: Any


@dataclass(slots=True)
class Move:
    plan: Plan
    write: bool


@dataclass(slots=True)
class Start:
    """Submit a batch of transfers and go on at once; the value is its Ticket. Targets in
    `dead` failed earlier in the same call and are not tried again. `at_once`: submit a
    small batch now too (see ClientState.start_transfers)."""

    plan: Plan
    write: bool
    dead: dict[Target, KVStoreError] | None = None
    at_once: bool = False


@dataclass(slots=True)
class Finish:
    """Wait for a started batch; the value is, per target node, its failure."""

    ticket: Ticket


@dataclass(slots=True)
class Ask:
    """Send a control request and go on at once; the value is what `Answer` takes."""

    method: str
    request: Any


@dataclass(slots=True)
class Answer:
    """Wait for the reply to an `Ask`: the same value (and errors) as an Rpc step's."""

    asked: Any


@dataclass(slots=True)
class Later:
    """Send a control request and go on; `then` gets its reply, or None if it failed,
    some time before the client's next control call (the flow never waits for it)."""

    method: str
    request: Any
    then: Callable[[Any], None]


@dataclass(slots=True)
class Settle:
    """Hand over the reply of a Later step still unread (the driver reads it now)."""


@dataclass(slots=True)
class Release:
    lease_id: int


@dataclass(slots=True)
class Wait:
    seconds: float


Step = Rpc | Ask | Answer | Later | Settle | Move | Start | Finish | Release | Wait
Flow = Generator[Step, Any, T]


@dataclass
class ClientStats:
    puts: int = 0
    gets: int = 0
    hits: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    corrupt_reads: int = 0
    local_transfers: int = 0  # objects moved by the same-host fast path
    early_reads: int = 0  # objects read while asking, kept (the answer confirmed them)
    early_wasted: int = 0  # objects read while asking, thrown away (moved or gone)
    one_call_puts: int = 0  # objects put into space started ahead (one control call)
    failovers: int = 0
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class Lease:
    """Pins on the first `count` keys of a lookup. Release it (or leave the `with`) once
    loaded; it expires by itself at `expires_at` (this host's time.monotonic())."""

    id: int
    keys: list[bytes]
    expires_at: float
    _client: Any = field(default=None, repr=False)

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def expired(self) -> bool:
        return time.monotonic() > self.expires_at

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None and self.id:
            with contextlib.suppress(KVStoreError):  # it expires on its own
                self._client.release(self)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None and self.id:
            with contextlib.suppress(KVStoreError):
                await self._client.release(self)


@dataclass(slots=True)
class Dest:
    """Where one object's bytes come from or land: registered memory."""

    addr: int
    view: memoryview


class ClientState:
    """Everything a client holds except its control channel."""

    def __init__(self, transfer: Transfer, staging: Staging, local: LocalSegments,
                 writer_id: str, replicas: int, placements: Placements | None = None,
                 reserve_bytes: int = 0) -> None:
        self.transfer = transfer
        self.placements = placements if placements is not None else Placements()
        self.reservations = Reservations(writer_id, reserve_bytes) if reserve_bytes else None
        # The newest leader epoch the driver has seen: replies of older ones are refused,
        # and space started ahead under an older leader is never written.
        self.epoch = 0
        self.staging = staging
        self.local = local
        self.writer_id = writer_id
        self.replicas = replicas
        self.stats = ClientStats()
        self.regions: list[tuple[int, int]] = []
        self._local_known: dict[Target, bool] = {}  # target -> reachable by memcpy
        self._answered: dict[Target, float] = {}  # engine target -> when it last moved bytes

    def current(self, reply: Any) -> bool:
        """Whether a reply comes from the newest leader seen (not a standby's, not a
        deposed leader's); if so, its epoch becomes the newest seen."""
        if from_stale_leader(reply, self.epoch):
            return False
        self.epoch = reply.epoch
        return True

    @classmethod
    def build(cls, etcd: str | None, layout: Layout, buffer_size: int, host: str, protocol: str,
              device: str, same_host: bool, replicas: int,
              timeout: float | None = None,
              placement_memory: int = DEFAULT_CAPACITY,
              reserve_bytes: int = DEFAULT_RESERVE) -> ClientState:
        """A client's data side: its Transfer Engine, staging buffer and local maps.
        `timeout` bounds each transfer batch (a peer that stopped answering);
        `placement_memory` objects' placements are remembered (0: no early reads);
        up to `reserve_bytes` of space is started ahead for puts (0: none; see
        reservations.py)."""
        if reserve_bytes < 0:
            raise InvalidArgument(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        transfer = Transfer(host, protocol, device, timeout=timeout)
        return cls(transfer, Staging(transfer, buffer_size),
                   LocalSegments(etcd, layout, enabled=same_host), uuid.uuid4().hex, replicas,
                   Placements(placement_memory), reserve_bytes)

    # -- registered memory ---------------------------------------------------------------

    def register(self, buffer: Any) -> None:
        addr, nbytes = buffer_address(buffer)
        self.transfer.register(addr, nbytes)
        self.regions.append((addr, addr + nbytes))

    def unregister(self, buffer: Any) -> None:
        addr, nbytes = buffer_address(buffer)
        self.transfer.unregister(addr)
        self.regions = [r for r in self.regions if r != (addr, addr + nbytes)]

    def dest(self, buffer: Any) -> Dest:
        addr, view = address_and_view(buffer)
        end = addr + view.nbytes
        for lo, hi in self.regions:
            if lo <= addr and end <= hi:
                return Dest(addr, view)
        raise InvalidArgument("buffer is not inside registered memory; call "
                              "client.register(buffer or the tensor it is a slice of) first")

    # -- moving bytes ---------------------------------------------------------------------

    def pipelined(self, sizes: Sequence[int]) -> list[tuple[int, int]]:
        """The groups to move a batch of these sizes in (see `groups`): one group when
        every node met so far is reached by memcpy, which runs in the caller's thread and
        so overlaps nothing; extra control calls would only cost."""
        known = self._local_known
        if known and all(known.values()):
            return [(0, len(sizes))]
        return groups(sizes)

    def answering(self, targets: Iterable[Target]) -> bool:
        """Whether each target is reached by memcpy or moved bytes for this client within
        EARLY_FRESH seconds: an early read goes only there. A node that froze since is
        then still listed by the master (its lease outlives EARLY_FRESH), so asking first
        would send the read there as well; a node the master already dropped is never
        read early, which would wait out the transfer timeout for a certain miss."""
        known = self._local_known
        answered = self._answered
        oldest = time.monotonic() - EARLY_FRESH
        ready = self.transfer.ready
        for t in targets:
            if not known.get(t) and not (answered.get(t, 0.0) > oldest and ready(t[0])):
                return False
        return True

    def is_local(self, target: Target) -> bool:
        """Whether the target was last reached by memcpy (same-host)."""
        return self._local_known.get(target, False)

    def saw_answer(self, target: Target) -> None:
        """The target just moved bytes for this client (see `answering`)."""
        self._answered[target] = time.monotonic()

    def saw_failure(self, target: Target) -> None:
        """A transfer to the target failed: no early reads go there until one lands."""
        self._answered.pop(target, None)

    def resolved(self, plan: Plan) -> bool:
        """Whether starting this plan cannot block: same-host targets told apart (that may
        ask etcd) and engine targets known to answer (else they are probed first)."""
        known = self._local_known
        return all(t in known and (known[t] or self.transfer.ready(t[0])) for t in plan)

    def start_transfers(self, plan: Plan, write: bool,
                        dead: dict[Target, KVStoreError] | None = None,
                        at_once: bool = False) -> Ticket:
        """Submit the plan's engine transfers and return without waiting.

        Same-host targets are copied with memcpy, and a batch of at most SYNC_MAX bytes
        over the engine moves in one blocking engine call (it spins, which costs least for
        a short wait): both when the ticket is finished. A larger one is submitted now in
        pieces (see `pieces`) and polled when finished. With `at_once`, a small batch is
        submitted now as well and polled without sleeping: for a caller with something
        to do while it moves (early reads send their GetReplicas meanwhile). Targets in
        `dead` (failed earlier in the same call) are not tried again: their transfers fail
        at once.
        """
        t = Ticket(write)
        remote: list[tuple[Target, list[Xfer]]] = []
        for target, items in plan.items():
            if dead and target in dead:
                t.failed[target] = dead[target]
                continue
            local = self.local.get(*target)
            if local is not None and all(local.contains(x.remote, x.size) for x in items):
                self._local_known[target] = True
                t.local.append((local, items))
            else:
                self._local_known[target] = False
                remote.append((target, items))
        t.total = sum(x.size for _, items in remote for x in items)
        # The batch fails once this passes, like the engine's own blocking calls (about
        # the client's timeout), plus 1 s per GB.
        t.deadline = time.monotonic() + self.transfer.batch_timeout + t.total * 1e-9
        if t.total <= SYNC_MAX:
            if not at_once:
                t.small = remote
                return t
            t.spin = True
        # Pieces of PIECE bytes, larger for a large batch (MAX_PIECES per batch at most):
        # each costs a submission and polls, and a few dozen in flight keep the engine busy.
        piece = max(PIECE, -(-t.total // MAX_PIECES) if MAX_PIECES else 0)
        for target, items in remote:
            try:
                for local_addr, remote_addr, n, xs in pieces(items, piece):
                    t.pending.append((self.transfer.start(target[0], local_addr, remote_addr,
                                                          n, write), target, xs, n))
            except KVStoreError as exc:
                t.failed[target] = exc  # what was submitted before still moves
        return t

    def finish_transfers(self, t: Ticket) -> dict[Target, KVStoreError]:
        """Wait until every transfer of the ticket is over; per target node, the failure.
        Each read that landed is verified (its `ok` set) as soon as it lands, while the
        rest still moves. Polling sleeps in between, so that the engine's threads (and
        the store node's, on a small host) get the CPU rather than a spinning waiter."""
        with t.lock:
            if not t.done:
                self._finish(t)
                t.done = True
            return t.failed

    def _finish(self, t: Ticket) -> None:
        write, failed = t.write, t.failed
        for local, items in t.local:
            for x in items:
                if write:
                    local.write(x.remote, x.local, x.size)
                else:
                    local.read(x.local, x.remote, x.size)
                    _verify(x)
            self.stats.local_transfers += len(items)
        for target, items in t.small:
            op = self.transfer.write if write else self.transfer.read
            try:
                op(target[0], [x.local for x in items], [x.remote for x in items],
                   [x.size for x in items])
            except KVStoreError as exc:
                failed[target] = exc
                self.saw_failure(target)
                continue
            if not write:
                for x in items:
                    _verify(x)
            self.saw_answer(target)
        pending = t.pending
        if not pending:
            return
        targets = {p[1] for p in pending}
        verb = "writing to" if write else "reading from"
        deadline = t.deadline
        status = self.transfer.status
        while True:
            still = []
            waiting = 0
            for k, p in enumerate(pending):
                # Pieces land about in the order they were submitted: after POLL_WINDOW
                # still moving, the rest are not asked this round.
                if waiting >= POLL_WINDOW:
                    still += pending[k:]
                    break
                st = status(p[0])
                if st == 0:
                    still.append(p)
                    waiting += 1
                elif st < 0:
                    failed.setdefault(p[1], Unavailable(f"{verb} store node {p[1][0]} failed; "
                                                        "the node may be down"))
                elif not write:
                    for x in p[2]:
                        x.left -= 1
                        if not x.left:
                            _verify(x)
            pending = still
            if not pending:
                break
            if time.monotonic() > deadline:
                # Abandoned, as the engine's own blocking calls do after their timeout.
                for p in pending:
                    failed.setdefault(p[1], Unavailable(
                        f"{verb} store node {p[1][0]} did not finish in time (the client's "
                        "timeout); the node may be frozen or cut off"))
                break
            if t.spin:
                continue
            left = sum(p[3] for p in pending)
            time.sleep(min(POLL_MAX, max(POLL_MIN, left / POLL_RATE)))
        t.pending = []
        for target in targets:
            if target in failed:
                self.saw_failure(target)
            else:
                self.saw_answer(target)

    def run_transfers(self, plan: Plan, write: bool) -> dict[Target, KVStoreError]:
        """Start and finish a plan (the Move step)."""
        return self.finish_transfers(self.start_transfers(plan, write))

    def close(self) -> None:
        self.local.close()
        self.staging.close()
        self.transfer.close()


# Transfer Engine batches up to this many bytes wait in one blocking engine call (it
# spins, which costs least for a short wait); larger ones are polled (see run_transfers).
SYNC_MAX = 256 << 10
# Over the Transfer Engine, bytes move in pieces of about PIECE: transfers adjacent both
# here and on the node are merged up to it, larger objects cut into pieces of it, which
# the engine moves in parallel over several connections. A batch larger than
# PIECE x MAX_PIECES uses fewer, larger pieces (each costs a submission and polls).
PIECE = 512 << 10
# Early reads go only to store nodes that moved bytes for this client this recently
# (see ClientState.answering); well under any node lease (2 s at the very least).
EARLY_FRESH = 1.0
MAX_PIECES = 64
# Polling a batch in flight: sleep about the time the bytes left need at POLL_RATE,
# within [POLL_MIN, POLL_MAX] seconds; each round asks about the pieces in the order
# they were submitted, and stops after POLL_WINDOW that are still moving.
POLL_RATE = 8e9
POLL_MIN = 20e-6
POLL_MAX = 2e-3
POLL_WINDOW = 8


def pieces(items: list[Xfer], piece: int = 0) -> list[tuple[int, int, int, list[Xfer]]]:
    """(local, remote, length, the transfers it carries) per engine transfer: consecutive
    transfers contiguous on both sides merged up to `piece` bytes, larger ones cut into
    pieces of `piece`. Sets each transfer's `left` to the number of pieces it is in."""
    piece = piece or PIECE
    out: list[tuple[int, int, int, list[Xfer]]] = []
    run: list[Xfer] = []
    size = 0
    for x in items:
        if x.size > piece:
            if run:
                out.append((run[0].local, run[0].remote, size, run))
                run, size = [], 0
            x.left = 0
            for off in range(0, x.size, piece):
                out.append((x.local + off, x.remote + off, min(piece, x.size - off), [x]))
                x.left += 1
            continue
        x.left = 1
        if run and size + x.size <= piece and \
                run[-1].local + run[-1].size == x.local and run[-1].remote + run[-1].size == x.remote:
            run.append(x)
            size += x.size
            continue
        if run:
            out.append((run[0].local, run[0].remote, size, run))
        run, size = [x], x.size
    if run:
        out.append((run[0].local, run[0].remote, size, run))
    return out


# A batch of at least 2 x PIPELINE_MIN bytes goes in groups of about equal bytes (at most
# PIPELINE_GROUPS, each at least PIPELINE_MIN): the control call of one group (PutStart,
# PutEnd, GetReplicas) and its checksums run while another group's bytes move.
PIPELINE_MIN = 8 << 20
PIPELINE_GROUPS = 4


def groups(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Index ranges [lo, hi) of `sizes`, in order, of about equal bytes (see PIPELINE_MIN)."""
    total = sum(sizes)
    n = max(1, min(PIPELINE_GROUPS, len(sizes), total // PIPELINE_MIN))
    if n == 1:
        return [(0, len(sizes))]
    out: list[tuple[int, int]] = []
    lo, acc = 0, 0
    for i, size in enumerate(sizes):
        acc += size
        # close a group once it holds its share, leaving one item at least per later group
        if acc * n >= total * (len(out) + 1) and len(sizes) - (i + 1) >= n - len(out) - 1 \
                and len(out) < n - 1:
            out.append((lo, i + 1))
            lo = i + 1
    out.append((lo, len(sizes)))
    return out


def _verify(x: Xfer) -> None:
    if x.view is not None:
        x.ok = checksum(x.view) == x.checksum


# -- flows --------------------------------------------------------------------------------


def exists(keys: Sequence[bytes]) -> Flow[list[bool]]:
    checked = checked_keys(keys)
    if not checked:
        return []
    reply = yield Rpc("Exists", pb.KeysRequest(keys=checked))
    return list(reply.exists)


def remove_many(st: ClientState, keys: Sequence[bytes], force: bool) -> Flow[list[Code]]:
    checked = checked_keys(keys)
    for k in checked:
        st.placements.forget(k)
    reply = yield Rpc("Remove", pb.RemoveRequest(keys=checked, force=force))
    return [Code(c) for c in reply.codes]


def lookup(st: ClientState, keys: Sequence[bytes], ttl: float | None) -> Flow[Lease]:
    checked = checked_keys(keys)
    sent = time.monotonic()
    reply = yield Rpc("Lookup", pb.LookupRequest(keys=checked, lease_ttl=ttl or 0.0,
                                                 holder=st.writer_id))
    return Lease(reply.lease_id, checked[:reply.count], sent + reply.ttl_remaining)


def renew(lease: Lease, ttl: float | None) -> Flow[None]:
    if lease.id:
        sent = time.monotonic()
        reply = yield Rpc("RenewLease", pb.RenewLeaseRequest(lease_id=lease.id, ttl=ttl or 0.0))
        lease.expires_at = sent + reply.ttl_remaining


def release(lease: Lease, keep_first: int | None) -> Flow[None]:
    if not lease.id:
        return
    req = pb.ReleaseLeaseRequest(lease_id=lease.id)
    if keep_first is not None:
        if keep_first < 0:
            raise InvalidArgument(f"keep_first must be >= 0, got {keep_first}")
        req.keep_first_n = keep_first
    yield Rpc("ReleaseLease", req)
    if keep_first is None or keep_first == 0:
        lease.keys, lease.id = [], 0
    else:
        lease.keys = lease.keys[:keep_first]


def put_many(st: ClientState, keys: Sequence[bytes],
             values: Sequence[Any]) -> Flow[list[KVStoreError | None]]:
    """Per key: None once stored (or already stored: same key, same bytes), else the error."""
    checked = checked_keys(keys)
    if len(checked) != len(values):
        raise InvalidArgument(f"put_many got {len(checked)} keys but {len(values)} values")
    views = [byte_view(v) for v in values]
    for key, view in zip(checked, views, strict=True):
        if view.nbytes == 0:
            raise InvalidArgument("empty value: store at least one byte", key=key)
    results: list[KVStoreError | None] = [None] * len(checked)
    # Batches larger than the staging buffer go in slices that fit; each group's values
    # are copied in just before its PutStart (while the group before it moves).
    for lo, hi in st.staging.slices([v.nbytes for v in views]):
        offsets = st.staging.layout([v.nbytes for v in views[lo:hi]])
        srcs = [Dest(st.staging.addr + off, st.staging.view[off:off + view.nbytes])
                for off, view in zip(offsets, views[lo:hi], strict=True)]

        def fill(a: int, b: int, srcs: list[Dest] = srcs, base: int = lo) -> None:
            for dest, view in zip(srcs[a:b], views[base + a:base + b], strict=True):
                dest.view[:] = view

        part = yield from _put(st, checked[lo:hi], srcs, fill)
        results[lo:hi] = part
    return results


def put_from(st: ClientState, keys: Sequence[bytes],
             buffers: Sequence[Any]) -> Flow[list[KVStoreError | None]]:
    checked = checked_keys(keys)
    if len(checked) != len(buffers):
        raise InvalidArgument(f"put_from got {len(checked)} keys but {len(buffers)} buffers")
    srcs = [st.dest(b) for b in buffers]
    return (yield from _put(st, checked, srcs))


def _put(st: ClientState, keys: list[bytes], srcs: list[Dest],
         fill: Callable[[int, int], None] | None = None) -> Flow[list[KVStoreError | None]]:
    """Into space started ahead (one control call, see reservations.py) when the client
    holds it for every object, else the plain way; then ask for space for the next
    batch of this shape. A batch large enough to be pipelined goes the plain way: its
    control calls already overlap its transfers, and moving it all at once is slower
    over the engine than in pipelined groups (measured: 1 MiB x 32, ~20% less)."""
    rs = st.reservations
    sizes = [d.view.nbytes for d in srcs]
    if rs is None or len(st.pipelined(sizes)) > 1:
        return (yield from _put_plain(st, keys, srcs, fill))
    taken = rs.take(sizes, st.replicas, st.epoch)
    if taken is None and rs.asking():
        yield Settle()  # the space asked for after the last put: wait for it this once
        taken = rs.take(sizes, st.replicas, st.epoch)
    if taken is not None:
        if st.answering({target for r in taken for target, _ in r.locations}):
            results = yield from _put_reserved(st, keys, srcs, fill, taken)
        else:
            for r in taken:
                rs.give_back(r, st.replicas)
            taken = None
    if taken is None:
        results = yield from _put_plain(st, keys, srcs, fill)
    yield from _reserve(st, rs, sizes)
    return results


def _reserve(st: ClientState, rs: Reservations, sizes: list[int]) -> Flow[None]:
    """Revoke placeholders past their age; ask (without waiting) for what the pool lacks
    to cover a batch of these sizes again."""
    stale = rs.expired()
    if stale:
        yield Later("PutRevoke", pb.KeysRequest(keys=stale, writer=st.writer_id), _ignore)
    asked = rs.wanted(sizes, st.replicas)
    if asked:
        sent, replicas = time.monotonic(), st.replicas

        def granted(reply: Any) -> None:
            rs.granted(asked, replicas, reply, sent)

        yield Later("PutStart", pb.PutStartRequest(
            keys=[k for k, _ in asked], sizes=[z for _, z in asked], checksums=[0] * len(asked),
            replicas=replicas, writer=st.writer_id, ahead=True), granted)


def _put_reserved(st: ClientState, keys: list[bytes], srcs: list[Dest],
                  fill: Callable[[int, int], None] | None,
                  taken: list[Reserved]) -> Flow[list[KVStoreError | None]]:
    """Write each value into its placeholder (checksums computed while the bytes move),
    then PutCommit. What did not land, or what the master no longer holds for us, is put
    again the plain way."""
    rs = st.reservations
    assert rs is not None
    n = len(keys)
    if fill is not None:
        fill(0, n)
    plan: Plan = defaultdict(list)
    for d, r in zip(srcs, taken, strict=True):
        for target, addr in r.locations:
            plan[target].append(Xfer(d.addr, addr, r.size))
    ticket = yield Start(plan, write=True, at_once=True)
    sums = [checksum(d.view) for d in srcs]
    failed: dict[Target, KVStoreError] = yield Finish(ticket)
    again: list[int] = []
    commit: list[int] = []
    for i, r in enumerate(taken):
        if failed and any(target in failed for target, _ in r.locations):
            rs.lost(r)
            again.append(i)
        else:
            commit.append(i)
    results: list[KVStoreError | None] = [None] * n
    if commit:
        reply = yield Rpc("PutCommit", pb.PutCommitRequest(
            placeholders=[taken[i].key for i in commit], keys=[keys[i] for i in commit],
            sizes=[taken[i].size for i in commit], checksums=[sums[i] for i in commit],
            writer=st.writer_id))
        now = time.monotonic()
        learn = st.placements.learn
        for i, code in zip(commit, reply.codes, strict=True):
            r = taken[i]
            if code == Code.OK or code == Code.ALREADY_EXISTS:
                st.stats.puts += 1
                st.stats.bytes_written += r.size
                if code == Code.ALREADY_EXISTS:
                    rs.give_back(r, st.replicas)  # still PENDING and ours
                    continue
                st.stats.one_call_puts += 1
                if reply.epoch == r.epoch:
                    (segment, node_id), addr = r.locations[0]
                    learn(keys[i], r.epoch, r.placement, r.size, sums[i], segment, node_id,
                          addr, now)
            else:
                # The placeholder is gone (reclaimed, its node lost, a new leader) or the
                # key is refused here: the plain way gives the canonical answer. A
                # placeholder still there is given up (revoked with the next put).
                if code != Code.NOT_FOUND:
                    rs.lost(r)
                again.append(i)
    if again:
        again.sort()
        redo = yield from _put_plain(st, [keys[i] for i in again], [srcs[i] for i in again])
        for i, res in zip(again, redo, strict=True):
            results[i] = res
    return results


def _put_plain(st: ClientState, keys: list[bytes], srcs: list[Dest],
               fill: Callable[[int, int], None] | None = None) -> Flow[list[KVStoreError | None]]:
    """PutStart, transfer, PutEnd; a large batch in pipelined groups (see `groups`): at most
    two groups are in flight, the next one's PutStart and the previous one's PutEnd run
    while a group moves."""
    results: list[KVStoreError | None] = [None] * len(keys)
    inflight: list[tuple[_Started, Ticket | None]] = []
    dead: dict[Target, KVStoreError] = {}  # nodes that failed a group: later groups skip them
    try:
        for lo, hi in st.pipelined([d.view.nbytes for d in srcs]):
            if fill is not None:
                fill(lo, hi)
            group, plan = yield from _put_start(st, keys, srcs, lo, hi, results)
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
    items: list[pb.PutStartItem]
    epoch: int
    sums: list[int]
    started: list[int]


def _put_start(st: ClientState, keys: list[bytes], srcs: list[Dest], lo: int, hi: int,
               results: list[KVStoreError | None]) -> Flow[tuple[_Started, Plan]]:
    """PutStart for keys[lo:hi] (asking again while the master answers BUSY); the group
    and the plan that writes it."""
    sizes = [d.view.nbytes for d in srcs[lo:hi]]
    sums = [checksum(d.view) for d in srcs[lo:hi]]
    reply = yield Rpc("PutStart", pb.PutStartRequest(
        keys=keys[lo:hi], sizes=sizes, checksums=sums, replicas=st.replicas,
        writer=st.writer_id))
    items = list(reply.items)
    epoch = reply.epoch
    # BUSY: the master is demoting objects to SSD to make room; ask again shortly.
    budget = time.monotonic() + BUSY_BUDGET
    delay = 0.005
    busy = [j for j, item in enumerate(items) if item.code == Code.BUSY]
    while busy and time.monotonic() < budget:
        yield Wait(delay)
        delay = min(delay * 2, 0.1)
        again = yield Rpc("PutStart", pb.PutStartRequest(
            keys=[keys[lo + j] for j in busy], sizes=[sizes[j] for j in busy],
            checksums=[sums[j] for j in busy], replicas=st.replicas, writer=st.writer_id))
        for j, item in zip(busy, again.items, strict=True):
            items[j] = item
        busy = [j for j in busy if items[j].code == Code.BUSY]
        # Placements are only compared within one epoch: a retry answered by a new
        # leader makes the earlier answers' placements unknown.
        if again.epoch != reply.epoch:
            reply = again
            epoch = 0
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
        yield Rpc("PutRevoke", pb.KeysRequest(keys=[keys[i] for i in revoke], writer=st.writer_id))
    if commit:
        end = yield Rpc("PutEnd", pb.KeysRequest(keys=[keys[i] for i in commit],
                                                 writer=st.writer_id))
        # Learned only if PutEnd came from the leader that placed them.
        learn = st.placements.learn if end.epoch == group.epoch else _ignore
        now = time.monotonic()
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


def _ignore(*_args: Any) -> None:
    pass


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


def _settle(keys: list[bytes], items: list[pb.ReadItem], lease_id: int,
            deadline: float) -> Flow[list[pb.ReadItem]]:
    """Ask again, under the same lease, for objects the master is bringing back from
    SSD into DRAM (IN_PROGRESS), until they are readable or the lease runs out."""
    delay = 0.002
    waiting = [j for j, item in enumerate(items) if item.code == Code.IN_PROGRESS]
    while waiting and lease_id and time.monotonic() + delay < deadline:
        yield Wait(delay)
        delay = min(delay * 2, 0.05)
        again = yield Rpc("GetReplicas", pb.GetReplicasRequest(
            keys=[keys[j] for j in waiting], lease_id=lease_id))
        for j, item in zip(waiting, again.items, strict=True):
            items[j] = item
        waiting = [j for j in waiting if items[j].code == Code.IN_PROGRESS]
    return items


def _get_once(st: ClientState, keys: list[bytes], todo: list[int],
              out: list[bytes | KVStoreError]) -> Flow[list[int]]:
    sent = time.monotonic()
    asked = [keys[i] for i in todo]
    request = pb.GetReplicasRequest(keys=asked, holder=st.writer_id)
    seen = st.placements.recall(asked)
    early: list[tuple[Target, Xfer]] | None = None
    early_failed: dict[Target, KVStoreError] = {}
    if seen is not None and st.answering({(s.segment, s.node_id) for s in seen}):
        sizes = [s.size for s in seen]
        if len(list(st.staging.slices(sizes))) == 1:  # (may grow the buffer)
            dests = [Dest(st.staging.addr + off, st.staging.view[off:off + n])
                     for off, n in zip(st.staging.layout(sizes), sizes, strict=True)]
            plan, early = _early_plan(seen, dests)
            reply, early_failed = yield from _read_while_asking(request, plan)
    if early is None:
        reply = yield Rpc("GetReplicas", request)
    deadline = sent + reply.ttl_remaining
    items = yield from _settle(asked, list(reply.items), reply.lease_id, deadline)
    _note_placements(st, asked, reply.epoch, items, seen)
    found: list[tuple[int, pb.ReadItem]] = []
    retry: list[int] = []
    in_time = time.monotonic() <= deadline
    kept = 0
    for p, (i, item) in enumerate(zip(todo, items, strict=True)):
        if item.code != Code.OK or not item.locations:
            continue
        if early is not None and seen is not None and in_time:
            target, x = early[p]
            if confirmed(seen[p], reply.epoch, item):
                if target in early_failed:
                    # As a first read failing there: another attempt asks first (the
                    # node may be gone) and tries the other replicas.
                    out[i] = early_failed[target]
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
    if early is not None:
        st.stats.early_reads += kept
        st.stats.early_wasted += len(early) - kept
    try:
        for lo, hi in st.staging.slices([item.size for _, item in found]):
            part = found[lo:hi]
            offsets = st.staging.layout([item.size for _, item in part])
            dests = [Dest(st.staging.addr + off, st.staging.view[off:off + item.size])
                     for off, (_, item) in zip(offsets, part, strict=True)]
            errs = yield from _read_into(st, keys, part, dests)
            if time.monotonic() > deadline:
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


def _early_plan(seen: list[Seen], dests: list[Dest]) -> tuple[Plan, list[tuple[Target, Xfer]]]:
    """Reads of each object from where it was last seen (its first replica), into dests."""
    plan: Plan = defaultdict(list)
    early: list[tuple[Target, Xfer]] = []
    for s, d in zip(seen, dests, strict=True):
        target = (s.segment, s.node_id)
        x = Xfer(d.addr, s.addr, s.size, d.view[:s.size], s.checksum)
        plan[target].append(x)
        early.append((target, x))
    return plan, early


def _read_while_asking(request: pb.GetReplicasRequest,
                       plan: Plan) -> Flow[tuple[Any, dict[Target, KVStoreError]]]:
    """GetReplicas, with the plan's reads moving while the master answers: the reply and
    the reads' failures per node. The reads are submitted before the request is sent
    (sending wakes the master, which is not free on a small VM), and the caller sleeps
    in the socket for the reply before it polls the reads, so that the master and the
    engine's threads have the CPU meanwhile (single 64 KiB gets on 2 vCPUs, 5 rounds
    interleaved: p50 208-266 µs this way, 271-342 µs polling first, 357-450 µs asking
    before reading)."""
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


def _note_placements(st: ClientState, keys: list[bytes], epoch: int,
                     items: list[pb.ReadItem], seen: list[Seen] | None) -> None:
    """Remember where each object of a reply sits; forget the ones it says are gone."""
    placements = st.placements
    if not placements.capacity:
        return
    fresh = time.monotonic() - placements.max_age / 2
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


def get_into(st: ClientState, keys: Sequence[bytes], buffers: Sequence[Any],
             lease: Lease | None) -> Flow[list[KVStoreError | None]]:
    """GetReplicas (pins under a short lease, or checks the caller's), read, verify,
    release; a large batch in pipelined groups (see `groups`): each group's GetReplicas
    runs while the groups before it move. When every object's placement is known, they
    are read while GetReplicas is asked (see placements.py); a buffer whose key then
    fails may have been written."""
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
                             or not st.answering({(s.segment, s.node_id) for s in seen})):
        seen = None
    try:
        for lo, hi in spans:
            sent_at = time.monotonic()
            request = pb.GetReplicasRequest(keys=checked[lo:hi], lease_id=lease.id if lease else 0,
                                            holder=st.writer_id)
            early: list[tuple[Target, Xfer]] | None = None
            early_failed: dict[Target, KVStoreError] = {}
            if seen is not None:
                plan, early = _early_plan(seen, dests)
                reply, early_failed = yield from _read_while_asking(request, plan)
            else:
                reply = yield Rpc("GetReplicas", request)
            if reply.lease_id and lease is None:
                leases.append(reply.lease_id)
            deadline = lease.expires_at if lease else sent_at + reply.ttl_remaining
            items = yield from _settle(checked[lo:hi], list(reply.items), reply.lease_id,
                                       deadline)
            _note_placements(st, checked[lo:hi], reply.epoch, items, seen)
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
                    if early is not None and seen is not None and confirmed(seen[i], reply.epoch,
                                                                             item):
                        kept.append((len(found), *early[i]))
                    else:
                        rest.append(len(found))
                    found.append((i, item))
            if early is not None:
                st.stats.early_reads += len(kept)
                st.stats.early_wasted += len(early) - len(kept)
            plan, sent = _read_plan(found, [dests[i] for i, _ in found], rest, 0)
            inflight.append((deadline, found, sent, (yield Start(plan, write=False)), kept,
                             early_failed))
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
            if (found or lease is not None) and time.monotonic() > deadline:
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


# One read sent: (index into its part, target node, the transfer).
_Sent = tuple[int, Target, Xfer]


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
    """Read each object of `part` into its dest and verify it; per object the error.

    Replica r of each object is tried in round r; most reads finish in round 0.
    """
    errs: list[KVStoreError | None] = [None] * len(part)
    yield from _read_rounds(st, keys, part, dests, errs, list(range(len(part))), 0)
    return errs


# -- buffers and keys ---------------------------------------------------------------------


def buffer_address(buffer: Any) -> tuple[int, int]:
    """(address, length in bytes) of a contiguous buffer or CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size"):
        if not buffer.is_contiguous():
            raise InvalidArgument("tensor is not contiguous; pass a contiguous tensor or slice")
        if buffer.device.type != "cpu":
            raise InvalidArgument(f"tensors on {buffer.device} need the CUDA Transfer Engine "
                                  "build (mooncake-transfer-engine)")
        return int(buffer.data_ptr()), int(buffer.numel() * buffer.element_size())
    addr, view = address_and_view(buffer)
    return addr, view.nbytes


def address_and_view(buffer: Any) -> tuple[int, memoryview]:
    """The address and a flat byte view of a contiguous buffer or CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size"):
        return buffer_address(buffer)[0], byte_view(buffer)
    view = byte_view(buffer)
    try:  # a writable buffer: the quick way
        return ctypes.addressof(ctypes.c_char.from_buffer(view)), view
    except (TypeError, ValueError):  # read-only or empty
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data), view


def byte_view(buffer: Any) -> memoryview:
    """A flat byte view of a buffer-protocol object or a CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "numpy"):
        import torch

        buffer = buffer.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(buffer)
    except TypeError as exc:
        raise InvalidArgument(f"{type(buffer).__name__} is not a buffer") from exc
    if not view.contiguous:
        raise InvalidArgument("buffer is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def checked_keys(keys: Sequence[bytes]) -> list[bytes]:
    out = [bytes(k) if isinstance(k, (bytearray, memoryview)) else k for k in keys]
    for k in out:
        check_key(k)
    return out
