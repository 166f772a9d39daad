"""The common single read, in straight-line code: why it stands apart from the flows.

A single get of an object this client wrote or read lately, on a store node that
answered lately, is an early read (early.py, placements.py): the bytes move while
GetReplicas is asked. Run through the flow machinery (steps, tickets, plans, a generator
per level, the driver's dispatch on each step) the same read costs the caller tens of
µs more of Python, most of it on the critical path; the figures are in
docs/client-internals.md. So this one operation is written as its own small driver,
with the I/O in line: it speaks to the control channel and the engine directly, where
a flow would yield steps. It shares the flows' vocabulary otherwise: the state, its
clock and placements, the data path's view of which nodes answer
(`DataPath.answering`, `saw_answer`/`saw_failure`), and early.py's `confirmed`.

`read_one` does just that read: start the transfer (or copy, same-host), ask, wait,
confirm the placement, verify the checksum. Anything out of the ordinary ends it with
SLOW, after the transfer it started is over, and the caller then runs the full flow,
which owns every other case: a placement unknown or too old, a node that did not answer
lately, a failed transfer or call, a reply from another leader or with an error, an
object moved, evicted or coming back from SSD, a bad checksum. So do objects over
SYNC_MAX: their transfer is too long to wait for spinning, which on a small host takes
the CPU the engine's threads need (the flow polls in pieces and sleeps in between). A
miss (the master holds no such key) is final here as there. Both clients take this
path: `_read` is the read without its one wait, `read_one` waits spinning (below),
`read_one_async` on the event loop.

No lease. The question is GetReplicas with `unpinned`: the master pins nothing and
grants nothing, so there is no lease to give back (a release frame less per get for the
client to send and the master to run, and no lease to grant). The read needs no pin: it
started before the question, the answer confirms that the object sat unchanged at the
placement read from until the master answered, and the bytes are kept only if they
match its checksum. So what was read is the object's value at the answer, whatever
happened to the range afterwards; an object evicted, removed or rewritten while its
bytes were still moving fails the checksum (XXH3-64: a torn read passes it by chance
once in 2^64) and goes to the flow, which reads under a lease. A master too old to know
`unpinned` grants a lease anyway: it is released as before.

Waiting. On a VM a thread asleep in recv costs a wake-up of tens of µs when the reply
comes, and its vCPU, idle meanwhile, may have been halted. The transfer is awaited
spinning anyway, so the spin watches both: the engine's status and whether the reply
has arrived (`ready`, a zero-timeout poll). The reply is read as soon as it is there,
without a sleep; only a master slower than SPIN_AFTER past the landed transfer is
waited for asleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final

from kvstore.checksum import matches
from kvstore.errors import Code, KVStoreError, check_key
from kvstore.rpc.columns import READS as COLUMNS
from kvstore.rpc.columns import read_items
from kvstore.v1 import master_pb2 as pb
from kvstore_client import datapath
from kvstore_client.buffers import DEVICE_MEMORY, Dest
from kvstore_client.control import Retry
from kvstore_client.early import confirmed
from kvstore_client.state import ClientState


class Slow:
    """The full flow must handle this read."""

    def __repr__(self) -> str:
        return "SLOW"


SLOW: Final = Slow()

# How long the spin goes on watching for the reply after the transfer landed, before
# the reply is waited for asleep: a master that takes longer is busy, and spinning would
# take CPU from it on a small host.
SPIN_AFTER: Final = 0.0005


def read_one(st: ClientState, control: Any, key: bytes, dest: Dest | None,
             timeout: float, shard: int = 0) -> memoryview | Slow | None:
    """Read `key` early into `dest` (the staging buffer when None): the view holding the
    verified object, None for a miss, or SLOW (nothing decided; see the module doc).
    Raises only what the full flow would raise first (an invalid key). The blocking
    driver of `_read`: the reply is awaited spinning (`_await`). `control` is the
    channel to the leader of the key's shard, `shard`."""
    read = _read(st, control, key, dest, timeout, shard)
    try:
        wait = next(read)
        landed = wait.landed if wait.tid == 0 else _await(st, control, wait.asked, wait.tid,
                                                          wait.target, wait.size)
        try:
            reply = control.answer(wait.asked, "GetReplicas")
        except (Retry, KVStoreError):
            reply = None  # the flow calls again
        read.send((reply, landed))
    except StopIteration as done:
        return done.value
    raise AssertionError("_read waits once")


async def read_one_async(st: ClientState, control: Any, key: bytes, dest: Dest | None,
                         timeout: float, shard: int = 0) -> memoryview | Slow | None:
    """`read_one` for an asyncio control channel: the reply is awaited on the loop, then
    the transfer (started before the ask, so usually landed by then) is looked at, and
    waited for in a worker thread if it still moves."""
    read = _read(st, control, key, dest, timeout, shard)
    try:
        wait = next(read)
        try:
            reply = await control.answer(wait.asked, "GetReplicas")
        except (Retry, KVStoreError):
            reply = None
        landed = wait.landed
        if wait.tid:
            landed = _polled(st, wait.tid, wait.target)
            if landed is None:
                landed = await asyncio.to_thread(_landed, st, wait.tid, wait.target,
                                                 wait.size)
        read.send((reply, landed))
    except StopIteration as done:
        return done.value
    raise AssertionError("_read waits once")


@dataclass(slots=True)
class _Wait:
    """What `_read` waits for: the reply to `asked`, and the engine transfer `tid` (0: a
    same-host copy, already `landed`)."""

    asked: Any
    tid: int
    target: tuple[str, str]
    size: int
    landed: bool | None


