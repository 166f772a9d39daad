"""Leader election races that a slow standby must survive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kvstore.coord.etcd import WatchEvent
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.master.election import Election


class VanishingLeaderEtcd:
    """The old leader's key disappears between the standby's two reads, and the watch
    (started after the delete) never reports it: the standby must still notice."""

    def __init__(self) -> None:
        self.reads = 0

    async def get_prefix(self, prefix: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
        self.reads += 1
        return [], 42  # already gone

    async def watch_prefix(self, prefix: bytes, start_revision: int = 0
                           ) -> AsyncIterator[WatchEvent]:
        await asyncio.sleep(3600)  # the delete happened before start_revision
        yield WatchEvent("delete", prefix, b"", 0)


def test_standby_notices_a_leader_gone_before_its_watch_started() -> None:
    etcd = VanishingLeaderEtcd()
    election = Election(etcd, Layout(), MasterRecord("m", "a:1", 1), ttl=1)  # type: ignore[arg-type]

    async def run() -> None:
        await asyncio.wait_for(election._wait_for_vacancy(), timeout=2)

    asyncio.run(run())
    assert etcd.reads == 1
