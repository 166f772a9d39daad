"""Leader election through etcd: our own campaign, not etcd3aio's Election.

A master grants an etcd lease, then tries to create the leader key bound to that lease
in a transaction guarded by `create_revision == 0`. Whoever creates it leads; its create
revision is the leader *epoch*, which only grows across leaders, so replies carrying it
let clients and store nodes reject an old leader. The others watch the key and try again
when it disappears (the leader's lease lapsed or it resigned).

A leader that cannot confirm its lease (etcd unreachable, or this process was paused
past the lease's deadline) stops answering as leader at once, but does not give up:
etcd keeps leases across its own restart and extends each by its TTL when it comes
back, so the keepalive goes on trying and the leader resumes as soon as etcd confirms
the lease. Only etcd's word that the lease is gone ends the leadership: `lost` is set,
and the daemon becomes a standby in-process and campaigns again (`reset`).

A record that vanishes while its lease lives (an operator's delete, a restore of etcd
from an older backup) is not trusted to mean anything: the master's own record under
`masters/` is put again at once, and a leader whose leader key vanished gives its lease
up and campaigns again, since a standby may already hold the seat under a newer epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from kvstore.coord.etcd import ETCD_ERRORS, Etcd
from kvstore.coord.layout import Layout, MasterRecord

log = logging.getLogger(__name__)

RETRY_PAUSE = 0.5  # s between tries while etcd is away


class Election:
    def __init__(self, etcd: Etcd, layout: Layout, record: MasterRecord, ttl: int = 5) -> None:
        self.etcd = etcd
        self.layout = layout
        self.record = record
        self.ttl = ttl
        self._is_leader = False
        self._epoch = 0
        self._leader_address = ""
        self._leader_record: MasterRecord | None = None
        self.lease_id = 0
        self._keepalive: asyncio.Task[None] | None = None
        self._guards: list[asyncio.Task[None]] = []
        self.lost = asyncio.Event()
        # When our etcd lease ends at the latest, by our own clock. A leader paused past
        # it (SIGSTOP, a long GC) must not answer even one call before its keepalive
        # task runs again and finds the lease gone: standbys may already lead.
        self._lease_deadline = 0.0
        self._elected_at = 0.0

    @property
    def is_leader(self) -> bool:
        """Elected, and the lease is known alive now (by our own clock's deadline)."""
        if not self._is_leader or self.lost.is_set():
            return False
        return time.monotonic() < self._lease_deadline

    @property
    def suspended(self) -> bool:
        """Elected, but the lease's deadline passed unconfirmed: not serving until etcd
        answers (it resumes, or says the lease is gone and we stand by)."""
        return self._is_leader and not self.lost.is_set() and \
            time.monotonic() >= self._lease_deadline

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leader_address(self) -> str:
        return self._leader_address

    @property
    def leader_record(self) -> MasterRecord | None:
        """The record of the master that leads as far as this one knows (None: unknown)."""
        return self._leader_record

    @property
    def leader_for(self) -> float:
        """Seconds since this master was elected (0 when it does not lead)."""
        return time.monotonic() - self._elected_at if self._elected_at else 0.0

    def _on_lost(self) -> None:
        if self._is_leader:
            log.error("etcd says this master's lease is gone (epoch %d): stepping down to "
                      "standby", self._epoch)
        self._is_leader = False
        self.lost.set()

    def _refreshed(self, loop_deadline: float) -> None:
        # keep_alive reports loop time; asyncio's default loop clock is time.monotonic.
        if self.suspended:
            log.warning("etcd confirmed this master's lease again: serving as leader "
                        "(epoch %d)", self._epoch)
        self._lease_deadline = loop_deadline

    async def _stop_guards(self) -> None:
        guards, self._guards = self._guards, []
        for task in guards:
            task.cancel()
        for task in guards:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def reset(self) -> None:
        """After the lease was lost: forget the old term, ready to register again."""
        await self._stop_guards()
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive
            self._keepalive = None
        self._is_leader = False
        self._elected_at = 0.0
        self._leader_address = ""  # until the campaign reads who leads now
        self._leader_record = None
        self.lease_id = 0
        self.lost = asyncio.Event()

    async def register(self) -> None:
        """Grant our lease, keep it alive and announce this master (leader or standby).
        While etcd is unreachable, keeps trying (a line in the log every few tries)."""
        tries = 0
        while True:
            granted = time.monotonic()
            try:
                lease_id = await self.etcd.grant(self.ttl)
                await self.etcd.put(self.layout.master(self.record.master_id),
                                    self.record.encode(), lease=lease_id)
                break
            except ETCD_ERRORS as exc:
                if tries % 10 == 0:
                    log.warning("cannot register this master in etcd at %s (%s); retrying",
                                self.etcd.endpoint, exc)
                tries += 1
                await asyncio.sleep(RETRY_PAUSE)
        self.lease_id = lease_id
        self._lease_deadline = granted + self.ttl
        # confirm_loss: an unreachable etcd never ends the lease (see the module doc).
        self._keepalive = asyncio.create_task(
            self.etcd.keep_alive(self.lease_id, self.ttl, self._on_lost, self._refreshed,
                                 confirm_loss=True),
            name="master-lease",
        )
        self._guards.append(asyncio.create_task(
            self._guard(self.layout.master(self.record.master_id), self._announce_again),
            name="master-record"))

    async def _announce_again(self) -> None:
        log.warning("this master's record in etcd vanished while its lease lives (deleted, "
                    "or etcd restored from a backup): announcing it again")
        await self.etcd.put(self.layout.master(self.record.master_id), self.record.encode(),
                            lease=self.lease_id)

    async def _seat_gone(self) -> None:
        log.error("the leader key vanished under this leader (epoch %d) while its lease "
                  "lives: giving the lease up and campaigning again, since another master "
                  "may lead under a newer epoch", self._epoch)
        await self.etcd.revoke(self.lease_id)
        self._on_lost()

    async def _guard(self, key: bytes, on_gone: Callable[[], Awaitable[None]]) -> None:
        """Call `on_gone` whenever `key` does not hold this master's record, until
        cancelled. The key is read and watched from the revision of that read (a delete
        in between is never missed), and read again every lease TTL in case a watch
        stream was lost."""
        while not self.lost.is_set():
            try:
                kvs, revision = await self.etcd.get_prefix(key)
                if dict(kvs).get(key) != self.record.encode():
                    await on_gone()
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.ttl):
                        async for ev in self.etcd.watch_prefix(key, start_revision=revision + 1):
                            if ev.key == key and (ev.kind == "delete" or
                                                  ev.value != self.record.encode()):
                                break
            except ETCD_ERRORS as exc:
                log.debug("watching %r: %s", key, exc)
                await asyncio.sleep(RETRY_PAUSE)

    async def campaign(self, on_elected: Callable[[int], Awaitable[None]]) -> None:
        """Return once elected (after `on_elected(epoch)` ran), or when the lease is lost."""
        value = self.record.encode()
        while not self.lost.is_set():
            try:
                won = await self._try_once(value)
                if won is not None:
                    await on_elected(won)
                    self._is_leader = True
                    self._elected_at = time.monotonic()
                    self._guards.append(asyncio.create_task(
                        self._guard(self.layout.leader, self._seat_gone), name="leader-key"))
                    return
            except ETCD_ERRORS as exc:
                log.warning("campaign: etcd unreachable (%s); retrying", exc)
                await asyncio.sleep(RETRY_PAUSE)

    async def _try_once(self, value: bytes) -> int | None:
        """One try: our epoch if we won; else None once the seat is free again."""
        revision = await self.etcd.create_if_absent(self.layout.leader, value, self.lease_id)
        if revision is not None:
            self._epoch = revision
            self._leader_address = self.record.address
            self._leader_record = self.record
            log.info("elected leader, epoch %d", revision)
            return revision
        current = await self.etcd.get_with_revision(self.layout.leader)
        if current is None:
            return None
        raw, epoch = current
        holder = MasterRecord.decode(raw)
        self._epoch = epoch
        self._leader_address = holder.address
        self._leader_record = holder
        if holder.master_id == self.record.master_id:
            # Ours already: a try whose rebuild failed (etcd went away meanwhile).
            log.info("the leader key is this master's (epoch %d): taking the seat", epoch)
            return epoch
        log.info("standby: leader is %s (epoch %d)", self._leader_address, epoch)
        await self._wait_for_vacancy()
        return None

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
        await self._stop_guards()
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        self._is_leader = False
        if self.lease_id:
            await self.etcd.revoke(self.lease_id)
