"""Continuous checked client traffic for the fault scenarios.

Several workers, each with its own `KVStoreClient`, loop over put_many of new keys, get
of one written key and get_many of several (plus one key never written). A value's bytes
are derived from its key (`value_for`), so every read is checked against what was
written, whichever worker wrote it. Three workers are threads of the test process, with
different client settings (same-host memcpy path or Transfer Engine, fast channel or
gRPC, 1 or 2 replicas); one is a separate process. Two of them (the 2-replica thread
and the process) write same-sized values, so their clients put most batches into space
started ahead (one control call per put); the others' varied sizes never do.

Per worker the harness records: calls made, reads that returned the right bytes, misses
(a written key read back as absent), typed errors by class, WRONG BYTES (a read that
returned anything but the written value: must stay 0), exceptions that are not a
`KVStoreError` (bugs), and the longest call. A call still running `bound` seconds after
it started is a hang; the threads are daemons, so a hung call never keeps the test
process alive.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import queue
import random
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_SIZE = 256
MAX_SIZE = 8192
FIXED_SIZE = 4096  # keys with FIXED in them: same-sized values, as KV blocks are
FIXED = b"-fx-"
BATCH = 8


def value_for(key: bytes) -> bytes:
    """The bytes stored under `key`: 256 B to 8 KiB (FIXED_SIZE for a key with FIXED in
    it), a function of the key alone."""
    if FIXED in key:
        size = FIXED_SIZE
    else:
        digest = hashlib.blake2b(key, digest_size=8).digest()
        size = MIN_SIZE + int.from_bytes(digest, "little") % (MAX_SIZE - MIN_SIZE)
    return hashlib.shake_128(key).digest(size)


def describe_wrong(op: str, key: bytes, got: bytes, written: bool) -> str:
    """What a wrong read returned, as far as one can tell from here."""
    t = f"at {time.monotonic():.3f}: {op} {key!r}"
    if not written:
        return f"{t}: a key never written read back as {len(got)} bytes"
    want = value_for(key)
    diff = [i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b]
    return (f"{t}: {len(got)} bytes, expected {len(want)}; {len(diff)} differ"
            + (f", first at {diff[0]}, last at {diff[-1]}" if diff else "")
            + f"; zeros {got.count(0)}")


@dataclass
class WorkerConfig:
    name: str
    etcd: str
    timeout: float
    same_host: bool = True
    transport: str = "fast"
    replicas: int = 0  # 0: the master's default (1)
    seed: int = 0
    # Same-sized values: the client puts them into space it started ahead (one control
    # call per put, see kvstore_client/reservations.py) from its third batch on.
    fixed: bool = False


@dataclass
class WorkerStats:
    name: str
    calls: int = 0
    keys_written: int = 0
    reads_ok: int = 0
    misses: int = 0
    wrong_bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    untyped: list[str] = field(default_factory=list)  # non-KVStoreError exceptions: bugs
    max_call_s: float = 0.0
    max_call_op: str = ""
    started: bool = False  # the client was constructed
    one_call_puts: int = 0  # objects put into space started ahead (client stats)
    wrong: list[str] = field(default_factory=list)  # the first wrong reads, described

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


class Worker:
    """The loop shared by thread and process workers."""

    def __init__(self, cfg: WorkerConfig, read_pool: list[bytes] | None = None) -> None:
        self.cfg = cfg
        self.stats = WorkerStats(cfg.name)
        self.acked: list[tuple[bytes, float]] = []  # (key, when its put returned OK)
        self.read_pool = read_pool or []  # keys written by someone else, also read back
        self.in_call: tuple[str, float] | None = None
        self._rng = random.Random(cfg.seed)

    def _timed(self, op: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        self.in_call = (op, t0)
        try:
            return fn(*args)
        finally:
            took = time.monotonic() - t0
            self.in_call = None
            self.stats.calls += 1
            if took > self.stats.max_call_s:
                self.stats.max_call_s, self.stats.max_call_op = took, op

    def _check(self, key: bytes, got: bytes | None, written: bool, op: str = "") -> None:
        if got is None:
            if written:
                self.stats.misses += 1
        elif written and got == value_for(key):
            self.stats.reads_ok += 1
        else:
            self.stats.wrong_bytes += 1
            if len(self.stats.wrong) < 5:
                self.stats.wrong.append(describe_wrong(op, key, got, written))

    def _pick(self) -> list[bytes]:
        pool = [k for k, _ in self.acked[-2000:]]
        if self.read_pool:
            pool += self._rng.sample(self.read_pool, min(len(self.read_pool), 200))
        return self._rng.sample(pool, min(len(pool), BATCH))

    def run(self, stop: threading.Event | Any) -> None:
        from kvstore_client import KVStoreClient, KVStoreError

        cfg = self.cfg
        try:
            client = KVStoreClient(etcd=cfg.etcd, timeout=cfg.timeout, same_host=cfg.same_host,
                                   transport=cfg.transport, replicas=cfg.replicas,
                                   buffer_size=4 << 20)
        except KVStoreError as exc:
            self.stats.error(exc)
            return
        self.stats.started = True
        n = 0
        with client:
            while not stop.is_set():
                n += 1
                tag = f"{cfg.name}{FIXED.decode() if cfg.fixed else '-'}{n}"
                keys = [f"{tag}-{i}".encode() for i in range(BATCH)]
                try:
                    errs = self._timed("put_many", client.put_many, keys,
                                       [value_for(k) for k in keys])
                    now = time.monotonic()
                    for key, err in zip(keys, errs, strict=True):
                        if err is None:
                            self.acked.append((key, now))
                            self.stats.keys_written += 1
                        else:
                            self.stats.error(err)
                    picked = self._pick()
                    if picked:
                        self._check(picked[0], self._timed("get", client.get, picked[0]), True,
                                    "get")
                        never = f"{cfg.name}-never-{n}".encode()
                        got = self._timed("get_many", client.get_many, [*picked, never])
                        for key, value in zip(picked, got, strict=False):
                            self._check(key, value, True, "get_many")
                        self._check(never, got[-1], False, "get_many")
                except KVStoreError as exc:
                    self.stats.error(exc)
                    time.sleep(0.02)
                except Exception as exc:  # not a typed error: a bug, recorded and asserted on
                    self.stats.untyped.append(f"{type(exc).__name__}: {exc}\n"
                                              + traceback.format_exc(limit=4))
                    time.sleep(0.05)
                self.stats.one_call_puts = client.stats.one_call_puts


def _process_main(cfg: WorkerConfig, stop: Any, out: Any) -> None:
    w = Worker(cfg)
    w.run(stop)
    out.put(asdict(w.stats))


class Traffic:
    """Start workers against a cluster; stop them; collect their stats."""

    def __init__(self, etcd: str, timeout: float, tag: str, read_pool: list[bytes] | None = None,
                 process_worker: bool = True, all_remote: bool = False) -> None:
        self.timeout = timeout
        # Thread workers: the same-host memcpy path, the Transfer Engine with 2 replicas,
        # the Transfer Engine over gRPC control. all_remote: no same-host path at all.
        configs = [
            WorkerConfig(f"{tag}-t0", etcd, timeout, same_host=not all_remote, seed=1),
            WorkerConfig(f"{tag}-t1", etcd, timeout, same_host=False, replicas=2, seed=2,
                         fixed=True),
            WorkerConfig(f"{tag}-t2", etcd, timeout, same_host=False, transport="grpc", seed=3),
        ]
        self.workers = [Worker(c, read_pool) for c in configs]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=w.run, args=(self._stop,), daemon=True,
                                          name=w.cfg.name) for w in self.workers]
        self._proc: Any = None
        self._proc_cfg = WorkerConfig(f"{tag}-p0", etcd, timeout, same_host=not all_remote, seed=4,
                                      fixed=True)
        if process_worker:
            ctx = mp.get_context("spawn")
            self._pstop = ctx.Event()
            self._pout: Any = ctx.Queue()
            self._proc = ctx.Process(target=_process_main, args=(self._proc_cfg, self._pstop,
                                                                 self._pout), daemon=True)
        self.stats: list[WorkerStats] = []
        self.hung: list[str] = []

    def start(self) -> None:
        if self._proc is not None:
            self._proc.start()
        for t in self._threads:
            t.start()

    def acked(self) -> list[tuple[bytes, float, int]]:
        """(key, ack time, replicas asked) of every key the thread workers wrote so far."""
        return [(k, t, w.cfg.replicas or 1) for w in self.workers for k, t in list(w.acked)]

    def wait_running(self, calls: int = 3, timeout: float = 60.0) -> None:
        """Until every thread worker has made a few calls (clients start slowly on 2 cores)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(w.stats.calls >= calls for w in self.workers):
                return
            time.sleep(0.05)
        raise AssertionError(f"traffic did not start: {[asdict(w.stats) for w in self.workers]}")

    def stop(self, bound: float) -> list[WorkerStats]:
        """Stop every worker; a call still running `bound` s after it began is a hang."""
        self._stop.set()
        if self._proc is not None:
            self._pstop.set()
        deadline = time.monotonic() + bound
        for t, w in zip(self._threads, self.workers, strict=True):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                call = w.in_call
                if call is not None and time.monotonic() - call[1] > bound:
                    self.hung.append(f"{w.cfg.name}: {call[0]} running for "
                                     f"{time.monotonic() - call[1]:.1f} s")
                t.join(timeout=max(0.0, (call[1] + bound if call else deadline)
                                   - time.monotonic()))
                if t.is_alive():
                    self.hung.append(f"{w.cfg.name}: did not stop within {bound:.0f} s")
        self.stats = [w.stats for w in self.workers]
        if self._proc is not None:
            try:
                got = self._pout.get(timeout=max(1.0, deadline - time.monotonic()) + 5.0)
                self.stats.append(WorkerStats(**got))
            except queue.Empty:
                self.hung.append(f"{self._proc_cfg.name}: the worker process did not report "
                                 f"within {bound:.0f} s")
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=5)
        return self.stats

    # -- totals ------------------------------------------------------------------------

    def total(self, name: str) -> int:
        return sum(getattr(s, name) for s in self.stats)

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stats:
            for k, v in s.errors.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items()))

    def untyped(self) -> list[str]:
        return [u for s in self.stats for u in s.untyped]

    def max_call(self) -> tuple[float, str]:
        s = max(self.stats, key=lambda s: s.max_call_s)
        return s.max_call_s, f"{s.name} {s.max_call_op}"
