"""The leader's links to store nodes: inventory deltas out, inventories in.

After each tick the leader sends every node the replicas committed on it and freed
from it since the last flush, batched in one `Apply` per node. A new leader reads the
nodes' inventories back to rebuild its index. Deltas to an unreachable node wait (up to
a bound) and go with the next flush; the node's own etcd lease decides whether it is
alive, not these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from kvstore.errors import Code
from kvstore.security.daemons import DaemonSecurity
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg

log = logging.getLogger(__name__)

MAX_QUEUED = 200_000  # per node; past this the oldest deltas are dropped (a stale inventory
# only costs hits after a failover, never correctness: reads verify checksums)


@dataclass
class _Link:
    address: str
    channel: grpc.aio.Channel
    stub: spbg.StoreNodeStub
    add: list[spb.Replica] = field(default_factory=list)
    drop: list[spb.Replica] = field(default_factory=list)
    # One Apply at a time per node, in order: flush_node() waits behind it.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tls: bool = False


class NodeLinks:
    def __init__(self, epoch: Callable[[], int], security: DaemonSecurity | None = None) -> None:
        self._epoch = epoch
        self._security = security or DaemonSecurity()
        self._links: dict[str, _Link] = {}
        self.deltas_sent = 0
        self.deltas_dropped = 0
        self._closing: set[asyncio.Future[None]] = set()

    def set_node(self, node_id: str, address: str, tls: bool = False) -> None:
        link = self._links.get(node_id)
        if link is not None and link.address == address and link.tls == tls:
            return
        if link is not None:
            self._close_later(link)
        if not address:
            self._links.pop(node_id, None)
            return
        channel = self._security.channel(address, tls)
        self._links[node_id] = _Link(address, channel, spbg.StoreNodeStub(channel), tls=tls)

    def drop_node(self, node_id: str) -> None:
        link = self._links.pop(node_id, None)
        if link is not None:
            self._close_later(link)

    def _close_later(self, link: _Link) -> None:
        task = asyncio.ensure_future(link.channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def queue(self, node_id: str, replica: spb.Replica, added: bool) -> None:
        link = self._links.get(node_id)
        if link is None:
            return
        target = link.add if added else link.drop
        target.append(replica)
        if len(target) > MAX_QUEUED:
            del target[: len(target) - MAX_QUEUED]
            self.deltas_dropped += 1

    async def flush(self) -> None:
        sends = []
        for node_id, link in self._links.items():
            if link.add or link.drop:
                add, drop = link.add, link.drop
                link.add, link.drop = [], []
                sends.append(self._send(node_id, link, add, drop))
        if sends:
            await asyncio.gather(*sends)

    async def flush_node(self, node_id: str) -> None:
        """Deliver everything queued for one node, after any Apply already in flight.

        Tier moves call this first: a drop of a key's old SSD copy must reach the node
        before a new demotion of that key, or the node would delete the new copy."""
        link = self._links.get(node_id)
        if link is None:
            return
        add, drop = link.add, link.drop
        link.add, link.drop = [], []
        await self._send(node_id, link, add, drop)

    async def _send(self, node_id: str, link: _Link, add: list[spb.Replica],
                    drop: list[spb.Replica]) -> None:
        async with link.lock:
            if add or drop:
                await self._apply(node_id, link, add, drop)

    async def _apply(self, node_id: str, link: _Link, add: list[spb.Replica],
                     drop: list[spb.Replica]) -> None:
        try:
            reply = await link.stub.Apply(spb.ApplyRequest(epoch=self._epoch(), add=add,
                                                           drop=drop), timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            log.warning("inventory delta to node %s failed (%s); will retry", node_id,
                        exc.code().name)
            link.add[:0], link.drop[:0] = add, drop
            return
        if reply.error.code == Code.NOT_LEADER:
            log.error("node %s says a newer leader exists: %s", node_id, reply.error.message)
            return
        self.deltas_sent += len(add) + len(drop)

    async def inventory(self, node_id: str, timeout: float = 10.0) -> list[spb.Replica] | None:
        link = self._links.get(node_id)
        if link is None:
            return None
        try:
            reply = await link.stub.Inventory(spb.InventoryRequest(epoch=self._epoch()),
                                              timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning("inventory of node %s unavailable (%s)", node_id, exc.code().name)
            return None
        if reply.error.code:
            log.error("node %s refused its inventory: %s", node_id, reply.error.message)
            return None
        return list(reply.replicas)

    async def move(self, node_id: str, items: list[spb.MoveItem],
                   timeout: float = 30.0) -> list[int] | None:
        """Have a node copy between its tiers; per item a Code, or None if unreachable."""
        link = self._links.get(node_id)
        if link is None:
            return None
        try:
            reply = await link.stub.Move(spb.MoveRequest(epoch=self._epoch(), items=items),
                                         timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning("tier moves on node %s failed (%s)", node_id, exc.code().name)
            return None
        if reply.error.code:
            log.error("node %s refused tier moves: %s", node_id, reply.error.message)
            return None
        return list(reply.codes)

    async def close(self) -> None:
        for link in self._links.values():
            with contextlib.suppress(Exception):
                await link.channel.close()
        self._links.clear()
