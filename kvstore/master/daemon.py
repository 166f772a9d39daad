"""The master process: gRPC server + election + membership watch + tick loop.

This is the thin I/O shell around `MasterCore`. It owns the event loop and every
socket; the core only sees method calls and the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from dataclasses import dataclass

import grpc

from kvstore.coord.etcd import Etcd
from kvstore.coord.layout import Layout, MasterRecord, NodeRecord
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.master.core import CoreConfig, MasterCore, MonotonicClock
from kvstore.master.election import Election
from kvstore.master.metrics import MasterMetrics
from kvstore.master.service import MasterService, add_to_server

log = logging.getLogger(__name__)

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


@dataclass
class MasterOptions:
    etcd: str = "127.0.0.1:2379"
    listen: str = "127.0.0.1:50051"
    cluster: str = "default"
    master_id: str = ""
    etcd_lease_ttl: int = 5
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    tick_interval: float = 0.1
    core: CoreConfig | None = None


class MasterDaemon:
    def __init__(self, opts: MasterOptions) -> None:
        self.opts = opts
        self.layout = Layout(opts.cluster)
        self.core = MasterCore(opts.core or CoreConfig(), MonotonicClock())
        self.metrics = MasterMetrics()
        self.etcd = Etcd(opts.etcd)
        master_id = opts.master_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.record = MasterRecord(master_id=master_id, address=opts.listen, pid=os.getpid(),
                                   metrics=f"{opts.metrics_host}:{opts.metrics_port}" if opts.metrics_port else "")
        self.election = Election(self.etcd, self.layout, self.record, ttl=opts.etcd_lease_ttl)
        self.service = MasterService(self.core, self.election, self.metrics)
        self.server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0) or until leadership is lost (exit 3)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        await self.etcd.connect()
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        add_to_server(self.service, self.server)
        try:
            port = self.server.add_insecure_port(self.opts.listen)
        except RuntimeError as exc:
            raise InvalidArgument(
                f"cannot listen on {self.opts.listen} ({exc}); pick a free port with --listen"
            ) from exc
        if port == 0:
            raise InvalidArgument(f"cannot listen on {self.opts.listen}; pick a free port with --listen")
        await self.server.start()
        self.metrics.watch_core(self.core.stats, lambda: self.election.is_leader,
                                lambda: self.election.epoch)
        if self.opts.metrics_port:
            self.metrics.serve(self.opts.metrics_port, self.opts.metrics_host)
        await self.election.register()
        log.info("master %s listening on %s", self.record.master_id, self.opts.listen)
        campaign = asyncio.create_task(self.election.campaign(self._on_elected), name="campaign")
        lost = asyncio.create_task(self.election.lost.wait(), name="lease-lost")
        stop = asyncio.create_task(self._stop.wait(), name="stop")
        await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        code = 3 if self.election.lost.is_set() and not self._stop.is_set() else 0
        for task in (campaign, lost, stop, *self._tasks):
            task.cancel()
        for task in (campaign, lost, stop, *self._tasks):
            with contextlib.suppress(asyncio.CancelledError, KVStoreError):
                await task
        await self.server.stop(grace=0.5)
        await self.election.resign()
        await self.etcd.close()
        log.info("master stopped (exit %d)", code)
        return code

    async def _on_elected(self, epoch: int) -> None:
        """Mount every live node before answering as leader, then follow membership."""
        records, revision = await self.etcd.get_prefix(self.layout.nodes)
        for _key, raw in records:
            self._mount(raw)
        self._tasks.append(asyncio.create_task(self._follow_nodes(revision + 1), name="nodes"))
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="tick"))

    def _mount(self, raw: bytes) -> None:
        try:
            node = NodeRecord.decode(raw)
            self.core.mount_segment(node.node_id, node.segment, node.base_addr, node.size,
                                    node.tier)
            log.info("mounted node %s (%s, %d bytes)", node.node_id, node.segment, node.size)
        except (ValueError, TypeError, KeyError, KVStoreError) as exc:
            log.error("ignoring a bad node record in etcd (%s): %r", exc, raw[:200])

    async def _follow_nodes(self, start_revision: int) -> None:
        async for ev in self.etcd.watch_prefix(self.layout.nodes, start_revision):
            if ev.kind == "put":
                self._mount(ev.value)
            else:
                node_id = ev.key[len(self.layout.nodes):].decode(errors="replace")
                lost = self.core.unmount_node(node_id)
                log.warning("node %s is gone (etcd lease ended); %d objects lost their last "
                            "replica", node_id, len(lost))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.tick_interval)
            try:
                self.core.tick()
                self.core.drain_events()
            except Exception:  # the loop must survive a bug in one tick
                log.exception("master tick failed")
