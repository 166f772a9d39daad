"""Checked client traffic that runs through every chaos event.

Three worker threads, each with its own `KVStoreClient` (a client is not thread-safe):
1 replica over the same-host path, 2 replicas of same-sized values over the Transfer
Engine (the one-call put path), and 1 replica over gRPC control that also holds leases
(`lookup` pins a few of its keys for seconds, renews, releases: leases live across
events). Values are `tests.faults.traffic.value_for(key)`, so every read is checked
against the key alone. Each worker keeps its working set bounded (LIVE_CAP keys): the
oldest are read back and, if right, removed and retired from the ledger; a key that does
not read back stays for the checks to judge. Nothing is evicted, so no loss is an
eviction (the driver cross-checks the leader's counters).

Every call is bounded by the client's timeout; the loops end when `stop` is set.
A `Probe` puts, reads and removes fresh keys in a loop: the cluster serves when its
rounds succeed.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.ledger import Ledger
from tests.faults.traffic import FIXED, describe_wrong, value_for

TIMEOUT = 5.0  # s: the clients' timeout (each control call and transfer batch)
BATCH = 8
LIVE_CAP = 300  # keys per worker before the oldest are retired
PACE = 0.05  # s between a worker's iterations: the 2 shared cores are not ours alone
LEASE_TTL = 10.0  # s asked for the leases the lease worker holds
HOLD = (1.0, 8.0)  # s a lease is held, uniformly drawn


@dataclass
class WorkerSpec:
    name: str
    replicas: int
    same_host: bool
    transport: str
    fixed: bool = False  # same-sized values: the client's one-call put path
    leases: bool = False


@dataclass
class Stats:
    name: str
    calls: int = 0
    acked: int = 0
    reads_ok: int = 0
    misses: int = 0
    wrong_bytes: int = 0
    wrong: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    untyped: list[str] = field(default_factory=list)
    leases: int = 0
    lease_short: int = 0  # lookups that pinned fewer keys than asked
    retired: int = 0

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


SPECS = [
    WorkerSpec("w0", 1, same_host=True, transport="fast"),
    WorkerSpec("w1", 2, same_host=False, transport="fast", fixed=True),
    WorkerSpec("w2", 1, same_host=False, transport="grpc", leases=True),
]


class Worker:
    def __init__(self, spec: WorkerSpec, endpoint: str, ledger: Ledger, seed: int) -> None:
        self.spec = spec
        self.endpoint = endpoint
        self.ledger = ledger
        self.stats = Stats(spec.name)
        self.rng = random.Random(seed)
        self.mine: deque[bytes] = deque()
        self.lease: Any = None
        self.lease_until = 0.0
        self.thread = threading.Thread(target=self._run, name=f"chaos-{spec.name}", daemon=True)
        self.stop = threading.Event()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.stats.calls += 1
        return fn(*args)

    def _check(self, key: bytes, got: bytes | None, op: str) -> None:
        if got is None:
            self.stats.misses += 1
        elif got == value_for(key):
            self.stats.reads_ok += 1
        else:
            self.stats.wrong_bytes += 1
            if len(self.stats.wrong) < 5:
                self.stats.wrong.append(describe_wrong(op, key, got, True))

    def _run(self) -> None:
        from kvstore_client import KVStoreClient, KVStoreError

        client = None
        n = 0
        while not self.stop.is_set():
            if client is None:
                try:
                    client = KVStoreClient(etcd=self.endpoint, timeout=TIMEOUT,
                                           same_host=self.spec.same_host,
                                           transport=self.spec.transport,
                                           replicas=self.spec.replicas, buffer_size=4 << 20)
                except KVStoreError as exc:
                    self.stats.error(exc)
                    self.stop.wait(0.2)
                    continue
            n += 1
            try:
                self._step(client, n)
            except KVStoreError as exc:
                self.stats.error(exc)
            except Exception as exc:  # not a typed error: a bug, reported by the checks
                self.stats.untyped.append(f"{type(exc).__name__}: {exc}\n"
                                          + traceback.format_exc(limit=4))
            self.stop.wait(PACE)
        if client is not None:
            self._release(client)
            client.close()

    def _step(self, client: Any, n: int) -> None:
        tag = f"{self.spec.name}{FIXED.decode() if self.spec.fixed else '-'}{n}"
        keys = [f"{tag}-{i}".encode() for i in range(BATCH)]
        self.ledger.writing(keys)
        try:
            errs = self._call(client.put_many, keys, [value_for(k) for k in keys])
            now = time.monotonic()
            for key, err in zip(keys, errs, strict=True):
                if err is None:
                    self.ledger.acked(key, now, self.spec.replicas)
                    self.mine.append(key)
                    self.stats.acked += 1
                else:
                    self.stats.error(err)
        finally:
            self.ledger.written(keys)
        if self.mine:
            picked = self.rng.sample(list(self.mine), min(len(self.mine), BATCH))
            for key, got in zip(picked, self._call(client.get_many, picked), strict=True):
                self._check(key, got, "get_many")
        if self.spec.leases:
            self._lease_step(client)
        if len(self.mine) > LIVE_CAP:
            self._retire(client)

    def _lease_step(self, client: Any) -> None:
        from kvstore_client import KVStoreError

        now = time.monotonic()
        if self.lease is not None:
            if now >= self.lease_until:
                self._release(client)
            elif self.lease.expires_at - now < LEASE_TTL / 2:
                try:
                    self._call(client.renew, self.lease, LEASE_TTL)
                except KVStoreError as exc:  # e.g. a new leader: the old pins are gone
                    self.stats.error(exc)
                    self.lease = None
            return
        if len(self.mine) < BATCH:
            return
        # The newest keys: the oldest are the next to be retired, and a pinned key must
        # not be removed under its own lease.
        want = list(self.mine)[-BATCH:]
        lease = self._call(client.lookup, want, LEASE_TTL)
        self.stats.leases += 1
        if lease.count < len(want):
            self.stats.lease_short += 1
        for key, got in zip(lease.keys, self._call(client.get_many, lease.keys), strict=True):
            self._check(key, got, "get_many under a lease")
        self.lease = lease
        self.lease_until = now + self.rng.uniform(*HOLD)

    def _release(self, client: Any) -> None:
        from kvstore_client import KVStoreError

        if self.lease is not None:
            lease, self.lease = self.lease, None
            try:
                self._call(client.release, lease)
            except KVStoreError as exc:
                self.stats.error(exc)

    def _retire(self, client: Any) -> None:
        # Keys the checks counted lost leave the working set without a read.
        if any(self.ledger.state(k) != "live" for k in list(self.mine)[:BATCH * 4]):
            self.mine = deque(k for k in self.mine if self.ledger.state(k) == "live")
        pinned = set(self.lease.keys) if self.lease is not None else set()
        # Up to 4 batches a step: a working set that grew while the cluster was down
        # shrinks back, since each step also puts one batch.
        n = min(len(self.mine) - LIVE_CAP, 4 * BATCH)
        batch = [k for k in list(self.mine)[:n * 2] if k not in pinned][:n]
        if not batch:
            return
        got = self._call(client.get_many, batch)
        right = []
        for key, value in zip(batch, got, strict=True):
            self._check(key, value, "get_many (retire)")
            if value == value_for(key):
                right.append(key)
        # Retired before the remove, so that no check reads a key while it goes; a key
        # that did not read back is kept for the checks to judge.
        for key in right:
            self.ledger.retired(key)
            self.mine.remove(key)
        if right:
            self._call(client.remove_many, right)
            self.stats.retired += len(right)
        # A key missing here goes to the back of `mine` until the checks judge it, so
        # that the keys behind it are retired meanwhile.
        for key in batch:
            if key not in right and key in self.mine:
                self.mine.remove(key)
                self.mine.append(key)


class Traffic:
    def __init__(self, endpoint: str, ledger: Ledger, seed: int) -> None:
        self.workers = [Worker(s, endpoint, ledger, seed * 10 + i) for i, s in enumerate(SPECS)]

    def start(self) -> None:
        for w in self.workers:
            w.thread.start()

    def stop(self, bound: float = 4 * TIMEOUT) -> list[str]:
        """Stop every worker; the names of those still running after `bound` s (hung)."""
        for w in self.workers:
            w.stop.set()
        deadline = time.monotonic() + bound
        for w in self.workers:
            w.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return [w.spec.name for w in self.workers if w.thread.is_alive()]

    def total(self, name: str) -> int:
        return sum(getattr(w.stats, name) for w in self.workers)

    def wrong(self) -> list[str]:
        return [x for w in self.workers for x in w.stats.wrong]

    def untyped(self) -> list[str]:
        return [x for w in self.workers for x in w.stats.untyped]

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.workers:
            for k, v in w.stats.errors.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items()))

    def running(self, calls: int) -> bool:
        return all(w.stats.calls >= calls for w in self.workers)


class Probe:
    """Fresh keys put, read back and removed in a loop; a round succeeds if all did."""

    def __init__(self, endpoint: str, tag: str) -> None:
        self.endpoint = endpoint
        self.tag = tag
        self.rounds: list[tuple[float, float, bool]] = []  # (start, end, ok)
        self.wrong_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-probe", daemon=True)

    def start(self) -> Probe:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from kvstore_client import KVStoreClient, KVStoreError

        client = None
        n = 0
        while not self._stop.is_set():
            t0 = time.monotonic()
            ok = False
            try:
                if client is None:
                    client = KVStoreClient(etcd=self.endpoint, timeout=TIMEOUT, same_host=False)
                n += 1
                keys = [f"{self.tag}-probe-{n}-{i}".encode() for i in range(4)]
                vals = [value_for(k) for k in keys]
                ok = client.put_many(keys, vals) == [None] * 4
                got = client.get_many(keys)
                self.wrong_bytes += sum(1 for g, v in zip(got, vals, strict=True)
                                        if g is not None and g != v)
                ok = ok and got == vals
                client.remove_many(keys)
            except KVStoreError:
                ok = False
            self.rounds.append((t0, time.monotonic(), ok))
            self._stop.wait(0.1)
        if client is not None:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=4 * TIMEOUT)

    def wait_serving(self, since: float, timeout: float, streak: int = 3) -> float:
        """Seconds from `since` until the first of `streak` good rounds in a row (all
        begun after `since` and after every failed round) completed; -1 past `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rounds = [r for r in list(self.rounds) if r[0] >= since]
            fails = [i for i, r in enumerate(rounds) if not r[2]]
            ok_run = rounds[fails[-1] + 1:] if fails else rounds
            if len(ok_run) >= streak:
                return max(0.0, ok_run[0][1] - since)
            time.sleep(0.05)
        return -1.0
