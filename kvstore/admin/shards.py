"""The cluster as one: find every shard's leader and merge their replies.

Every store node serves every shard (each shard holds a part of each node's segment),
so a node's capacity and use are the sums of its parts on every shard, and the
cluster's objects, leases and counters are the sums of every shard's. Each `merge_*`
takes the replies of the shards asked (one per shard, in shard order) and returns one
reply of the same type, so the commands print a merged reply the way they print one
shard's; a single reply is returned as it is (one shard prints exactly as before).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from kvstore.admin.connect import Admin
from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb


def parse_count(raw: bytes | None) -> int:
    """`layout.shard_count` as etcd holds it (decimal text); absent means one shard."""
    if raw is None:
        return 1
    try:
        count = int(raw.decode().strip())
    except ValueError:
        raise InvalidArgument(f"the cluster's shard count in etcd is {raw!r}, not a number; "
                              "fix the key or start the masters again") from None
    return max(count, 1)


def shard_count(etcd: str, cluster: str, timeout: float = 3.0) -> int:
    return parse_count(read_key_sync(etcd, Layout(cluster).shard_count, timeout=timeout))


def shards_to_ask(args: argparse.Namespace) -> tuple[list[int], int]:
    """(the shards a command asks, the cluster's count). --master pins one master (its
    own shard); --shard K asks only K; otherwise every shard."""
    wanted = getattr(args, "shard", None)
    if getattr(args, "master", ""):
        return [0], 1
    try:
        count = shard_count(args.etcd, args.cluster, min(getattr(args, "timeout", 10.0), 3.0))
    except InvalidArgument:
        raise
    except KVStoreError:
        count = 1  # etcd unreachable: the leader lookup says so in its own sentence
    if wanted is None:
        return list(range(count)), count
    if not 0 <= wanted < count:
        raise InvalidArgument(f"--shard {wanted}: the cluster has {count} shard(s), "
                              f"numbered 0 to {count - 1}")
    return [wanted], count


class ShardAdmins:
    """One `Admin` per shard a command asks (the shard's leader, found in etcd under its
    own key). With one shard it is exactly one `Admin` as before. A context manager."""

    def __init__(self, args: argparse.Namespace) -> None:
        asked, self.count = shards_to_ask(args)
        self.admins = [Admin(args, k, self.count) for k in asked]

    def __enter__(self) -> ShardAdmins:
        return self

    def __exit__(self, *exc: object) -> None:
        for a in self.admins:
            a.close()

    @property
    def first(self) -> Admin:
        return self.admins[0]

    @property
    def sharded(self) -> bool:
        return self.count > 1

    def call_all(self, method: str, request: Any) -> list[Any]:
        """The same call on every shard asked, in shard order (a shard that cannot be
        reached fails the command with its sentence, naming the shard)."""
        return [a.call(method, request) for a in self.admins]

    def for_key(self, key: bytes) -> Admin:
        """The leader of the key's shard (the first asked when --shard pinned one)."""
        if len(self.admins) == 1:
            return self.admins[0]
        return self.admins[shard_of(key, self.count)]


# ------------------------------------------------------------------ merging


def _sum_segments(into: dict[tuple[str, str], pb.NodeStatus], seg: pb.NodeStatus) -> None:
    key = (seg.node_id, seg.tier)
    if key not in into:
        into[key] = pb.NodeStatus(node_id=seg.node_id, segment=seg.segment, tier=seg.tier)
    t = into[key]
    t.capacity += seg.capacity
    t.used += seg.used
    t.pinned += seg.pinned
    t.objects += seg.objects


def _sum_counters(texts: Sequence[str]) -> str:
    out: dict[str, Any] = {}
    for text in texts:
        for name, value in json.loads(text or "{}").items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = out.get(name, 0) + value
            else:
                out.setdefault(name, value)
    return json.dumps(out) if out else ""


