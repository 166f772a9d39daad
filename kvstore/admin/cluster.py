"""`kvstore status`, `kvstore nodes`, `kvstore capacity`: the cluster at a glance."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any

from kvstore.admin.output import BAR_LEGEND, bar, emit_json, pct, ratio_text, seconds, size, table
from kvstore.admin.shards import ShardAdmins, merge_nodes, merge_status
from kvstore.errors import KVStoreError
from kvstore.v1 import master_pb2 as pb

# ------------------------------------------------------------------ status

_PENDING_WHY = ("pending: puts being written, or left by a writer that went away before "
                "committing (a client that died or retried after a failover); those are "
                "reclaimed --put-timeout after they started (`kvstore keys` shows the writer)")


def _segments(nodes: Iterable[pb.NodeStatus]) -> list[dict[str, Any]]:
    return [{"node_id": n.node_id, "segment": n.segment, "tier": n.tier, "capacity": n.capacity,
             "used": n.used, "pinned": n.pinned, "objects": n.objects} for n in nodes]


def _tiers(segments: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for s in segments:
        t = out.setdefault(s["tier"], {"capacity": 0, "used": 0, "pinned": 0, "nodes": 0})
        t["capacity"] += s["capacity"]
        t["used"] += s["used"]
        t["pinned"] += s["pinned"]
        t["nodes"] += 1
    return out


def status_dict(reply: pb.ClusterStatusResponse, standbys: list[dict[str, str]] | None = None,
                leader_id: str = "") -> dict[str, Any]:
    segments = _segments(reply.nodes)
    node_ids = sorted({s["node_id"] for s in segments})
    draining = sorted(reply.draining)
    lookups, hits = reply.recent_lookup_keys, reply.recent_hit_keys
    return {
        "leader": reply.leader,
        "leader_id": leader_id,
        "standbys": standbys,  # None: etcd could not be read
        "epoch": reply.epoch,
        "leader_for_seconds": round(reply.leader_for_seconds, 1),
        "nodes_alive": len(node_ids),
        "nodes_draining": [n for n in draining if n in node_ids],
        "tiers": _tiers(segments),
        "objects": {"complete": reply.objects_complete, "pending": reply.objects_pending},
        "bytes": {"complete": reply.bytes_complete, "pending": reply.bytes_pending},
        "active_leases": reply.active_leases,
        "hit_ratio": {
            "ratio": hits / lookups if lookups else None,
            "lookup_keys": lookups,
            "hit_keys": hits,
            "seconds": round(reply.recent_seconds, 3),
        },
        "nodes": segments,
        "counters": json.loads(reply.counters_json or "{}"),
    }


def status(args: argparse.Namespace) -> int:
    with ShardAdmins(args) as shards:
        replies = shards.call_all("ClusterStatus", pb.ClusterStatusRequest())
        reply = merge_status(replies)
        standbys: list[dict[str, str]] | None = []
        leader_ids: list[str] = []
        for admin, r in zip(shards.admins, replies, strict=True):
            try:
                masters = admin.masters()
            except KVStoreError:
                standbys = None  # etcd unreachable: the leaders' answers still stand
                leader_ids.append("")
                continue
            leader_ids.append(next((m.master_id for m in masters if m.address == r.leader), ""))
            if standbys is not None:
                standbys += [{"master_id": m.master_id, "address": m.address}
                             for m in masters if m.address != r.leader]
        leader_id = ", ".join(i for i in leader_ids if i)
        sharded = shards.sharded
        asked = [a.shard for a in shards.admins]
    info = status_dict(reply, standbys, leader_id)
    per_shard = [{"shard": k, "leader": r.leader, "leader_id": i, "epoch": r.epoch,
                  "leader_for_seconds": round(r.leader_for_seconds, 1),
                  "objects": r.objects_complete}
                 for k, r, i in zip(asked, replies, leader_ids, strict=True)]
    if sharded:
        info["shards"] = per_shard
    if args.json:
        emit_json(info)
        return 0
    if sharded:
        return _print_sharded(info, per_shard)
    rows = [
        ["leader", f"{info['leader']}" + (f" ({leader_id})" if leader_id else "")],
        ["standbys", "unknown (etcd unreachable)" if standbys is None
         else ", ".join(f"{s['address']} ({s['master_id']})" for s in standbys) or "none"],
        ["epoch", str(info["epoch"])],
        ["last failover", f"{info['leader_for_seconds']:.0f} s ago (this leader's term)"],
        ["nodes", f"{info['nodes_alive']} alive"
         + (f", {len(info['nodes_draining'])} draining ({', '.join(info['nodes_draining'])})"
            if info["nodes_draining"] else "")],
    ]
    print(table(rows + _totals_rows(info)))
    return 0


def _totals_rows(info: dict[str, Any]) -> list[list[str]]:
    """The cluster's capacity, objects, leases and hit ratio: the same rows whether one
    shard answered or several were summed."""
    rows = [[f"capacity {tier}", f"{size(t['used'])} used of {size(t['capacity'])} "
             f"({pct(t['used'], t['capacity'])}), {size(t['pinned'])} pinned"]
            for tier, t in sorted(info["tiers"].items())]
    rows.append(["objects", f"{info['objects']['complete']} complete, "
                            f"{info['objects']['pending']} pending "
                            f"({size(info['bytes']['complete'])})"])
    if info["objects"]["pending"]:
        rows.append(["", _PENDING_WHY])
    hr = info["hit_ratio"]
    rows += [
        ["leases", f"{info['active_leases']} active"],
        ["hit ratio", f"{ratio_text(hr['hit_keys'], hr['lookup_keys'])} over the last "
                      f"{seconds(hr['seconds'])} ({hr['hit_keys']}/{hr['lookup_keys']} keys)"],
    ]
    return rows


def _print_sharded(info: dict[str, Any], per_shard: list[dict[str, Any]]) -> int:
    """A sharded cluster: one row per shard's leader (its own epoch and term), then the
    cluster's sums as for one shard."""
    rows = [[f"shard {s['shard']}", f"leader {s['leader']}"
             + (f" ({s['leader_id']})" if s["leader_id"] else "")
             + f", epoch {s['epoch']}, elected {s['leader_for_seconds']:.0f} s ago, "
               f"{s['objects']} objects"] for s in per_shard]
    standbys = info["standbys"]
    rows.append(["standbys", "unknown (etcd unreachable)" if standbys is None
                 else ", ".join(f"{s['address']} ({s['master_id']})" for s in standbys) or "none"])
    rows.append(["nodes", f"{info['nodes_alive']} alive"
                 + (f", {len(info['nodes_draining'])} draining "
                    f"({', '.join(info['nodes_draining'])})" if info["nodes_draining"] else "")])
    print(table(rows + _totals_rows(info)))
    return 0


