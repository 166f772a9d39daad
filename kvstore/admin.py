"""Admin subcommands: read the cluster through etcd and the leader, print for people or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

import grpc

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Unavailable, error_for
from kvstore.units import format_size
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg


def leader_address(args: argparse.Namespace) -> str:
    if getattr(args, "master", ""):
        return str(args.master)
    raw = read_key_sync(args.etcd, Layout(args.cluster).leader)
    if raw is None:
        raise Unavailable(f"no kvstore master is registered in etcd at {args.etcd}")
    return MasterRecord.decode(raw).address


def cluster_status(address: str, timeout: float = 5.0) -> pb.ClusterStatusResponse:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = pbg.MasterStub(channel).ClusterStatus(pb.ClusterStatusRequest(),
                                                          timeout=timeout)
        except grpc.RpcError as exc:
            raise Unavailable(f"the master at {address} did not answer "
                              f"({exc.code().name})") from exc  # type: ignore[attr-defined]
    if reply.error.code:
        raise error_for(reply.error.code, reply.error.message)
    return reply


def status_dict(reply: pb.ClusterStatusResponse) -> dict[str, Any]:
    return {
        "leader": reply.leader,
        "epoch": reply.epoch,
        "nodes": [
            {"node_id": n.node_id, "segment": n.segment, "tier": n.tier, "capacity": n.capacity,
             "used": n.used, "pinned": n.pinned, "objects": n.objects}
            for n in reply.nodes
        ],
        "objects": {"complete": reply.objects_complete, "pending": reply.objects_pending},
        "bytes": {"complete": reply.bytes_complete, "pending": reply.bytes_pending},
        "active_leases": reply.active_leases,
        "counters": json.loads(reply.counters_json or "{}"),
    }


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def status(args: argparse.Namespace) -> int:
    info = status_dict(cluster_status(leader_address(args)))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    cap = sum(n["capacity"] for n in info["nodes"])
    used = sum(n["used"] for n in info["nodes"])
    print(table([
        ["leader", info["leader"]],
        ["epoch", str(info["epoch"])],
        ["nodes", str(len(info["nodes"]))],
        ["capacity", f"{format_size(used)} used of {format_size(cap)}"],
        ["objects", f"{info['objects']['complete']} complete, {info['objects']['pending']} pending"],
        ["leases", str(info["active_leases"])],
    ]))
    if info["nodes"]:
        print()
        rows = [["NODE", "TIER", "USED", "CAPACITY", "PINNED", "OBJECTS", "SEGMENT"]]
        rows += [[n["node_id"], n["tier"], format_size(n["used"]), format_size(n["capacity"]),
                  format_size(n["pinned"]), str(n["objects"]), n["segment"]]
                 for n in info["nodes"]]
        print(table(rows))
    return 0
