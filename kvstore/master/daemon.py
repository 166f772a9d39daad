"""The master process: gRPC server + election + membership watch + tick loop.

This is the thin I/O shell around `MasterCore`. It owns the event loop and every
socket; the core only sees method calls and the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field, replace

import grpc

from kvstore.addresses import join_address, split_address
from kvstore.coord.etcd import ETCD_ERRORS, Etcd
from kvstore.coord.layout import Layout, MasterRecord, NodeRecord
from kvstore.errors import Code, InvalidArgument, KVStoreError
from kvstore.master.coordination import add_coordination
from kvstore.master.core import CoreConfig, EventKind, MasterCore, MonotonicClock, TierMove
from kvstore.master.durability import Recorder, queue_changes
from kvstore.master.election import RETRY_PAUSE, Election
from kvstore.master.live_config import LiveConfig
from kvstore.master.metrics import MasterMetrics
from kvstore.master.node_proof import disproof
from kvstore.master.nodes import NodeLinks
from kvstore.master.service import MasterService, add_to_server
from kvstore.rpc.server import FastServer
from kvstore.security.access import Authenticator
from kvstore.security.daemons import DaemonSecurity
from kvstore.shards import ShardSpec
from kvstore.v1 import store_pb2 as spb

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
    # The fast control channel (kvstore.rpc) HOST:PORT; "": --listen's host, a free port.
    fast_listen: str = ""
    security: DaemonSecurity | None = None
    # s a write's reply waits for its store nodes to record it (see durability.py)
    ack_timeout: float = 3.0
    # This master's shard of the cluster's control plane (kvstore master --shard K/N).
    shard: ShardSpec = field(default_factory=ShardSpec)


# The smallest part of a node's DRAM segment a shard mounts: below it a shard's part
# holds too few objects to be worth placing on (and is likely a misconfiguration).
MIN_PART = 8 * 1024 * 1024


class WrongShardCount(InvalidArgument):
    """This master's --shard count is not the one the cluster recorded in etcd."""


# Allocations between two young-generation collections in the master process (CPython's
# default: 700). See `tune_gc`.
GC_GEN0 = 10_000


