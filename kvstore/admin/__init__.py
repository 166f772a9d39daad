"""Admin subcommands of `kvstore`: read and steer a running cluster.

Each reaches the cluster through etcd (`--etcd`, to find the leader) or one master
(`--master`), prints an aligned table for people or `--json` for scripts, and exits 2
with one sentence on a bad argument (any kvstore error), 1 when it ran but could not
finish (a key not found, a target not reached), 0 otherwise.

    status      leader, standbys, epoch, nodes, capacity per tier, objects, hit ratio
    nodes       per node: address, DRAM/SSD use, objects, alive/draining/lost
    capacity    per tier and node, with a bar of pinned / used / free
    evictions   evictions and demotions (last minute, total), watermarks, what blocks them
    keys        keys by prefix;  inspect  one object's state, replicas, pins
    evict       evict down to a fraction of the DRAM pool
    drain       empty a node (no new placements, then move or drop what it holds)
    config      live settings in etcd: get, set, unset

One module per family: cluster.py, objects.py, eviction.py, drain.py, settings.py.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvstore.admin.cluster import capacity, nodes, status
from kvstore.admin.connect import add_connection_args
from kvstore.admin.drain import MakeMover, drain
from kvstore.admin.eviction import evict, evictions
from kvstore.admin.objects import inspect, keys
from kvstore.admin.settings import config_get, config_set, config_unset

__all__ = ["register", "status"]


def register(sub: Any, make_mover: MakeMover | None = None) -> None:
    """Add the admin subcommands to the `kvstore` parser's subparsers. `make_mover`: what
    `drain` copies sole replicas with (a client of the store, handed in by the caller)."""

    def cmd(name: str, help_: str, func: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
        add_connection_args(p)
        p.set_defaults(func=func)
        return p

    cmd("status", "leader, standbys, epoch, nodes, capacity, objects, leases, hit ratio", status)
    cmd("nodes", "store nodes: address, DRAM/SSD use, objects, state", nodes)
    cmd("capacity", "capacity per tier and node, with a used/pinned/free bar", capacity)
    cmd("evictions", "evictions and demotions, watermarks, pinned bytes that blocked eviction",
        evictions)

    k = cmd("keys", "list keys (escaped bytes) by prefix", keys)
    k.add_argument("--prefix", default="", help="keys starting with this (escaped text, or hex with --hex)")
    k.add_argument("--limit", type=int, default=100, help="at most this many (default %(default)s)")
    k.add_argument("--hex", action="store_true", help="--prefix is hex digits")
    _tenant_arg(k)

    i = cmd("inspect", "one object: state, size, replicas, pins, last access", inspect)
    i.add_argument("keys", nargs="+", metavar="KEY",
                   help="the key as `kvstore keys` prints it (\\xNN escapes), or hex with --hex")
    i.add_argument("--hex", action="store_true", help="KEY is hex digits")
    _tenant_arg(i)

    e = cmd("evict", "evict unpinned objects down to a fraction of the DRAM pool", evict)
    e.add_argument("--to", type=float, required=True, metavar="RATIO",
                   help="target used fraction of the DRAM pool, e.g. 0.5")
    e.add_argument("--batch", type=int, default=1000, help="objects per call (default %(default)s)")

    d = cmd("drain", "empty a node: no new placements, then move or drop its objects", drain)
    d.set_defaults(make_mover=make_mover)
    d.add_argument("node", metavar="NODE", help="node id, as `kvstore nodes` shows it")
    d.add_argument("--no-move", action="store_true",
                   help="drop objects whose only replica is on the node instead of copying them")
    d.add_argument("--cancel", action="store_true", help="stop draining: the node takes placements again")
    d.add_argument("--batch", type=int, default=1000, help="objects per step (default %(default)s)")
    d.add_argument("--wait", type=float, default=300.0,
                   help="seconds to wait for pinned objects and pending puts (default %(default)s)")

    c = sub.add_parser("config", help="live settings (etcd): get, set, unset",
                       description="live settings kept in etcd and applied by the leader "
                                   "without a restart")
    csub = c.add_subparsers(dest="config_command", required=True)
    g = csub.add_parser("get", help="settings in force and in etcd")
    add_connection_args(g)
    g.add_argument("names", nargs="*", metavar="NAME")
    g.set_defaults(func=config_get)
    s = csub.add_parser("set", help="set NAME VALUE [NAME VALUE ...]")
    add_connection_args(s)
    s.add_argument("pairs", nargs="+", metavar="NAME VALUE")
    s.add_argument("--wait", type=float, default=5.0,
                   help="seconds to wait for the leader to apply them (default %(default)s)")
    s.set_defaults(func=config_set)
    u = csub.add_parser("unset", help="remove settings from etcd (back to the command line's)")
    add_connection_args(u)
    u.add_argument("names", nargs="+", metavar="NAME")
    u.set_defaults(func=config_unset)


def _tenant_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", default=None,
                   help="a client's keys are stored as TENANT/KEY: also look for KEY under "
                        "this tenant (default: the tenant of the client token in "
                        "$KVSTORE_TOKEN or the credentials file, if any)")
