"""The common single read, in straight-line code.

A single get of an object this client wrote or read lately, on a store node that
answered lately, is an early read (see placements.py): the bytes move while GetReplicas
is asked. Run through the flow machinery (flows.py: steps, tickets, plans, a generator
per level) the same read costs the caller ~60 µs more of Python, most of it on the
critical path: on 2 vCPUs, single 64 KiB gets over the engine took 202-337 µs p50 that
way and 147-283 µs this way (2 clusters, 12 rounds of 400 each way, alternating; lower
in every pair of rounds).

So `read_one` does just that read: start the transfer (or copy, same-host), ask, wait,
confirm the placement, verify the checksum, release the lease. Anything out of the
ordinary ends it with SLOW, after the transfer it started is over and its lease given
back, and the caller then runs the full flow, which owns every other case: a placement
unknown or too old, a node that did not answer lately, a failed transfer or call, a
reply from another leader or with an error, an object moved, evicted or coming back
from SSD, a bad checksum, a lease that lapsed. So do objects over SYNC_MAX: their
transfer is too long to wait for spinning, which on a small host takes the CPU the
engine's threads need (1 MiB gets over the engine: 968-1507 µs p50 spinning, 540-751 µs
through the flow, which polls in pieces and sleeps in between). A miss (the master
holds no such key) is final here as there. Only the sync client takes this path; the
async one always runs the flow (its event loop, not the flow, is what a call costs
there).
"""

from __future__ import annotations

import time
from typing import Any, Final

from kvstore.checksum import checksum
from kvstore.errors import Code, KVStoreError, check_key
from kvstore.v1 import master_pb2 as pb
from kvstore_client import flows
from kvstore_client.control import Retry
from kvstore_client.flows import ClientState, Dest, confirmed


class Slow:
    """The full flow must handle this read."""

    def __repr__(self) -> str:
        return "SLOW"


SLOW: Final = Slow()


def read_one(st: ClientState, control: Any, key: bytes, dest: Dest | None,
             timeout: float) -> memoryview | Slow | None:
    """Read `key` early into `dest` (the staging buffer when None): the view holding the
    verified object, None for a miss, or SLOW (nothing decided; see the module doc).
    Raises only what the full flow would raise first (an invalid key)."""
    if type(key) is not bytes:
        return SLOW  # the flow converts bytearray and memoryview keys
    check_key(key)
    seen = st.placements.recall_one(key)
    if seen is None:
        return SLOW
    size = seen.size
    if size > flows.SYNC_MAX:
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
    view = dest.view[:size]
    sent = time.monotonic()
    tid = 0
    if local is None:
        try:
            tid = st.transfer.start(seen.segment, dest.addr, seen.addr, size, False)
        except KVStoreError:
            return SLOW
    request = pb.GetReplicasRequest(keys=[key], holder=st.writer_id)
    reply: Any = None
    try:
        asked = control.ask("GetReplicas", request, timeout)
        if local is not None:
            # Same-host: the copy runs in this thread, so it goes while the master works.
            local.read(dest.addr, seen.addr, size)
            st.stats.local_transfers += 1
        reply = control.answer(asked, "GetReplicas")
    except (Retry, KVStoreError):
        pass  # the flow calls again, and retries or reports
    landed = True if local is not None else _landed(st, tid, target, size)
    if reply is None or reply.error.code or not st.current(reply):
        return SLOW
    lease_id = reply.lease_id
    try:
        if len(reply.items) != 1:
            return SLOW
        item = reply.items[0]
        if item.code == Code.NOT_FOUND:
            st.placements.forget(key)
            st.stats.gets += 1
            return None
        if (item.code != Code.OK or not item.locations or not landed
                or time.monotonic() > sent + reply.ttl_remaining
                or not confirmed(seen, reply.epoch, item) or checksum(view) != seen.checksum):
            return SLOW
        stats = st.stats
        stats.gets += 1
        stats.hits += 1
        stats.bytes_read += size
        stats.early_reads += 1
        placements = st.placements
        if seen.at < time.monotonic() - placements.max_age / 2:
            placements.learn_item(key, reply.epoch, item)  # as the flow would: refresh it
        return view
    finally:
        if lease_id:
            control.release(lease_id, timeout)


def _landed(st: ClientState, tid: int, target: tuple[str, str], size: int) -> bool:
    """Wait for one engine transfer, spinning (it is short, and was started before the
    ask); whether it landed. A node that failed it or ran out the client's timeout is no
    longer taken as answering, as in the flow."""
    status = st.transfer.status
    deadline = time.monotonic() + st.transfer.batch_timeout + size * 1e-9
    while True:
        s = status(tid)
        if s == 1:
            st.saw_answer(target)
            return True
        if s < 0 or time.monotonic() > deadline:
            st.saw_failure(target)
            return False
