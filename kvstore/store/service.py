"""gRPC handlers of a store node (called by the leader)."""

from __future__ import annotations

from typing import Any

from kvstore.errors import Code
from kvstore.store.inventory import Held, Inventory
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg

_STALE = "a newer leader has taken over; this master's epoch is stale"


class StoreNodeService(spbg.StoreNodeServicer):
    def __init__(self, node_id: str, inventory: Inventory) -> None:
        self.node_id = node_id
        self.inventory = inventory

    async def Apply(self, request: spb.ApplyRequest, context: Any) -> spb.ApplyResponse:
        if not self.inventory.admit_epoch(request.epoch):
            return spb.ApplyResponse(error=cpb.Error(code=Code.NOT_LEADER, message=_STALE))  # type: ignore[arg-type]
        self.inventory.apply(
            [(r.key, Held(r.offset, r.size, r.checksum)) for r in request.add if r.tier != "ssd"],
            [(r.key, r.offset) for r in request.drop if r.tier != "ssd"],
        )
        return spb.ApplyResponse()

    async def Inventory(self, request: spb.InventoryRequest,
                        context: Any) -> spb.InventoryResponse:
        if not self.inventory.admit_epoch(request.epoch):
            return spb.InventoryResponse(error=cpb.Error(code=Code.NOT_LEADER, message=_STALE))  # type: ignore[arg-type]
        return spb.InventoryResponse(node_id=self.node_id, replicas=[
            spb.Replica(key=k, offset=h.offset, size=h.size, checksum=h.checksum, tier="dram")
            for k, h in self.inventory.dram()
        ])
