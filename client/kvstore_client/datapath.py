"""The data path: how a client moves bytes, the work behind the `Start`, `Finish` and
`Move` steps (steps.py), which the drivers call.

A batch of transfers is a `Plan` (per store node, the `Xfer`s to it); started, it is a
`Ticket`. Same-host targets are copied with memcpy in the caller's thread; others go
over the Transfer Engine: a small batch in one blocking engine call, a larger one
submitted in pieces and polled, each object verified against its checksum as soon as
its pieces have landed. The data path remembers which nodes answered lately (early
reads and writes into space started ahead go only there) and which are reached by
memcpy. Time comes from the client's clock; the sleep between polls is the driver's
(it hands its own `sleep` to `finish_transfers`), so a test can run both by hand.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvstore.checksum import matches
from kvstore.errors import KVStoreError, Unavailable, Unsettled
from kvstore.transfer import Transfer
from kvstore_client.buffers import DEVICE_MEMORY
from kvstore_client.clock import MONOTONIC, Clock, MonotonicClock
from kvstore_client.local import LocalSegment, LocalSegments
from kvstore_client.stats import ClientStats

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
        self.local: list[tuple[Target, LocalSegment, list[Xfer]]] = []
        self.small: list[tuple[Target, list[Xfer]]] = []
        self.failed: dict[Target, KVStoreError] = {}
        self.total = 0
        self.spin = False  # poll without sleeping at first: a small batch submitted at once
        self.done = False
        self.lock = threading.Lock()


class DataPath:
    """A client's engine, same-host segments and what it learned of each node."""

    def __init__(self, transfer: Transfer, local: LocalSegments, stats: ClientStats,
                 clock: Clock = MONOTONIC) -> None:
        self.transfer = transfer
        self.local = local
        self.stats = stats
        self.clock = clock
        # The flows and the data path read the time through this: the production clock
        # as time.monotonic itself (a method call around it would cost more than the
        # reading, several times per get), any other clock through its `now`.
        self.now: Callable[[], float] = (time.monotonic if type(clock) is MonotonicClock
                                         else clock.now)
        self._local_known: dict[Target, bool] = {}  # target -> reachable by memcpy
        self._answered: dict[Target, float] = {}  # engine target -> when it last moved bytes
        self._gone: set[Target] = set()  # same-host targets whose node's process is gone

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
        oldest = self.now() - EARLY_FRESH
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
        self._answered[target] = self.now()

    def down(self, target: Target) -> bool:
        """Whether a target that just failed looks down, not briefly failing: a same-host
        node whose process is gone, or one the engine no longer counts as answering
        (a failure clears that until a probe or a transfer lands). A put retries what
        failed there once, elsewhere (puts._put_plain)."""
        return target in self._gone or not self.transfer.ready(target[0])

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
        submitted now as well, and polled without sleeping for a moment before the
        sleeps (see SPIN_MAX): for a caller with something to do while it moves (early
        reads send their GetReplicas meanwhile, puts compute checksums). Targets in
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
            if local is not None and all(local.contains(x.remote, x.size) for x in items) \
                    and not (DEVICE_MEMORY and any(DEVICE_MEMORY.covers(x.local, x.size)
                                                   for x in items)):  # a CPU copy
                self._local_known[target] = True
                t.local.append((target, local, items))
            else:
                self._local_known[target] = False
                remote.append((target, items))
        t.total = sum(x.size for _, items in remote for x in items)
        # The batch fails once this passes, like the engine's own blocking calls (about
        # the client's timeout), plus 1 s per GB.
        t.deadline = self.now() + self.transfer.batch_timeout + t.total * 1e-9
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

    def finish_transfers(self, t: Ticket,
                         sleep: Callable[[float], None]) -> dict[Target, KVStoreError]:
        """Wait until every transfer of the ticket is over; per target node, the failure.
        Each read that landed is verified (its `ok` set) as soon as it lands, while the
        rest still moves. Polling sleeps in between (with the driver's `sleep`), so that
        the engine's threads (and the store node's, on a small host) get the CPU rather
        than a spinning waiter."""
        with t.lock:
            if not t.done:
                self._finish(t, sleep)
                t.done = True
            return t.failed

    def _finish(self, t: Ticket, sleep: Callable[[float], None]) -> None:  # noqa: C901 (one poll loop over every piece state; split, the states scatter)
        write, failed = t.write, t.failed
        for target, local, items in t.local:
            if write and not local.alive():
                # Nothing copied: a killed node's segment stays mapped here, and the put
                # would wait for a record that never comes. Not Unsettled: no byte moved.
                failed[target] = Unavailable(
                    f"store node {target[1]} on this host is not running (killed or "
                    "restarted); put again: the master places it elsewhere")
                self.local.forget(*target)
                self._local_known.pop(target, None)
                self._gone.add(target)
                continue
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
                failed[target] = Unsettled(str(exc)) if write else exc
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
        # A write that ends without the engine's success may still land (see Unsettled).
        failure: type[Unavailable] = Unsettled if write else Unavailable
        deadline = t.deadline
        status = self.transfer.status
        now = self.now
        # A batch submitted at once is polled without sleeping for about the time its
        # bytes need at POLL_RATE (within [SPIN_MIN, SPIN_MAX]), then asleep like any
        # other: one still moving after that waits for CPU (the engine's threads, the
        # node's on a small host) or for its node. While it spins it yields the CPU
        # between polls, so that on a busy host those threads run instead: a sleep
        # would overshoot a short transfer by more than the transfer itself.
        spin_until = (now() + min(SPIN_MAX, max(SPIN_MIN, t.total / POLL_RATE))
                      if t.spin else 0.0)
        nap = 0.0
        while True:
            still = []
            waiting = 0
            landed = False
            k = 0  # pending[k:] not asked this round
            try:
                while k < len(pending):
                    # Pieces land about in the order they were submitted: after
                    # POLL_WINDOW still moving, the rest are not asked this round.
                    if waiting >= POLL_WINDOW:
                        break
                    p = pending[k]
                    st = status(p[0])
                    k += 1
                    if st == 0:
                        still.append(p)
                        waiting += 1
                        continue
                    landed = True
                    if st < 0:
                        failed.setdefault(p[1], failure(
                            f"{verb} store node {p[1][0]} failed; the node may be down"))
                    elif not write:
                        for x in p[2]:
                            x.left -= 1
                            if not x.left:
                                _verify(x)
            finally:
                # The ticket holds only what is still in the engine: whatever ends this
                # wait (an interrupted sleep too), the driver finishes the ticket again,
                # and an id reported over is freed by the engine, never to be asked again.
                t.pending = pending = still + pending[k:]
            if not pending:
                break
            at = now()
            if at > deadline:
                # Abandoned, as the engine's own blocking calls do after their timeout.
                for p in pending:
                    failed.setdefault(p[1], failure(
                        f"{verb} store node {p[1][0]} did not finish in time (the client's "
                        "timeout); the node may be frozen or cut off"))
                break
            if at < spin_until:
                os.sched_yield()
                continue
            nap = next_nap(nap, sum(p[3] for p in pending), landed)
            sleep(nap)
        t.pending = []
        for target in targets:
            if target in failed:
                self.saw_failure(target)
            else:
                self.saw_answer(target)

    def run_transfers(self, plan: Plan, write: bool,
                      sleep: Callable[[float], None]) -> dict[Target, KVStoreError]:
        """Start and finish a plan (the Move step)."""
        return self.finish_transfers(self.start_transfers(plan, write), sleep)


