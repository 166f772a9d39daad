"""The synchronous client: find the master through etcd, move bytes over the Transfer Engine.

A put is two-phase: PutStart (the master allocates space in store-node segments),
one batched Transfer Engine write per store node, then PutEnd (the object becomes
visible). A get is GetReplicas (which pins the objects under a short lease so nothing
evicts them mid-read), one batched read per store node into a registered staging
buffer, a checksum check of every object, and a lease release that the client does not
wait for. The master never sees object bytes.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
from typing_extensions import Buffer

from kvstore.checksum import checksum
from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
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
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore_client.local import LocalSegments
from kvstore_client.staging import Staging

R = TypeVar("R")

# A store node as a transfer target: (Transfer Engine segment name, node id).
Target = tuple[str, str]

_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


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


class KVStoreClient:
    """Blocking client. Thread-compatible, not thread-safe: use one per thread.

    `KVStoreClient(etcd="127.0.0.1:2379")` finds the leader through etcd;
    `KVStoreClient(master="127.0.0.1:50051")` talks to one master directly.
    """

    def __init__(
        self,
        etcd: str = "127.0.0.1:2379",
        *,
        master: str | None = None,
        cluster: str = "default",
        timeout: float = 10.0,
        replicas: int = 0,
        buffer_size: int = 64 << 20,
        host: str = "127.0.0.1",
        protocol: str = "tcp",
        device: str = "",
        same_host: bool = True,
    ) -> None:
        self.etcd = etcd
        self.timeout = timeout
        self.replicas = replicas
        self._layout = Layout(cluster)
        self._fixed_master = master
        self.writer_id = uuid.uuid4().hex
        self.stats = ClientStats()
        self._channel: grpc.Channel | None = None
        self._stub: pbg.MasterStub | None = None
        self.master_address = ""
        self._connect()
        self._transfer = Transfer(host, protocol, device)
        self._staging = Staging(self._transfer, buffer_size)
        self._regions: list[tuple[int, int]] = []
        # Same-host fast path: segments of local store nodes are mapped and copied with
        # memcpy instead of crossing TCP. Needs etcd (to learn where segments live).
        self._local = LocalSegments(None if master else etcd, self._layout, enabled=same_host)

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if getattr(self, "_local", None) is not None:
            self._local.close()
        if getattr(self, "_staging", None) is not None:
            self._staging.close()
        if getattr(self, "_transfer", None) is not None:
            self._transfer.close()

    def _discover(self) -> str:
        if self._fixed_master:
            return self._fixed_master
        raw = read_key_sync(self.etcd, self._layout.leader, timeout=min(self.timeout, 3.0))
        if raw is None:
            raise Unavailable(
                f"no kvstore master is registered in etcd at {self.etcd}; start one with "
                f"`kvstore master --etcd {self.etcd}` (or `kvstore up` for a dev cluster)"
            )
        return MasterRecord.decode(raw).address

    def _connect(self) -> None:
        address = self._discover()
        if address != self.master_address or self._channel is None:
            if self._channel is not None:
                self._channel.close()
            self._channel = grpc.insecure_channel(address, options=_GRPC_OPTIONS)
            self._stub = pbg.MasterStub(self._channel)
            self.master_address = address

    def _call(self, method: str, request: Any) -> Any:
        """One control round trip; follows the leader once if it moved."""
        deadline = time.monotonic() + self.timeout
        for attempt in range(3):
            assert self._stub is not None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                reply = getattr(self._stub, method)(request, timeout=remaining)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    if attempt < 2 and time.monotonic() < deadline:
                        time.sleep(min(0.2 * (attempt + 1), max(0.0, deadline - time.monotonic())))
                        self._reconnect_quietly()
                        continue
                    raise Unavailable(
                        f"the kvstore master at {self.master_address} did not answer {method} "
                        f"({code.name}); is it running?"
                    ) from exc
                raise Unavailable(f"{method} to {self.master_address} failed: {code.name}") from exc
            if reply.error.code == Code.NOT_LEADER and attempt < 2:
                self.stats.failovers += 1
                self._reconnect_quietly()
                continue
            if reply.error.code:
                raise error_for(reply.error.code, reply.error.message)
            return reply
        raise Unavailable(f"{method} did not complete within {self.timeout:.1f} s")

    def _reconnect_quietly(self) -> None:
        # The next attempt reports the failure.
        with contextlib.suppress(KVStoreError):
            self._connect()

    # -- small calls --------------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        keys = _checked(keys)
        if not keys:
            return []
        return list(self._call("Exists", pb.KeysRequest(keys=keys)).exists)

    def remove(self, key: bytes) -> bool:
        """Remove one object; False if it was not there."""
        code = self.remove_many([key])[0]
        return code == Code.OK

    def remove_many(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        keys = _checked(keys)
        reply = self._call("Remove", pb.RemoveRequest(keys=keys, force=force))
        return [Code(c) for c in reply.codes]

    # -- put ------------------------------------------------------------------------------

    def put(self, key: bytes, value: Buffer) -> None:
        err = self.put_many([key], [value])[0]
        if err is not None:
            raise err

    def put_many(self, keys: Sequence[bytes], values: Sequence[Buffer]) -> list[KVStoreError | None]:
        """Store each value under its key. Per key: None on success, else the error.

        A key that is already stored counts as success (content addressing: same key,
        same bytes). Batches larger than the staging buffer are sent in slices.
        """
        keys = _checked(keys)
        if len(keys) != len(values):
            raise InvalidArgument(f"put_many got {len(keys)} keys but {len(values)} values")
        views = [_byte_view(v) for v in values]
        for key, view in zip(keys, views, strict=True):
            if view.nbytes == 0:
                raise InvalidArgument("empty value: store at least one byte", key=key)
        results: list[KVStoreError | None] = [None] * len(keys)
        for lo, hi in self._staging.slices([v.nbytes for v in views]):
            self._put_slice(keys[lo:hi], views[lo:hi], results, lo)
        return results

    def _put_slice(self, keys: list[bytes], views: list[memoryview],
                   results: list[KVStoreError | None], base: int) -> None:
        sums = [checksum(v) for v in views]
        reply = self._call("PutStart", pb.PutStartRequest(
            keys=keys, sizes=[v.nbytes for v in views], checksums=sums,
            replicas=self.replicas, writer=self.writer_id))
        offsets = self._staging.layout([v.nbytes for v in views])
        plan: dict[Target, list[tuple[int, int, int]]] = defaultdict(list)
        started: list[int] = []
        for i, item in enumerate(reply.items):
            if item.code == Code.ALREADY_EXISTS:
                continue
            if item.code != Code.OK:
                results[base + i] = error_for(item.code, item.message, key=keys[i])
                continue
            self._staging.view[offsets[i]:offsets[i] + views[i].nbytes] = views[i]
            started.append(i)
            for loc in item.locations:
                plan[(loc.segment, loc.node_id)].append((self._staging.addr + offsets[i], loc.addr, loc.size))
        failed = self._run_transfers(plan, write=True)
        self._finish_puts(keys, reply, started, failed, [v.nbytes for v in views], results, base)

    def _finish_puts(self, keys: list[bytes], reply: pb.PutStartResponse, started: list[int],
                     failed: dict[Target, KVStoreError], sizes: list[int],
                     results: list[KVStoreError | None], base: int) -> None:
        """Commit what was written everywhere, revoke what was not."""
        commit: list[int] = []
        revoke: list[int] = []
        for i in started:
            bad = [failed[t] for loc in reply.items[i].locations
                   if (t := (loc.segment, loc.node_id)) in failed]
            if bad:
                revoke.append(i)
                results[base + i] = bad[0]
            else:
                commit.append(i)
        if revoke:
            self._call("PutRevoke", pb.KeysRequest(keys=[keys[i] for i in revoke],
                                                   writer=self.writer_id))
        if commit:
            end = self._call("PutEnd", pb.KeysRequest(keys=[keys[i] for i in commit],
                                                      writer=self.writer_id))
            for i, code in zip(commit, end.codes, strict=True):
                if code not in (Code.OK, Code.ALREADY_EXISTS):
                    results[base + i] = error_for(
                        code, "the write was not committed (it timed out at the master or "
                        "its node was lost); put it again", key=keys[i])
                else:
                    self.stats.puts += 1
                    self.stats.bytes_written += sizes[i]

    def _run_transfers(self, plan: dict[Target, list[tuple[int, int, int]]], write: bool
                       ) -> dict[Target, KVStoreError]:
        """Move every (local, remote, n) of the plan; per target node, the failure."""
        failed: dict[Target, KVStoreError] = {}
        for target, items in plan.items():
            local = self._local.get(*target)
            if local is not None and all(local.contains(r, n) for _, r, n in items):
                for a, r, n in items:
                    if write:
                        local.write(r, a, n)
                    else:
                        local.read(a, r, n)
                self.stats.local_transfers += len(items)
                continue
            op = self._transfer.write if write else self._transfer.read
            try:
                op(target[0], [a for a, _, _ in items], [r for _, r, _ in items],
                   [n for _, _, n in items])
            except KVStoreError as exc:
                failed[target] = exc
        return failed

    # -- leases -------------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes], ttl: float | None = None) -> Lease:
        """Pin the longest stored prefix of `keys` under a lease; `lease.count` says how many.

        Until the lease is released or expires, the master evicts none of them: a reader
        that saw `count` hits can load exactly those. Use it as a context manager.
        """
        keys = _checked(keys)
        sent = time.monotonic()
        reply = self._call("Lookup", pb.LookupRequest(keys=keys, lease_ttl=ttl or 0.0,
                                                      holder=self.writer_id))
        return Lease(reply.lease_id, keys[:reply.count], sent + reply.ttl_remaining, self)

    def renew(self, lease: Lease, ttl: float | None = None) -> None:
        if not lease.id:
            return
        sent = time.monotonic()
        reply = self._call("RenewLease", pb.RenewLeaseRequest(lease_id=lease.id, ttl=ttl or 0.0))
        lease.expires_at = sent + reply.ttl_remaining

    def release(self, lease: Lease, keep_first: int | None = None) -> None:
        """Unpin the lease's keys; with `keep_first=n`, keep the first n pinned."""
        if not lease.id:
            return
        req = pb.ReleaseLeaseRequest(lease_id=lease.id)
        if keep_first is not None:
            if keep_first < 0:
                raise InvalidArgument(f"keep_first must be >= 0, got {keep_first}")
            req.keep_first_n = keep_first
        self._call("ReleaseLease", req)
        if keep_first is None or keep_first == 0:
            lease.keys, lease.id = [], 0
        else:
            lease.keys = lease.keys[:keep_first]

    # -- zero-copy ------------------------------------------------------------------------

    def register(self, buffer: Any) -> None:
        """Register memory (any contiguous buffer or a CPU torch tensor) for zero-copy
        put_from/get_into. Slices of a registered buffer are usable too."""
        addr, nbytes = buffer_address(buffer)
        self._transfer.register(addr, nbytes)
        self._regions.append((addr, addr + nbytes))

    def unregister(self, buffer: Any) -> None:
        addr, nbytes = buffer_address(buffer)
        self._transfer.unregister(addr)
        self._regions = [r for r in self._regions if r != (addr, addr + nbytes)]

    def _registered(self, addr: int, nbytes: int) -> bool:
        return any(lo <= addr and addr + nbytes <= hi for lo, hi in self._regions)

    def put_from(self, keys: Sequence[bytes], buffers: Sequence[Any]) -> list[KVStoreError | None]:
        """Like put_many, but bytes go straight from registered memory to the store."""
        keys = _checked(keys)
        if len(keys) != len(buffers):
            raise InvalidArgument(f"put_from got {len(keys)} keys but {len(buffers)} buffers")
        srcs = [self._dest(b) for b in buffers]
        results: list[KVStoreError | None] = [None] * len(keys)
        self._put_direct(keys, srcs, results)
        return results

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                 lease: Lease | None = None) -> list[KVStoreError | None]:
        """Read each object straight into its registered buffer (no intermediate copy).

        Per key: None when the buffer holds the verified object, else the error
        (NotFound, CorruptObject, Unavailable). With `lease`, only keys pinned by it are
        read, and if the lease deadline passes before the transfer finishes the whole call
        raises LeaseExpired, even if bytes arrived: they may belong to a reused range.
        """
        keys = _checked(keys)
        if len(keys) != len(buffers):
            raise InvalidArgument(f"get_into got {len(keys)} keys but {len(buffers)} buffers")
        dests = [self._dest(b) for b in buffers]
        out: list[KVStoreError | None] = [None] * len(keys)
        sent = time.monotonic()
        reply = self._call("GetReplicas", pb.GetReplicasRequest(
            keys=keys, lease_id=lease.id if lease else 0, holder=self.writer_id))
        deadline = lease.expires_at if lease else sent + reply.ttl_remaining
        try:
            found: list[tuple[int, pb.ReadItem]] = []
            for i, item in enumerate(reply.items):
                if item.code != Code.OK or not item.locations:
                    out[i] = error_for(item.code or Code.NOT_FOUND, "not in the store"
                                       if item.code in (Code.OK, Code.NOT_FOUND)
                                       else "not pinned by this lease", key=keys[i])
                elif item.size > dests[i].view.nbytes:
                    out[i] = InvalidArgument(f"buffer of {dests[i].view.nbytes} bytes is smaller "
                                             f"than the object ({item.size} bytes)", key=keys[i])
                else:
                    found.append((i, item))
            errs = self._read_into(keys, found, [dests[i] for i, _ in found])
            for (i, _), err in zip(found, errs, strict=True):
                out[i] = err
            if time.monotonic() > deadline:
                raise LeaseExpired("the read lease expired before the transfer finished; "
                                   "the bytes are not trusted (look the keys up again)")
        finally:
            if reply.lease_id and lease is None:
                self._release_async(reply.lease_id)
        return out

    def _dest(self, buffer: Any) -> _Dest:
        addr, nbytes = buffer_address(buffer)
        if not self._registered(addr, nbytes):
            raise InvalidArgument("buffer is not inside registered memory; call "
                                  "client.register(buffer or the tensor it is a slice of) first")
        return _Dest(addr, _byte_view(buffer))

    def _put_direct(self, keys: list[bytes], srcs: list[_Dest],
                    results: list[KVStoreError | None]) -> None:
        sums = [checksum(d.view) for d in srcs]
        reply = self._call("PutStart", pb.PutStartRequest(
            keys=keys, sizes=[d.view.nbytes for d in srcs], checksums=sums,
            replicas=self.replicas, writer=self.writer_id))
        plan: dict[Target, list[tuple[int, int, int]]] = defaultdict(list)
        started: list[int] = []
        for i, item in enumerate(reply.items):
            if item.code == Code.ALREADY_EXISTS:
                continue
            if item.code != Code.OK:
                results[i] = error_for(item.code, item.message, key=keys[i])
                continue
            started.append(i)
            for loc in item.locations:
                plan[(loc.segment, loc.node_id)].append((srcs[i].addr, loc.addr, loc.size))
        failed = self._run_transfers(plan, write=True)
        self._finish_puts(keys, reply, started, failed, [d.view.nbytes for d in srcs], results, 0)

    # -- get ------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The object's bytes, or None if the store does not hold it."""
        out = self._get_batch([key])[0]
        if isinstance(out, NotFound):
            return None
        if isinstance(out, KVStoreError):
            raise out
        return out

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Per key: the bytes, or None for a miss. A corrupt or unreachable replica is a
        miss too (a cache reader recomputes); `stats.errors` counts them."""
        return [None if isinstance(o, KVStoreError) else o for o in self._get_batch(keys)]

    def _get_batch(self, keys: Sequence[bytes]) -> list[bytes | KVStoreError]:
        keys = _checked(keys)
        out: list[bytes | KVStoreError] = [NotFound("not in the store")] * len(keys)
        pending = list(range(len(keys)))
        for _attempt in range(2):
            if not pending:
                break
            pending = self._get_once(keys, pending, out)
        return out

    def _get_once(self, keys: list[bytes], todo: list[int],
                  out: list[bytes | KVStoreError]) -> list[int]:
        """Read `todo` under one lease; returns the indexes worth one more try."""
        sent = time.monotonic()
        reply = self._call("GetReplicas", pb.GetReplicasRequest(keys=[keys[i] for i in todo],
                                                                holder=self.writer_id))
        deadline = sent + reply.ttl_remaining
        found = [(i, item) for i, item in zip(todo, reply.items, strict=True)
                 if item.code == Code.OK and item.locations]
        retry: list[int] = []
        try:
            for lo, hi in self._staging.slices([item.size for _, item in found]):
                part = found[lo:hi]
                offsets = self._staging.layout([item.size for _, item in part])
                dests = [_Dest(self._staging.addr + off,
                               self._staging.view[off:off + item.size])
                         for off, (_, item) in zip(offsets, part, strict=True)]
                errs = self._read_into(keys, part, dests)
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
        finally:
            if reply.lease_id:
                self._release_async(reply.lease_id)
        self.stats.gets += len(todo)
        return retry

    def _read_into(self, keys: list[bytes], part: list[tuple[int, pb.ReadItem]],
                   dests: list[_Dest]) -> list[KVStoreError | None]:
        """Read each object of `part` into its dest and verify it; per object the error.

        Replica r of each object is tried in round r; most reads finish in round 0.
        """
        errs: list[KVStoreError | None] = [None] * len(part)
        remaining = list(range(len(part)))
        rounds = max((len(item.locations) for _, item in part), default=0)
        for rnd in range(rounds):
            plan: dict[Target, list[tuple[int, int, int]]] = defaultdict(list)
            which: dict[Target, list[int]] = defaultdict(list)
            for j in remaining:
                item = part[j][1]
                if rnd < len(item.locations):
                    loc: cpb.Location = item.locations[rnd]
                    plan[(loc.segment, loc.node_id)].append((dests[j].addr, loc.addr, item.size))
                    which[(loc.segment, loc.node_id)].append(j)
            failed = self._run_transfers(plan, write=False)
            still: list[int] = []
            for target, js in which.items():
                for j in js:
                    i, item = part[j]
                    if target in failed:
                        errs[j] = failed[target]
                        still.append(j)
                        continue
                    if checksum(dests[j].view[:item.size]) != item.checksum:
                        self.stats.corrupt_reads += 1
                        self._local.forget(*target)
                        errs[j] = CorruptObject(
                            f"object read from {target[0]} does not match its checksum; "
                            "it is treated as missing", key=keys[i])
                        still.append(j)
                        continue
                    errs[j] = None
                    self.stats.hits += 1
                    self.stats.bytes_read += item.size
            remaining = still
            if not remaining:
                break
        for j in remaining:
            err = errs[j]
            if err is not None:
                name = type(err).__name__
                self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
        return errs

    def _release_async(self, lease_id: int) -> None:
        """Release without waiting: the lease expires on its own if this is lost."""
        assert self._stub is not None
        with contextlib.suppress(grpc.RpcError):
            self._stub.ReleaseLease.future(pb.ReleaseLeaseRequest(lease_id=lease_id),
                                           timeout=self.timeout)


@dataclass(slots=True)
class _Dest:
    """Where one object's bytes come from or land: registered memory."""

    addr: int
    view: memoryview


