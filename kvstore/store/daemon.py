"""The store node process: owns a DRAM segment, serves it over the Transfer Engine.

Life of a node:
1. claim its identity from its data directories (kvstore.store.identity): the node id
   a previous run recorded there, and a lock that keeps a second process out;
2. reach etcd (retrying for as long as it takes: a node never exits because etcd is
   away) and refuse to start if its id is announced by a node that still answers;
3. allocate the segment and register it with the Transfer Engine;
4. announce itself in etcd under a key bound to its own etcd lease, so that its death
   (crash, freeze longer than the lease, network loss) is seen by the master. A record
   left by a previous incarnation of the same id is overwritten at once: the leader's
   membership watch sees another pid, drops the old incarnation's replicas and adopts
   this one's inventory (its re-indexed SSD objects), without waiting for the old lease;
5. mount the segment at the current leader of every master shard (and again whenever a
   shard's leader changes); each shard's leader keeps its own inventory and epoch here;
6. on SIGTERM: unmount at every shard's leader, write the DRAM objects to the SSD tier
   if it has one (bounded by --shutdown-flush; store/shutdown.py), delete the key,
   revoke the lease.

An incarnation whose key now names another one (it was frozen, and a newer process took
its id meanwhile) has been fenced: it stops, exit FENCED_EXIT, without touching the key
or unmounting, which would now hit the newer process.

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
import time
from dataclasses import dataclass

import grpc

from kvstore.coord.etcd import RETRY_LOG, Etcd
from kvstore.coord.layout import Layout, MasterRecord, NodeRecord
from kvstore.errors import AlreadyExists, InvalidArgument, KVStoreError, PermissionDenied
from kvstore.host import boot_id
from kvstore.rpc.deltas import DeltaServer
from kvstore.security.access import Authenticator, Role
from kvstore.security.daemons import DaemonSecurity
from kvstore.store import identity
from kvstore.store.inventory import ShardInventories
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.shutdown import flush_to_ssd, log_report
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import NodeCollector, TierCounters, serve_metrics
from kvstore.transfer import Transfer
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore.v1 import store_pb2_grpc as spbg

log = logging.getLogger(__name__)
PREFAULT_PROGRESS = 10.0  # s between progress lines while the DRAM segment is reserved
PROBE_TIMEOUT = 1.0  # s a previous incarnation of our id has to answer a probe...
PROBE_ATTEMPTS = 3  # ...of this many before it is fenced (a busy node answers one of them)
# Any method name works: a live node answers UNIMPLEMENTED, and nothing runs there.
PROBE_METHOD = "/kvstore.v1.StoreNode/AreYouAlive"
FENCED_EXIT = 4  # a newer incarnation took this node's id


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
    data_dir: str = ""  # keeps the node's identity (a DRAM-only node's; see identity.py)
    ssd: int = 0  # SSD tier cap in bytes on disk
    ssd_fsync: bool = True
    prefault: bool = True  # reserve and map the DRAM segment at start (see segment.py)
    # SIGTERM: seconds to write DRAM objects to the SSD tier before leaving (0: none)
    shutdown_flush: float = 20.0
    security: DaemonSecurity | None = None


class StoreDaemon:
    def __init__(self, opts: StoreOptions) -> None:
        self.opts = opts
        self.layout = Layout(opts.cluster)
        self.node_id = opts.node_id  # settled by run() (identity.claim)
        self.identity: identity.NodeIdentity | None = None
        self.etcd = Etcd(opts.etcd)
        self._fenced = ""  # why this incarnation stopped for a newer one ("": it did not)
        self._stop = asyncio.Event()
        self.segment: DramSegment | None = None
        self.transfer: Transfer | None = None
        self.lease_id = 0
        self._lease_lost = asyncio.Event()
        self.inventories = ShardInventories()  # one per master shard (service.py)
        self.ssd: SsdTier | None = None
        self.counters = TierCounters()
        self.server: grpc.aio.Server | None = None
        self.service_address = ""
        self._deltas: DeltaServer | None = None
        self.deltas_address = ""
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
            tls=self.security.tls, deltas=self.deltas_address,
        )

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload_access)
        self.security.check_exposure(self.opts.listen or f"{self.opts.host}:0")
        if self.opts.ssd_dir and self.opts.ssd <= 0:
            raise InvalidArgument("--ssd-dir needs --ssd SIZE (the tier's cap on disk, e.g. 100GiB)")
        self.identity = identity.claim([self.opts.data_dir, self.opts.ssd_dir],
                                       self.opts.cluster, self.opts.node_id)
        try:
            return await self._run()
        finally:
            self.identity.release()

    async def _run(self) -> int:
        ident = self.identity
        assert ident is not None
        self.node_id = ident.node_id
        if ident.dirs:
            how = ("reused from" if ident.recorded == ident.node_id else
                   f"from --node-id (was {ident.recorded!r}), recorded in" if ident.recorded
                   else "new, recorded in")
            log.info("node %s: node id %s %s", self.node_id, how,
                     ", ".join(str(d) for d in ident.dirs))
        if not await self.etcd.connect_until(self._stop, f"node {self.node_id}"):
            return 0
        try:
            if not await self._refuse_live_namesake():
                await self.etcd.close()
                return 0
        except KVStoreError:
            await self.etcd.close()
            raise
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
            serve_metrics(NodeCollector(self.node_id, self.segment.size, self.inventories,
                                        lambda: self.ssd, self.counters),
                          self.opts.metrics_port, self.opts.metrics_host)
        tasks = [
            asyncio.create_task(self._announce_forever(), name="announce"),
            asyncio.create_task(self._mount_at_leaders(), name="mount"),
        ]
        tasks.append(asyncio.create_task(self._guard_identity(), name="fence-guard"))
        tasks.append(asyncio.create_task(self._keep_record(), name="record-guard"))
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, KVStoreError):
                await task
        await self._leave()
        return FENCED_EXIT if self._fenced else 0

    async def _read_own_key(self) -> tuple[bool, bytes | None]:
        """(read, value) of this node id's key; retried while etcd fails, until stopped."""
        last_log = -RETRY_LOG
        while not self._stop.is_set():
            try:
                return True, await self.etcd.get(self.layout.node(self.node_id))
            except Exception as exc:  # etcd away: keep trying, as everywhere else
                now = time.monotonic()
                if now - last_log >= RETRY_LOG:
                    log.warning("node %s: reading its etcd record failed (%s); retrying",
                                self.node_id, exc)
                    last_log = now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)
        return False, None

    async def _refuse_live_namesake(self) -> bool:
        """Raise AlreadyExists if our id is announced by a node that still answers; a
        record of one that does not (crashed, frozen) is ours to replace. False if told
        to stop first."""
        read, raw = await self._read_own_key()
        if not read:
            return False
        if raw is None:
            return True
        try:
            old = NodeRecord.decode(raw)
        except (ValueError, TypeError, KeyError):
            log.warning("node %s: replacing an unreadable etcd record of its id", self.node_id)
            return True
        if old.service and await self._answers(old):
            raise AlreadyExists(
                f"node id {self.node_id!r} is in use by a running store node (pid {old.pid} "
                f"on {old.host}, answering at {old.service}); stop that node, or give this "
                "one another --node-id or data directory")
        log.info("node %s: its previous incarnation (pid %d on %s) does not answer at %s; "
                 "this one replaces it", self.node_id, old.pid, old.host, old.service or "-")
        return True

    async def _answers(self, old: NodeRecord) -> bool:
        """Whether a gRPC server answers at `old.service`: any reply, an error included
        (the method exists nowhere), counts. A frozen process accepts the connection in
        the kernel but never replies: DEADLINE_EXCEEDED."""
        for _ in range(PROBE_ATTEMPTS):
            try:
                async with self.security.channel(old.service, old.tls) as channel:
                    await channel.unary_unary(PROBE_METHOD)(b"", timeout=PROBE_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    return False  # refused: nothing listens there any more
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    return True
                continue
            return True
        return False

    def _is_us(self, rec: NodeRecord) -> bool:
        return (rec.pid, rec.boot_id, rec.segment) == (
            os.getpid(), boot_id(), self.transfer.segment_name if self.transfer else "")

    async def _owner(self) -> str:
        """Who the etcd key of our id names: "us", "none", "other" or "unknown" (etcd
        did not answer)."""
        try:
            raw = await self.etcd.get(self.layout.node(self.node_id))
        except Exception:  # etcd away: the caller decides what that means
            return "unknown"
        if raw is None:
            return "none"
        try:
            return "us" if self._is_us(NodeRecord.decode(raw)) else "other"
        except (ValueError, TypeError, KeyError):
            return "other"

    def _fence(self) -> None:
        if not self._fenced:
            self._fenced = "its etcd record names a newer incarnation"
            log.error("node %s: a newer process has taken this node id (its etcd record now "
                      "names another pid or segment); this one stops, leaving the id to it",
                      self.node_id)
            self._stop.set()

    async def _guard_identity(self) -> None:
        """Notice, within a keepalive interval, that a newer incarnation took our id."""
        interval = max(self.opts.etcd_lease_ttl / 3.0, 0.2)
        while True:
            await asyncio.sleep(interval)
            if self.lease_id and await self._owner() == "other":
                self._fence()
                return

    async def _keep_record(self) -> None:
        """Announce again at once when our record vanishes while our lease lives (an
        operator's delete, etcd restored from an older backup): the leader then mounts
        us anew and adopts our inventory back. Only a create: a key that a newer
        incarnation took meanwhile is left to it (`_guard_identity` fences us then).
        The key is watched from the revision it was read at, and read again every lease
        TTL in case a watch stream was lost."""
        key = self.layout.node(self.node_id)
        while True:
            try:
                kvs, revision = await self.etcd.get_prefix(key)
                lease_id = self.lease_id
                if key not in dict(kvs) and lease_id and not self._lease_lost.is_set():
                    if await self.etcd.create_if_absent(key, self._record().encode(),
                                                        lease_id) is not None:
                        log.warning("node %s: its etcd record vanished while its lease "
                                    "lives; announced again (%d objects for the leader to "
                                    "adopt)", self.node_id, len(self.inventories))
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.opts.etcd_lease_ttl):
                        async for ev in self.etcd.watch_prefix(key, revision + 1):
                            if ev.key == key and ev.kind == "delete":
                                break
            except Exception as exc:  # etcd away, or the lease just ended: try again
                log.debug("node %s: watching its etcd record: %s", self.node_id, exc)
                await asyncio.sleep(1.0)

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
        service = StoreNodeService(self.node_id, self.inventories, self.segment, self.ssd,
                                   self.counters)
        service.segment_name = self.transfer.segment_name if self.transfer else ""
        spbg.add_StoreNodeServicer_to_server(service, self.server)
        listen = self.opts.listen or f"{self.opts.host}:0"
        try:
            port = self.security.add_port(self.server, listen)
        except RuntimeError as exc:
            raise InvalidArgument(f"cannot listen on {listen} ({exc}); pick a free --listen") from exc
        host = listen.rpartition(":")[0]
        self.service_address = f"{host}:{port}"
        await self.server.start()
        # The leader's deltas, on the put path: a plain stream beside gRPC (rpc/deltas.py).
        tls = self.security.server_tls
        self._deltas = DeltaServer(lambda request: service.Apply(request, None),
                                   self._admit if self.auth.required else None,
                                   tls.ssl_context() if tls else None,
                                   service.apply_columns)
        self.deltas_address = await self._deltas.start(host.strip("[]") or "127.0.0.1")

    def _admit(self, token: str) -> None:
        """Deltas come from the master (node role) or an operator (admin role) only."""
        principal = self.auth.principal(token)
        if principal.role not in (Role.NODE, Role.ADMIN):
            raise PermissionDenied(f"token {principal.name!r} has role {principal.role.value}; "
                                   "store nodes take deltas from the master only")

    async def _announce_forever(self) -> None:
        """Hold a lease-bound announcement in etcd; re-announce if the lease is ever lost.

        The first announcement overwrites whatever record our id has (a previous
        incarnation's: `_refuse_live_namesake` found it silent). A re-announcement only
        creates the key: if it exists, a newer incarnation wrote it while we were away,
        and we stop instead of overwriting it."""
        first = True
        while True:
            self._lease_lost.clear()
            key, value = self.layout.node(self.node_id), self._record().encode()
            try:
                lease_id = await self.etcd.grant(self.opts.etcd_lease_ttl)
                if first:
                    await self.etcd.put(key, value, lease=lease_id)
                elif await self.etcd.create_if_absent(key, value, lease_id) is None:
                    owner = await self._owner()
                    if owner == "other":
                        await self.etcd.revoke(lease_id)
                        self._fence()
                        return
                    if owner == "us":  # an earlier attempt of ours landed; bind it anew
                        await self.etcd.put(key, value, lease=lease_id)
                    else:
                        raise KVStoreError(f"the key of node {self.node_id} is {owner}")
                self.lease_id = lease_id
            except Exception as exc:  # etcd down: keep trying, the node itself is fine
                log.warning("announcing node in etcd failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            first = False
            log.info("node %s announced in etcd (lease %x)", self.node_id, self.lease_id)
            # Only etcd's word ends the lease (confirm_loss): etcd restores leases when it
            # restarts, and clearing the inventory during an outage would cost the next
            # leader the whole cache.
            try:
                await self.etcd.keep_alive(self.lease_id, self.opts.etcd_lease_ttl,
                                           self._lease_lost.set, confirm_loss=True)
            except Exception as exc:  # not etcd's word on the lease: it may well live on
                log.warning("node %s: keepalive of etcd lease %x failed (%s); announcing "
                            "again", self.node_id, self.lease_id, exc)
                await asyncio.sleep(1.0)
                continue  # the key is still ours: the next round binds it to a new lease
            # The master dropped our replicas when the lease ended, but our DRAM still
            # holds them: the inventory stays, and the leader adopts it again when we are
            # mounted anew (before it places anything here; an entry it cannot take
            # back, it tells us to drop). Clearing it lost every object of a node that
            # outlived a long etcd outage.
            log.warning("node %s lost its etcd lease; re-announcing with its inventory "
                        "(%d objects)", self.node_id, len(self.inventories))

    async def _leader_keys(self) -> list[bytes]:
        """The leader key of every master shard of the cluster. The count is read each
        time: a node may start before the first master has recorded it (absent: one
        shard, whose leader key is where it always was)."""
        raw = await self.etcd.get(self.layout.shard_count)
        count = 1
        if raw is not None:
            try:
                count = max(1, int(raw))
            except ValueError:
                log.warning("node %s: the cluster's shard count in etcd (%r) is not a "
                            "number; mounting at shard 0 only", self.node_id, raw[:32])
        if count <= 1:
            return [self.layout.leader]
        return [self.layout.for_shard(k, count).leader for k in range(count)]

    async def _mount_at_leaders(self) -> None:
        """Mount at each shard's leader named in etcd; mount again whenever one changes."""
        mounted: dict[bytes, int] = {}  # a shard's leader key -> the epoch mounted at
        while True:
            keys: list[bytes] = []
            try:
                keys = await self._leader_keys()
                for key in keys:
                    current = await self.etcd.get_with_revision(key)
                    if current is None:
                        continue
                    raw, epoch = current
                    # Never mount while a newer incarnation holds our id: the leader would
                    # take our segment for its and drop what that one holds.
                    if epoch != mounted.get(key) and await self._owner() == "us":
                        master = MasterRecord.decode(raw)
                        if await self._mount(master.address, master.tls):
                            mounted[key] = epoch
            except Exception as exc:
                log.warning("reading the leader from etcd failed (%s)", exc)
            await asyncio.sleep(0.5 if not keys or any(k not in mounted for k in keys)
                                else 2.0)

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

    async def _flush_to_ssd(self) -> None:
        """SIGTERM with an SSD tier: write the DRAM objects there before leaving, within
        --shutdown-flush seconds, so that a restart brings them back (store/shutdown.py).
        A fenced incarnation writes nothing: the id, and what it holds, are a newer one's."""
        if self.ssd is None or self.segment is None or self._fenced or self.opts.shutdown_flush <= 0:
            return
        held = self.inventories.dram()  # every shard's objects
        if not held:
            return
        log.info("node %s: writing %d DRAM objects to its SSD tier before it stops (at most "
                 "%g s)", self.node_id, len(held), self.opts.shutdown_flush)
        try:
            report = await asyncio.to_thread(flush_to_ssd, held, self.segment.view, self.ssd,
                                             self.opts.shutdown_flush)
        except KVStoreError as exc:
            log.error("node %s: writing its DRAM objects to SSD failed: %s", self.node_id,
                      exc.message)
            return
        log_report(self.node_id, report, self.opts.shutdown_flush)

    async def _unmount(self, leader_key: bytes) -> None:
        current = await self.etcd.get(leader_key)
        if current is not None:
            master = MasterRecord.decode(current)
            async with self.security.channel(master.address, master.tls) as channel:
                await pbg.MasterStub(channel).UnmountSegment(
                    pb.UnmountSegmentRequest(node_id=self.node_id), timeout=3.0)

    async def _leave(self) -> None:
        """Clean stop: tell the leader first, so no reader is sent here after we are gone.
        Fenced (our id's key names a newer incarnation): unmount nothing, delete nothing;
        both would hit that one."""
        ours = not self._fenced and await self._owner() != "other"
        if ours:
            with contextlib.suppress(Exception):
                # Every shard's leader, at once: one that does not answer delays the
                # others' unmounts by nothing.
                await asyncio.gather(*(self._unmount(key) for key in await self._leader_keys()),
                                     return_exceptions=True)
        # After the unmount: the leader places nothing more here while it runs (a put
        # acknowledged into DRAM now would be lost at exit), and the DRAM it writes holds
        # still. The next start's inventory brings the objects back.
        if ours:
            await self._flush_to_ssd()
            with contextlib.suppress(Exception):
                await self.etcd.delete(self.layout.node(self.node_id))
        if self.lease_id:
            await self.etcd.revoke(self.lease_id)
        await self.etcd.close()
        if self.server is not None:
            await self.server.stop(grace=0.5)
        if self._deltas is not None:
            await self._deltas.close()
        if self.transfer is not None:
            self.transfer.close()
        if self.ssd is not None:
            self.ssd.close()
        log.info("node %s stopped", self.node_id)
