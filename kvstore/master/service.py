"""gRPC handlers of the master: translate messages into `MasterCore` calls and back.

Nothing here decides anything about objects; that is the core's job. The handlers only
check that this master leads, convert types, and turn typed errors into `Error` fields.
They run on the event loop thread and call the core synchronously: the core is plain
Python and every call is bounded by the batch size, so there is no lock to take.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import grpc

from kvstore.errors import Code, InvalidArgument, KVStoreError, NotLeader
from kvstore.master.core import Location, MasterCore
from kvstore.master.metrics import MasterMetrics, counters
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

R = TypeVar("R")


class Leadership(Protocol):
    """What the handlers need to know about the election."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    @property
    def leader_address(self) -> str: ...


def _locations(locs: Iterable[Location]) -> list[cpb.Location]:
    return [
        cpb.Location(node_id=loc.node_id, segment=loc.segment, addr=loc.addr, size=loc.size,
                     tier=loc.tier)
        for loc in locs
    ]


class MasterService(pbg.MasterServicer):
    def __init__(
        self,
        core: MasterCore,
        leadership: Leadership,
        metrics: MasterMetrics,
        after_write: Callable[[], None] | None = None,
    ) -> None:
        self.core = core
        self.leadership = leadership
        self.metrics = metrics
        # Called after calls that may change occupancy, so eviction events reach the
        # store nodes and the counters without waiting for the next tick.
        self._after_write = after_write or (lambda: None)

    # -- plumbing -------------------------------------------------------------------

    def _run(self, name: str, response: type[R], body: Callable[[], R]) -> R:
        t0 = time.perf_counter()
        epoch = self.leadership.epoch
        try:
            if not self.leadership.is_leader:
                raise NotLeader(
                    "this master is a standby; the leader is at "
                    f"{self.leadership.leader_address or 'an unknown address (election running)'}"
                )
            reply = body()
            reply.epoch = epoch  # type: ignore[attr-defined]
        except KVStoreError as exc:
            error = cpb.Error(code=int(exc.code), message=exc.message)  # type: ignore[arg-type]
            reply = response(error=error, epoch=epoch)  # type: ignore[call-arg]
            self.metrics.rpc_errors.labels(name, exc.code.name).inc()
        self.metrics.rpc_latency.labels(name).observe(time.perf_counter() - t0)
        return reply

    def _ttl(self, expires_at: float) -> float:
        return max(0.0, expires_at - self.core.clock.now()) if expires_at else 0.0

    # -- writes ---------------------------------------------------------------------

    async def PutStart(self, request: pb.PutStartRequest, context: Any) -> pb.PutStartResponse:
        def body() -> pb.PutStartResponse:
            results = self.core.put_start(
                list(request.keys), list(request.sizes), list(request.checksums),
                replicas=request.replicas or None, writer=request.writer,
            )
            self._after_write()
            return pb.PutStartResponse(items=[
                pb.PutStartItem(code=int(r.code), message=r.message,  # type: ignore[arg-type]
                                locations=_locations(r.locations))
                for r in results
            ])
        return self._run("PutStart", pb.PutStartResponse, body)

    def _codes(self, codes: list[Code]) -> pb.CodesResponse:
        return pb.CodesResponse(codes=[int(c) for c in codes])  # type: ignore[misc]

    async def PutEnd(self, request: pb.KeysRequest, context: Any) -> pb.CodesResponse:
        return self._run("PutEnd", pb.CodesResponse,
                         lambda: self._codes(self.core.put_end(list(request.keys), request.writer)))

    async def PutRevoke(self, request: pb.KeysRequest, context: Any) -> pb.CodesResponse:
        def body() -> pb.CodesResponse:
            reply = self._codes(self.core.put_revoke(list(request.keys), request.writer))
            self._after_write()
            return reply
        return self._run("PutRevoke", pb.CodesResponse, body)

    async def Remove(self, request: pb.RemoveRequest, context: Any) -> pb.CodesResponse:
        def body() -> pb.CodesResponse:
            reply = self._codes(self.core.remove(list(request.keys), force=request.force))
            self._after_write()
            return reply
        return self._run("Remove", pb.CodesResponse, body)

    # -- reads ----------------------------------------------------------------------

    async def Exists(self, request: pb.KeysRequest, context: Any) -> pb.ExistsResponse:
        return self._run("Exists", pb.ExistsResponse,
                         lambda: pb.ExistsResponse(exists=self.core.exists(list(request.keys))))

    async def Lookup(self, request: pb.LookupRequest, context: Any) -> pb.LookupResponse:
        def body() -> pb.LookupResponse:
            r = self.core.lookup(list(request.keys), request.lease_ttl or None, request.holder)
            return pb.LookupResponse(count=r.count, lease_id=r.lease_id,
                                     ttl_remaining=self._ttl(r.expires_at))
        return self._run("Lookup", pb.LookupResponse, body)

    async def GetReplicas(self, request: pb.GetReplicasRequest,
                          context: Any) -> pb.GetReplicasResponse:
        def body() -> pb.GetReplicasResponse:
            r = self.core.get_replicas(list(request.keys), request.lease_id or None,
                                       request.lease_ttl or None, request.holder)
            return pb.GetReplicasResponse(
                lease_id=r.lease_id,
                ttl_remaining=self._ttl(r.expires_at),
                items=[pb.ReadItem(code=int(i.code), size=i.size, checksum=i.checksum,  # type: ignore[arg-type]
                                   locations=_locations(i.locations)) for i in r.results],
            )
        return self._run("GetReplicas", pb.GetReplicasResponse, body)

    async def RenewLease(self, request: pb.RenewLeaseRequest, context: Any) -> pb.LeaseResponse:
        def body() -> pb.LeaseResponse:
            expires_at = self.core.renew_lease(request.lease_id, request.ttl or None)
            return pb.LeaseResponse(ttl_remaining=self._ttl(expires_at))
        return self._run("RenewLease", pb.LeaseResponse, body)

    async def ReleaseLease(self, request: pb.ReleaseLeaseRequest,
                           context: Any) -> pb.LeaseResponse:
        def body() -> pb.LeaseResponse:
            keep = request.keep_first_n if request.HasField("keep_first_n") else None
            self.core.release_lease(request.lease_id, keep)
            return pb.LeaseResponse()
        return self._run("ReleaseLease", pb.LeaseResponse, body)

    # -- membership and status ------------------------------------------------------

    async def MountSegment(self, request: pb.MountSegmentRequest,
                           context: Any) -> pb.MountSegmentResponse:
        def body() -> pb.MountSegmentResponse:
            if not request.node_id or not request.segment or request.size == 0:
                raise InvalidArgument("MountSegment needs node_id, segment and a non-zero size")
            self.core.mount_segment(request.node_id, request.segment, request.base_addr,
                                    request.size, request.tier or "dram")
            return pb.MountSegmentResponse()
        return self._run("MountSegment", pb.MountSegmentResponse, body)

    async def UnmountSegment(self, request: pb.UnmountSegmentRequest,
                             context: Any) -> pb.MountSegmentResponse:
        def body() -> pb.MountSegmentResponse:
            self.core.unmount_node(request.node_id)
            self._after_write()
            return pb.MountSegmentResponse()
        return self._run("UnmountSegment", pb.MountSegmentResponse, body)

    async def ClusterStatus(self, request: pb.ClusterStatusRequest,
                            context: Any) -> pb.ClusterStatusResponse:
        def body() -> pb.ClusterStatusResponse:
            s = self.core.stats()
            return pb.ClusterStatusResponse(
                leader=self.leadership.leader_address,
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
                counters_json=json.dumps(counters(s)),
            )
        return self._run("ClusterStatus", pb.ClusterStatusResponse, body)


def add_to_server(service: MasterService, server: grpc.aio.Server) -> None:
    pbg.add_MasterServicer_to_server(service, server)
