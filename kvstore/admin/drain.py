"""`kvstore drain NODE`: empty a store node so it can be stopped without losing data.

1. The node is marked draining (in etcd, for a future leader, and on the leader): it
   gets no new placements.
2. The leader frees the node's replicas of objects that have another replica elsewhere
   (readers use that one), batch by batch.
3. Objects whose only replica is on the node need their bytes copied, and the master
   never touches bytes: this process reads them with a client (the Mover), removes them and
   puts them again, which places them on the other nodes. Between the remove and the
   put a reader misses them (and recomputes): a cache may miss, never serve wrong bytes.
   With --no-move they are removed and reported gone instead.
4. Pinned objects (a reader holds a lease) and uncommitted puts are waited for, up to
   --wait seconds; whatever is left then is reported.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kvstore.admin.connect import Admin
from kvstore.admin.output import ProgressBar, emit_json, key_json, size
from kvstore.admin.shards import ShardAdmins
from kvstore.coord.etcd import write_keys_sync
from kvstore.errors import Code, InvalidArgument, KVStoreError
from kvstore.v1 import master_pb2 as pb


class Mover(Protocol):
    """Copies sole replicas off a draining node. It moves bytes, so it is a client of the
    store: the `kvstore` command hands one in (kvstore_client.mover.SoleCopyMover), and
    this module never imports the client library."""

    moved: int
    moved_bytes: int
    gone: list[tuple[bytes, str]]  # (key, why)
    skipped: int

    def move(self, sole: Sequence[tuple[bytes, int]]) -> int: ...

    def close(self) -> None: ...


MakeMover = Callable[[argparse.Namespace], Mover]


def _mark(admin: Admin, node_id: str, draining: bool) -> str:
    """Record the mark in etcd (a new leader restores it); a warning when etcd is not
    reachable, since the leader is told directly anyway."""
    key = admin.layout.drain_mark(node_id)
    try:
        if draining:
            write_keys_sync(admin.etcd, {key: b"1"})
        else:
            write_keys_sync(admin.etcd, {}, [key])
    except KVStoreError as exc:
        return f"warning: the mark is not stored in etcd ({exc.message}); a new leader will not know it"
    return ""


def drain(args: argparse.Namespace) -> int:
    node_id = args.node
    if not node_id:
        raise InvalidArgument("name the node to drain, e.g. `kvstore drain node-1`")
    if args.batch < 1:
        raise InvalidArgument(f"--batch must be >= 1, got {args.batch}")
    with ShardAdmins(args) as shards:
        # The mark is cluster-wide (one etcd key every shard's leader restores from), and
        # every shard's leader is told directly, so no shard places on the node any more.
        admin = shards.first
        if args.cancel:
            warning = _mark(admin, node_id, False)
            reply = shards.call_all(
                "SetDraining", pb.SetDrainingRequest(node_id=node_id, draining=False))[-1]
            if args.json:
                emit_json({"node_id": node_id, "draining": False, "draining_nodes": list(reply.draining)})
            else:
                print(f"{node_id} takes new placements again")
            if warning:
                print(warning, file=sys.stderr)
            return 0
        shards.call_all("SetDraining", pb.SetDrainingRequest(node_id=node_id, draining=True))
        warning = _mark(admin, node_id, True)
        make_mover: MakeMover | None = getattr(args, "make_mover", None)
        if make_mover is None:
            raise InvalidArgument("this build of `kvstore` cannot move objects (no client "
                                  "library); use --no-move to drop them instead")
        mover = make_mover(args)
        try:
            # Each shard frees its own replicas on the node; the mover (a client) puts
            # sole copies back through whichever shard owns each key.
            results = [_drain_loop(a, mover, node_id, args) for a in shards.admins]
        finally:
            mover.close()
    result = _sum_results(results)
    if warning:
        result["warning"] = warning
    if args.json:
        emit_json(result)
    else:
        _print_result(result)
    return 0 if result["complete"] else 1


def _drain_loop(admin: Admin, mover: Mover, node_id: str, args: argparse.Namespace) -> dict[str, Any]:
    bar = ProgressBar(f"draining {node_id}", 0, enabled=not args.json)
    deadline = time.monotonic() + args.wait
    dropped = dropped_bytes = 0
    total = -1
    while True:
        r = admin.call("Drain", pb.DrainRequest(node_id=node_id, max_objects=args.batch))
        dropped += r.dropped
        dropped_bytes += r.dropped_bytes
        if total < 0:
            total = r.remaining + r.dropped
        sole = list(zip(r.sole_keys, r.sole_sizes, strict=True))
        progressed = r.dropped
        if sole:
            if args.no_move:
                codes = admin.call("Remove", pb.RemoveRequest(keys=[k for k, _ in sole])).codes
                for (k, _), c in zip(sole, codes, strict=True):
                    if c == Code.OK:
                        mover.gone.append((k, "only replica; dropped (--no-move)"))
                    progressed += c in (Code.OK, Code.NOT_FOUND)
            else:
                progressed += mover.move(sole)
        remaining = max(r.remaining - (progressed - r.dropped), 0)
        total = max(total, dropped + mover.moved + len(mover.gone) + remaining)
        bar.update(total - remaining, f"{dropped} dropped, {mover.moved} moved, "
                   f"{len(mover.gone)} gone, {remaining} left", total=total)
        if r.remaining == 0:
            break
        if not progressed:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)  # pinned or pending: wait for leases to end and puts to commit
    bar.finish()
    return {
        "node_id": node_id,
        "complete": r.remaining == 0,
        "dropped": dropped,  # replicas freed: another replica remains elsewhere
        "dropped_bytes": dropped_bytes,
        "moved": mover.moved,  # only replicas copied to other nodes
        "moved_bytes": mover.moved_bytes,
        "gone": [key_json(k) | {"reason": why} for k, why in mover.gone],
        "remaining": r.remaining,
        "remaining_pinned": r.remaining_pinned,
        "remaining_pending": r.remaining_pending,
    }


def _sum_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One shard's result as it is; several shards' summed (the mover's counts are
    the mover's totals already, the same in every shard's result)."""
    if len(results) == 1:
        return results[0]
    out = dict(results[-1])
    out["complete"] = all(r["complete"] for r in results)
    for name in ("dropped", "dropped_bytes", "remaining", "remaining_pinned", "remaining_pending"):
        out[name] = sum(r[name] for r in results)
    return out


def _print_result(d: dict[str, Any]) -> None:
    print(f"{d['node_id']}: {d['dropped']} extra replicas dropped ({size(d['dropped_bytes'])}), "
          f"{d['moved']} objects moved ({size(d['moved_bytes'])}), {len(d['gone'])} gone")
    for g in d["gone"][:20]:
        print(f"  gone: {g['key']}  ({g['reason']})")
    if len(d["gone"]) > 20:
        print(f"  ... and {len(d['gone']) - 20} more (--json lists them all)")
    if d["complete"]:
        print(f"{d['node_id']} is empty and draining; it can be stopped")
    else:
        print(f"{d['node_id']} still holds {d['remaining']} replicas ({d['remaining_pinned']} pinned "
              f"by leases, {d['remaining_pending']} uncommitted); run drain again later")
    if "warning" in d:
        print(d["warning"])

