"""Leader election through etcd: our own campaign, not etcd3aio's Election.

A master grants an etcd lease, then tries to create the leader key bound to that lease
in a transaction guarded by `create_revision == 0`. Whoever creates it leads; its create
revision is the leader *epoch*, which only grows across leaders, so replies carrying it
let clients and store nodes reject an old leader. The others watch the key and try again
when it disappears (the leader's lease lapsed or it resigned).

A leader whose lease is lost steps down at once: `on_lost` fires, and the daemon stops
serving (it exits, so that its supervisor restarts it as a standby with a clean state).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from kvstore.coord.etcd import Etcd
from kvstore.coord.layout import Layout, MasterRecord

log = logging.getLogger(__name__)


class Election:
    def __init__(self, etcd: Etcd, layout: Layout, record: MasterRecord, ttl: int = 5) -> None:
        self.etcd = etcd
        self.layout = layout
        self.record = record
        self.ttl = ttl
        self._is_leader = False
        self._epoch = 0
        self._leader_address = ""
        self.lease_id = 0
        self._keepalive: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()
        # When our etcd lease ends at the latest, by our own clock. A leader paused past
        # it (SIGSTOP, a long GC) must not answer even one call before its keepalive
        # task runs again and finds the lease gone: standbys may already lead.
        self._lease_deadline = 0.0
        self._elected_at = 0.0

    @property
    def is_leader(self) -> bool:
        if not self._is_leader or self.lost.is_set():
            return False
        if time.monotonic() >= self._lease_deadline:
            self._on_lost()
            return False
        return True

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leader_address(self) -> str:
        return self._leader_address

    @property
    def leader_for(self) -> float:
        """Seconds since this master was elected (0 when it does not lead)."""
        return time.monotonic() - self._elected_at if self._elected_at else 0.0

    def _on_lost(self) -> None:
        if self._is_leader:
            log.error("lost the etcd lease while leading (epoch %d): stepping down", self._epoch)
        self._is_leader = False
        self.lost.set()

    def _refreshed(self, loop_deadline: float) -> None:
        # keep_alive reports loop time; asyncio's default loop clock is time.monotonic.
        self._lease_deadline = loop_deadline

    async def register(self) -> None:
        """Grant our lease, keep it alive and announce this master (leader or standby)."""
        granted = time.monotonic()
        self.lease_id = await self.etcd.grant(self.ttl)
        self._lease_deadline = granted + self.ttl
        self._keepalive = asyncio.create_task(
            self.etcd.keep_alive(self.lease_id, self.ttl, self._on_lost, self._refreshed),
            name="master-lease",
        )
        await self.etcd.put(self.layout.master(self.record.master_id), self.record.encode(),
                            lease=self.lease_id)

    async def campaign(self, on_elected: Callable[[int], Awaitable[None]]) -> None:
        """Return once elected (after `on_elected(epoch)` ran), or when the lease is lost."""
        value = self.record.encode()
        while not self.lost.is_set():
            revision = await self.etcd.create_if_absent(self.layout.leader, value, self.lease_id)
            if revision is not None:
                self._epoch = revision
                self._leader_address = self.record.address
                log.info("elected leader, epoch %d", revision)
                await on_elected(revision)
                self._is_leader = True
                self._elected_at = time.monotonic()
                return
            current = await self.etcd.get_with_revision(self.layout.leader)
            if current is None:
                continue
            raw, epoch = current
            self._epoch = epoch
            self._leader_address = MasterRecord.decode(raw).address
            log.info("standby: leader is %s (epoch %d)", self._leader_address, epoch)
            await self._wait_for_vacancy()

    async def _wait_for_vacancy(self) -> None:
        """Return once the leader key is gone (or our own lease is lost).

        The key is read and watched from the revision of that read, so a delete that
        happens between the caller's read and ours is never missed; the watch is also
        re-armed every lease TTL as a backstop against a lost watch stream.
        """
        while not self.lost.is_set():
            kvs, revision = await self.etcd.get_prefix(self.layout.leader)
            if not any(key == self.layout.leader for key, _ in kvs):
                return
            try:
                async with asyncio.timeout(self.ttl):
                    async for ev in self.etcd.watch_prefix(self.layout.leader,
                                                           start_revision=revision + 1):
                        if ev.kind == "delete" and ev.key == self.layout.leader:
                            return
                        if self.lost.is_set():
                            return
            except TimeoutError:
                continue

    async def resign(self) -> None:
        """Give the leadership up at once (clean shutdown), so a standby need not wait."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        self._is_leader = False
        if self.lease_id:
            await self.etcd.revoke(self.lease_id)
