"""What the client does, free of I/O: every operation is a generator of steps.

Each operation (put, get, lookup, ...) is written once, as a flow (steps.py) that
yields control calls and transfers and receives their results; the synchronous client
(client.py) and the asyncio client (aio.py) are thin drivers that run those steps their
own way, so both behave identically by construction (the idea of h11's sans-I/O state
machine). A flow's one argument is the client's state (state.py), and its time is the
state's clock (clock.py): it never reads `time` and never sleeps (it yields `Wait`).

This module is the flows' public face and holds the control-only ones; the rest live
by what they hold:

- puts.py: put_many, put_from (PutStart/transfer/PutEnd, or space started ahead and one
  PutCommit, see reservations.py);
- gets.py: get_many, get_into (GetReplicas under a short lease, reads, checksums,
  release), on early.py, which asks and reads known objects meanwhile (placements.py);
- datapath.py: the transfers behind the Start/Finish/Move steps, which the drivers run;
- buffers.py: what a caller's buffers and keys become before any step is yielded.

The quick single get (quick.py) stands apart on purpose; its module says why.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import Code, InvalidArgument
from kvstore.v1 import master_pb2 as pb
from kvstore_client.buffers import checked_keys
from kvstore_client.gets import get_into, get_many
from kvstore_client.puts import put_from, put_many
from kvstore_client.state import ClientState, Lease
from kvstore_client.steps import (
    Answer,
    Ask,
    Finish,
    Flow,
    Later,
    Move,
    Release,
    Rpc,
    Settle,
    Start,
    Step,
    Wait,
)

__all__ = [
    "Answer",
    "Ask",
    "Finish",
    "Flow",
    "Later",
    "Move",
    "Release",
    "Rpc",
    "Settle",
    "Start",
    "Step",
    "Wait",
    "exists",
    "get_into",
    "get_many",
    "lookup",
    "put_from",
    "put_many",
    "release",
    "remove_many",
    "renew",
]


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
    sent = st.now()
    reply = yield Rpc("Lookup", pb.LookupRequest(keys=checked, lease_ttl=ttl or 0.0,
                                                 holder=st.writer_id))
    return st.lease(reply.lease_id, checked[:reply.count], sent + reply.ttl_remaining)


def renew(st: ClientState, lease: Lease, ttl: float | None) -> Flow[None]:
    if lease.id:
        sent = st.now()
        reply = yield Rpc("RenewLease", pb.RenewLeaseRequest(lease_id=lease.id, ttl=ttl or 0.0))
        lease.expires_at = sent + reply.ttl_remaining


def release(lease: Lease, keep_first: int | None, ordered: bool = True) -> Flow[None]:
    """With `ordered` (a channel that runs one connection's frames in order: the fast
    channel), a one-way frame: every later call of this client is handled after it, so
    waiting for its reply would only add a round trip. Otherwise a call, waited for."""
    if not lease.id:
        return
    if keep_first is not None and keep_first < 0:
        raise InvalidArgument(f"keep_first must be >= 0, got {keep_first}")
    if ordered:
        # keep_first 0 releases the whole lease: the client forgets its id either way.
        yield Release(lease.id, keep_first=keep_first or 0)
    else:
        req = pb.ReleaseLeaseRequest(lease_id=lease.id)
        if keep_first is not None:
            req.keep_first_n = keep_first
        yield Rpc("ReleaseLease", req)
    if keep_first is None or keep_first == 0:
        lease.id = 0  # its keys stay readable: what it pinned
    else:
        lease.keys = lease.keys[:keep_first]
