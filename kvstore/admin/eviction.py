"""`kvstore evictions` (what eviction did and what stops it) and `kvstore evict --to R`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvstore.admin.output import ProgressBar, emit_json, pct, seconds, size, table
from kvstore.admin.shards import ShardAdmins, merge_evictions, merge_status
from kvstore.errors import InvalidArgument
from kvstore.v1 import master_pb2 as pb


def evictions_dict(r: pb.EvictionStatsResponse,
                   counters: dict[str, Any] | None = None) -> dict[str, Any]:
    c = counters or {}
    return {
        "pin_capped": {"lookups": int(c.get("pin_capped", 0)),
                       "keys": int(c.get("pin_capped_keys", 0))},
        "epoch": r.epoch,
        "recent_seconds": round(r.recent_seconds, 3),
        "tiers": [{
            "tier": t.tier,
            "evicted": {"recent": t.recent_evicted, "recent_bytes": t.recent_evicted_bytes,
                        "total": t.evicted, "total_bytes": t.evicted_bytes},
            "demoted": {"recent": t.recent_demoted, "recent_bytes": t.recent_demoted_bytes,
                        "total": t.demoted, "total_bytes": t.demoted_bytes},
        } for t in r.tiers],
        "watermarks": {"high": r.evict_high, "low": r.evict_low},
        "pool": {"capacity": r.pool_capacity, "used": r.pool_used, "pinned": r.pool_pinned,
                 "pending": r.pool_pending},
        "blocked": {"count": r.blocked, "bytes": r.blocked_bytes,
                    "pinned_bytes_last": r.blocked_pinned_bytes},
        "held_seconds": round(r.held_seconds, 3),
    }


def evictions(args: argparse.Namespace) -> int:
    with ShardAdmins(args) as shards:
        reply = merge_evictions(shards.call_all("EvictionStats", pb.EvictionStatsRequest()))
        status = merge_status(shards.call_all("ClusterStatus", pb.ClusterStatusRequest()))
    d = evictions_dict(reply, json.loads(status.counters_json or "{}"))
    if args.json:
        emit_json(d)
        return 0
    window = f"last {seconds(d['recent_seconds'])}"
    rows = [["TIER", "EVICTED", f"({window})", "BYTES", "TOTAL", "BYTES", "DEMOTED",
             f"({window})", "TOTAL"]]
    for t in d["tiers"]:
        e, m = t["evicted"], t["demoted"]
        rows.append([t["tier"], str(e["recent"]), "", size(e["recent_bytes"]), str(e["total"]),
                     size(e["total_bytes"]), str(m["recent"]), "", str(m["total"])])
    print(table(rows, right=[1, 3, 4, 5, 6, 8]))
    pool, w, b = d["pool"], d["watermarks"], d["blocked"]
    print()
    rows = [
        ["watermarks", f"start above {100 * w['high']:.0f}%, free down to {100 * w['low']:.0f}% "
                       "of the DRAM pool"],
        ["DRAM pool", f"{size(pool['used'])} used of {size(pool['capacity'])} "
                      f"({pct(pool['used'], pool['capacity'])})"],
        ["pinned", f"{size(pool['pinned'])} (leases; never evicted)"],
        ["pending", f"{size(pool['pending'])} (puts not yet committed)"],
        ["blocked", f"{b['count']} time(s) eviction stopped short, {size(b['bytes'])} it could "
                    f"not free; {size(b['pinned_bytes_last'])} pinned the last time"
         if b["count"] else "never: eviction always reached its target"],
    ]
    capped = d["pin_capped"]
    rows.append(["pin cap", f"{capped['lookups']} lookup(s) cut short, {capped['keys']} key(s) "
                 "not reported (a client or tenant at pin_share of the pool)"
                 if capped["lookups"] else "never reached"])
    if d["held_seconds"]:
        rows.append(["held", f"{seconds(d['held_seconds'])} more (after a master failover)"])
    print(table(rows))
    return 0


def evict(args: argparse.Namespace) -> int:
    """Evict down to --to of the DRAM pool in steps of --batch objects, with progress.
    Exit 0 when the target is reached, 1 when pinned or pending objects (or the
    post-failover hold) stop it short."""
    ratio = args.to
    if not 0.0 <= ratio <= 1.0:
        raise InvalidArgument(f"--to is a fraction of the DRAM pool between 0 and 1, got {ratio:g}")
    if args.batch < 1:
        raise InvalidArgument(f"--batch must be >= 1, got {args.batch}")
    evicted = evicted_bytes = 0
    with ShardAdmins(args) as shards:
        # Each shard evicts its own part of the pool down to the ratio, one after the
        # other: the cluster's pool is then at the ratio too.
        befores = shards.call_all("EvictionStats", pb.EvictionStatsRequest())
        before = merge_evictions(befores)
        start = before.pool_used
        target = int(ratio * before.pool_capacity)
        need = max(start - target, 0)
        bar = ProgressBar("evicting", need, enabled=not args.json, in_bytes=True)
        ends: list[pb.EvictResponse] = []
        shard_start = [b.pool_used for b in befores]
        for i, admin in enumerate(shards.admins):
            while True:
                r = admin.call("Evict", pb.EvictRequest(ratio=ratio, max_objects=args.batch))
                evicted += r.evicted
                evicted_bytes += r.evicted_bytes
                freed = sum(max(b - e.used, 0) for b, e in zip(shard_start, ends, strict=False))
                freed += max(shard_start[i] - r.used, 0)
                bar.update(min(freed, need), f"{evicted} objects")
                if r.reached or r.held or r.evicted == 0:
                    break
            ends.append(r)
    bar.finish()
    if len(ends) > 1:
        r = pb.EvictResponse(evicted=evicted, evicted_bytes=evicted_bytes,
                             used=sum(e.used for e in ends), capacity=sum(e.capacity for e in ends),
                             pinned=sum(e.pinned for e in ends),
                             reached=all(e.reached for e in ends), held=any(e.held for e in ends))
    result = {
        "ratio": ratio,
        "evicted": evicted,
        "evicted_bytes": evicted_bytes,
        "used_before": start,
        "used": r.used,
        "capacity": r.capacity,
        "pinned": r.pinned,
        "reached": r.reached,
        "held": r.held,
    }
    if args.json:
        emit_json(result)
    else:
        print(f"evicted {evicted} objects ({size(evicted_bytes)}); DRAM pool now "
              f"{size(r.used)} of {size(r.capacity)} ({pct(r.used, r.capacity)})")
        if r.held:
            print("not reached: eviction is held after a master failover (one lease TTL); retry later")
        elif not r.reached:
            print(f"not reached: what is left is pinned ({size(r.pinned)} by leases) or pending")
    return 0 if r.reached else 1