# ------------------------------------------------------------------ nodes


def _node_dict(n: pb.NodeInfo) -> dict[str, Any]:
    tiers = {s.tier: {"segment": s.segment, "capacity": s.capacity, "used": s.used,
                      "pinned": s.pinned, "objects": s.objects} for s in n.segments}
    dram = tiers.get("dram")
    out: dict[str, Any] = {
        "node_id": n.node_id,
        "state": n.state,
        "address": dram["segment"] if dram else "",
        "objects": n.objects,
        "tiers": tiers,
    }
    if n.state in ("lost", "left"):
        out["gone_seconds"] = round(n.gone_seconds, 3)
        out["objects_lost"] = n.objects_lost
    return out


def _used_of(t: dict[str, int] | None) -> str:
    return f"{size(t['used'])} / {size(t['capacity'])}" if t else "-"


def nodes(args: argparse.Namespace) -> int:
    with ShardAdmins(args) as shards:
        reply = merge_nodes(shards.call_all("NodeList", pb.NodeListRequest()))
    info = [_node_dict(n) for n in reply.nodes]
    if args.json:
        emit_json({"epoch": reply.epoch, "nodes": info})
        return 0
    if not info:
        print("no store nodes")
        return 0
    with_ssd = any("ssd" in n["tiers"] for n in info)
    head = ["NODE", "STATE", "ADDRESS", "DRAM USED / CAP"] + (["SSD USED / CAP"] if with_ssd else [])
    rows = [[*head, "OBJECTS", "NOTE"]]
    for n in info:
        note = ""
        if "gone_seconds" in n:
            note = f"gone {seconds(n['gone_seconds'])} ago, {n['objects_lost']} objects lost with it"
        elif n["state"] == "draining":
            note = "no new placements"
        row = [n["node_id"], n["state"], n["address"], _used_of(n["tiers"].get("dram"))]
        if with_ssd:
            row.append(_used_of(n["tiers"].get("ssd")))
        rows.append([*row, str(n["objects"]), note])
    print(table(rows, right=[len(head)]))
    return 0


# ------------------------------------------------------------------ capacity


def capacity_dict(reply: pb.NodeListResponse) -> dict[str, Any]:
    tiers: dict[str, dict[str, Any]] = {}
    for n in reply.nodes:
        if n.state in ("lost", "left"):
            continue
        for s in n.segments:
            t = tiers.setdefault(s.tier, {"capacity": 0, "used": 0, "pinned": 0, "free": 0,
                                          "nodes": []})
            free = max(s.capacity - s.used, 0)
            t["capacity"] += s.capacity
            t["used"] += s.used
            t["pinned"] += s.pinned
            t["free"] += free
            t["nodes"].append({"node_id": n.node_id, "state": n.state, "capacity": s.capacity,
                               "used": s.used, "pinned": s.pinned, "free": free,
                               "objects": s.objects})
    return tiers


def capacity(args: argparse.Namespace) -> int:
    with ShardAdmins(args) as shards:
        reply = merge_nodes(shards.call_all("NodeList", pb.NodeListRequest()))
    tiers = capacity_dict(reply)
    if args.json:
        emit_json({"epoch": reply.epoch, "tiers": tiers})
        return 0
    if not tiers:
        print("no store nodes")
        return 0
    rows = [["TIER", "NODE", "USED", "PINNED", "FREE", "CAPACITY", "USE", ""]]
    for tier, t in sorted(tiers.items()):
        for n in t["nodes"]:
            rows.append([tier, n["node_id"] + (" (draining)" if n["state"] == "draining" else ""),
                         size(n["used"]), size(n["pinned"]), size(n["free"]), size(n["capacity"]),
                         pct(n["used"], n["capacity"]), bar(n["used"], n["pinned"], n["capacity"])])
        rows.append([tier, "all", size(t["used"]), size(t["pinned"]), size(t["free"]),
                     size(t["capacity"]), pct(t["used"], t["capacity"]),
                     bar(t["used"], t["pinned"], t["capacity"])])
    print(table(rows, right=[2, 3, 4, 5, 6]))
    print(f"\n{BAR_LEGEND}")
    return 0
