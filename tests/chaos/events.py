"""The operator events a chaos run draws from, and how each one is applied.

Each event is a function of the cluster, the ledger and a seeded RNG. It records the DRAM
losses it causes in the ledger (the only losses the rules explain), right when they
happen, and returns when the operator's action is over: a kill returns at once (the
supervisor restarts the daemon on its own), an outage returns when it has been undone
(SIGCONT, link up, etcd started again). The time to serve again is counted from then.

Placements are asked for right after a store node is signalled and before anything else
(`place`): the leader still lists the dead node's copies then, since a restarted node
takes seconds to mount, so the objects written just before the kill have a known
placement too.

With several master shards a master event draws its target from the seeded RNG: the
kill -9 or SIGTERM of the leader hits one shard's leader or every shard's at once (each
shard then fails over on its own, side by side), a standby's and SIGSTOP of the leader
one shard's. With one shard nothing is drawn, so a seed draws what it always drew.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.chaos.cluster import ETCD_LEASE_TTL, TRANSIENT, ChaosCluster
from tests.chaos.ledger import Ledger
from tests.chaos.supervisor import Daemon

DELAY = (2.0, 2.0 * ETCD_LEASE_TTL)  # s before a "restart later": below and past the lease
OUTAGE = (1.0, 2.0 * ETCD_LEASE_TTL)  # s a process stays stopped or a link cut
ETCD_LONG = 2.0 * ETCD_LEASE_TTL + 0.5  # s etcd stays down in etcd-down-long


@dataclass
class Applied:
    kind: str
    detail: str
    started: float  # the fault began (the signal, the link down)
    ended: float = 0.0  # the operator's action is over: serving again is counted from here
    lost_nodes: list[str] = field(default_factory=list)  # node ids whose DRAM died


@dataclass
class Ctx:
    cluster: ChaosCluster
    ledger: Ledger
    rng: random.Random
    place: Callable[[], None]  # ask the leader where the unplaced keys are


def _shards(ctx: Ctx, every: bool) -> list[int]:
    """The shards a master event hits: shard 0 with one shard; with several, one drawn
    shard, or (`every` allowed) every shard for half the draws."""
    n = ctx.cluster.shards
    if n == 1:
        return [0]
    if every and ctx.rng.random() < 0.5:
        return list(range(n))
    return [ctx.rng.randrange(n)]


def _signal_master(ctx: Ctx, which: str, sig: int, name: str) -> Applied:
    c = ctx.cluster
    shards = _shards(ctx, every=which == "leader")
    targets = [c.leader(k) if which == "leader" else c.standby(k) for k in shards]
    t = time.monotonic()
    pids = [c.sup.signal(d, sig) for d in targets]
    what = ", ".join(f"{d.name} (pid {pid})" for d, pid in zip(targets, pids, strict=True))
    if c.shards > 1:
        what += (" of every shard" if len(shards) > 1 else f" of shard {shards[0]}")
    a = Applied(name, f"{signal.Signals(sig).name} {which} {what}", t)
    if sig == signal.SIGTERM:
        for d, pid in zip(targets, pids, strict=True):
            c.sup.wait_exit(d, pid)
    a.ended = time.monotonic() if sig == signal.SIGTERM else t
    return a


def _signal_store(ctx: Ctx, sig: int, later: bool, name: str) -> Applied:
    c = ctx.cluster
    d = ctx.rng.choice(c.stores)
    node = c.node_id(d)
    delay = ctx.rng.uniform(*DELAY) if later else 0.0
    t = time.monotonic()
    if sig == signal.SIGTERM:
        # A SIGTERMed node unmounts within milliseconds and the leader forgets its copies
        # at once: where the last objects written were must be asked first, while the
        # node is frozen for a quarter of a second.
        c.sup.signal(d, signal.SIGSTOP)
        ctx.place()
        # Same-host clients still write into the frozen node's memory: a put that began
        # just before the first ask is placed by the second.
        time.sleep(0.25)
        ctx.place()
    pid = c.sup.signal(d, sig, restart_after=delay)
    if sig == signal.SIGTERM:
        c.sup.signal(d, signal.SIGCONT)
    # The DRAM of a SIGTERMed node goes with it too: it unmounts and exits.
    ctx.ledger.dram_lost(node, t, f"{signal.Signals(sig).name} of {node}")
    ctx.place()
    a = Applied(name, f"{signal.Signals(sig).name} {d.name} ({node}, pid {pid}), restarted "
                + (f"after {delay:.1f} s" if later else "at once"), t, lost_nodes=[node])
    if sig == signal.SIGTERM:
        c.sup.wait_exit(d, pid)
    a.ended = time.monotonic() if sig == signal.SIGTERM else t
    return a


def _outage(ctx: Ctx, name: str, d: Daemon, what: str, begin: Callable[[], object],
            end: Callable[[], object], is_store: bool) -> Applied:
    """Hold a fault for a drawn duration; a store node the leader drops meanwhile lost
    its DRAM (it comes back empty)."""
    c = ctx.cluster
    node = c.node_id(d) if is_store else ""
    duration = ctx.rng.uniform(*OUTAGE)
    t = time.monotonic()
    begin()
    a = Applied(name, f"{what} {d.name}{f' ({node})' if node else ''} for {duration:.1f} s", t)
    if is_store:
        ctx.place()
    dropped = False
    try:
        while time.monotonic() < t + duration:
            if is_store and not dropped:
                with contextlib.suppress(*TRANSIENT):
                    dropped = node not in ctx.cluster.alive_nodes()
            time.sleep(0.25)
    finally:
        end()
    a.ended = time.monotonic()
    if is_store and not dropped:
        with contextlib.suppress(*TRANSIENT):
            dropped = node not in ctx.cluster.alive_nodes()
    if dropped:
        ctx.ledger.dram_lost(node, t, f"{node} dropped by the leader during {what.lower()}")
        a.lost_nodes.append(node)
        a.detail += " (the leader dropped it)"
    return a


def _stop(ctx: Ctx, name: str, d: Daemon, is_store: bool) -> Applied:
    return _outage(ctx, name, d, "SIGSTOP", lambda: ctx.cluster.sup.signal(d, signal.SIGSTOP),
                   lambda: ctx.cluster.sup.signal(d, signal.SIGCONT), is_store)


def stop_store(ctx: Ctx) -> Applied:
    return _stop(ctx, "stop-store", ctx.rng.choice(ctx.cluster.stores), True)


def stop_leader(ctx: Ctx) -> Applied:
    return _stop(ctx, "stop-leader", ctx.cluster.leader(_shards(ctx, every=False)[0]), False)


def cut_store(ctx: Ctx) -> Applied:
    c = ctx.cluster
    return _outage(ctx, "cut-store", c.isolated(), "network cut of",
                   lambda: c.cut(True), lambda: c.cut(False), True)


def _etcd(ctx: Ctx, name: str, down: float) -> Applied:
    c = ctx.cluster
    assert c.etcd is not None
    t = time.monotonic()
    pid = c.sup.signal(c.etcd, signal.SIGKILL, restart_after=down)
    a = Applied(name, f"SIGKILL etcd (pid {pid}), restarted after {down:.1f} s", t)
    c.sup.wait_started(c.etcd, pid, timeout=down + 30)
    a.ended = c.etcd.started_at
    return a


EVENTS: dict[str, Callable[[Ctx], Applied]] = {
    "kill9-leader": lambda x: _signal_master(x, "leader", signal.SIGKILL, "kill9-leader"),
    "term-leader": lambda x: _signal_master(x, "leader", signal.SIGTERM, "term-leader"),
    "kill9-standby": lambda x: _signal_master(x, "standby", signal.SIGKILL, "kill9-standby"),
    "term-standby": lambda x: _signal_master(x, "standby", signal.SIGTERM, "term-standby"),
    "kill9-store-now": lambda x: _signal_store(x, signal.SIGKILL, False, "kill9-store-now"),
    "kill9-store-later": lambda x: _signal_store(x, signal.SIGKILL, True, "kill9-store-later"),
    "term-store-now": lambda x: _signal_store(x, signal.SIGTERM, False, "term-store-now"),
    "term-store-later": lambda x: _signal_store(x, signal.SIGTERM, True, "term-store-later"),
    "etcd-restart": lambda x: _etcd(x, "etcd-restart", 0.0),
    "etcd-down-long": lambda x: _etcd(x, "etcd-down-long", ETCD_LONG),
    "stop-store": stop_store,
    "stop-leader": stop_leader,
    "cut-store": cut_store,
}
