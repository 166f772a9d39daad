"""What every system adapter offers, and the two API views the data-path benchmark
measures through.

An adapter (`System`) wraps one client of one system and speaks three vocabularies:
the bytes API (values are Python bytes), the registered-buffer API (bytes move from and
into a `Slots` buffer registered with the system's Transfer Engine), and one replayed
request (`replay_step`, as a vLLM connector would do it). The benchmarks never call a
client directly: what differs between the systems lives in bench/systems/ours.py and
bench/systems/mooncake.py only.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple


class Slots:
    """One buffer of 2 x `count` slots, each one object long: sources in [0, count),
    destinations in [count, 2 x count). Registered with the system by its adapter."""

    def __init__(self, count: int, max_size: int) -> None:
        import numpy as np

        self.count = max(1, count)
        self.buf = np.zeros(2 * self.count * max_size, dtype=np.uint8)
        self.addr = int(self.buf.ctypes.data)
        self.size = max_size

    def fill(self, value: bytes) -> None:
        """Every source slot holds `value`; slots are `len(value)` long from now on."""
        self.size = len(value)
        view = self.buf.data
        for i in range(self.count):
            view[i * self.size:(i + 1) * self.size] = value

    def src_addr(self, i: int) -> int:
        return self.addr + i * self.size

    def dst_addr(self, i: int) -> int:
        return self.addr + (self.count + i) * self.size

    def src(self, i: int) -> Any:
        return self.buf[i * self.size:(i + 1) * self.size]

    def dst(self, i: int) -> Any:
        lo = (self.count + i) * self.size
        return self.buf[lo:lo + self.size]

    def dst_view(self, i: int) -> memoryview:
        lo = (self.count + i) * self.size
        return self.buf.data[lo:lo + self.size]

    @classmethod
    def random(cls, count: int, size: int) -> Slots:
        """Slots whose sources all hold the same random `size` bytes (the replay's)."""
        slots = cls(count, size)
        slots.fill(os.urandom(size))
        return slots


class Step(NamedTuple):
    """One replayed request, as `replay_step` reports it."""

    lookup_hits: int    # blocks the lookup (or existence check) reported
    hits: int           # blocks loaded: the hit that counts
    lookup_s: float
    load_s: float
    put_s: float
    release_s: float
    put_errors: int
    read_bytes: int
    written_bytes: int


class System:
    """One client of one system. `name` labels its figures ("kvstore-te", "kvstore-shm",
    "mooncake", or "kvstore" in the replay). Failures of the benchmark's own operations
    raise RuntimeError; a replayed request counts its failures in `rc_counts` instead."""

    name = ""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.rc_counts: dict[str, int] = {}

    # bytes API
    def put(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def put_many(self, keys: list[str], value: bytes) -> None:
        raise NotImplementedError

    def get_many(self, keys: list[str]) -> list[Any]:
        raise NotImplementedError

    # registered-buffer API: object i of a call comes from source slot i, lands in
    # destination slot i; a get says per key whether it landed
    def put_one_from(self, key: str) -> None:
        self.put_from([key])

    def get_one_into(self, key: str) -> bool:
        return self.get_into([key])[0]

    def put_from(self, keys: list[str]) -> None:
        raise NotImplementedError

    def get_into(self, keys: list[str]) -> list[bool]:
        raise NotImplementedError

    def remove(self, keys: list[str]) -> None:
        raise NotImplementedError

    # one request of a trace
    def replay_step(self, keys: list[str]) -> Step:
        raise NotImplementedError

    def count(self, what: str, n: int = 1) -> None:
        self.rc_counts[what] = self.rc_counts.get(what, 0) + n

    # what the client says about itself (None: the system has no such thing)
    def local_transfers(self) -> int | None:
        """Objects moved by a same-host memcpy path so far."""
        return None

    def early_reads(self) -> tuple[int, int] | None:
        """Objects read while their location was asked so far: (kept, thrown away)."""
        return None

    def one_call_puts(self) -> tuple[int, int] | None:
        """Objects put so far: (into space started ahead, all)."""
        return None

    def info(self) -> dict[str, Any]:
        """Counters for the replay's report."""
        return {}

    def close(self) -> None:
        pass


class Api:
    """One way of putting and getting objects, as bench.vs_mooncake measures it. `get`
    returns what the caller would hold (bytes, or a view of the buffer read into) so the
    driver can check it, untimed."""

    system = ""   # "kvstore-te", "kvstore-shm" or "mooncake"
    api = ""      # "b" (bytes) or "r" (registered buffers)
    phases: Any = None  # our client's phase timer (bench.systems.ours.Phases), if on

    def prepare(self, value: bytes) -> None:
        self.value = value

    def put(self, key: str) -> None:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def put_many(self, keys: list[str]) -> None:
        raise NotImplementedError

    def get_many(self, keys: list[str]) -> list[Any]:
        raise NotImplementedError

    def remove(self, keys: list[str]) -> None:
        raise NotImplementedError

    def local_transfers(self) -> int | None:
        return None

    def early_reads(self) -> tuple[int, int] | None:
        return None

    def one_call_puts(self) -> tuple[int, int] | None:
        return None


class _View(Api):
    def __init__(self, system: System) -> None:
        self.s = system
        self.system = system.name

    def remove(self, keys: list[str]) -> None:
        self.s.remove(keys)

    def local_transfers(self) -> int | None:
        return self.s.local_transfers()

    def early_reads(self) -> tuple[int, int] | None:
        return self.s.early_reads()

    def one_call_puts(self) -> tuple[int, int] | None:
        return self.s.one_call_puts()


class BytesApi(_View):
    """b: ours put/get and put_many/get_many; Mooncake put/get and put_batch/get_batch."""

    api = "b"

    def put(self, key: str) -> None:
        self.s.put(key, self.value)

    def get(self, key: str) -> Any:
        return self.s.get(key)

    def put_many(self, keys: list[str]) -> None:
        self.s.put_many(keys, self.value)

    def get_many(self, keys: list[str]) -> list[Any]:
        return self.s.get_many(keys)


class RegisteredApi(_View):
    """r: ours put_from/get_into; Mooncake put_from/get_into and batch_put_from/
    batch_get_into. A get returns a view of the destination slot, or None."""

    api = "r"

    def prepare(self, value: bytes) -> None:
        super().prepare(value)
        self.s.slots.fill(value)

    def put(self, key: str) -> None:
        self.s.put_one_from(key)

    def get(self, key: str) -> Any:
        return self.s.slots.dst_view(0) if self.s.get_one_into(key) else None

    def put_many(self, keys: list[str]) -> None:
        self.s.put_from(keys)

    def get_many(self, keys: list[str]) -> list[Any]:
        slots = self.s.slots
        return [slots.dst_view(i) if ok else None for i, ok in enumerate(self.s.get_into(keys))]
