"""Live settings: what `kvstore config set` and `kvstore drain` leave in etcd, applied.

`config/<name>` holds one live setting as text (`config/evict_high` = `0.85`); the
leader reads them all when elected, then follows the prefix and swaps the new values
into the running core (MasterCore.reconfigure) without a restart. A deleted key falls
back to the master's command-line value. `draining/<node>` marks a node draining; the
CLI also tells the leader directly, so only a new leader needs to read these.

Bad values never stop a master: a setting that does not parse is skipped, and a set of
settings that is inconsistent as a whole (evict_low above evict_high) is refused and
logged, keeping what was in force.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from kvstore.coord.etcd import Etcd
from kvstore.coord.layout import Layout
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.master.core import CoreConfig, MasterCore
from kvstore.master.core.config import live_settings, parse_setting, with_settings

log = logging.getLogger(__name__)


def settings_from(prefix: bytes, records: list[tuple[bytes, bytes]]) -> dict[str, float]:
    """The parsable live settings among etcd records under `prefix`."""
    out: dict[str, float] = {}
    for key, raw in records:
        name = key[len(prefix):].decode(errors="replace")
        try:
            out[name] = parse_setting(name, raw.decode(errors="replace").strip())
        except InvalidArgument as exc:
            log.warning("ignoring live setting %s from etcd: %s", name, exc.message,
                        extra={"setting": name, "value": raw[:100].decode(errors="replace")})
    return out


class LiveConfig:
    """Reads and follows the live settings of one cluster for the leader."""

    def __init__(self, etcd: Etcd, layout: Layout) -> None:
        self.etcd = etcd
        self.layout = layout
        self.base = CoreConfig()  # the command-line config, before etcd's settings

    def resolve(self, records: list[tuple[bytes, bytes]]) -> CoreConfig:
        """`base` with the settings in `records`; InvalidArgument if they conflict."""
        return with_settings(self.base, settings_from(self.layout.config, records))

    async def load(self, base: CoreConfig) -> tuple[CoreConfig, int]:
        """`base` with etcd's settings, and the revision to follow them from."""
        self.base = base
        records, revision = await self.etcd.get_prefix(self.layout.config)
        try:
            config = self.resolve(records)
        except InvalidArgument as exc:
            log.error("live settings in etcd conflict, using the command line's: %s",
                      exc.message, extra={"event": "config_refused"})
            return base, revision
        if records:
            log.info("live settings from etcd", extra={"event": "config_applied",
                                                       "settings": live_settings(config)})
        return config, revision

    async def restore_draining(self, core: MasterCore) -> list[str]:
        """Mark the nodes etcd says are draining (before they mount)."""
        records, _ = await self.etcd.get_prefix(self.layout.draining)
        nodes = [key[len(self.layout.draining):].decode(errors="replace") for key, _ in records]
        for node_id in nodes:
            core.set_draining(node_id, True, must_exist=False)
        if nodes:
            log.info("nodes draining: %s", ", ".join(nodes), extra={"nodes": nodes})
        return nodes

    async def follow(self, start_revision: int, core: Callable[[], MasterCore]) -> None:
        """Apply every change under config/ to the current core, until cancelled. A
        broken watch is resumed from the revision after the last event seen."""
        revision = start_revision
        while True:
            try:
                async for ev in self.etcd.watch_prefix(self.layout.config, revision):
                    revision = ev.mod_revision + 1
                    records, _ = await self.etcd.get_prefix(self.layout.config)
                    self.apply(records, core())
            except (KVStoreError, OSError, grpc.aio.AioRpcError) as exc:
                log.warning("watching live settings in etcd failed (%s); retrying", exc,
                            extra={"event": "config_watch_failed"})
            await asyncio.sleep(1.0)

    def apply(self, records: list[tuple[bytes, bytes]], core: MasterCore) -> bool:
        try:
            config = self.resolve(records)
            before = live_settings(core.config)
            core.reconfigure(config)
        except InvalidArgument as exc:
            log.error("refused live settings from etcd, keeping those in force: %s",
                      exc.message, extra={"event": "config_refused"})
            return False
        after = live_settings(config)
        changed = {k: v for k, v in after.items() if before[k] != v}
        if changed:
            log.info("live settings changed: %s",
                     ", ".join(f"{k}={v:g}" for k, v in changed.items()),
                     extra={"event": "config_applied", "changed": changed})
        return True

    async def change(self, new: dict[str, float], unset: list[str], core: MasterCore) -> None:
        """The leader's side of `kvstore config set|unset`: check `new` (each value, and
        all of them with the settings in force and the rest of etcd's), write them and
        drop `unset` in one etcd transaction, then apply them here at once (the watch
        applies the same records again, which changes nothing). InvalidArgument names a
        bad value or a conflict; nothing is written then."""
        for name, value in new.items():
            parse_setting(name, repr(value))
        for name in unset:
            parse_setting(name, "1")  # the name only: InvalidArgument for an unknown one
        records, _ = await self.etcd.get_prefix(self.layout.config)
        gone = {self.layout.setting(n) for n in unset}
        puts = {self.layout.setting(k): repr(v).encode() for k, v in new.items()}
        after = [(k, v) for k, v in records if k not in gone and k not in puts]
        after += list(puts.items())
        try:
            self.resolve(after)
        except InvalidArgument as exc:
            held = live_settings(core.config)
            raise InvalidArgument(
                f"{exc.message} (with the settings in force: "
                f"{', '.join(f'{k}={v:g}' for k, v in held.items() if k not in new)}); "
                "set the related values together, e.g. `kvstore config set evict_low 0.5 "
                "evict_high 0.6`") from exc
        await self.etcd.write(puts, sorted(gone))
        self.apply(after, core)
