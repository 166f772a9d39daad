"""The leader's links to store nodes: inventory deltas out, inventories in.

The leader sends every node the replicas committed on it and freed from it, batched in
one `Apply` per node. A new leader reads the nodes' inventories back to rebuild its
index, so a commit is durable once its node has applied it: the handlers of PutEnd,
PutCommit and Remove hold their reply until then (see `record` and docs/durability.md).

Each node has one sender task. It starts an `Apply` as soon as deltas some reply waits
for (or intents) are queued and no `Apply` to that node is in flight, and takes
everything queued meanwhile into the next one: under load, commits group themselves,
one round trip per node per batch. Deltas nothing waits for (a commit acknowledged on
its intent, an intent's drop, the tick's frees) wait up to `DEFER` for company first:
a single client's puts then share one `Apply` instead of costing the master and the
node a round trip each (each one is two syscalls and a wake-up on both sides). Deltas
to an unreachable node wait (up to a bound) and are sent again, in order, with
backoff; the node's own etcd lease decides whether it is alive, not these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from kvstore.addresses import split_address
from kvstore.errors import Code, KVStoreError
from kvstore.rpc.delta_columns import Row, row
from kvstore.rpc.deltas import DeltaClient, apply_request
from kvstore.security.daemons import DaemonSecurity
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg

log = logging.getLogger(__name__)

MAX_QUEUED = 200_000  # per node; past this the oldest deltas are dropped (a stale inventory
# only costs hits after a failover, never correctness: reads verify checksums)
APPLY_TIMEOUT = 5.0  # s for one Apply before it is retried
RETRY_MAX = 1.0  # s, the longest pause between two tries of a failing node
DEFER = 0.001  # s a delta no reply waits for may wait for others to share its Apply
DEFER_ROWS = 512  # queued rows that are sent at once even if nothing waits for them


class Applied(enum.Enum):
    """How a wait for a node's Apply ended."""

    YES = "applied"  # the node holds the deltas: a new leader will find them
    GONE = "gone"  # the node left or was lost: its replicas went with it
    STALE = "stale"  # the node answered that a newer leader exists
    LATE = "late"  # not applied within the wait (the node is slow or unreachable)


# One queued change (delta_columns.Row): key, offset, size, checksum, flags. Kept as a
# tuple until its Apply is built: a message per change made at queue time and copied
# into the request cost ~3x as much (a put queues two: its intent and its commit), and
# over the delta channel the rows go in columns.


