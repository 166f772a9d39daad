"""The promise, through SGLang's calls: pages batch_exists reported survive an eviction
flood before batch_get_v1, and the store down is misses and failed writes."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore_client import KVStoreClient
from tests.conftest import Cluster, require_private_netns
from tests.sglang.helpers import PAGE, create, fill, mha_host_pool, page_keys, pages_of, storage_config

MiB = 1 << 20


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Cluster]:
    """One 64 MiB node: a few dozen 1 MiB objects push it past its watermark."""
    require_private_netns()
    c = Cluster(tmp_path)
    c.start_etcd()
    try:
        c.start_master()
        c.start_store("64MiB")
        c.wait_nodes(1)
        yield c
    finally:
        c.stop()


def _flood(cluster: Cluster, tag: str, mib: int = 192) -> None:
    with KVStoreClient(etcd=cluster.etcd) as flood:
        for j in range(0, mib, 16):
            batch = [f"flood-{tag}-{k}".encode() for k in range(j, j + 16)]
            errs = flood.put_many(batch, [bytes([k % 251]) * MiB for k in range(j, j + 16)])
            assert all(e is None for e in errs), errs


def test_reported_pages_survive_a_flood_between_exists_and_get(small: Cluster) -> None:
    wpool, rpool = mha_host_pool(tokens=4096), mha_host_pool(tokens=4096)
    writer = create(storage_config(small.etcd), wpool)
    reader = create(storage_config(small.etcd), rpool)
    try:
        reported, unreported = page_keys(24), page_keys(24)
        src = wpool.alloc(48 * PAGE)
        fill(wpool, src, seed=11)
        assert writer.batch_set_v1(reported + unreported, src) == [True] * 48
        assert reader.batch_exists(reported) == 24  # SGLang's prefetch thread ...
        _flood(small, "a")  # ... another engine fills the store three times over ...
        assert json.loads(small.status().counters_json)["evictions"] > 0
        # The flood did evict what no lease held: pages written at the same time and
        # never reported are gone (so the reported ones survive because of the lease).
        probe = create(storage_config(small.etcd), mha_host_pool())
        try:
            assert probe.batch_exists(unreported) < 24
        finally:
            probe.close()
        dst = rpool.alloc(24 * PAGE)
        assert reader.batch_get_v1(reported, dst) == [True] * 24  # ... then its I/O thread
        for a, b in zip(pages_of(wpool, src[:24 * PAGE]), pages_of(rpool, dst), strict=True):
            assert torch.equal(a, b)
        stats = reader.get_stats().kvstore
        assert stats["leased_reads"] == 24 and stats["pinned_pages"] == 0
    finally:
        writer.close()
        reader.close()


def test_two_requests_with_one_prefix_each_keep_their_own_promise(small: Cluster) -> None:
    wpool, rpool = mha_host_pool(), mha_host_pool()
    writer = create(storage_config(small.etcd), wpool)
    reader = create(storage_config(small.etcd), rpool)
    try:
        keys = page_keys(8)
        src = wpool.alloc(8 * PAGE)
        fill(wpool, src, seed=14)
        assert writer.batch_set_v1(keys, src) == [True] * 8
        assert reader.batch_exists(keys) == 8  # request 1
        assert reader.batch_exists(keys) == 8  # request 2, same prefix
        first = rpool.alloc(8 * PAGE)
        assert reader.batch_get_v1(keys, first) == [True] * 8  # request 1 reads ...
        _flood(small, "c")  # ... the store fills up before request 2 reads
        assert json.loads(small.status().counters_json)["evictions"] > 0
        second = rpool.alloc(8 * PAGE)
        assert reader.batch_get_v1(keys, second) == [True] * 8
        for a, b in zip(pages_of(wpool, src), pages_of(rpool, second), strict=True):
            assert torch.equal(a, b)
        assert reader.get_stats().kvstore["leased_reads"] == 16
    finally:
        writer.close()
        reader.close()


def test_generic_reads_keep_the_promise_too(small: Cluster) -> None:
    wpool, rpool = mha_host_pool(), mha_host_pool()
    writer = create(storage_config(small.etcd), wpool)
    reader = create(storage_config(small.etcd), rpool)
    try:
        keys = page_keys(8)
        src = wpool.alloc(8 * PAGE)
        fill(wpool, src, seed=12)
        assert writer.batch_set_v1(keys, src) == [True] * 8
        assert reader.batch_exists(keys) == 8
        _flood(small, "b")
        targets = [rpool.get_dummy_flat_data_page() for _ in keys]
        got = reader.batch_get(keys, targets)
        for g, want in zip(got, pages_of(wpool, src), strict=True):
            assert g is not None and torch.equal(g.view(torch.uint8), want)
    finally:
        writer.close()
        reader.close()


def _poll(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_store_down_is_misses_and_failed_sets_and_recovers(small: Cluster) -> None:
    pool = mha_host_pool()
    backend = create(storage_config(small.etcd, timeout=1.0, retry_interval=0.5), pool)
    try:
        keys = page_keys(4)
        idx = pool.alloc(4 * PAGE)
        fill(pool, idx, seed=13)
        assert backend.batch_set_v1(keys, idx) == [True] * 4
        assert backend.batch_exists(keys) == 4  # pinned, then the store goes away
        for proc in small.procs:
            if proc.name.startswith(("master", "store")):
                proc.kill(signal.SIGKILL)
        flats = [pool.get_data_page(s) for s in idx[::PAGE].tolist()]
        # What SGLang's threads see: a count, per-page lists of False, False; no exception.
        assert backend.batch_get_v1(keys, idx) == [False] * 4
        assert backend.batch_exists(keys) == 0
        assert backend.batch_set_v1(page_keys(4), idx) == [False] * 4
        assert backend.batch_set(page_keys(4), flats) is False
        assert backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys]) == \
            [None] * 4
        assert backend.exists(keys[0]) is False
        assert backend.clear() is False
        stats = backend.get_stats().kvstore
        assert stats["store_down"] >= 1 and stats["pages_write_failed"] >= 8

        # A new master and store node (the old objects are gone with the node's memory):
        # the same backend writes and finds pages again once the store answers.
        small.masters.clear()
        small.stores.clear()
        small.start_master()
        small.start_store("64MiB")
        small.wait_nodes(1)
        again = page_keys(2)
        _poll(lambda: backend.batch_set_v1(again, idx[:2 * PAGE]) == [True, True],
              "writes to succeed after the store came back")
        assert backend.batch_exists(again) == 2
    finally:
        backend.close()