# Transfer Engine batches up to this many bytes wait in one blocking engine call (it
# spins, which costs least for a short wait); larger ones are polled (see finish_transfers).
SYNC_MAX = 256 << 10
# Over the Transfer Engine, bytes move in pieces of about PIECE: transfers adjacent both
# here and on the node are merged up to it, larger objects cut into pieces of it, which
# the engine moves in parallel over several connections. A batch larger than
# PIECE x MAX_PIECES uses fewer, larger pieces (each costs a submission and polls).
PIECE = 512 << 10
# Early reads go only to store nodes that moved bytes for this client this recently
# (see DataPath.answering); well under any node lease (2 s at the very least).
EARLY_FRESH = 1.0
MAX_PIECES = 64
# Polling a batch in flight: the first sleep is about the time the bytes left need at
# POLL_RATE, each poll that finds nothing landed doubles it, within [POLL_MIN, POLL_MAX]
# seconds (see next_nap); each round asks about the pieces in the order they were
# submitted, and stops after POLL_WINDOW that are still moving. A batch submitted at
# once (at_once) is first polled without sleeping, yielding the CPU between polls, for
# the time its bytes need at POLL_RATE within [SPIN_MIN, SPIN_MAX]: a single put's
# transfer, on an idle host, ends within SPIN_MIN, where the first sleeps would add
# their timer slack to its latency; one still moving after SPIN_MAX is waiting for
# CPU or its node, and spinning longer never pays.
POLL_RATE = 8e9
POLL_MIN = 20e-6
POLL_MAX = 2e-3
POLL_WINDOW = 8
SPIN_MIN = 200e-6
SPIN_MAX = 300e-6


def next_nap(nap: float, left: int, landed: bool) -> float:
    """The sleep before the next poll of a batch with `left` bytes still moving, after a
    sleep of `nap` (0: none yet) and a poll that saw a piece end (`landed`) or not.

    A batch that is not over by the time its bytes should have taken is waiting for CPU
    or for its node, and polling it as often again costs the caller's CPU for nothing:
    each poll that finds nothing landed doubles the sleep. One that lands pieces is
    moving, and is polled at the pace of what is left."""
    sized = left / POLL_RATE
    if nap and not landed:
        sized = max(sized, 2 * nap)
    return min(POLL_MAX, max(POLL_MIN, sized))


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
        x.ok = matches(x.view, x.checksum)


