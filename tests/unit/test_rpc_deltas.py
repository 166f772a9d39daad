"""The leader's delta channel to a store node (kvstore.rpc.deltas): Apply round trips in
order, and a node that requires tokens refuses one of the wrong role."""

from __future__ import annotations

import asyncio

import pytest

from kvstore.errors import PermissionDenied, Unauthenticated
from kvstore.rpc.deltas import DeltaClient, DeltaServer
from kvstore.v1 import store_pb2 as spb


def test_apply_round_trips_in_order() -> None:
    async def main() -> None:
        seen: list[int] = []

        async def apply(request: spb.ApplyRequest) -> spb.ApplyResponse:
            await asyncio.sleep(0.01 if request.epoch == 1 else 0)  # the first is slower
            seen.append(request.epoch)
            return spb.ApplyResponse()

        server = DeltaServer(apply)
        address = await server.start("127.0.0.1")
        client = DeltaClient(address)
        for epoch in (1, 2, 3):
            await client.apply(spb.ApplyRequest(epoch=epoch, add=[spb.Replica(key=b"k")]), 5)
        assert seen == [1, 2, 3]
        await client.close()
        await server.close()

    asyncio.run(main())


def test_a_node_that_requires_tokens_admits_only_the_right_ones() -> None:
    async def main() -> None:
        async def apply(request: spb.ApplyRequest) -> spb.ApplyResponse:
            return spb.ApplyResponse()

        def admit(token: str) -> None:
            if token != "node-token":
                raise PermissionDenied("token 'client' has role client")

        server = DeltaServer(apply, admit)
        address = await server.start("127.0.0.1")
        with pytest.raises(Unauthenticated):
            await DeltaClient(address).apply(spb.ApplyRequest(epoch=1), 5)
        with pytest.raises(PermissionDenied):
            await DeltaClient(address, token="client-token").apply(spb.ApplyRequest(epoch=1), 5)
        good = DeltaClient(address, token="node-token")
        await good.apply(spb.ApplyRequest(epoch=1), 5)
        await good.close()
        await server.close()

    asyncio.run(main())
