"""The flows of a client of several master shards: routing, fan-out and merge.

In a cluster of N master shards (docs/scaling.md, "The client: routing, fan-out and
merge") each key belongs to shard `shard_of(key, N)`, and only that shard's leader
knows it. A batch is split by shard, each part in the batch's key order; each part runs
the flow a client of one shard runs (flows.py, puts.py, gets.py), every control step of
it tagged with its shard (steps.py), and the parts run side by side (`fan_out`): every
part's request is sent before any reply is read, and a part that waits for its bytes
lets the others go on. The answers are merged back into the batch's key order; the call
ends with its slowest part.

A tenant's keys are stored as `tenant/key`, and a node lists its SSD objects to the
shard of that stored key (a new leader adopts them by it): so every split here routes
`ClientState.key_prefix` and the key, as the masters' shard check does.

A part that fails (its shard's leader down past the client's timeout, say) fails only
its own keys, as a lost store node fails only its replicas: a per-key error for a put or
a get, a miss for a lookup or `exists`. When every part fails, the call raises the first
part's error, as the call to a single master would.

A lookup's prefix spans shards ("A lookup's contiguous prefix across shards"): each
shard answers the present prefix of its own part, which ends at a position of the batch;
the batch's prefix ends at the first of them. A shard that pinned keys past that is
trimmed to the keys before it (ReleaseLease's keep_first_n, one-way) before the hit is
reported, and the Lease holds each shard's own lease (`Lease.parts`).

With one shard none of this runs: the session calls flows.py directly.

Space started ahead for one-call puts (reservations.py) is kept per shard: a
placeholder and the key it becomes must be one shard's, so each shard has its own pool,
whose placeholders are named to route to it (`reservations.names`). Each part of a put
runs the one-shard put flow with its shard's pool: one PutCommit to its shard when the
pool holds a placeholder for each of its values, else PutStart and PutEnd there, as a
client of one shard does; the refill asked after it (a `Later` step) goes to the same
shard. A Later call is in flight per shard (session.py): a part's refill does not wait
for another shard's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kvstore.errors import Code, InvalidArgument, KVStoreError, LeaseNotFound, error_for
from kvstore.shards import positions_by_shard
from kvstore.v1 import master_pb2 as pb
from kvstore_client import flows, gets, puts
from kvstore_client.buffers import checked_keys
from kvstore_client.state import ClientState, Lease, LeasePart
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
    Step,
    Wait,
)

T = TypeVar("T")
V = TypeVar("V")

# The steps a part waits on: `fan_out` runs the others' meanwhile.
_WAITS = (Answer, Finish, Move, Wait, Settle)

LIST_DEFAULT = 100  # keys a ListKeys lists when its request names no limit (the master's)

Parts = list[tuple[int, list[int]]]  # (shard, the positions of its keys in the batch)


def split(keys: Sequence[bytes], shards: int, prefix: bytes = b"") -> Parts:
    """The shards a batch touches, each with its keys' positions, in the batch's order.
    A key's shard is that of the key the masters store: `prefix` (the client's tenant's,
    `ClientState.key_prefix`) and the key."""
    routed = [prefix + k for k in keys] if prefix else keys
    return [(k, pos) for k, pos in enumerate(positions_by_shard(routed, shards)) if pos]


def fan_out(parts: list[tuple[int, Flow[Any]]]) -> Flow[list[Any]]:
    """Run each (shard, flow) side by side, the flow's control steps sent to its shard;
    per part, what its flow returned or the KVStoreError that ended it.

    A part runs until it waits (an Rpc is sent as an Ask and waited for as its Answer,
    so that every part's request is out before any reply is read); then the waiting
    parts are taken in turn: each one's wait is done and the part runs to its next."""
    out: list[Any] = [None] * len(parts)
    waiting: dict[int, Step] = {}
    for j, (shard, flow) in enumerate(parts):
        step = yield from _advance(flow, shard, j, out, None, None)
        if step is not None:
            waiting[j] = step
    while waiting:
        for j in list(waiting):
            step = waiting.pop(j)
            value: Any = None
            error: KVStoreError | None = None
            try:
                value = yield step
            except KVStoreError as exc:
                error = exc
            shard, flow = parts[j]
            nxt = yield from _advance(flow, shard, j, out, value, error)
            if nxt is not None:
                waiting[j] = nxt
    return out


def _advance(flow: Flow[Any], shard: int, j: int, out: list[Any], value: Any,
             error: KVStoreError | None) -> Flow[Step | None]:
    """Resume part j with `value` (or `error`) and run it until it waits: the step it
    waits on, or None once it has ended (its result, or its error, in out[j])."""
    while True:
        try:
            step = flow.throw(error) if error is not None else flow.send(value)
        except StopIteration as done:
            out[j] = done.value
            return None
        except KVStoreError as exc:
            out[j] = exc
            return None
        value, error = None, None
        if isinstance(step, Rpc):
            try:
                asked = yield Ask(step.method, step.request, shard)
            except KVStoreError as exc:
                error = exc
                continue
            return Answer(asked)
        if isinstance(step, Ask | Later | Release):
            step.shard = shard
        elif isinstance(step, _WAITS):
            return step
        try:
            value = yield step
        except KVStoreError as exc:
            error = exc


def merge(n: int, parts: Parts, got: list[Any],
          failed: Callable[[KVStoreError, int], V]) -> list[Any]:
    """The parts' per-key answers in the batch's order (n keys); a failed part's keys
    get `failed(error, position)`. Raises the first part's error when every part failed."""
    errors = [g for g in got if isinstance(g, KVStoreError)]
    if errors and len(errors) == len(got):
        raise errors[0]
    out: list[Any] = [None] * n
    for (_, pos), g in zip(parts, got, strict=True):
        if isinstance(g, KVStoreError):
            for i in pos:
                out[i] = failed(g, i)
        else:
            for i, v in zip(pos, g, strict=True):
                out[i] = v
    return out


def _per_key(keys: list[bytes]) -> Callable[[KVStoreError, int], KVStoreError]:
    def failed(err: KVStoreError, i: int) -> KVStoreError:
        return error_for(err.code, err.message, key=keys[i])
    return failed


def _pick(items: Sequence[T], pos: list[int]) -> list[T]:
    return [items[i] for i in pos]


# -- the flows ---------------------------------------------------------------------------


def exists(keys: Sequence[bytes], shards: int, prefix: bytes = b"") -> Flow[list[bool]]:
    checked = checked_keys(keys)
    if not checked:
        return []
    parts = split(checked, shards, prefix)
    got = yield from fan_out([(k, flows.exists(_pick(checked, pos))) for k, pos in parts])
    return merge(len(checked), parts, got, lambda _e, _i: False)


def remove_many(st: ClientState, keys: Sequence[bytes], force: bool,
                shards: int) -> Flow[list[Code]]:
    checked = checked_keys(keys)
    parts = split(checked, shards, st.key_prefix)
    got = yield from fan_out([(k, flows.remove_many(st, _pick(checked, pos), force))
                              for k, pos in parts])
    return merge(len(checked), parts, got, lambda e, _i: Code(e.code))


def put_many(st: ClientState, keys: Sequence[bytes], values: Sequence[Any],
             shards: int) -> Flow[list[KVStoreError | None]]:
    checked, views = puts.checked_values(keys, values)
    parts = split(checked, shards, st.key_prefix)
    got = yield from fan_out([
        (k, puts.put_many(st, _pick(checked, pos), _pick(views, pos), st.staging_of(k, shards),
                          k))
        for k, pos in parts])
    return merge(len(checked), parts, got, _per_key(checked))


def put_from(st: ClientState, keys: Sequence[bytes], buffers: Sequence[Any],
             shards: int) -> Flow[list[KVStoreError | None]]:
    checked, srcs = puts.checked_sources(st, keys, buffers)
    parts = split(checked, shards, st.key_prefix)
    got = yield from fan_out([(k, puts.put_sources(st, _pick(checked, pos), _pick(srcs, pos),
                                                   k))
                              for k, pos in parts])
    return merge(len(checked), parts, got, _per_key(checked))


def get_many(st: ClientState, keys: Sequence[bytes],
             shards: int) -> Flow[list[bytes | KVStoreError]]:
    checked = checked_keys(keys)
    parts = split(checked, shards, st.key_prefix)
    got = yield from fan_out([(k, gets.get_many(st, _pick(checked, pos), st.staging_of(k, shards)))
                              for k, pos in parts])
    return merge(len(checked), parts, got, _per_key(checked))


def get_into(st: ClientState, keys: Sequence[bytes], buffers: Sequence[Any],
             lease: Lease | None, shards: int) -> Flow[list[KVStoreError | None]]:
    """Each shard's part read under that shard's part of `lease` (if given): keys of a
    shard the lease holds nothing on are not pinned by it (LeaseNotFound, as a master
    answers for a key its lease does not pin)."""
    checked, dests = gets.checked_dests(st, keys, buffers)
    out: list[KVStoreError | None] = [None] * len(checked)
    parts: Parts = []
    flows_: list[tuple[int, Flow[Any]]] = []
    # A lease this client does not know (made by another process's client, whose id
    # came here alone) cannot be shown to the shards: each part is read under a short
    # lease of its own, as without one.
    held = lease_parts(st, lease) if lease is not None else None
    for k, pos in split(checked, shards, st.key_prefix):
        part_lease = None
        if held is not None:
            part = held.get(k)
            if part is None:
                for i in pos:
                    out[i] = LeaseNotFound("not pinned by this lease", key=checked[i])
                continue
            part_lease = Lease(part.id, [], part.expires_at, _clock=st.clock)
        parts.append((k, pos))
        flows_.append((k, gets.read_into(st, _pick(checked, pos), _pick(dests, pos),
                                         part_lease)))
    if not parts:
        return out
    got = yield from fan_out(flows_)
    merged = merge(len(checked), parts, got, _per_key(checked))
    for _, pos in parts:
        for i in pos:
            out[i] = merged[i]
    return out


def lease_parts(st: ClientState, lease: Lease) -> dict[int, LeasePart] | None:
    """A lease's parts per shard: its own, or those this client holds under its id (a
    Lease rebuilt from the id alone); None if this client does not know it."""
    if lease.parts is not None:
        return lease.parts
    return st.shard_leases.get(lease.id) if lease.id else {}


def lookup(st: ClientState, keys: Sequence[bytes], ttl: float | None,
           shards: int) -> Flow[Lease]:
    """Pin the longest present prefix of `keys` over every shard (see the module doc)."""
    checked = checked_keys(keys)
    parts = split(checked, shards, st.key_prefix)
    sent = st.now()
    if not parts:
        return _lease(st, [], {}, sent)
    asked = []
    for k, pos in parts:
        asked.append((yield Ask("Lookup", pb.LookupRequest(
            keys=_pick(checked, pos), lease_ttl=ttl or 0.0, holder=st.writer_id), k)))
    replies: list[Any] = []
    for a in asked:
        try:
            replies.append((yield Answer(a)))
        except KVStoreError as exc:
            replies.append(exc)
    if all(isinstance(r, KVStoreError) for r in replies):
        raise replies[0]
    prefix = len(checked)
    for (_, pos), r in zip(parts, replies, strict=True):
        count = 0 if isinstance(r, KVStoreError) else r.count
        if count < len(pos):
            prefix = min(prefix, pos[count])  # this shard's first miss (a failed one's first key)
    held: dict[int, LeasePart] = {}
    ends: list[float] = []
    for (k, pos), r in zip(parts, replies, strict=True):
        if isinstance(r, KVStoreError):
            continue
        ends.append(sent + r.ttl_remaining)
        if not r.lease_id:
            continue
        keep = bisect_left(pos, prefix)  # its keys before the batch's first miss
        if not keep:
            yield Release(r.lease_id, k)
            continue
        if keep < r.count:
            yield Release(r.lease_id, k, keep)  # what it pinned past the prefix
        held[k] = LeasePart(r.lease_id, r.epoch, sent + r.ttl_remaining)
    return _lease(st, checked[:prefix], held, min(ends, default=sent))


def _lease(st: ClientState, keys: list[bytes], held: dict[int, LeasePart],
           ends: float) -> Lease:
    lease = st.lease(st.hold_lease(held) if held else 0, keys,
                     min((p.expires_at for p in held.values()), default=ends))
    lease.parts = held
    return lease


def renew(st: ClientState, lease: Lease, ttl: float | None) -> Flow[None]:
    """Renew each shard's part (asked of all, then answered); the first failure is
    raised once every answer is in (the parts renewed keep their new deadlines)."""
    held = lease_parts(st, lease)
    if held is None:
        raise LeaseNotFound("this client holds no such lease: renew it with the client "
                            "that looked its keys up")
    if not lease.id or not held:
        return
    sent = st.now()
    asked = []
    for k, part in held.items():
        asked.append((k, (yield Ask("RenewLease", pb.RenewLeaseRequest(
            lease_id=part.id, ttl=ttl or 0.0), k))))
    first: KVStoreError | None = None
    for k, a in asked:
        try:
            reply = yield Answer(a)
        except KVStoreError as exc:
            first = first or exc
        else:
            held[k] = replace(held[k], expires_at=sent + reply.ttl_remaining)
    lease.parts = held
    lease.expires_at = min(p.expires_at for p in held.values())
    if first is not None:
        raise first


def release(st: ClientState, lease: Lease, keep_first: int | None,
            shards: int, ordered: bool = True) -> Flow[None]:
    """Release each shard's part (one-way where `ordered`, else waited for: as one
    shard's release, flows.release); with `keep_first=n`, each shard keeps its keys
    among the lease's first n. A lease this client does not know is left to expire (its
    id names nothing at any master)."""
    held = lease_parts(st, lease)
    if not lease.id or held is None:
        return
    if keep_first is not None and keep_first < 0:
        raise InvalidArgument(f"keep_first must be >= 0, got {keep_first}")
    keeps = {k: 0 for k in held}
    whole: dict[int, int] = {}
    if keep_first:
        for k, pos in split(lease.keys[:keep_first], shards, st.key_prefix):
            keeps[k] = len(pos)
        whole = {k: len(pos) for k, pos in split(lease.keys, shards, st.key_prefix)}
    asked = []
    for k, part in held.items():
        keep = keeps.get(k, 0)
        if keep and keep >= whole.get(k, 0):
            continue  # it keeps all it pins
        if ordered:
            yield Release(part.id, k, keep)
            continue
        req = pb.ReleaseLeaseRequest(lease_id=part.id)
        if keep:
            req.keep_first_n = keep
        asked.append((yield Ask("ReleaseLease", req, k)))
    first: KVStoreError | None = None
    for a in asked:
        try:
            yield Answer(a)
        except KVStoreError as exc:
            first = first or exc
    kept = {k: p for k, p in held.items() if keeps.get(k)}
    lease.parts = kept
    if keep_first:
        lease.keys = lease.keys[:keep_first]
    if kept:
        st.shard_leases[lease.id] = kept
    else:
        st.shard_leases.pop(lease.id, None)
        lease.id = 0
    if first is not None:
        raise first


def list_keys(request: pb.ListKeysRequest, shards: int) -> Flow[pb.ListKeysResponse]:
    """ListKeys asked of every shard and merged: the first `limit` keys in key order
    (each shard lists its own first ones), truncated if any shard's list was or the
    merge cut it. A shard that fails fails the call: a listing without it would be
    silently short."""
    asked = []
    for k in range(shards):
        asked.append((yield Ask("ListKeys", request, k)))
    objects = []
    truncated = False
    for a in asked:
        reply = yield Answer(a)
        objects += reply.objects
        truncated = truncated or reply.truncated
    objects.sort(key=lambda o: o.key)
    limit = request.limit or LIST_DEFAULT
    merged = pb.ListKeysResponse(truncated=truncated or len(objects) > limit)
    merged.objects.extend(objects[:limit])
    return merged