def tune_gc() -> None:
    """For the master process, once everything is imported and before it serves.

    A write call leaves a few hundred short-lived objects per batch (messages, tuples,
    dicts), nearly none in cycles, so at the default threshold the collector runs every
    couple of calls, mostly to find nothing; and each full collection walks every
    object the imports made (grpc, protobuf, prometheus), a pause that lands on whichever
    put is in flight: the p99. Freezing what exists now takes those
    out of every later collection, and a higher first threshold makes the young ones
    rare; cycles are still collected (docs/perf-notes.md has the figures)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0, gen1, gen2)


async def expire_in_rounds(core: MasterCore) -> int:
    """The lease expiry a tick left over (TickReport.leases_due), one bounded round at a
    time with the loop's other work between rounds: many leases that nobody released,
    due together, then delay each request by one round, not by all of them (the p99 of
    lookups at 8 clients, docs/perf-notes.md). Returns how many leases expired."""
    n, more = 0, True
    while more:
        await asyncio.sleep(0)  # let the requests that came meanwhile in first
        got, more = core.expire_leases()
        n += got
    return n


class MasterDaemon:
    def __init__(self, opts: MasterOptions) -> None:
        self.opts = opts
        self.spec = opts.shard
        self.layout = Layout(opts.cluster, self.spec.index, self.spec.count)
        self.core = MasterCore(opts.core or CoreConfig(), MonotonicClock())
        self.metrics = MasterMetrics(shard=self.spec.index, shards=self.spec.count)
        self.etcd = Etcd(opts.etcd)
        master_id = opts.master_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        metrics = f"{opts.metrics_host}:{opts.metrics_port}" if opts.metrics_port else ""
        self.security = opts.security or DaemonSecurity()
        self.record = MasterRecord(master_id=master_id, address=opts.listen, pid=os.getpid(),
                                   metrics=metrics, tls=self.security.tls)
        self.election = Election(self.etcd, self.layout, self.record, ttl=opts.etcd_lease_ttl)
        self.auth = Authenticator(self.security.access)
        self.service = MasterService(self.core, self.election, self.metrics, self.auth)
        self.service.shard = self.spec
        self.links = NodeLinks(lambda: self.election.epoch, self.security,
                               lambda node, answers: self.core.set_unresponsive(node, not answers),
                               shard=self.spec.index, shards=self.spec.count)
        self.recorder = Recorder(lambda: self.core.take_replica_changes(), self.links,
                                 opts.ack_timeout, self._dram_base)
        self.service.recorder = self.recorder.record
        self.service.durability_counters = self.recorder.counters
        self._fast: FastServer | None = None
        self.live_config = LiveConfig(self.etcd, self.layout)
        self._records: dict[str, NodeRecord] = {}
        self._moves_wanted = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self.server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0). Neither a lost etcd lease nor etcd being
        away ends the process: a master whose lease etcd says is gone stands by and
        campaigns again, with a clean state (`_stand_by`)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload_access)
        self.security.check_exposure(self.opts.listen, self.opts.fast_listen)
        if not await self.etcd.connect_until(self._stop, f"master {self.record.master_id}"):
            return 0
        while True:  # etcd answered just now; a blip here is waited out, not fatal
            try:
                await self.check_shard_count()
                break
            except WrongShardCount:
                raise
            except ETCD_ERRORS as exc:  # (KVStoreError among them: etcd's auth, say)
                log.warning("reading the cluster's shard count from etcd failed (%s); "
                            "retrying", exc)
                await asyncio.sleep(RETRY_PAUSE)
            if self._stop.is_set():
                return 0
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        add_to_server(self.service, self.server)
        add_coordination(self.server, self.service, self.election, self.live_config,
                         lambda: self.core)
        try:
            port = self.security.add_port(self.server, self.opts.listen)
        except RuntimeError as exc:
            raise InvalidArgument(
                f"cannot listen on {self.opts.listen} ({exc}); pick a free port with --listen"
            ) from exc
        if port == 0:
            raise InvalidArgument(f"cannot listen on {self.opts.listen}; pick a free port with --listen")
        await self.server.start()
        tls = self.security.server_tls
        fast = self._fast = FastServer(
            self.service.handle, tls=tls.ssl_context() if tls else None,
            authenticate=self.auth.principal if self.auth.required else None,
            settle=self.service.settle)
        fast_listen = self.opts.fast_listen or join_address(split_address(self.opts.listen)[0], 0)
        try:
            fast_address = await fast.start(fast_listen)
        except (OSError, ValueError) as exc:
            await self.server.stop(grace=0)
            raise InvalidArgument(
                f"cannot listen on {fast_listen} for the fast channel ({exc}); pick a free "
                "port with --fast-listen") from exc
        self.record = replace(self.record, fast=fast_address)
        self.election.record = self.record  # announced with the address by register()
        self.metrics.watch_core(lambda: self.core.stats(), lambda: self.election.is_leader,
                                lambda: self.election.epoch)
        if self.opts.metrics_port:
            self.metrics.serve(self.opts.metrics_port, self.opts.metrics_host)
        log.info("master %s listening on %s (fast channel %s)", self.record.master_id,
                 self.opts.listen, fast_address)
        stop = asyncio.create_task(self._stop.wait(), name="stop")
        while not self._stop.is_set():
            register = asyncio.create_task(self.election.register(), name="register")
            await asyncio.wait({register, stop}, return_when=asyncio.FIRST_COMPLETED)
            if self._stop.is_set():
                register.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await register
                break
            campaign = asyncio.create_task(self.election.campaign(self._on_elected),
                                           name="campaign")
            lost = asyncio.create_task(self.election.lost.wait(), name="lease-lost")
            await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
            for task in (campaign, lost):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, KVStoreError, *ETCD_ERRORS):
                    await task
            if not self._stop.is_set():
                await self._stand_by()
        await self._end_term()
        await fast.close()
        await self.server.stop(grace=0.5)
        await self.election.resign()
        await self.links.close()
        await self.etcd.close()
        log.info("master stopped (exit 0)")
        return 0

    async def check_shard_count(self) -> None:
        """Record this master's shard count in etcd if none is, else check it is the
        recorded one: the count is fixed per cluster (keys would land on other shards)."""
        recorded = await self.etcd.get(self.layout.shard_count)
        if recorded is None:
            if await self.etcd.create_if_absent(self.layout.shard_count,
                                                str(self.spec.count).encode(), 0) is not None:
                log.info("cluster %s: shard count %d recorded in etcd", self.opts.cluster,
                         self.spec.count)
                return
            recorded = await self.etcd.get(self.layout.shard_count)
        count = int(recorded) if recorded else 1
        if count != self.spec.count:
            raise WrongShardCount(
                f"cluster {self.opts.cluster!r} has {count} master shard(s), recorded in "
                f"etcd; this master was started with --shard {self.spec}: start it with "
                f"--shard K/{count} (K from 0 to {count - 1}); the count of a cluster "
                "cannot change")

    def _dram_base(self, node_id: str) -> int | None:
        """A mounted node's DRAM segment base address (intents name offsets in it)."""
        node = self._records.get(node_id)
        return node.base_addr if node is not None and node.tier == "dram" else None

    async def _end_term(self) -> None:
        """Stop what this master ran as leader (membership, ticks, moves)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, KVStoreError, *ETCD_ERRORS):
                await task

    async def _stand_by(self) -> None:
        """etcd said our lease is gone: another master may lead now. Drop the term's
        state (a new term rebuilds it from the store nodes) and campaign again."""
        await self._end_term()
        await self.links.close()
        self.recorder.reset()
        self._records.clear()
        self.core = self.service.core = MasterCore(self.opts.core or CoreConfig(),
                                                   MonotonicClock())
        await self.election.reset()
        log.warning("master %s: standing by; campaigning again", self.record.master_id)

    async def _on_elected(self, epoch: int) -> None:
        """Rebuild the index from the store nodes, then follow membership and tick.

        Runs before this master answers as leader. Lease ids start at `epoch << 32` so
        an id from an older leader never names one of ours. Pins the old leader held
        are unknown here, so nothing is evicted for one maximum lease TTL if anything
        was adopted (etcd's lessor does the same with Promote).
        """
        t0 = time.monotonic()
        config = replace(self.opts.core or CoreConfig(), first_lease_id=epoch << 32)
        config, config_revision = await self.live_config.load(config)
        self.core = self.service.core = MasterCore(config, MonotonicClock())
        self.core.journal = []
        self.recorder.reset()
        if self.security.access is not None:
            self.core.set_quotas(self.security.access.quotas())
        await self.live_config.restore_draining(self.core)
        self.core.on_move_queued = self._moves_wanted.set
        records, revision = await self.etcd.get_prefix(self.layout.nodes)
        proven = await asyncio.gather(*(self._proven(raw) for _key, raw in records))
        nodes = [n for n in (self._mount(raw) for (_key, raw), ok in zip(records, proven,
                                                                        strict=True) if ok)
                 if n is not None]
        adopted = sum(await asyncio.gather(*(self._adopt(n) for n in nodes)))
        if adopted:
            self.core.hold_eviction_until(self.core.clock.now() + config.max_lease_ttl)
        log.info("leader epoch %d: index rebuilt from %d node(s), %d replica(s) adopted in "
                 "%.2f s", epoch, len(nodes), adopted, time.monotonic() - t0)
        self._tasks.append(asyncio.create_task(self._follow_nodes(revision + 1), name="nodes"))
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="tick"))
        self._tasks.append(asyncio.create_task(
            self.live_config.follow(config_revision + 1, lambda: self.core), name="config"))
        self._tasks.append(asyncio.create_task(self._mover_loop(), name="tier-moves"))

    def reload_access(self) -> None:
        """SIGHUP: read the access file again (new or revoked tokens, quotas). Open fast
        connections are closed, so that each authenticates again with the new file."""
        try:
            access = self.auth.reload()
        except KVStoreError as exc:
            log.error("SIGHUP: keeping the access file as it was: %s", exc.message)
            return
        self.security = replace(self.security, access=access)
        self.core.set_quotas(access.quotas())
        if self._fast is not None:
            self._fast.drop_connections()
        log.info("access file %s reloaded: %d token(s), %d tenant(s)", access.source,
                 len(access.principals), len(access.tenants))

    async def _proven(self, raw: bytes) -> bool:
        """Whether the node a record names proved itself (kvstore.master.node_proof); a
        record as mounted already needs no new proof, a bad one is _mount's to log."""
        try:
            record = NodeRecord.decode(raw)
        except (ValueError, TypeError, KeyError):
            return True
        if self._records.get(record.node_id) == record:
            return True
        why = await disproof(self.security, record, self.election.epoch,
                             shard=self.spec.index, shards=self.spec.count)
        if why:
            log.error("ignoring the etcd record of node %s, not mounting it: %s",
                      record.node_id, why, extra={"event": "node_unproven",
                                                  "node": record.node_id})
        return not why

    def _mount(self, raw: bytes, adopting: bool = False) -> str | None:
        """Mount the node a record describes; `adopting`: with no placements on it
        until the caller has replayed its inventory (MasterCore.set_adopting)."""
        node: NodeRecord | None = None
        try:
            node = NodeRecord.decode(raw)
            if adopting:
                self.core.set_adopting(node.node_id, True)
            prev = self._records.get(node.node_id)
            if prev is not None and (prev.pid, prev.segment) != (node.pid, node.segment):
                # The node restarted: it holds only what its inventory will say now.
                self.recorder.forget(self.core.unmount_node(node.node_id))
            start, length = self.spec.part(node.size)
            if self.spec.count > 1 and length < MIN_PART:
                raise InvalidArgument(
                    f"node {node.node_id}'s segment of {node.size} bytes leaves shard "
                    f"{self.spec} only {length} bytes, under the {MIN_PART} a shard needs: "
                    "give the node more memory (--dram) or run fewer shards")
            self.core.mount_segment(node.node_id, node.segment, node.base_addr, length,
                                    node.tier, start)
            ssd = node.ssd_capacity // self.spec.count
            if ssd:
                self.core.mount_segment(node.node_id, f"ssd:{node.node_id}", 0, ssd, "ssd")
            self._records[node.node_id] = node
        except (ValueError, TypeError, KeyError, KVStoreError) as exc:
            log.error("ignoring a bad node record in etcd (%s): %r", exc, raw[:200])
            if node is not None and adopting:
                self.core.set_adopting(node.node_id, False)
            return None
        self.links.set_node(node.node_id, node.service, node.tls, node.deltas)
        log.info("mounted node %s (%s, %d bytes%s)", node.node_id, node.segment, length,
                 f" of {node.size}, shard {self.spec}" if self.spec.count > 1 else "")
        return node.node_id

    async def _adopt(self, node_id: str) -> int:
        """Adopt what a node says it holds; returns how many replicas were taken."""
        replicas = await self.links.inventory(node_id)
        adopted = refused = 0
        if self.spec.count > 1:
            replicas = [r for r in replicas or () if self._ours(node_id, r)]
        for r in replicas or ():
            code = self.core.adopt_replica(r.key, r.size, r.checksum, node_id, r.offset,
                                           r.tier or "dram")
            adopted += code == Code.OK
            if code == Code.INVALID_ARGUMENT and (r.tier or "dram") == "dram":
                # Its range overlaps what this leader placed there meanwhile (or the
                # entry contradicts the index): the node must forget it, or a later
                # leader could adopt it over the newer object.
                self.links.queue(node_id, r, added=False)
                refused += 1
        if refused:
            log.warning("node %s: %d inventory entries refused (ranges in use or a size/"
                        "checksum the index disagrees with); the node drops them", node_id,
                        refused)
            self.links.kick([node_id])
        return adopted

    def _ours(self, node_id: str, r: spb.Replica) -> bool:
        """Whether an inventory entry is this shard's: a DRAM one inside its part of the
        node's segment, an SSD one whose key hashes to it. Another shard's entries are
        left alone (never dropped: that shard's master owns them)."""
        if (r.tier or "dram") != "dram":
            return self.spec.owns(r.key)
        node = self._records.get(node_id)
        if node is None:
            return False
        start, length = self.spec.part(node.size)
        return start <= r.offset and r.offset + r.size <= start + length

    async def _follow_nodes(self, start_revision: int) -> None:
        """Mount and unmount nodes as etcd's membership changes, until cancelled. A
        broken watch (etcd restarted, unreachable for a while) is followed by a fresh
        read of the membership, reconciled with what is mounted, and a new watch."""
        revision = start_revision
        while True:
            try:
                async for ev in self.etcd.watch_prefix(self.layout.nodes, revision):
                    revision = ev.mod_revision + 1
                    await self._on_node_event(ev.kind, ev.key, ev.value, resync=False)
            except ETCD_ERRORS as exc:
                log.warning("watching store nodes in etcd failed (%s); reading them again",
                            exc)
            await asyncio.sleep(RETRY_PAUSE)
            try:
                records, at = await self.etcd.get_prefix(self.layout.nodes)
            except ETCD_ERRORS:
                continue
            seen = {key: raw for key, raw in records}
            for key, raw in seen.items():
                await self._on_node_event("put", key, raw, resync=True)
            for node_id in list(self._records):
                if self.layout.node(node_id) not in seen:
                    await self._on_node_event("delete", self.layout.node(node_id), b"",
                                              resync=True)
            revision = at + 1

    async def _on_node_event(self, kind: str, key: bytes, value: bytes, resync: bool) -> None:
        """One membership change; `resync`: from a fresh read, so a node whose record is
        as mounted already is left as it is."""
        if kind == "put":
            known = self._records.get(key[len(self.layout.nodes):].decode(errors="replace"))
            if not await self._proven(value):
                return
            node_id = self._mount(value, adopting=True)
            if node_id is None:
                return
            try:
                if not (resync and known == self._records.get(node_id)):
                    await self._adopt(node_id)
            finally:
                self.core.set_adopting(node_id, False)
            return
        node_id = key[len(self.layout.nodes):].decode(errors="replace")
        gone = self.core.unmount_node(node_id)
        self.links.drop_node(node_id)
        self.recorder.forget(gone)  # PENDING ones: their intents on other nodes go
        self._records.pop(node_id, None)
        log.warning("node %s is gone (etcd lease ended); %d objects went with it",
                    node_id, len(gone))
        if gone:
            # A verified copy of a lost key may sit on another node's SSD (its data came
            # back under another id, or it held a copy the index did not know of).
            again = sum([await self._adopt(n) for n in list(self._records)
                         if self._records[n].ssd_capacity])
            if again:
                log.info("%d object(s) of node %s adopted again from other nodes' SSDs",
                         again, node_id)

    async def _mover_loop(self) -> None:
        """Carry out tier moves (demotions, promotions) as soon as the core asks."""
        while True:
            await self._moves_wanted.wait()
            self._moves_wanted.clear()
            # Promotions travel apart from demotions: a reader waits for a promotion,
            # and a Move with demotions answers only after the node's SSD flush, which
            # a promotion has no need of.
            groups: dict[tuple[str, bool], list[TierMove]] = {}
            for m in self.core.take_tier_moves():
                groups.setdefault((m.node_id, m.kind == "promote"), []).append(m)
            for (node_id, _), moves in sorted(groups.items(), key=lambda g: not g[0][1]):
                task = asyncio.create_task(self._run_moves(node_id, moves))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    def _queue_deltas(self) -> None:
        queue_changes(self.links, self.core.take_replica_changes())

    async def _run_moves(self, node_id: str, moves: list[TierMove]) -> None:
        # Inventory changes made before these moves reach the node first (see flush_node).
        self._queue_deltas()
        await self.links.flush_node(node_id)
        items = [spb.MoveItem(kind=m.kind, key=m.key, size=m.size, checksum=m.checksum,
                              dram_offset=m.dram_offset, ssd_offset=m.ssd_offset)
                 for m in moves]
        codes = await self.links.move(node_id, items)
        failed: dict[str, int] = {}
        for i, m in enumerate(moves):
            code = Code(codes[i]) if codes else Code.UNAVAILABLE
            if code != Code.OK:
                failed[f"{m.kind} {code.name}"] = failed.get(f"{m.kind} {code.name}", 0) + 1
            self.core.finish_tier_move(m, code)
        if failed:
            # A full or failing SSD shows here (demotions then end as evictions), not as
            # errors to clients: say so where an operator looks.
            log.warning("tier moves on node %s failed: %s", node_id,
                        ", ".join(f"{n} x {what}" for what, n in sorted(failed.items())))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.tick_interval)
            try:
                report = self.core.tick()
                for event in self.core.take_events():
                    if event.kind is EventKind.RECLAIMED:
                        self.recorder.forget(event.keys)
                self._moves_wanted.set()  # eviction in tick() may have queued demotions
                # Frees from the tick's evictions; each node's sender delivers them in
                # the background, so a slow node never delays the tick.
                self._queue_deltas()
                self.links.flush()
                if report.leases_due:
                    await expire_in_rounds(self.core)
            except Exception:  # the loop must survive a bug in one tick
                log.exception("master tick failed")
