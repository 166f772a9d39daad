"""`kvstore config get|set|unset`: live settings, kept in etcd, applied by the leader.

`set` and `unset` go through the leader (Coordination.SetConfig, an admin token's call):
this command checks each value on its own (a number, in range), the leader checks them
all together with the settings in force (evict_low < evict_high, default_lease_ttl <=
max_lease_ttl), writes them to etcd in one transaction and applies them without a
restart. A bad value is an InvalidArgument: one sentence, exit code 2. Nothing here
writes etcd, so where etcd's auth is on only the daemons may (docs/operations.md).
`set` then waits (up to --wait seconds) until the leader reports them, so a script can
rely on them once it returns. `get` reads etcd's values where its etcd user may.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import grpc

from kvstore.admin.connect import Admin
from kvstore.admin.output import emit_json, table
from kvstore.admin.shards import ShardAdmins
from kvstore.coord.etcd import read_items_sync
from kvstore.errors import Code, InvalidArgument, KVStoreError, Unavailable, error_for
from kvstore.master.core.config import (
    LIVE_SETTINGS,
    parse_setting,
)
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg


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


def _set_at_leader(admin: Admin, request: pb.SetConfigRequest) -> pb.SetConfigResponse:
    """SetConfig at the leader; a standby's NOT_LEADER sends it to etcd's leader once."""
    for attempt in range(2):
        admin._connect()  # finds the leader (etcd, or --master) and opens the channel
        stub = pbg.CoordinationStub(admin._channel)
        try:
            reply = stub.SetConfig(request, timeout=admin.timeout, metadata=admin.creds.metadata())
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise Unavailable(f"the master at {admin.address} cannot change settings "
                                  "(it predates SetConfig); upgrade it to this kvstore "
                                  "version") from exc
            raise Unavailable(f"the master at {admin.address} did not answer SetConfig "
                              f"({exc.code().name}); is it running?") from exc
        if reply.error.code == Code.NOT_LEADER and not admin.fixed and attempt == 0:
            admin.close()
            continue
        if reply.error.code:
            raise error_for(reply.error.code, reply.error.message)
        return reply
    raise AssertionError("unreachable")


def config_get(args: argparse.Namespace) -> int:
    names = _names(args.names)
    with ShardAdmins(args) as shards:
        admin = shards.first  # settings are the cluster's: one leader's values stand for all
        unreadable = ""
        try:
            stored = _stored(admin)
        except (InvalidArgument, Unavailable):
            raise
        except KVStoreError as exc:  # etcd's auth: this user may not read config/
            stored, unreadable = {}, exc.message
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
    if unreadable:
        print(f"(ETCD is unknown: {unreadable})")
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
    with ShardAdmins(args) as shards:
        # One leader stores them in etcd; every shard's leader watches the same keys, so
        # the command waits until each of them reports them in force.
        _set_at_leader(shards.first, pb.SetConfigRequest(
            settings=[pb.ConfigSetting(name=k, value=v) for k, v in new.items()]))
        applied = all([_wait_applied(a, new, args.wait) for a in shards.admins])
    result = {"set": new, "applied": applied}
    if args.json:
        emit_json(result)
    else:
        what = ", ".join(f"{k}={v:g}" for k, v in new.items())
        print(f"{what}: stored in etcd by the leader, " + (
            "applied by the leader" if applied else "not yet reported in force"))
    return 0


def config_unset(args: argparse.Namespace) -> int:
    names = _names(args.names)
    if not args.names:
        raise InvalidArgument("name the settings to unset, e.g. `kvstore config unset evict_high`")
    with ShardAdmins(args) as shards:
        _set_at_leader(shards.first, pb.SetConfigRequest(unset=names))
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