@dataclass
class _Link:
    address: str
    channel: grpc.aio.Channel
    stub: spbg.StoreNodeStub
    changes: list[Row] = field(default_factory=list)  # queued, in order
    tls: bool = False
    queued: int = 0  # deltas ever queued for this node
    applied: int = 0  # of those, how many the node has applied (in order)
    waiters: list[tuple[int, asyncio.Future[Applied]]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    sender: asyncio.Task[None] | None = None
    stale: bool = False  # the node said a newer leader exists: nothing of ours holds
    fast: DeltaClient | None = None  # the node's delta channel, when it announces one
    urgent: bool = False  # something queued is to go now (an intent, a waited-for delta)
    timer: asyncio.TimerHandle | None = None  # the deferred wake (see DEFER)


class NodeLinks:
    def __init__(self, epoch: Callable[[], int], security: DaemonSecurity | None = None,
                 on_health: Callable[[str, bool], None] | None = None,
                 shard: int = 0, shards: int = 1) -> None:
        """`on_health(node, answers)`: called when a node misses a delta (False: no
        placements there, see MasterCore.set_unresponsive) and when one lands again.
        `shard` of `shards`: the master shard these links speak for; every request to a
        node names it (a node keeps one inventory and epoch per shard)."""
        self._epoch = epoch
        self.shard = shard
        self.shards = shards
        self._security = security or DaemonSecurity()
        self.on_health = on_health
        self.down: set[str] = set()  # nodes whose last Apply failed
        self._links: dict[str, _Link] = {}
        self.deltas_sent = 0
        self.deltas_dropped = 0
        self.applies = 0  # Apply calls that succeeded (deltas_sent / applies: the batching)
        self._closing: set[asyncio.Future[None]] = set()

    def set_node(self, node_id: str, address: str, tls: bool = False, deltas: str = "") -> None:
        link = self._links.get(node_id)
        if link is not None and link.address == address and link.tls == tls and \
                (link.fast.address if link.fast else "") == deltas:
            return
        if link is not None:
            self._retire(link, Applied.GONE)
        if not address:
            self._links.pop(node_id, None)
            return
        channel = self._security.channel(address, tls)
        link = _Link(address, channel, spbg.StoreNodeStub(channel), tls=tls)
        if deltas:
            link.fast = self._delta_client(deltas, tls)
        link.sender = asyncio.ensure_future(self._send_loop(node_id, link))
        self._links[node_id] = link
        self._healthy(node_id, True)  # a new incarnation, or a new address: a fresh start

    def _delta_client(self, address: str, tls: bool) -> DeltaClient:
        # TLS as for the node's gRPC service (DaemonSecurity.channel).
        peer = self._security.peer_tls_for(tls)
        if peer is None:
            return DeltaClient(address, token=self._security.token)
        return DeltaClient(address, peer.ssl_context(), peer.hostname(split_address(address)[0]),
                           self._security.token)

    def _healthy(self, node_id: str, answers: bool) -> None:
        if answers == (node_id not in self.down):
            return
        if answers:
            self.down.discard(node_id)
            log.info("node %s answers again: placements resume", node_id)
        else:
            self.down.add(node_id)
            log.warning("node %s missed an inventory delta: no placements there until "
                        "one lands", node_id)
        if self.on_health is not None:
            self.on_health(node_id, answers)

    def drop_node(self, node_id: str) -> None:
        self.down.discard(node_id)
        link = self._links.pop(node_id, None)
        if link is not None:
            self._retire(link, Applied.GONE)

    def _retire(self, link: _Link, why: Applied) -> None:
        if link.sender is not None:
            link.sender.cancel()
        if link.timer is not None:
            link.timer.cancel()
            link.timer = None
        self._wake_waiters(link, why, everyone=True)
        for closing in (link.channel.close(), *((link.fast.close(),) if link.fast else ())):
            task = asyncio.ensure_future(closing)
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # -- queueing and delivery ----------------------------------------------------------

    def queue(self, node_id: str, replica: spb.Replica, added: bool) -> int:
        """Queue one change; returns its place in the node's queue (`applied` reaches it
        once the node has it), 0 if the leader has no link to the node."""
        m = self.queue_row(node_id, row(replica.key, replica.offset, replica.size,
                                        replica.checksum, replica.tier, replica.pending,
                                        replica.record, not added))
        return 0 if m is None else m[1]

    def queue_row(self, node_id: str, row: Row) -> tuple[_Link, int] | None:
        """Queue one change (see `Row`); returns its mark (see `mark`: the node's queue
        ends there now), None if the leader has no link to the node."""
        link = self._links.get(node_id)
        if link is None:
            return None
        target = link.changes
        target.append(row)
        link.queued += 1
        if len(target) > MAX_QUEUED:
            del target[: len(target) - MAX_QUEUED]
            self.deltas_dropped += 1
        return link, link.queued

    def applied(self, node_id: str, seq: int) -> bool:
        """Whether the node has applied its queue up to `seq` (see `queue`)."""
        link = self._links.get(node_id)
        return link is not None and link.applied >= seq

    def mark_at(self, node_id: str, seq: int) -> tuple[_Link, int] | None:
        """A mark (see `mark`) at an earlier place in the node's queue."""
        link = self._links.get(node_id)
        return None if link is None else (link, seq)

    def mark(self, node_id: str) -> tuple[_Link, int] | None:
        """Where `node_id`'s queue ends now: `wait` returns once the node has applied up
        to here. None if the leader has no link to it (no service address known)."""
        link = self._links.get(node_id)
        return None if link is None else (link, link.queued)

    def kick(self, node_ids: Iterable[str] | None = None, now: bool = False) -> None:
        """Have the senders deliver what is queued (all nodes, or these), without waiting:
        `now`, or within DEFER (see the module's docstring; a waiter sends at once)."""
        links = (self._links.values() if node_ids is None
                 else [self._links[n] for n in node_ids if n in self._links])
        for link in links:
            if link.applied < link.queued:
                if now:
                    link.urgent = True
                    link.wake.set()
                else:
                    self._defer(link)

    @staticmethod
    def _defer(link: _Link) -> None:
        if link.wake.is_set() or link.timer is not None:
            return
        if len(link.changes) >= DEFER_ROWS:
            link.wake.set()
            return

        def wake() -> None:
            link.timer = None
            link.wake.set()
        link.timer = asyncio.get_running_loop().call_later(DEFER, wake)

    def waiter(self, mark: tuple[_Link, int]) -> asyncio.Future[Applied]:
        """A future that says when (and how) the node of `mark` applied everything queued
        up to it. No task and no timer: the node's sender resolves it."""
        link, seq = mark
        future: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        if link.stale:
            future.set_result(Applied.STALE)
        elif link.applied >= seq:
            future.set_result(Applied.YES)
        elif link.sender is None or link.sender.done():
            future.set_result(Applied.GONE)
        else:
            link.waiters.append((seq, future))
            link.urgent = True
            link.wake.set()
        return future

    async def wait(self, mark: tuple[_Link, int], timeout: float) -> Applied:
        """Wait until the node of `mark` applied everything queued up to it."""
        future = self.waiter(mark)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return Applied.LATE

    def flush(self) -> None:
        """Deliver everything queued, in the background (the tick's deltas)."""
        self.kick()

    async def flush_node(self, node_id: str, timeout: float = APPLY_TIMEOUT) -> None:
        """Deliver everything queued for one node, after any Apply already in flight.

        Tier moves call this first: a drop of a key's old SSD copy must reach the node
        before a new demotion of that key, or the node would delete the new copy."""
        mark = self.mark(node_id)
        if mark is not None:
            await self.wait(mark, timeout)

    async def _send_loop(self, node_id: str, link: _Link) -> None:
        failures = 0
        while True:
            await link.wake.wait()
            link.wake.clear()
            if link.timer is not None:
                link.timer.cancel()
                link.timer = None
            while link.changes:
                changes, upto = link.changes, link.queued
                link.changes = []
                link.urgent = False
                outcome = await self._apply(node_id, link, changes)
                if outcome is Applied.YES:
                    failures = 0
                    self._healthy(node_id, True)
                    link.applied = upto
                    self._wake_waiters(link, Applied.YES)
                elif outcome is Applied.STALE:
                    # A newer leader owns this node: nothing of ours will be applied.
                    link.stale = True
                    link.applied = upto
                    self._wake_waiters(link, Applied.STALE)
                else:
                    # Sent again first, in order, with whatever was queued meanwhile.
                    link.changes[:0] = changes
                    self._healthy(node_id, False)
                    failures += 1
                    await asyncio.sleep(min(RETRY_MAX, 0.05 * (2 ** min(failures, 5))))
                    continue
                if link.changes and not link.urgent and not link.waiters:
                    # Queued during the Apply, and nothing waits for it: company first.
                    self._defer(link)
                    break
            # Waiters for deltas a trim dropped (MAX_QUEUED) would wait forever.
            if not link.changes and link.applied < link.queued:
                link.applied = link.queued
                self._wake_waiters(link, Applied.YES)

    @staticmethod
    def _wake_waiters(link: _Link, how: Applied, everyone: bool = False) -> None:
        keep = []
        for seq, future in link.waiters:
            if everyone or seq <= link.applied:
                if not future.done():
                    future.set_result(how)
            else:
                keep.append((seq, future))
        link.waiters = keep

    async def _apply(self, node_id: str, link: _Link, changes: list[Row]) -> Applied:
        try:
            if link.fast is not None:
                reply = await link.fast.apply_rows(self._epoch(), self.shard, changes,
                                                   APPLY_TIMEOUT)
            else:
                reply = await link.stub.Apply(apply_request(self._epoch(), changes, self.shard),
                                              timeout=APPLY_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            log.warning("inventory delta to node %s failed (%s); will retry", node_id,
                        exc.code().name)
            return Applied.LATE
        except (OSError, EOFError, TimeoutError, KVStoreError) as exc:
            log.warning("inventory delta to node %s failed (%s); will retry", node_id,
                        getattr(exc, "message", None) or type(exc).__name__)
            return Applied.LATE
        if reply.error.code == Code.NOT_LEADER:
            log.error("node %s says a newer leader exists: %s", node_id, reply.error.message)
            return Applied.STALE
        self.deltas_sent += len(changes)
        self.applies += 1
        return Applied.YES

    # -- reads from nodes -----------------------------------------------------------------

    async def inventory(self, node_id: str, timeout: float = 10.0) -> list[spb.Replica] | None:
        link = self._links.get(node_id)
        if link is None:
            return None
        try:
            reply = await link.stub.Inventory(spb.InventoryRequest(
                epoch=self._epoch(), shard=self.shard, shards=self.shards),
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
            reply = await link.stub.Move(spb.MoveRequest(epoch=self._epoch(), shard=self.shard,
                                                         items=items),
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
            if link.sender is not None:
                link.sender.cancel()
            self._wake_waiters(link, Applied.GONE, everyone=True)
            with contextlib.suppress(Exception):
                await link.channel.close()
            if link.fast is not None:
                await link.fast.close()
        self._links.clear()
        self.down.clear()
