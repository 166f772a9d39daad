"""The master's RPC handlers: translate messages into `MasterCore` calls and back.

Nothing here decides anything about objects; that is the core's job. A handler only
checks that this master leads, converts types, and turns typed errors into `Error`
fields. Every RPC is one plain method `request -> reply`, reached through
`handle(method, request)`, which both transports call: the gRPC servicer methods below
(the public contract) and the fast channel (kvstore.rpc). So leadership and epoch
checks, metrics and error mapping cannot differ between them. Handlers run on the event
loop thread and call the core synchronously: the core is plain Python and every call is
bounded by the batch size, so there is no lock to take.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from kvstore.errors import Code, InvalidArgument, KVStoreError, NotLeader, WrongShard
from kvstore.master.core import Location, MasterCore, ObjectInfo, SegmentStats
from kvstore.master.core.config import live_settings
from kvstore.master.durability import Placed
from kvstore.master.metrics import MasterMetrics, counters
from kvstore.rpc import columns
from kvstore.rpc.methods import METHODS
from kvstore.security.access import OPEN, Authenticator, Principal, Role
from kvstore.shards import ShardSpec
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

log = logging.getLogger(__name__)

Body = Callable[[Any], Message]
# (method, reply) -> None if the reply may leave at once, else what to await first.



class Recorder(Protocol):
    """kvstore.master.durability.Recorder.record."""

    def __call__(self, method: str, reply: Any, stored: dict[bytes, set[str]],
                 placed: Sequence[Placed] = (),
                 released: Iterable[bytes] = (),
                 renamed: dict[bytes, bytes] | None = None,
                 records: bool = False) -> asyncio.Future[None] | None: ...


class Leadership(Protocol):
    """What the handlers need to know about the election."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    @property
    def leader_address(self) -> str: ...

    @property
    def leader_for(self) -> float: ...


def _add_locations(field: Any, locs: Iterable[Location]) -> None:
    # add() + attribute stores: about 3x faster with upb than building Location(...)
    # objects and passing them to the parent's constructor, which copies them again.
    add = field.add
    for loc in locs:
        m = add()
        m.node_id = loc.node_id
        m.segment = loc.segment
        m.addr = loc.addr
        m.size = loc.size
        m.tier = loc.tier


# Keys per ListKeys/Inspect reply: an admin call, but one reply must stay well under the
# 64 MiB message limit (a key is at most 1 KiB).
_MAX_LIST = 10_000
# A NamedTuple built without its constructor's keyword and default handling (Placed,
# once per key a PutStart places).
_new_tuple = tuple.__new__


def _node_status(seg: SegmentStats) -> pb.NodeStatus:
    return pb.NodeStatus(node_id=seg.node_id, segment=seg.segment, tier=seg.tier,
                         capacity=seg.capacity, used=seg.used, pinned=seg.pinned_bytes,
                         objects=seg.replicas)


def _fill_object(m: pb.ObjectInfo, info: ObjectInfo, now: float) -> None:
    m.key = info.key
    m.state = info.state
    m.size = info.size
    m.checksum = info.checksum
    _add_locations(m.replicas, info.locations)
    m.pins = info.pins
    m.idle_seconds = max(0.0, now - info.last_access)
    m.age_seconds = max(0.0, now - info.created)
    m.writer = info.writer


def foreign_keys(request: Any, spec: ShardSpec, prefix: bytes = b"") -> list[bytes]:
    """The keys (and placeholders) of `request` that are not `spec`'s shard's, as the
    client names them. A key's shard is that of the key the master stores, `prefix` (the
    caller's tenant's) and the key: what a node's inventory lists a shard by and a new
    leader adopts by, so a tenant's client routes its prefixed keys too."""
    out: list[bytes] = []
    for field in ("keys", "placeholders"):
        keys = getattr(request, field, None)
        if keys:
            if prefix:
                out.extend(k for k in keys if not spec.owns(prefix + k))
            else:
                out.extend(k for k in keys if not spec.owns(k))
    return out


