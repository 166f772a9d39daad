"""`kvstore keys` and `kvstore inspect`: what the index holds, key by key.

Keys are bytes. They print escaped (printable ASCII as is, the rest as \\xNN), and a key
given on the command line is read the same way, so a key copied from `kvstore keys`
works as it is; `--hex` takes hex digits instead.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvstore.admin.connect import Admin
from kvstore.admin.output import emit_json, escape_key, key_json, parse_key, seconds, size, table
from kvstore.admin.shards import ShardAdmins, merge_keys
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.security.access import SEPARATOR, key_prefix
from kvstore.security.credentials import Credentials
from kvstore.v1 import master_pb2 as pb

_PER_TENANT = ("; keys are per tenant: a client's key KEY is stored as TENANT/KEY (e.g. "
               "dev/KEY on `kvstore up`'s cluster); pass --tenant NAME or the full key")


def object_dict(o: pb.ObjectInfo) -> dict[str, Any]:
    return {
        **key_json(o.key),
        "state": o.state,
        "size": o.size,
        "checksum": f"{o.checksum:016x}",
        "replicas": [{"node_id": r.node_id, "tier": r.tier, "segment": r.segment, "addr": r.addr}
                     for r in o.replicas],
        "pins": o.pins,
        "idle_seconds": round(o.idle_seconds, 3),
        "age_seconds": round(o.age_seconds, 3),
        **({"writer": o.writer} if o.writer else {}),
    }


def tenant_prefix(admin: Admin, args: argparse.Namespace) -> bytes:
    """The prefix a client's keys carry on the master (`TENANT/`), for the tenant named
    by --tenant, else the one of the client token this user's clients present (the
    credentials file's entry, or $KVSTORE_TOKEN); b"" when there is none."""
    name = getattr(args, "tenant", None)
    if name is None:
        token = Credentials.resolve(cluster=admin.creds.entry, role="client").token
        if not token:
            return b""
        try:
            name = admin.call("Authenticate", pb.AuthenticateRequest(token=token)).tenant
        except KVStoreError:
            return b""  # an old master, or a token it does not know: no guess
    return key_prefix(name or "")


def keys(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidArgument(f"--limit must be >= 1, got {args.limit}")
    prefix = parse_key(args.prefix, args.hex) if args.prefix else b""
    asked = prefix
    with ShardAdmins(args) as shards:
        reply = merge_keys(shards.call_all(
            "ListKeys", pb.ListKeysRequest(prefix=prefix, limit=args.limit)), args.limit)
        if not reply.objects and prefix:
            # Keys are per tenant: a client's `block-1` is `dev/block-1` here.
            tenant = tenant_prefix(shards.first, args)
            if tenant and not prefix.startswith(tenant):
                prefix = tenant + prefix
                reply = merge_keys(shards.call_all(
                    "ListKeys", pb.ListKeysRequest(prefix=prefix, limit=args.limit)), args.limit)
    objects = [object_dict(o) for o in reply.objects]
    if args.json:
        emit_json({"epoch": reply.epoch, "prefix": escape_key(prefix), "objects": objects,
                   "truncated": reply.truncated})
        return 0
    if not objects:
        print("no keys" + (f" start with {escape_key(asked)!r}" if asked else "")
              + (f" or {escape_key(prefix)!r}" if prefix != asked else "")
              + (_PER_TENANT if asked and prefix == asked and SEPARATOR not in asked else ""))
        return 0
    if prefix != asked:
        print(f"no keys start with {escape_key(asked)!r}; these are the tenant's keys "
              f"that do (a client's keys are stored as TENANT/KEY):")
    rows = [["KEY", "STATE", "SIZE", "REPLICAS", "PINS", "IDLE"]]
    rows += [[o["key"], o["state"], size(o["size"]),
              ",".join(f"{r['node_id']}/{r['tier']}" for r in o["replicas"]),
              str(o["pins"]), seconds(o["idle_seconds"])] for o in objects]
    print(table(rows, right=[2, 4, 5]))
    if reply.truncated:
        print(f"... more keys match; raise --limit (now {args.limit}) or narrow --prefix")
    return 0


def inspect_keys(shards: ShardAdmins, keys: list[bytes]) -> pb.InspectResponse:
    """Inspect each key at its shard's leader; the items come back in `keys`' order."""
    if len(shards.admins) == 1:
        reply: pb.InspectResponse = shards.first.call("Inspect", pb.KeysRequest(keys=keys))
        return reply
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(shards.for_key(k).shard, []).append(i)
    items: list[pb.InspectItem | None] = [None] * len(keys)
    epoch = 0
    for admin in shards.admins:
        positions = groups.get(admin.shard, [])
        if not positions:
            continue
        part = admin.call("Inspect", pb.KeysRequest(keys=[keys[i] for i in positions]))
        epoch = max(epoch, part.epoch)
        for i, item in zip(positions, part.items, strict=True):
            items[i] = item
    return pb.InspectResponse(epoch=epoch, items=[it for it in items if it is not None])


def inspect(args: argparse.Namespace) -> int:
    wanted = [parse_key(k, args.hex) for k in args.keys]
    with ShardAdmins(args) as shards:
        reply = inspect_keys(shards, wanted)
        found = [(k, item.object if item.code == 0 else None)
                 for k, item in zip(wanted, reply.items, strict=True)]
        missing = [i for i, (_, o) in enumerate(found) if o is None]
        tenant = tenant_prefix(shards.first, args) if missing else b""
        if tenant:
            # Keys are per tenant: look for the missing ones under the tenant's prefix.
            again = inspect_keys(shards, [tenant + wanted[i] for i in missing])
            for i, item in zip(missing, again.items, strict=True):
                if item.code == 0:
                    found[i] = (wanted[i], item.object)  # asked as the tenant named it
    if args.json:
        out = [object_dict(o) | {"found": True} if o is not None else key_json(k) | {"found": False}
               for k, o in found]
        emit_json({"epoch": reply.epoch, "objects": out})
        return 0 if all(o is not None for _, o in found) else 1
    for i, (k, o) in enumerate(found):
        if i:
            print()
        if o is None:
            rows = [["key", escape_key(k)], ["state", "not found"]]
            if SEPARATOR not in k:
                rows.append(["note", _PER_TENANT.lstrip("; ")])
            print(table(rows))
            continue
        if k != o.key:
            tenant_name = o.key.split(SEPARATOR)[0].decode(errors="replace")
            print(f"{escape_key(k)} is tenant {tenant_name!r}'s key {escape_key(o.key)} (keys "
                  "are per tenant: a client's key KEY is stored as TENANT/KEY)")
        d = object_dict(o)
        rows = [
            ["key", d["key"]],
            ["key (hex)", d["key_hex"]],
            ["state", d["state"] + (f" (writer {d['writer']})" if "writer" in d else "")],
            ["size", f"{size(d['size'])} ({d['size']} bytes)"],
            ["checksum", d["checksum"]],
            ["pins", f"{d['pins']} lease(s)" if d["pins"] else "none"],
            ["last access", f"{seconds(d['idle_seconds'])} ago"],
            ["created", f"{seconds(d['age_seconds'])} ago"],
        ]
        for j, r in enumerate(d["replicas"]):
            rows.append(["replicas" if j == 0 else "",
                         f"{r['node_id']}  {r['tier']}  {r['segment']}  0x{r['addr']:x}"])
        print(table(rows))
    return 0 if all(o is not None for _, o in found) else 1
