"""kvstore, as the benchmarks drive it: one `KVStoreClient` in one configuration.

- bytes API: put/get, put_many/get_many;
- registered buffers: `register` + put_from/get_into (one key or many);
- a replayed request: `lookup` (pins the hit prefix under a lease) -> get_into under
  that lease -> put_from the blocks after the prefix -> release.

`Phases` times where the client's time goes (bench.vs_mooncake --phases) through the
client's public `phase_timer` hook.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.systems.base import Slots, Step, System


def _ok(errors: list[Any], what: str) -> None:
    bad = [e for e in errors if e is not None]
    if bad:
        raise RuntimeError(f"{what}: {len(bad)} of {len(errors)} failed, first: {bad[0]!r}")


class Ours(System):
    """Our client. `options` go to KVStoreClient (same_host, placement_memory, ...)."""

    def __init__(self, name: str, etcd: str, slots: Slots, buffer_size: int,
                 lease_ttl: float = 30.0, **options: Any) -> None:
        super().__init__(slots)
        from kvstore_client import KVStoreClient

        self.name = name
        self.c = KVStoreClient(etcd=etcd, buffer_size=buffer_size, **options)
        self.c.register(slots.buf)
        self.lease_ttl = lease_ttl

    # -- bytes ------------------------------------------------------------------------------

    def put(self, key: str, value: bytes) -> None:
        self.c.put(key.encode(), value)

    def get(self, key: str) -> Any:
        return self.c.get(key.encode())

    def put_many(self, keys: list[str], value: bytes) -> None:
        _ok(self.c.put_many([k.encode() for k in keys], [value] * len(keys)), "put_many")

    def get_many(self, keys: list[str]) -> list[Any]:
        return list(self.c.get_many([k.encode() for k in keys]))

    # -- registered buffers ------------------------------------------------------------------

    def put_from(self, keys: list[str]) -> None:
        _ok(self.c.put_from([k.encode() for k in keys],
                            [self.slots.src(i) for i in range(len(keys))]), "put_from")

    def get_into(self, keys: list[str]) -> list[bool]:
        errs = self.c.get_into([k.encode() for k in keys],
                               [self.slots.dst(i) for i in range(len(keys))])
        return [e is None for e in errs]

    def remove(self, keys: list[str]) -> None:
        self.c.remove_many([k.encode() for k in keys], force=True)

    # -- one replayed request ----------------------------------------------------------------

    def replay_step(self, keys: list[str]) -> Step:
        from kvstore_client import KVStoreError

        c = self.c
        clock = time.perf_counter
        bkeys = [k.encode() for k in keys]
        st = c.stats
        read0, written0 = st.bytes_read, st.bytes_written
        t0 = clock()
        lease = c.lookup(bkeys, ttl=self.lease_ttl)
        t1 = clock()
        n = lease.count
        loaded = n
        put_errors = 0
        try:
            if n:
                try:
                    errs = c.get_into(bkeys[:n], [self.slots.dst(i) for i in range(n)],
                                      lease=lease)
                    loaded = next((i for i, e in enumerate(errs) if e is not None), n)
                    for e in errs:
                        if e is not None:
                            self.count(f"load {type(e).__name__}")
                except KVStoreError as exc:
                    self.count(f"load {type(exc).__name__}")
                    loaded = 0
            t2 = clock()
            rest = bkeys[loaded:]
            if rest:
                errs = c.put_from(rest, [self.slots.src(i) for i in range(len(rest))])
                for e in errs:
                    if e is not None:
                        put_errors += 1
                        self.count(f"put {type(e).__name__}")
            t3 = clock()
        finally:
            if lease.id:
                c.release(lease)
        t4 = clock()
        return Step(n, loaded, t1 - t0, t2 - t1, t3 - t2, t4 - t3, put_errors,
                    st.bytes_read - read0, st.bytes_written - written0)

    # -- what the client says about itself ----------------------------------------------------

    def local_transfers(self) -> int | None:
        return int(self.c.stats.local_transfers)

    def early_reads(self) -> tuple[int, int] | None:
        st = self.c.stats
        return int(st.early_reads), int(st.early_wasted)

    def one_call_puts(self) -> tuple[int, int] | None:
        st = self.c.stats
        return int(st.one_call_puts), int(st.puts)

    def info(self) -> dict[str, Any]:
        s = self.c.stats
        return {"local_transfers": s.local_transfers, "errors": s.errors,
                "corrupt_reads": s.corrupt_reads}

    def close(self) -> None:
        self.c.close()


class OtherReader(Ours):
    """Reads what another client wrote: its own `KVStoreClient` (and engine) reads, the
    `writer` puts and removes. It has seen none of the keys, so every get asks where
    before reading, as a second inference engine would; the writer's early reads and
    one-call puts do not help it. Registered with the writer's buffer, so the same
    source and destination slots serve both."""

    def __init__(self, name: str, etcd: str, writer: Ours, buffer_size: int,
                 **options: Any) -> None:
        super().__init__(name, etcd, writer.slots, buffer_size, **options)
        self.writer = writer

    def put(self, key: str, value: bytes) -> None:
        self.writer.put(key, value)

    def put_many(self, keys: list[str], value: bytes) -> None:
        self.writer.put_many(keys, value)

    def put_from(self, keys: list[str]) -> None:
        self.writer.put_from(keys)

    def remove(self, keys: list[str]) -> None:
        self.writer.remove(keys)


# The client's phase names (see KVStoreClient.phase_timer) as --phases prints them.
PHASE_NAMES = {
    "later": "later {} send",       # a refill sent after a commit (reservations.py)
    "settle": "later: read reply",  # ... and its reply, read before the next put
    "start": "transfer submit",
    "finish": "transfer wait",
    "move": "transfer",
    "release": "release (one-way)",
    "wait": "backoff",
    "quick get": "quick get (whole)",  # straight-line code: ask, transfer, checksum inside
}


class Phases:
    """Where our client's time goes (--phases): exclusive wall time per phase, fed by the
    client's `phase_timer` hook. A phase nested in another counts for the inner one alone;
    time in other threads is prefixed "bg:" and overlaps the caller's. What no step covers
    (argument checks, plans, checksums of puts, staging copies, bytes objects) is
    "other" = call - sum; a get's checksums run inside "transfer wait"."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self._local = threading.local()
        self._main = threading.get_ident()

    def install(self, system: Ours) -> None:
        system.c.phase_timer = self

    def __call__(self, phase: str | None) -> None:
        if phase is None:
            self._exit()
            return
        kind, _, method = phase.partition(" ")
        shown = PHASE_NAMES.get(phase) or PHASE_NAMES.get(kind)
        self._enter(shown.format(method) if shown else phase)

    def _enter(self, name: str) -> None:
        now = time.perf_counter()
        stack = self._local.__dict__.setdefault("stack", [])
        if stack:
            top = stack[-1]
            self.acc[top[0]] = self.acc.get(top[0], 0.0) + now - top[1]
        if threading.get_ident() != self._main:
            name = "bg:" + name
        stack.append([name, now])

    def _exit(self) -> None:
        now = time.perf_counter()
        stack = self._local.stack
        name, t0 = stack.pop()
        self.acc[name] = self.acc.get(name, 0.0) + now - t0
        if stack:
            stack[-1][1] = now

    def snapshot(self) -> dict[str, float]:
        return dict(self.acc)

    @staticmethod
    def per_call(before: dict[str, float], after: dict[str, float], calls: int,
                 total: float) -> dict[str, float]:
        """Seconds per call by phase between two snapshots, plus "other" and "call"."""
        out = {k: (v - before.get(k, 0.0)) / calls for k, v in after.items()
               if v - before.get(k, 0.0) > 0}
        out["other"] = max(0.0, total / calls - sum(v for k, v in out.items()
                                                    if not k.startswith("bg:")))
        out["call"] = total / calls
        return out
