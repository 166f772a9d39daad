"""The Coordination service: who leads, and changing live settings, over gRPC.

Both exist so that nothing but the daemons needs to write etcd (docs/operations.md,
"etcd's users and roles"). `WhoLeads` is answered by every master, standbys included,
so a client given a list of master addresses finds the leader without etcd; `SetConfig`
is the leader's alone and an admin token's alone: the leader checks the values and
writes them to etcd itself (LiveConfig.change).

Callers are authenticated as for the Master service (the same access file, the same
`authorization` metadata); a refusal travels in the reply's `error`, as there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from kvstore.coord.etcd import ETCD_ERRORS
from kvstore.errors import KVStoreError, NotLeader, Unavailable, WrongShard
from kvstore.master.core import MasterCore
from kvstore.master.core.config import live_settings
from kvstore.master.election import Election
from kvstore.master.live_config import LiveConfig
from kvstore.master.service import MasterService
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

log = logging.getLogger(__name__)


def _error(exc: KVStoreError) -> cpb.Error:
    return cpb.Error(code=int(exc.code), message=exc.message)  # type: ignore[arg-type]


class CoordinationService(pbg.CoordinationServicer):
    def __init__(self, master: MasterService, election: Election, live: LiveConfig,
                 core: Callable[[], MasterCore]) -> None:
        self.master = master
        self.election = election
        self.live = live
        self.core = core

    async def WhoLeads(self, request: pb.WhoLeadsRequest, context: Any) -> pb.WhoLeadsResponse:
        caller = self.master.caller_of(context.invocation_metadata())
        if isinstance(caller, KVStoreError):  # any valid token may ask, none else
            return pb.WhoLeadsResponse(error=_error(caller))
        spec = self.master.shard
        if request.shard != spec.index:
            return pb.WhoLeadsResponse(shard=spec.index, shards=spec.count, error=_error(
                WrongShard(f"this master serves shard {spec.index} of {spec.count}, not "
                           f"shard {request.shard}: ask a master of shard {request.shard}")))
        record = self.election.leader_record
        if record is None or not self.election.leader_address or (
                record.master_id == self.election.record.master_id and
                not self.election.is_leader):
            # None known, or this master holds the seat but does not serve yet (it is
            # rebuilding its index, or cannot confirm its lease): the caller asks again.
            return pb.WhoLeadsResponse(is_leader=False, shard=spec.index, shards=spec.count)
        return pb.WhoLeadsResponse(
            shard=spec.index, shards=spec.count,
            epoch=self.election.epoch, is_leader=self.election.is_leader,
            master_id=record.master_id, address=record.address, fast=record.fast,
            tls=record.tls)

    async def SetConfig(self, request: pb.SetConfigRequest,
                        context: Any) -> pb.SetConfigResponse:
        epoch = self.election.epoch
        try:
            caller = self.master.caller_of(context.invocation_metadata())
            if isinstance(caller, KVStoreError):
                raise caller
            caller.check("SetConfig")  # admin only: in no other role's list
            if not self.election.is_leader:
                raise NotLeader("this master is a standby; set live settings at the leader, "
                                f"{self.election.leader_address or 'not elected yet'}")
            core = self.core()
            await self.live.change({s.name: s.value for s in request.settings},
                                   list(request.unset), core)
            log.info("live settings changed by %s", caller.name,
                     extra={"event": "config_set", "by": caller.name})
            return pb.SetConfigResponse(epoch=epoch, settings=[
                pb.ConfigSetting(name=name, value=value)
                for name, value in live_settings(core.config).items()])
        except KVStoreError as exc:
            return pb.SetConfigResponse(error=_error(exc), epoch=epoch)
        except ETCD_ERRORS as exc:
            return pb.SetConfigResponse(error=_error(Unavailable(
                f"the leader could not write the settings to etcd ({exc}); nothing changed, "
                "retry when etcd answers")), epoch=epoch)


def add_coordination(server: grpc.aio.Server, master: MasterService, election: Election,
                     live: LiveConfig, core: Callable[[], MasterCore]) -> None:
    pbg.add_CoordinationServicer_to_server(
        CoordinationService(master, election, live, core), server)
