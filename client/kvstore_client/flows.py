"""What the client does, free of I/O: every operation is a generator of steps.

Each operation (put, get, lookup, ...) is written once, as a generator that yields
`Rpc` (a control call to the master), `Move` (a batch of data transfers) or `Release`
(a lease release nobody waits for), and receives each step's result. The synchronous
client and the asyncio client are thin drivers that run these steps their own way, so
both behave identically by construction (the idea of h11's sans-I/O state machine).

A put is two-phase: PutStart (the master allocates space), one transfer batch per
store node, PutEnd (the objects become visible) or PutRevoke. A get is GetReplicas
(which pins the objects under a short lease so nothing evicts them mid-read), one batch
of reads per store node into registered memory, a checksum check of every object, and a
release. A read whose lease ran out before the bytes arrived is not trusted.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import Generator, Sequence
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
    check_key,
    error_for,
)
from kvstore.transfer import Transfer
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore_client.local import LocalSegments
from kvstore_client.staging import Staging

T = TypeVar("T")

# How long a put keeps asking while the master makes room (BUSY) before giving up.
BUSY_BUDGET = 5.0

# A store node as a transfer target: (Transfer Engine segment name, node id).
Target = tuple[str, str]
# One transfer: (local address, remote address, length).
Plan = dict[Target, list[tuple[int, int, int]]]


@dataclass(slots=True)
class Rpc:
    method: str
    request: Any


@dataclass(slots=True)
class Move:
    plan: Plan
    write: bool


@dataclass(slots=True)
class Release:
    lease_id: int


@dataclass(slots=True)
class Wait:
    seconds: float


Step = Rpc | Move | Release | Wait
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
                 writer_id: str, replicas: int) -> None:
        self.transfer = transfer
        self.staging = staging
        self.local = local
        self.writer_id = writer_id
        self.replicas = replicas
        self.stats = ClientStats()
        self.regions: list[tuple[int, int]] = []

    @classmethod
    def build(cls, etcd: str | None, layout: Layout, buffer_size: int, host: str, protocol: str,
              device: str, same_host: bool, replicas: int,
              timeout: float | None = None) -> ClientState:
        """A client's data side: its Transfer Engine, staging buffer and local maps.
        `timeout` bounds each transfer batch (a peer that stopped answering)."""
        transfer = Transfer(host, protocol, device, timeout=timeout)
        return cls(transfer, Staging(transfer, buffer_size),
                   LocalSegments(etcd, layout, enabled=same_host), uuid.uuid4().hex, replicas)

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
        addr, nbytes = buffer_address(buffer)
        if not any(lo <= addr and addr + nbytes <= hi for lo, hi in self.regions):
            raise InvalidArgument("buffer is not inside registered memory; call "
                                  "client.register(buffer or the tensor it is a slice of) first")
        return Dest(addr, byte_view(buffer))

    # -- the one blocking step -----------------------------------------------------------

    def run_transfers(self, plan: Plan, write: bool) -> dict[Target, KVStoreError]:
        """Move every (local, remote, n) of the plan; per target node, the failure."""
        failed: dict[Target, KVStoreError] = {}
        for target, items in plan.items():
            local = self.local.get(*target)
            if local is not None and all(local.contains(r, n) for _, r, n in items):
                for a, r, n in items:
                    if write:
                        local.write(r, a, n)
                    else:
                        local.read(a, r, n)
                self.stats.local_transfers += len(items)
                continue
            op = self.transfer.write if write else self.transfer.read
            try:
                op(target[0], [a for a, _, _ in items], [r for _, r, _ in items],
                   [n for _, _, n in items])
            except KVStoreError as exc:
                failed[target] = exc
        return failed

    def close(self) -> None:
        self.local.close()
        self.staging.close()
        self.transfer.close()


# -- flows --------------------------------------------------------------------------------


def exists(keys: Sequence[bytes]) -> Flow[list[bool]]:
    checked = checked_keys(keys)
    if not checked:
        return []
    reply = yield Rpc("Exists", pb.KeysRequest(keys=checked))
    return list(reply.exists)


def remove_many(keys: Sequence[bytes], force: bool) -> Flow[list[Code]]:
    reply = yield Rpc("Remove", pb.RemoveRequest(keys=checked_keys(keys), force=force))
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
    # Batches larger than the staging buffer go in slices that fit.
    for lo, hi in st.staging.slices([v.nbytes for v in views]):
        offsets = st.staging.layout([v.nbytes for v in views[lo:hi]])
        srcs = []
        for off, view in zip(offsets, views[lo:hi], strict=True):
            st.staging.view[off:off + view.nbytes] = view
            srcs.append(Dest(st.staging.addr + off, st.staging.view[off:off + view.nbytes]))
        part = yield from _put(st, checked[lo:hi], srcs)
        results[lo:hi] = part
    return results


def put_from(st: ClientState, keys: Sequence[bytes],
             buffers: Sequence[Any]) -> Flow[list[KVStoreError | None]]:
    checked = checked_keys(keys)
    if len(checked) != len(buffers):
        raise InvalidArgument(f"put_from got {len(checked)} keys but {len(buffers)} buffers")
    srcs = [st.dest(b) for b in buffers]
    return (yield from _put(st, checked, srcs))


def _put(st: ClientState, keys: list[bytes], srcs: list[Dest]) -> Flow[list[KVStoreError | None]]:
    results: list[KVStoreError | None] = [None] * len(keys)
    sizes = [d.view.nbytes for d in srcs]
    sums = [checksum(d.view) for d in srcs]
    reply = yield Rpc("PutStart", pb.PutStartRequest(
        keys=keys, sizes=sizes, checksums=sums, replicas=st.replicas, writer=st.writer_id))
    items = list(reply.items)
    # BUSY: the master is demoting objects to SSD to make room; ask again shortly.
    budget = time.monotonic() + BUSY_BUDGET
    delay = 0.005
    busy = [i for i, item in enumerate(items) if item.code == Code.BUSY]
    while busy and time.monotonic() < budget:
        yield Wait(delay)
        delay = min(delay * 2, 0.1)
        again = yield Rpc("PutStart", pb.PutStartRequest(
            keys=[keys[i] for i in busy], sizes=[sizes[i] for i in busy],
            checksums=[sums[i] for i in busy], replicas=st.replicas, writer=st.writer_id))
        for i, item in zip(busy, again.items, strict=True):
            items[i] = item
        busy = [i for i in busy if items[i].code == Code.BUSY]
    plan: Plan = defaultdict(list)
    started: list[int] = []
    for i, item in enumerate(items):
        if item.code == Code.ALREADY_EXISTS:
            continue
        if item.code != Code.OK:
            results[i] = error_for(item.code, item.message, key=keys[i])
            continue
        started.append(i)
        for loc in item.locations:
            plan[(loc.segment, loc.node_id)].append((srcs[i].addr, loc.addr, loc.size))
    failed: dict[Target, KVStoreError] = (yield Move(plan, write=True)) if plan else {}
    commit: list[int] = []
    revoke: list[int] = []
    for i in started:
        bad = [failed[t] for loc in items[i].locations
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
        for i, code in zip(commit, end.codes, strict=True):
            if code not in (Code.OK, Code.ALREADY_EXISTS):
                results[i] = error_for(code, "the write was not committed (it timed out at the "
                                       "master or its node was lost); put it again", key=keys[i])
            else:
                st.stats.puts += 1
                st.stats.bytes_written += srcs[i].view.nbytes
    return results


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
    reply = yield Rpc("GetReplicas", pb.GetReplicasRequest(keys=asked, holder=st.writer_id))
    deadline = sent + reply.ttl_remaining
    items = yield from _settle(asked, list(reply.items), reply.lease_id, deadline)
    found = [(i, item) for i, item in zip(todo, items, strict=True)
             if item.code == Code.OK and item.locations]
    retry: list[int] = []
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
    finally:
        if reply.lease_id:
            yield Release(reply.lease_id)
    st.stats.gets += len(todo)
    return retry


def get_into(st: ClientState, keys: Sequence[bytes], buffers: Sequence[Any],
             lease: Lease | None) -> Flow[list[KVStoreError | None]]:
    checked = checked_keys(keys)
    if len(checked) != len(buffers):
        raise InvalidArgument(f"get_into got {len(checked)} keys but {len(buffers)} buffers")
    dests = [st.dest(b) for b in buffers]
    out: list[KVStoreError | None] = [None] * len(checked)
    sent = time.monotonic()
    reply = yield Rpc("GetReplicas", pb.GetReplicasRequest(
        keys=checked, lease_id=lease.id if lease else 0, holder=st.writer_id))
    deadline = lease.expires_at if lease else sent + reply.ttl_remaining
    try:
        items = yield from _settle(checked, list(reply.items), reply.lease_id, deadline)
        found: list[tuple[int, pb.ReadItem]] = []
        for i, item in enumerate(items):
            if item.code != Code.OK or not item.locations:
                missing = item.code in (Code.OK, Code.NOT_FOUND)
                out[i] = error_for(item.code or Code.NOT_FOUND,
                                   "not in the store" if missing else "not pinned by this lease",
                                   key=checked[i])
            elif item.size > dests[i].view.nbytes:
                out[i] = InvalidArgument(f"buffer of {dests[i].view.nbytes} bytes is smaller "
                                         f"than the object ({item.size} bytes)", key=checked[i])
            else:
                found.append((i, item))
        errs = yield from _read_into(st, checked, found, [dests[i] for i, _ in found])
        for (i, _), err in zip(found, errs, strict=True):
            out[i] = err
        if time.monotonic() > deadline:
            raise LeaseExpired("the read lease expired before the transfer finished; "
                               "the bytes are not trusted (look the keys up again)")
    finally:
        if reply.lease_id and lease is None:
            yield Release(reply.lease_id)
    st.stats.gets += len(checked)
    return out


def _read_into(st: ClientState, keys: list[bytes], part: list[tuple[int, pb.ReadItem]],
               dests: list[Dest]) -> Flow[list[KVStoreError | None]]:
    """Read each object of `part` into its dest and verify it; per object the error.

    Replica r of each object is tried in round r; most reads finish in round 0.
    """
    errs: list[KVStoreError | None] = [None] * len(part)
    remaining = list(range(len(part)))
    rounds = max((len(item.locations) for _, item in part), default=0)
    for rnd in range(rounds):
        plan: Plan = defaultdict(list)
        which: dict[Target, list[int]] = defaultdict(list)
        for j in remaining:
            item = part[j][1]
            if rnd < len(item.locations):
                loc: cpb.Location = item.locations[rnd]
                plan[(loc.segment, loc.node_id)].append((dests[j].addr, loc.addr, item.size))
                which[(loc.segment, loc.node_id)].append(j)
        failed: dict[Target, KVStoreError] = yield Move(plan, write=False)
        still: list[int] = []
        for target, js in which.items():
            for j in js:
                i, item = part[j]
                if target in failed:
                    errs[j] = failed[target]
                    still.append(j)
                elif checksum(dests[j].view[:item.size]) != item.checksum:
                    st.stats.corrupt_reads += 1
                    st.local.forget(*target)
                    errs[j] = CorruptObject(f"object read from {target[0]} does not match its "
                                            "checksum; it is treated as missing", key=keys[i])
                    still.append(j)
                else:
                    errs[j] = None
                    st.stats.hits += 1
                    st.stats.bytes_read += item.size
        remaining = still
        if not remaining:
            break
    for j in remaining:
        err = errs[j]
        if err is not None:
            name = type(err).__name__
            st.stats.errors[name] = st.stats.errors.get(name, 0) + 1
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
    arr = np.frombuffer(byte_view(buffer), dtype=np.uint8)
    return int(arr.ctypes.data), int(arr.nbytes)


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
