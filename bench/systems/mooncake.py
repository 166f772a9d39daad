"""Mooncake Store, as the benchmarks drive it: one `MooncakeDistributedStore` client with
no segment of its own (bench/clusters.py), so every byte crosses the Transfer Engine.

- bytes API: put/get, put_batch/get_batch;
- registered buffers: `register_buffer` + put_from/get_into for one key,
  batch_put_from/batch_get_into for many;
- a replayed request: Mooncake has no lease, so batch_is_exist gives the prefix,
  batch_get_into reads it (an object evicted in between is a lost hit) and
  batch_put_from writes the blocks after it that batch_is_exist did not report.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.systems.base import Slots, Step, System


class Mooncake(System):
    name = "mooncake"

    def __init__(self, endpoint: dict[str, str], slots: Slots, local_buffer: int) -> None:
        # A client with no segment and no SSD of its own, also when the store node
        # offloads to SSD: it reads an offloaded object from that node over its offload RPC.
        super().__init__(slots)
        from bench.clusters import MooncakeCluster, mooncake_client

        mc = MooncakeCluster(master=endpoint["master"], metadata=endpoint["metadata"],
                             logs=Path("."))
        self.s = mooncake_client(mc, local_buffer)
        rc = self.s.register_buffer(slots.addr, slots.buf.nbytes)
        if rc != 0:
            raise RuntimeError(f"mooncake register_buffer rc={rc}")

    # -- bytes ------------------------------------------------------------------------------

    def put(self, key: str, value: bytes) -> None:
        rc = self.s.put(key, value)
        if rc != 0:
            raise RuntimeError(f"mooncake put({key}) rc={rc}")

    def get(self, key: str) -> Any:
        return self.s.get(key)

    def put_many(self, keys: list[str], value: bytes) -> None:
        rc = self.s.put_batch(keys, [value] * len(keys))
        if rc != 0:
            raise RuntimeError(f"mooncake put_batch rc={rc}")

    def get_many(self, keys: list[str]) -> list[Any]:
        return list(self.s.get_batch(keys))

    # -- registered buffers ------------------------------------------------------------------

    def put_one_from(self, key: str) -> None:
        rc = self.s.put_from(key, self.slots.src_addr(0), self.slots.size)
        if rc != 0:
            raise RuntimeError(f"mooncake put_from({key}) rc={rc}")

    def get_one_into(self, key: str) -> bool:
        return bool(self.s.get_into(key, self.slots.dst_addr(0), self.slots.size)
                    == self.slots.size)

    def put_from(self, keys: list[str]) -> None:
        n, slots = len(keys), self.slots
        rcs = self.s.batch_put_from(keys, [slots.src_addr(i) for i in range(n)], [slots.size] * n)
        if any(rcs):
            raise RuntimeError(f"mooncake batch_put_from rcs={sorted(set(rcs))}")

    def get_into(self, keys: list[str]) -> list[bool]:
        n, slots = len(keys), self.slots
        got = self.s.batch_get_into(keys, [slots.dst_addr(i) for i in range(n)], [slots.size] * n)
        return [g == slots.size for g in got]

    def remove(self, keys: list[str]) -> None:
        self.s.batch_remove(keys, True)

    # -- one replayed request ----------------------------------------------------------------

    def replay_step(self, keys: list[str]) -> Step:
        s, slots = self.s, self.slots
        bs = slots.size
        clock = time.perf_counter
        t0 = clock()
        exist = s.batch_is_exist(keys)
        t1 = clock()
        n = next((i for i, e in enumerate(exist) if e != 1), len(keys))
        loaded = n
        if n:
            got = s.batch_get_into(keys[:n], [slots.dst_addr(i) for i in range(n)], [bs] * n)
            loaded = next((i for i, g in enumerate(got) if g != bs), n)
            for g in got:
                if g != bs:
                    self.count(f"get rc={g}")
        t2 = clock()
        # The blocks after the loaded prefix that are not stored: the ones that
        # batch_is_exist did not report, and the reported ones that failed to load.
        todo = [i for i in range(loaded, len(keys)) if i < n or exist[i] != 1]
        put_errors = 0
        written = 0
        if todo:
            rcs = s.batch_put_from([keys[i] for i in todo],
                                   [slots.src_addr(j) for j in range(len(todo))], [bs] * len(todo))
            for rc in rcs:
                if rc == 0:
                    written += bs
                else:
                    put_errors += 1
                    self.count(f"put rc={rc}")
        t3 = clock()
        return Step(n, loaded, t1 - t0, t2 - t1, t3 - t2, 0.0, put_errors, loaded * bs, written)

    def ssd_reads(self) -> int:
        """Reads this client has made from a node's SSD offload (offload RPCs; a batch get
        may fetch several objects in one)."""
        count = getattr(self.s, "get_offload_rpc_read_count", None)
        return int(count()) if count is not None else 0

    def info(self) -> dict[str, Any]:
        return {"ssd_reads": self.ssd_reads()}

    def close(self) -> None:
        self.s.close()
