"""`kvstore config get|set|unset`: live settings, kept in etcd, applied by the leader.

`set` checks the values before writing anything: each on its own (a number, in range)
and all together with the settings in force (evict_low < evict_high, default_lease_ttl
<= max_lease_ttl). A bad value is an InvalidArgument: one sentence, exit code 2. The
values are written in one etcd transaction; the leader follows the prefix and applies
them without a restart. `set` waits (up to --wait seconds) until the leader reports
them, so a script can rely on them once it returns.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvstore.admin.connect import Admin
from kvstore.admin.output import emit_json, table
from kvstore.coord.etcd import read_items_sync, write_keys_sync
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.master.core.config import (
    LIVE_SETTINGS,
    CoreConfig,
    live_settings,
    parse_setting,
    with_settings,
)
from kvstore.v1 import master_pb2 as pb


def _stored(admin: Admin) -> dict[str, str]:
    """The settings etcd holds, as text (unparsed: `get` shows what is there)."""
    prefix = admin.layout.config
    return {k[len(prefix):].decode(errors="replace"): v.decode(errors="replace")
            for k, v in read_items_sync(admin.etcd, prefix, timeout=min(admin.timeout, 3.0))}


def _in_force(admin: Admin) -> dict[str, float] | None:
    """The settings the leader uses now, or None when no leader answers."""
    try:
        reply = admin.call("GetConfig", pb.GetConfigRequest())
    except KVStoreError:
        return None
    return {s.name: s.value for s in reply.settings}


def _names(given: list[str]) -> list[str]:
    for name in given:
        if name not in LIVE_SETTINGS:
            raise InvalidArgument(
                f"{name!r} is not a live setting; choose one of {', '.join(LIVE_SETTINGS)}")
    return given or list(LIVE_SETTINGS)


def config_get(args: argparse.Namespace) -> int:
    names = _names(args.names)
    with Admin(args) as admin:
        stored = _stored(admin)
        leader = _in_force(admin)
    out: dict[str, Any] = {
        name: {"value": leader.get(name) if leader else None, "etcd": stored.get(name),
               "help": LIVE_SETTINGS[name]}
        for name in names
    }
    if args.json:
        emit_json({"settings": out, "leader": leader is not None})
        return 0
    rows = [["NAME", "IN FORCE", "ETCD", "MEANING"]]
    for name, s in out.items():
        rows.append([name, "?" if s["value"] is None else f"{s['value']:g}",
                     s["etcd"] if s["etcd"] is not None else "-", s["help"]])
    print(table(rows))
    if leader is None:
        print("(no leader answered: IN FORCE is unknown)")
    return 0


def _pairs(items: list[str]) -> dict[str, float]:
    if not items or len(items) % 2:
        raise InvalidArgument("give NAME VALUE pairs, e.g. `kvstore config set evict_high 0.85`")
    out: dict[str, float] = {}
    for name, text in zip(items[::2], items[1::2], strict=True):
        out[name] = parse_setting(name, text)
    return out


def config_set(args: argparse.Namespace) -> int:
    new = _pairs(args.pairs)
    with Admin(args) as admin:
        current = _in_force(admin)
        if current is None:
            # No leader: check against what etcd holds over the defaults.
            current = live_settings(CoreConfig())
            for name, text in _stored(admin).items():
                try:
                    current[name] = parse_setting(name, text)
                except InvalidArgument:
                    continue
        try:
            with_settings(CoreConfig(), {**current, **new})
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"{exc.message} (with the settings in force: "
                f"{', '.join(f'{k}={v:g}' for k, v in current.items() if k not in new)}); "
                "set the related values together, e.g. `kvstore config set evict_low 0.5 "
                "evict_high 0.6`") from exc
        write_keys_sync(admin.etcd, {admin.layout.setting(k): repr(v).encode() for k, v in new.items()})
        applied = _wait_applied(admin, new, args.wait)
    result = {"set": new, "applied": applied}
    if args.json:
        emit_json(result)
    else:
        what = ", ".join(f"{k}={v:g}" for k, v in new.items())
        print(f"{what}: stored in etcd, " + ("applied by the leader" if applied else
              "not yet applied by a leader (it will be when one leads)"))
    return 0


def config_unset(args: argparse.Namespace) -> int:
    names = _names(args.names)
    if not args.names:
        raise InvalidArgument("name the settings to unset, e.g. `kvstore config unset evict_high`")
    with Admin(args) as admin:
        write_keys_sync(admin.etcd, {}, [admin.layout.setting(n) for n in names])
    if args.json:
        emit_json({"unset": names})
    else:
        print(f"{', '.join(names)}: removed from etcd; the leader uses its command-line values")
    return 0


def _wait_applied(admin: Admin, new: dict[str, float], wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        now = _in_force(admin)
        if now is not None and all(abs(now.get(k, float("nan")) - v) < 1e-12 for k, v in new.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