@dataclass
class Lease:
    """Pins on the first `count` keys of a lookup. Release it (or leave the `with`) once
    loaded; it expires by itself at `expires_at` (this host's time.monotonic())."""

    id: int
    keys: list[bytes]
    expires_at: float
    _client: KVStoreClient | None = field(default=None, repr=False)

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
            with contextlib.suppress(LeaseExpired, Unavailable):
                self._client.release(self)


def buffer_address(buffer: Any) -> tuple[int, int]:
    """(address, length in bytes) of a contiguous buffer or CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size"):
        if not buffer.is_contiguous():
            raise InvalidArgument("tensor is not contiguous; pass a contiguous tensor or slice")
        if buffer.device.type != "cpu":
            raise InvalidArgument(f"tensors on {buffer.device} need the CUDA Transfer Engine "
                                  "build (mooncake-transfer-engine)")
        return int(buffer.data_ptr()), int(buffer.numel() * buffer.element_size())
    arr = np.frombuffer(_byte_view(buffer), dtype=np.uint8)
    return int(arr.ctypes.data), int(arr.nbytes)


def _byte_view(buffer: Any) -> memoryview:
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


def _checked(keys: Sequence[bytes]) -> list[bytes]:
    out = [bytes(k) if isinstance(k, (bytearray, memoryview)) else k for k in keys]
    for k in out:
        check_key(k)
    return out