class MasterService(pbg.MasterServicer):
    def __init__(
        self,
        core: MasterCore,
        leadership: Leadership,
        metrics: MasterMetrics,
        auth: Authenticator | None = None,
    ) -> None:
        self.core = core
        self.leadership = leadership
        self.metrics = metrics
        self.auth = auth or Authenticator(None)
        # The caller of the call being handled. Bodies run one at a time on the event
        # loop thread, so a plain attribute is enough; handle() sets it for each call.
        self._caller: Principal = OPEN
        # Set by the daemon (kvstore.master.durability): holds the replies of writes
        # until the store nodes have recorded them. None: replies leave at once.
        self.recorder: Recorder | None = None
        self.durability_counters: Callable[[], dict[str, int]] = dict
        # Keys the call being handled found already stored, with the nodes holding them:
        # its OK must wait for their record too (a retry after a write that was not
        # recorded in time finds the key stored, and must not be acknowledged sooner).
        self._stored: dict[bytes, set[str]] = {}
        # What the put call being handled placed (its intents go to the nodes) and the
        # keys whose PENDING attempt it ended without a commit (kvstore.master.durability).
        self._placed: list[Placed] = []
        self._released: list[bytes] = []
        # The placeholders PutCommit renamed (key -> placeholder) and whether their put
        # records were written (PutCommitRequest.records).
        self._renamed: dict[bytes, bytes] = {}
        # The shard this master serves (the daemon sets it); with one, no key is checked.
        self.shard = ShardSpec()
        self._records = False
        bodies: dict[str, Body] = {
            "PutStart": self.put_start,
            "PutEnd": self.put_end,
            "PutRevoke": self.put_revoke,
            "PutCommit": self.put_commit,
            "Remove": self.remove,
            "Exists": self.exists,
            "Lookup": self.lookup,
            "GetReplicas": self.get_replicas,
            "RenewLease": self.renew_lease,
            "ReleaseLease": self.release_lease,
            "MountSegment": self.mount_segment,
            "UnmountSegment": self.unmount_segment,
            "ClusterStatus": self.cluster_status,
            "NodeList": self.node_list,
            "ListKeys": self.list_keys,
            "Inspect": self.inspect,
            "EvictionStats": self.eviction_stats,
            "Evict": self.evict,
            "SetDraining": self.set_draining,
            "Drain": self.drain,
            "GetConfig": self.get_config,
            "Authenticate": self.authenticate,
        }
        missing = sorted(set(METHODS) - set(bodies))
        if missing:
            raise TypeError(f"MasterService has no handler for {missing} (see master.proto)")
        # name -> (body, response type, latency histogram child), resolved once.
        self._routes: dict[str, tuple[Body, type[Message], Any]] = {
            name: (bodies[name], m.response, metrics.rpc_latency.labels(name))
            for name, m in METHODS.items()
        }

    # -- the one entry point of both transports ----------------------------------------

    def handle(self, method: str, request: Any, caller: Principal | KVStoreError = OPEN) -> Any:
        """Run one RPC: who calls (a principal, or why the caller was refused), role
        check, leadership check, body, epoch stamp, error mapping, metrics."""
        body, response, latency = self._routes[method]
        self._stored = {}
        t0 = time.perf_counter()
        leadership = self.leadership
        epoch = leadership.epoch
        try:
            if isinstance(caller, KVStoreError):
                if method != "Authenticate":  # it checks the token in its request
                    raise caller
            elif caller is not OPEN:
                caller.check(method)
                self._caller = caller
            if not leadership.is_leader:
                if getattr(leadership, "suspended", False):
                    raise NotLeader(
                        "the leader cannot confirm its etcd lease (is etcd reachable?); it "
                        "accepts no calls until etcd answers: retry shortly")
                raise NotLeader(
                    "this master is a standby; the leader is at "
                    f"{leadership.leader_address or 'an unknown address (election running)'}"
                )
            if self.shard.count > 1:
                self._check_shard(request)
            reply: Any = body(request)
            reply.epoch = epoch
        except KVStoreError as exc:
            reply = response(error=cpb.Error(code=int(exc.code), message=exc.message),  # type: ignore[arg-type]
                             epoch=epoch)
            self.metrics.rpc_errors.labels(method, exc.code.name).inc()
        except Exception as exc:  # a bug in one call must not reach (or kill) a transport
            log.exception("%s failed", method)
            reply = response(error=cpb.Error(
                code=int(Code.INTERNAL),  # type: ignore[arg-type]
                message=f"the master failed to handle {method} ({type(exc).__name__}: {exc}); "
                        "see its log"), epoch=epoch)
            self.metrics.rpc_errors.labels(method, Code.INTERNAL.name).inc()
        self._caller = OPEN
        latency.observe(time.perf_counter() - t0)
        return reply

    def _check_shard(self, request: Any) -> None:
        """Refuse, as a whole, a call naming any key of another shard (one xxh3 per key)."""
        prefix = self._caller.prefix
        foreign = foreign_keys(request, self.shard, prefix)
        if foreign:
            stored = f"{prefix.decode(errors='replace')}key" if prefix else "key"
            raise WrongShard(
                f"{len(foreign)} key(s) of this call, such as {foreign[0][:64]!r}, are not "
                f"shard {self.shard.index}'s of {self.shard.count}: route each key to the "
                f"master of shard xxh3_64({stored}) % {self.shard.count}"
                + (" (the key as stored, with this token's tenant prefix)" if prefix else ""))

    def settle(self, method: str, reply: Any) -> asyncio.Future[None] | None:
        """What `reply` must wait for before it leaves (None: nothing). Both transports
        call it right after `handle`, before the next call runs: the changes a write
        made are then still the journal's newest."""
        stored, self._stored = self._stored, {}
        placed, released, renamed = self._placed, self._released, self._renamed
        if placed:
            self._placed = []
        if released:
            self._released = []
        if renamed:
            self._renamed = {}
        recorder = self.recorder
        if recorder is None:
            return None
        if renamed:
            return recorder(method, reply, stored, placed, released, renamed, self._records)
        return recorder(method, reply, stored, placed, released)

    async def _handle_settled(self, method: str, request: Any, context: Any) -> Any:
        reply = self.handle(method, request, self.caller_of(context.invocation_metadata()))
        wait = self.settle(method, reply)
        if wait is not None:
            await wait
        return reply

    def _note_stored(self, keys: list[bytes], codes: Sequence[int]) -> None:
        if Code.ALREADY_EXISTS not in codes:  # the usual batch: one scan in C, no loop
            return
        for key, code in zip(keys, codes, strict=False):
            if code == Code.ALREADY_EXISTS:
                info = self.core.inspect(key)
                if info is not None and info.locations:
                    self._stored[key] = {loc.node_id for loc in info.locations}

    def _keys(self, keys: Iterable[bytes]) -> list[bytes]:
        """The caller's keys as the core stores them: a client's under its tenant."""
        prefix = self._caller.prefix
        if not prefix:
            return list(keys)
        return [prefix + k for k in keys]

    def _owner(self) -> str | None:
        """Whose leases the caller may use: a client only its tenant's; others any."""
        return self._caller.tenant if self._caller.role is Role.CLIENT else None

    def caller_of(self, metadata: Any) -> Principal | KVStoreError:
        """The principal of a gRPC call, or the error that refuses it."""
        try:
            return self.auth.from_metadata(metadata)
        except KVStoreError as exc:
            return exc

    def authenticate(self, request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
        p = self.auth.principal(request.token)
        return pb.AuthenticateResponse(name=p.name, role=p.role.value, tenant=p.tenant)

    def _ttl(self, expires_at: float) -> float:
        return max(0.0, expires_at - self.core.clock.now()) if expires_at else 0.0

    # -- writes ---------------------------------------------------------------------

    def put_start(self, request: pb.PutStartRequest) -> pb.PutStartResponse:
        keys = self._keys(request.keys)
        room = request.record_room if self.recorder is not None else 0
        sizes = list(request.sizes)
        results = self.core.put_start(
            keys, sizes, list(request.checksums),
            replicas=request.replicas or None, writer=request.writer, ahead=request.ahead,
            record_room=room,
        )
        if room:
            # A placeholder's intent: its key and checksum come in the record its writer
            # appends to the value (kvstore/put_record.py).
            # Placed(k, 0, locations, record=True), built without keyword handling.
            self._placed = [_new_tuple(Placed, (k, 0, r.locations, True))
                            for k, r in zip(keys, results, strict=True)
                            if r.code == Code.OK and r.locations]
        elif not request.ahead:
            self._note_stored(keys, [r.code for r in results])
            if self.recorder is not None:
                # Space started ahead has no checksum yet: its commit is recorded the
                # old way (PutCommit waits for the node).
                self._placed = [_new_tuple(Placed, (k, total, r.locations, False))
                                for k, total, r in zip(keys, request.checksums, results,
                                                       strict=True)
                                if r.code == Code.OK and r.locations]
        reply = pb.PutStartResponse(put_timeout=self.core.put_timeout(request.ahead),
                                    record_room=room)
        if request.columns_version >= columns.PACKED and \
                all(not r.code and r.locations for r in results):
            # Every key placed: one packed array per field (kvstore/rpc/columns.py).
            columns.fill_placed(reply.columns, results, sizes,
                                columns.version_for(request.columns_version))
            return reply
        add = reply.items.add
        for r in results:
            item = add()
            if r.code:
                item.code = r.code
            if r.message:
                item.message = r.message
            if r.placement:
                item.placement = r.placement
            # _add_locations, inlined: one call less per item.
            add_location = item.locations.add
            for loc in r.locations:
                m = add_location()
                m.node_id = loc.node_id
                m.segment = loc.segment
                m.addr = loc.addr
                m.size = loc.size
                m.tier = loc.tier
        return reply

    @staticmethod
    def _codes(codes: list[Code]) -> pb.CodesResponse:
        return pb.CodesResponse(codes=codes)  # type: ignore[arg-type]  # a Code is an int

    def put_end(self, request: pb.KeysRequest) -> pb.CodesResponse:
        keys = self._keys(request.keys)
        codes = self.core.put_end(keys, request.writer)
        self._note_stored(keys, codes)
        return self._codes(codes)

    def put_revoke(self, request: pb.KeysRequest) -> pb.CodesResponse:
        keys = self._keys(request.keys)
        codes = self.core.put_revoke(keys, request.writer, unsettled=request.unsettled)
        self._released = [k for k, c in zip(keys, codes, strict=False) if c == Code.OK]
        return self._codes(codes)

    def put_commit(self, request: pb.PutCommitRequest) -> pb.CodesResponse:
        keys = self._keys(request.keys)
        placeholders = self._keys(request.placeholders)
        codes = self.core.put_commit(placeholders, keys,
                                     list(request.sizes), list(request.checksums), request.writer)
        self._note_stored(keys, codes)
        if self.recorder is not None:
            self._renamed = {k: p for k, p, c in zip(keys, placeholders, codes, strict=True)
                             if c == Code.OK}
            self._records = request.records
        return self._codes(codes)

    def remove(self, request: pb.RemoveRequest) -> pb.CodesResponse:
        keys = self._keys(request.keys)
        codes = self.core.remove(keys, force=request.force)
        self._released = [k for k, c in zip(keys, codes, strict=False) if c == Code.OK]
        return self._codes(codes)

    # -- reads ----------------------------------------------------------------------

    def exists(self, request: pb.KeysRequest) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=self.core.exists(self._keys(request.keys)))

    def lookup(self, request: pb.LookupRequest) -> pb.LookupResponse:
        r = self.core.lookup(self._keys(request.keys), request.lease_ttl or None, request.holder,
                             self._caller.tenant)
        return pb.LookupResponse(count=r.count, lease_id=r.lease_id,
                                 ttl_remaining=self._ttl(r.expires_at))

    def get_replicas(self, request: pb.GetReplicasRequest) -> pb.GetReplicasResponse:
        r = self.core.get_replicas(self._keys(request.keys), request.lease_id or None,
                                   request.lease_ttl or None, request.holder,
                                   self._owner() if request.lease_id else self._caller.tenant,
                                   pin=not request.unpinned, columns=request.columns)
        reply = (pb.GetReplicasResponse(lease_id=r.lease_id, ttl_remaining=self._ttl(r.expires_at))
                 if r.lease_id else pb.GetReplicasResponse())  # unpinned, or nothing found
        if request.columns:  # one packed array per field (kvstore/rpc/columns.py)
            version = columns.version_for(request.columns_version)
            if r.columns is not None:  # the core answered in columns already
                columns.fill_lists(reply.columns, r.columns, version)
            else:
                columns.fill(reply.columns, r.results, version)
            return reply
        add = reply.items.add
        for i in r.results:
            # Fields as keywords of add(): one call instead of one store per field.
            item = add(code=int(i.code), size=i.size, checksum=i.checksum, placement=i.placement)
            _add_locations(item.locations, i.locations)
        return reply

    def renew_lease(self, request: pb.RenewLeaseRequest) -> pb.LeaseResponse:
        expires_at = self.core.renew_lease(request.lease_id, request.ttl or None, self._owner())
        return pb.LeaseResponse(ttl_remaining=self._ttl(expires_at))

    def release_lease(self, request: pb.ReleaseLeaseRequest) -> pb.LeaseResponse:
        keep = request.keep_first_n if request.HasField("keep_first_n") else None
        self.core.release_lease(request.lease_id, keep, self._owner())
        return pb.LeaseResponse()

    # -- membership and status ------------------------------------------------------

    def mount_segment(self, request: pb.MountSegmentRequest) -> pb.MountSegmentResponse:
        if not request.node_id or not request.segment or request.size == 0:
            raise InvalidArgument("MountSegment needs node_id, segment and a non-zero size")
        tier = request.tier or "dram"
        # A node mounting itself names its whole segment: this shard takes its own part
        # of it, as when it mounts the node from its etcd record (daemon._mount).
        if tier == "dram":
            start, size = self.shard.part(request.size)
        else:
            start, size = 0, request.size // self.shard.count
        self.core.mount_segment(request.node_id, request.segment, request.base_addr,
                                size, tier, start)
        return pb.MountSegmentResponse()

    def unmount_segment(self, request: pb.UnmountSegmentRequest) -> pb.MountSegmentResponse:
        self.core.unmount_node(request.node_id, reason="left")
        return pb.MountSegmentResponse()

    def cluster_status(self, request: pb.ClusterStatusRequest) -> pb.ClusterStatusResponse:
        s = self.core.stats()
        return pb.ClusterStatusResponse(
            leader=self.leadership.leader_address,
            leader_for_seconds=self.leadership.leader_for,
            nodes=[
                pb.NodeStatus(node_id=seg.node_id, segment=seg.segment, tier=seg.tier,
                              capacity=seg.capacity, used=seg.used,
                              pinned=seg.pinned_bytes, objects=seg.replicas)
                for node in s.nodes.values() for seg in node.segments
            ],
            objects_complete=s.objects_complete,
            objects_pending=s.objects_pending,
            bytes_complete=s.bytes_complete,
            bytes_pending=s.bytes_pending,
            active_leases=s.active_leases,
            counters_json=json.dumps({**counters(s), **self.core.tier_counters(),
                                      **self.durability_counters()}),
            recent_lookup_keys=s.recent.get("lookup_keys", 0),
            recent_hit_keys=s.recent.get("hit_keys", 0),
            recent_seconds=s.recent_seconds,
            draining=s.draining,
            shard=self.shard.index, shards=self.shard.count,
        )

    # -- operator calls ---------------------------------------------------------------

    def node_list(self, request: pb.NodeListRequest) -> pb.NodeListResponse:
        now = self.core.clock.now()
        reply = pb.NodeListResponse()
        for n in self.core.node_list():
            reply.nodes.add(
                node_id=n.node_id, state=n.state, objects=n.objects,
                gone_seconds=max(0.0, now - n.gone_at) if n.gone_at else 0.0,
                objects_lost=n.objects_lost,
                segments=[_node_status(seg) for seg in n.segments],
            )
        return reply

    def list_keys(self, request: pb.ListKeysRequest) -> pb.ListKeysResponse:
        limit = request.limit or 100
        if limit > _MAX_LIST:
            raise InvalidArgument(f"limit must be at most {_MAX_LIST} keys, got {limit}; "
                                  "narrow the prefix instead")
        keys = self.core.keys(request.prefix, limit + 1)
        now = self.core.clock.now()
        reply = pb.ListKeysResponse(truncated=len(keys) > limit)
        for key in keys[:limit]:
            info = self.core.inspect(key)
            if info is not None:
                _fill_object(reply.objects.add(), info, now)
        return reply

    def inspect(self, request: pb.KeysRequest) -> pb.InspectResponse:
        if len(request.keys) > _MAX_LIST:
            raise InvalidArgument(f"inspect at most {_MAX_LIST} keys per call, got {len(request.keys)}")
        now = self.core.clock.now()
        reply = pb.InspectResponse()
        for key in request.keys:
            item = reply.items.add()
            info = self.core.inspect(key)
            if info is None:
                item.code = int(Code.NOT_FOUND)
            else:
                _fill_object(item.object, info, now)
        return reply

    def eviction_stats(self, request: pb.EvictionStatsRequest) -> pb.EvictionStatsResponse:
        e = self.core.eviction_stats()
        return pb.EvictionStatsResponse(
            tiers=[pb.TierEvictions(
                tier=t.tier, evicted=t.evicted, evicted_bytes=t.evicted_bytes,
                recent_evicted=t.evicted_recent, recent_evicted_bytes=t.evicted_bytes_recent,
                demoted=t.demoted, demoted_bytes=t.demoted_bytes,
                recent_demoted=t.demoted_recent, recent_demoted_bytes=t.demoted_bytes_recent,
            ) for t in e.tiers],
            evict_high=e.evict_high, evict_low=e.evict_low,
            pool_capacity=e.pool_capacity, pool_used=max(e.pool_used, 0),
            pool_pinned=e.pool_pinned, pool_pending=e.pool_pending,
            blocked=e.blocked, blocked_bytes=e.blocked_bytes,
            blocked_pinned_bytes=e.blocked_pinned_bytes,
            held_seconds=e.held_for, recent_seconds=e.recent_seconds,
        )

    def evict(self, request: pb.EvictRequest) -> pb.EvictResponse:
        r = self.core.evict_to(request.ratio, request.max_objects or None)
        return pb.EvictResponse(evicted=r.evicted, evicted_bytes=r.evicted_bytes,
                                used=max(r.used, 0), capacity=r.capacity, reached=r.reached,
                                held=r.held, pinned=r.pinned)

    def set_draining(self, request: pb.SetDrainingRequest) -> pb.SetDrainingResponse:
        self.core.set_draining(request.node_id, request.draining)
        return pb.SetDrainingResponse(draining=self.core.draining())

    def drain(self, request: pb.DrainRequest) -> pb.DrainResponse:
        r = self.core.drain(request.node_id, request.max_objects or 1000)
        return pb.DrainResponse(
            dropped=r.dropped, dropped_bytes=r.dropped_bytes,
            sole_keys=[k for k, _ in r.sole], sole_sizes=[size for _, size in r.sole],
            remaining=r.remaining, remaining_pinned=r.remaining_pinned,
            remaining_pending=r.remaining_pending,
        )

    def get_config(self, request: pb.GetConfigRequest) -> pb.GetConfigResponse:
        return pb.GetConfigResponse(settings=[
            pb.ConfigSetting(name=name, value=value)
            for name, value in live_settings(self.core.config).items()
        ])


# -- the gRPC servicer: the public contract, same handlers ---------------------------------

# Calls whose reply may wait for the store nodes' record (docs/durability.md, section 1).
SETTLED = frozenset({"PutStart", "PutEnd", "PutRevoke", "PutCommit", "Remove"})


def _grpc_forward(name: str) -> Callable[..., Any]:
    """The servicer method for one RPC of master.proto: the same handler as the fast
    channel's, with the caller read off the call's metadata."""
    if name in SETTLED:
        async def forward(self: MasterService, request: Any, context: Any) -> Any:
            return await self._handle_settled(name, request, context)
    else:
        async def forward(self: MasterService, request: Any, context: Any) -> Any:
            return self.handle(name, request, self.caller_of(context.invocation_metadata()))
    forward.__name__ = forward.__qualname__ = name
    return forward


# One forward per RPC, made from the method table (MasterService.__init__ already refuses
# a table with an RPC it has no body for).
for _name in METHODS:
    setattr(MasterService, _name, _grpc_forward(_name))


def add_to_server(service: MasterService, server: grpc.aio.Server) -> None:
    pbg.add_MasterServicer_to_server(service, server)
