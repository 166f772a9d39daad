"""SGLang calls the backend from three threads at once (prefetch: batch_exists, prefetch
I/O: batch_get_v1, backup: batch_set_v1): one backend, those three loops together."""

from __future__ import annotations

import threading
from typing import Any

import torch

from tests.conftest import Cluster
from tests.sglang.helpers import PAGE, create, fill, mha_host_pool, page_keys, pages_of, storage_config


def test_prefetch_io_and_backup_threads_at_once(store: Cluster) -> None:
    pool = mha_host_pool(tokens=8192)
    backend = create(storage_config(store.etcd, model="threads"), pool)
    errors: list[BaseException] = []
    rounds = 12
    written: list[tuple[list[str], Any]] = []
    ready = threading.Condition()

    def guard(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by the test below
                errors.append(exc)
                with ready:
                    ready.notify_all()
        return run

    @guard
    def backup() -> None:
        for r in range(rounds):
            keys = page_keys(4, tag=f"t{r}")
            idx = pool.alloc(4 * PAGE)
            fill(pool, idx, seed=100 + r)
            assert backend.batch_set_v1(keys, idx) == [True] * 4
            with ready:
                written.append((keys, idx))
                ready.notify_all()

    def wait_for(n: int) -> tuple[list[str], Any]:
        with ready:
            while len(written) <= n and not errors:
                ready.wait(1.0)
            assert not errors
            return written[n]

    found: list[int] = []

    @guard
    def prefetch_and_io() -> None:
        for r in range(rounds):
            keys, src = wait_for(r)
            n = backend.batch_exists(keys)
            found.append(n)
            dst = pool.alloc(4 * PAGE)
            assert backend.batch_get_v1(keys[:n], dst[:n * PAGE]) == [True] * n
            for a, b in zip(pages_of(pool, src[:n * PAGE]), pages_of(pool, dst[:n * PAGE]),
                            strict=True):
                assert torch.equal(a, b)
            pool.free(dst)

    @guard
    def stats() -> None:
        for _ in range(rounds):
            wait_for(0)
            backend.get_stats()

    threads = [threading.Thread(target=f) for f in (backup, prefetch_and_io, stats)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert found == [4] * rounds
        s = backend.get_stats().kvstore
        assert s["pages_written"] == 4 * rounds and s["leased_reads"] == 4 * rounds
        assert s["pinned_pages"] == 0
    finally:
        backend.close()
