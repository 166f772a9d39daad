"""The store node process: owns a DRAM segment, serves it over the Transfer Engine.

Life of a node:
1. allocate the segment and register it with the Transfer Engine;
2. announce itself in etcd under a key bound to its own etcd lease, so that its death
   (crash, freeze longer than the lease, network loss) is seen by the master;
3. mount the segment at the current leader (and again whenever the leader changes);
4. on SIGTERM: unmount, delete the key, revoke the lease.

If the etcd lease is lost while the process lives on (e.g. it was frozen), the master has
already dropped this node's replicas; the node re-announces itself with a fresh lease and
is mounted again as empty space. Stale bytes left in the segment are never served: the
master no longer points at them, and every read is checked against its checksum.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass

import grpc

from kvstore.coord.etcd import Etcd
from kvstore.coord.layout import Layout, MasterRecord, NodeRecord
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.security.access import Authenticator
from kvstore.security.daemons import DaemonSecurity
from kvstore.store.inventory import Inventory
from kvstore.store.segment import DramSegment, boot_id
from kvstore.store.service import StoreNodeService
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import NodeCollector, TierCounters, serve_metrics
from kvstore.transfer import Transfer
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore.v1 import store_pb2_grpc as spbg

log = logging.getLogger(__name__)
PREFAULT_PROGRESS = 10.0  # s between progress lines while the DRAM segment is reserved


@dataclass
class StoreOptions:
    etcd: str = "127.0.0.1:2379"
    dram: int = 1 << 30
    cluster: str = "default"
    node_id: str = ""
    host: str = "127.0.0.1"
    protocol: str = "tcp"
    device: str = ""
    etcd_lease_ttl: int = 5
    metrics_port: int = 0
    listen: str = ""  # the node's gRPC address; default: --host with a free port
    metrics_host: str = "127.0.0.1"
    ssd_dir: str = ""  # no SSD tier unless set
    ssd: int = 0  # SSD tier cap in bytes on disk
    ssd_fsync: bool = True
    prefault: bool = True  # reserve and map the DRAM segment at start (see segment.py)
    security: DaemonSecurity | None = None


class StoreDaemon:
    def __init__(self, opts: StoreOptions) -> None:
        self.opts = opts
        self.layout = Layout(opts.cluster)
        self.node_id = opts.node_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.etcd = Etcd(opts.etcd)
        self._stop = asyncio.Event()
        self.segment: DramSegment | None = None
        self.transfer: Transfer | None = None
        self.lease_id = 0
        self._lease_lost = asyncio.Event()
        self.inventory = Inventory()
        self.ssd: SsdTier | None = None
        self.counters = TierCounters()
        self.server: grpc.aio.Server | None = None
        self.service_address = ""
        self.security = opts.security or DaemonSecurity()
        self.auth = Authenticator(self.security.access)

    def _record(self) -> NodeRecord:
        assert self.segment is not None and self.transfer is not None
        return NodeRecord(
            node_id=self.node_id, segment=self.transfer.segment_name,
            base_addr=self.segment.base_addr, size=self.segment.size, tier="dram",
            pid=os.getpid(), host=self.opts.host, service=self.service_address,
            ssd_capacity=self.ssd.capacity_bytes if self.ssd is not None else 0,
            shm_path=self.segment.shm_path,
            shm_inode=os.fstat(self.segment.fd).st_ino, boot_id=boot_id(),
            tls=self.security.tls,
        )

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload_access)
        self.security.check_exposure(self.opts.listen or f"{self.opts.host}:0")
        await self.etcd.connect()
        if self.opts.ssd_dir:
            self._open_ssd()
        started = time.monotonic()
        self.segment = DramSegment(self.opts.dram, name=f"kvstore-{self.node_id}",
                                   prefault=False)
        if self.opts.prefault:
            log.info("node %s: reserving its %d-byte DRAM segment before it joins (about "
                     "0.5 s per GiB)", self.node_id, self.opts.dram)
            if not await self._prefault(started):
                log.info("node %s: stopped while reserving its DRAM segment", self.node_id)
                self.segment.close()
                return 0
            log.info("node %s: %d-byte DRAM segment reserved%s in %.2f s", self.node_id,
                     self.segment.size, "" if self.segment.prefaulted else
                     " (this kernel cannot map it ahead: pages map at first write)",
                     time.monotonic() - started)
        self.transfer = Transfer(self.opts.host, self.opts.protocol, self.opts.device)
        self.transfer.register(self.segment.base_addr, self.segment.size)
        log.info("node %s: %d-byte segment registered as %s", self.node_id, self.segment.size,
                 self.transfer.segment_name)
        await self._serve()
        if self.opts.metrics_port:
            serve_metrics(NodeCollector(self.node_id, self.segment.size, self.inventory,
                                        lambda: self.ssd, self.counters),
                          self.opts.metrics_port, self.opts.metrics_host)
        tasks = [
            asyncio.create_task(self._announce_forever(), name="announce"),
            asyncio.create_task(self._mount_at_leaders(), name="mount"),
        ]
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, KVStoreError):
                await task
        await self._leave()
        return 0

    async def _prefault(self, started: float) -> bool:
        """Reserve the segment a step at a time (~0.5 s each), letting the loop run in
        between: a SIGTERM during a reservation of hundreds of GiB (minutes) is honoured
        within a step or two, and progress is logged every PREFAULT_PROGRESS seconds.
        False if told to stop before it was done."""
        assert self.segment is not None
        last = started
        for done in self.segment.prefault_steps():
            await asyncio.sleep(0)  # the signal handlers run here
            if self._stop.is_set():
                return False
            now = time.monotonic()
            if now - last >= PREFAULT_PROGRESS and done < self.segment.size:
                log.info("node %s: %d of %d bytes of its DRAM segment reserved", self.node_id,
                         done, self.segment.size)
                last = now
        return True

    def reload_access(self) -> None:
        """SIGHUP: read the access file again (e.g. a rotated node token)."""
        try:
            access = self.auth.reload()
        except KVStoreError as exc:
            log.error("SIGHUP: keeping the access file as it was: %s", exc.message)
            return
        log.info("access file %s reloaded: %d token(s)", access.source, len(access.principals))

    def _open_ssd(self) -> None:
        if self.opts.ssd <= 0:
            raise InvalidArgument("--ssd-dir needs --ssd SIZE (the tier's cap on disk, e.g. 100GiB)")
        self.ssd = SsdTier(self.opts.ssd_dir, self.opts.ssd, fsync=self.opts.ssd_fsync)
        report = self.ssd.open()
        # What survived the last run is readable again once the leader adopts it.
        log.info("node %s: SSD tier %s re-indexed: %d objects (%d bytes) recovered, %d corrupt "
                 "dropped, %d temp files removed, %d dropped over the cap, in %.2f s",
                 self.node_id, self.opts.ssd_dir, report.recovered, report.bytes,
                 report.corrupt, report.temp_removed, report.evicted_over_cap, report.seconds)
        self.counters.corrupt += report.corrupt

    async def _serve(self) -> None:
        assert self.segment is not None
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20),
                                               ("grpc.max_send_message_length", 256 << 20)],
                                      interceptors=self.security.node_interceptors(self.auth))
        service = StoreNodeService(self.node_id, self.inventory, self.segment, self.ssd,
                                   self.counters)
        spbg.add_StoreNodeServicer_to_server(service, self.server)
        listen = self.opts.listen or f"{self.opts.host}:0"
        try:
            port = self.security.add_port(self.server, listen)
        except RuntimeError as exc:
            raise InvalidArgument(f"cannot listen on {listen} ({exc}); pick a free --listen") from exc
        host = listen.rpartition(":")[0]
        self.service_address = f"{host}:{port}"
        await self.server.start()

    async def _announce_forever(self) -> None:
        """Hold a lease-bound announcement in etcd; re-announce if the lease is ever lost."""
        while True:
            self._lease_lost.clear()
            try:
                self.lease_id = await self.etcd.grant(self.opts.etcd_lease_ttl)
                await self.etcd.put(self.layout.node(self.node_id), self._record().encode(),
                                    lease=self.lease_id)
            except Exception as exc:  # etcd down: keep trying, the node itself is fine
                log.warning("announcing node in etcd failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            log.info("node %s announced in etcd (lease %x)", self.node_id, self.lease_id)
            # Only etcd's word ends the lease (confirm_loss): etcd restores leases when it
            # restarts, and clearing the inventory during an outage would cost the next
            # leader the whole cache.
            await self.etcd.keep_alive(self.lease_id, self.opts.etcd_lease_ttl,
                                       self._lease_lost.set, confirm_loss=True)
            # The master dropped our replicas when the lease ended; so do we, or a later
            # leader would adopt ranges it has since handed out again.
            self.inventory.clear()
            log.warning("node %s lost its etcd lease; re-announcing", self.node_id)

    async def _mount_at_leaders(self) -> None:
        """Mount at the leader named in etcd; mount again whenever the leader changes."""
        mounted_epoch = -1
        while True:
            try:
                current = await self.etcd.get_with_revision(self.layout.leader)
            except Exception as exc:
                log.warning("reading the leader from etcd failed (%s)", exc)
                current = None
            if current is not None:
                raw, epoch = current
                if epoch != mounted_epoch:
                    master = MasterRecord.decode(raw)
                    if await self._mount(master.address, master.tls):
                        mounted_epoch = epoch
            await asyncio.sleep(0.5 if mounted_epoch < 0 else 2.0)

    async def _mount(self, address: str, tls: bool) -> bool:
        assert self.segment is not None and self.transfer is not None
        req = pb.MountSegmentRequest(
            node_id=self.node_id, segment=self.transfer.segment_name,
            base_addr=self.segment.base_addr, size=self.segment.size, tier="dram",
        )
        try:
            async with self.security.channel(address, tls) as channel:
                reply = await pbg.MasterStub(channel).MountSegment(req, timeout=3.0)
        except grpc.aio.AioRpcError as exc:
            log.warning("mounting at master %s failed: %s", address, exc.code().name)
            return False
        if reply.error.code:
            log.warning("master %s refused the mount: %s", address, reply.error.message)
            return False
        log.info("node %s mounted at master %s (epoch %d)", self.node_id, address, reply.epoch)
        return True

    async def _leave(self) -> None:
        """Clean stop: tell the leader first, so no reader is sent here after we are gone."""
        with contextlib.suppress(Exception):
            current = await self.etcd.get(self.layout.leader)
            if current is not None:
                master = MasterRecord.decode(current)
                async with self.security.channel(master.address, master.tls) as channel:
                    await pbg.MasterStub(channel).UnmountSegment(
                        pb.UnmountSegmentRequest(node_id=self.node_id), timeout=3.0)
        with contextlib.suppress(Exception):
            await self.etcd.delete(self.layout.node(self.node_id))
        if self.lease_id:
            await self.etcd.revoke(self.lease_id)
        await self.etcd.close()
        if self.server is not None:
            await self.server.stop(grace=0.5)
        if self.transfer is not None:
            self.transfer.close()
        if self.ssd is not None:
            self.ssd.close()
        log.info("node %s stopped", self.node_id)