def merge_status(replies: Sequence[pb.ClusterStatusResponse]) -> pb.ClusterStatusResponse:
    """Sums across shards; `leader` lists every shard's leader, `epoch` is the highest
    (each shard has its own: `kvstore status` prints them per shard),
    `leader_for_seconds` the shortest (the latest failover of any shard)."""
    if len(replies) == 1:
        return replies[0]
    segs: dict[tuple[str, str], pb.NodeStatus] = {}
    for r in replies:
        for n in r.nodes:
            _sum_segments(segs, n)
    out = pb.ClusterStatusResponse(
        epoch=max(r.epoch for r in replies),
        leader=", ".join(r.leader for r in replies),
        nodes=list(segs.values()),
        objects_complete=sum(r.objects_complete for r in replies),
        objects_pending=sum(r.objects_pending for r in replies),
        bytes_complete=sum(r.bytes_complete for r in replies),
        bytes_pending=sum(r.bytes_pending for r in replies),
        active_leases=sum(r.active_leases for r in replies),
        counters_json=_sum_counters([r.counters_json for r in replies]),
        recent_lookup_keys=sum(r.recent_lookup_keys for r in replies),
        recent_hit_keys=sum(r.recent_hit_keys for r in replies),
        recent_seconds=min(r.recent_seconds for r in replies),
        draining=sorted({d for r in replies for d in r.draining}),
        leader_for_seconds=min(r.leader_for_seconds for r in replies),
        shard=0,
        shards=max(r.shards for r in replies),
    )
    return out


# A node's state as the worst any shard reports: a shard that lost it lost its part.
_STATE_RANK = {"alive": 0, "draining": 1, "left": 2, "lost": 3}


def merge_nodes(replies: Sequence[pb.NodeListResponse]) -> pb.NodeListResponse:
    if len(replies) == 1:
        return replies[0]
    order: list[str] = []
    merged: dict[str, pb.NodeInfo] = {}
    segs: dict[str, dict[tuple[str, str], pb.NodeStatus]] = {}
    for r in replies:
        for n in r.nodes:
            if n.node_id not in merged:
                order.append(n.node_id)
                merged[n.node_id] = pb.NodeInfo(node_id=n.node_id, state=n.state)
                segs[n.node_id] = {}
            m = merged[n.node_id]
            if _STATE_RANK.get(n.state, 0) > _STATE_RANK.get(m.state, 0):
                m.state = n.state
            m.objects += n.objects
            m.objects_lost += n.objects_lost
            m.gone_seconds = max(m.gone_seconds, n.gone_seconds)
            for s in n.segments:
                _sum_segments(segs[n.node_id], s)
    nodes = []
    for node_id in order:
        m = merged[node_id]
        m.segments.extend(segs[node_id].values())
        nodes.append(m)
    return pb.NodeListResponse(epoch=max(r.epoch for r in replies), nodes=nodes)


def merge_evictions(replies: Sequence[pb.EvictionStatsResponse]) -> pb.EvictionStatsResponse:
    """Counts and the DRAM pool summed; the watermarks are cluster-wide settings (every
    shard's leader applies the same ones), so the first shard's stand for all."""
    if len(replies) == 1:
        return replies[0]
    tiers: dict[str, pb.TierEvictions] = {}
    fields = ("evicted", "evicted_bytes", "recent_evicted", "recent_evicted_bytes", "demoted",
              "demoted_bytes", "recent_demoted", "recent_demoted_bytes")
    for r in replies:
        for t in r.tiers:
            m = tiers.setdefault(t.tier, pb.TierEvictions(tier=t.tier))
            for f in fields:
                setattr(m, f, getattr(m, f) + getattr(t, f))
    first = replies[0]
    return pb.EvictionStatsResponse(
        epoch=max(r.epoch for r in replies),
        tiers=list(tiers.values()),
        evict_high=first.evict_high,
        evict_low=first.evict_low,
        pool_capacity=sum(r.pool_capacity for r in replies),
        pool_used=sum(r.pool_used for r in replies),
        pool_pinned=sum(r.pool_pinned for r in replies),
        pool_pending=sum(r.pool_pending for r in replies),
        blocked=sum(r.blocked for r in replies),
        blocked_bytes=sum(r.blocked_bytes for r in replies),
        blocked_pinned_bytes=sum(r.blocked_pinned_bytes for r in replies),
        held_seconds=max(r.held_seconds for r in replies),
        recent_seconds=min(r.recent_seconds for r in replies),
    )


def merge_keys(replies: Sequence[pb.ListKeysResponse], limit: int) -> pb.ListKeysResponse:
    """Every shard's keys in key byte order, cut at `limit` (0: a hundred, as the master
    reads it); truncated when any shard had more or the merge was cut."""
    if len(replies) == 1:
        return replies[0]
    limit = limit or 100
    objects = sorted((o for r in replies for o in r.objects), key=lambda o: o.key)
    truncated = any(r.truncated for r in replies) or len(objects) > limit
    return pb.ListKeysResponse(epoch=max(r.epoch for r in replies), objects=objects[:limit],
                               truncated=truncated)