def _read(st: ClientState, control: Any, key: bytes, dest: Dest | None,  # noqa: C901 (hand-inlined on purpose: see the module doc)
          timeout: float, shard: int = 0,
          ) -> Generator[_Wait, tuple[Any, bool | None], memoryview | Slow | None]:
    """`read_one` without its one wait, which it yields: it is sent the reply (None if
    the call failed) and whether the transfer landed (None: still moving)."""
    if type(key) is not bytes:
        return SLOW  # the flow converts bytearray and memoryview keys
    check_key(key)
    seen = st.placements.recall_one(key)
    if seen is None:
        return SLOW
    size = seen.size
    if size > datapath.SYNC_MAX:
        return SLOW  # a long transfer: the flow polls it in pieces, sleeping in between
    target = (seen.segment, seen.node_id)
    if not st.answering((target,)):
        return SLOW
    local = None
    if st.is_local(target):
        local = st.local.get(*target)
        if local is None or not local.contains(seen.addr, size):
            return SLOW  # unmapped or remounted since: the flow finds out which
    if dest is None:
        staging = st.staging
        if size > staging.size:
            return SLOW
        dest = Dest(staging.addr, staging.view)
    elif size > dest.view.nbytes:
        return SLOW
    elif local is not None and DEVICE_MEMORY.covers(dest.addr, size):
        return SLOW  # GPU memory: the engine moves it, never a CPU copy
    view = dest.view[:size]
    sent = st.now()
    tid = 0
    if local is None:
        try:
            tid = st.transfer.start(seen.segment, dest.addr, seen.addr, size, False)
        except KVStoreError:
            return SLOW
    request = pb.GetReplicasRequest(keys=[key], holder=st.writer_id, unpinned=True, columns=True,
                                    columns_version=COLUMNS)
    reply: Any = None
    landed: bool | None = None
    try:
        asked = control.ask("GetReplicas", request, timeout)
    except (Retry, KVStoreError):
        pass  # the flow calls again, and retries or reports
    else:
        if local is not None:
            # Same-host: the copy runs in this thread, so it goes while the master works.
            local.read(dest.addr, seen.addr, size)
            st.stats.local_transfers += 1
            landed = True
        reply, landed = yield _Wait(asked, tid, target, size, landed)
    if landed is None and tid:
        # The ask failed while the bytes moved: wait them out, so that none land in
        # `dest` after the flow took it over. A same-host read started no engine
        # transfer (and its copy never ran): there is no id to poll, and the engine
        # takes any id it is given for the address of a batch (see Transfer.status).
        landed = _landed(st, tid, target, size)
    if reply is None or reply.error.code or not st.current(reply, shard):
        return SLOW
    lease_id = reply.lease_id  # 0 but from a master that does not know `unpinned`
    try:
        items = read_items(reply)
        if len(items) != 1:
            return SLOW
        item = items[0]
        if item.code == Code.NOT_FOUND:
            st.placements.forget(key)
            st.stats.gets += 1
            return None
        if (item.code != Code.OK or not item.locations or not landed
                or (lease_id and st.now() > sent + reply.ttl_remaining)
                or not confirmed(seen, reply.epoch, item) or not matches(view, seen.checksum)):
            return SLOW
        stats = st.stats
        stats.gets += 1
        stats.hits += 1
        stats.bytes_read += size
        stats.early_reads += 1
        placements = st.placements
        if seen.at < st.now() - placements.max_age / 2:
            placements.learn_item(key, reply.epoch, item)  # as the flow would: refresh it
        return view
    finally:
        if lease_id:
            control.release(lease_id, timeout)


def _await(st: ClientState, control: Any, asked: Any, tid: int, target: tuple[str, str],
           size: int) -> bool | None:
    """Spin on the engine transfer and on the reply to `asked` (see the module doc) until
    the reply is there, or the transfer is over and SPIN_AFTER has passed since. Whether
    the transfer landed; None while it is still moving (then `_landed` waits for it)."""
    ready = control.ready
    monotonic = st.now
    deadline = _deadline(st, size)
    landed: bool | None = None
    give_up = 0.0
    while True:
        if landed is None:
            landed = _polled(st, tid, target)
            if landed is not None:
                give_up = monotonic() + SPIN_AFTER
        if ready(asked):
            return landed
        now = monotonic()
        if landed is not None and now > give_up:
            return landed
        if now > deadline:
            if landed is None:
                st.saw_failure(target)  # as _landed would: the node ran out the timeout
            return False if landed is None else landed


def _landed(st: ClientState, tid: int, target: tuple[str, str], size: int) -> bool:
    """Wait for one engine transfer, spinning (it is short, and was started before the
    ask); whether it landed. A node that failed it or ran out the client's timeout is no
    longer taken as answering, as in the flow."""
    deadline = _deadline(st, size)
    while True:
        landed = _polled(st, tid, target)
        if landed is not None:
            return landed
        if st.now() > deadline:
            st.saw_failure(target)
            return False


def _polled(st: ClientState, tid: int, target: tuple[str, str]) -> bool | None:
    """One look at an engine transfer: True landed, False failed (either recorded against
    the node, as in the flow), None still moving."""
    s = st.transfer.status(tid)
    if s == 1:
        st.saw_answer(target)
        return True
    if s < 0:
        st.saw_failure(target)
        return False
    return None


def _deadline(st: ClientState, size: int) -> float:
    """When a wait for one transfer of `size` bytes started now gives up."""
    return st.now() + st.transfer.batch_timeout + size * 1e-9
