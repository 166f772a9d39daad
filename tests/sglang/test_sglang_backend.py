"""KVStoreHiCacheStorage against a real cluster, built by SGLang's own factory over
SGLang's real host pools: prefix semantics, byte-identical pages (zero-copy v1 and the
generic API), namespaces, MLA writers, bad input, stats and clear."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from kvstore_client import KVStoreClient
from kvstore_sglang import (
    BadKey,
    ConfigError,
    KVStoreHiCacheStorage,
    NotRegistered,
    PageSizeMismatch,
    UnsupportedLayout,
)
from tests.conftest import Cluster
from tests.sglang.helpers import (
    PAGE,
    create,
    fill,
    mha_host_pool,
    mla_host_pool,
    page_keys,
    pages_of,
    storage_config,
)


@pytest.fixture
def engines(store: Cluster) -> Any:
    """Backends made with the factory; closed after the test."""
    made: list[Any] = []

    def make(host_pool: Any = None, **config: Any) -> tuple[Any, Any]:
        pool = host_pool if host_pool is not None else mha_host_pool()
        backend = create(storage_config(store.etcd, **config), pool)
        made.append(backend)
        return backend, pool

    yield make
    for b in made:
        b.close()


def test_the_factory_builds_it_from_the_extra_config(engines: Any) -> None:
    backend, _ = engines()
    assert isinstance(backend, KVStoreHiCacheStorage)
    assert backend.namespace.geometry.objects == 2  # K and V of a page_first MHA page


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_v1_a_fresh_engine_finds_the_prefix_and_reads_identical_pages(engines: Any,
                                                                      layout: str) -> None:
    writer, wpool = engines(mha_host_pool(layout))
    keys = page_keys(6)
    src = wpool.alloc(6 * PAGE)
    fill(wpool, src, seed=1)
    assert writer.batch_set_v1(keys, src) == [True] * 6

    reader, rpool = engines(mha_host_pool(layout))  # another engine, same namespace
    assert reader.batch_exists(keys + page_keys(3)) == 6
    dst = rpool.alloc(6 * PAGE)
    assert not all(torch.equal(a, b) for a, b in zip(pages_of(wpool, src), pages_of(rpool, dst),
                                                     strict=True))
    assert reader.batch_get_v1(keys, dst) == [True] * 6
    for a, b in zip(pages_of(wpool, src), pages_of(rpool, dst), strict=True):
        assert torch.equal(a, b)
    stats = reader.get_stats().kvstore
    assert stats["hits"] == 6 and stats["misses"] == 3 and stats["leased_reads"] == 6
    assert stats["bytes_read"] == 6 * reader.namespace.page_bytes
    assert stats["pinned_pages"] == 0  # read through: the lease is released


def test_a_missing_page_in_the_middle_stops_the_prefix(engines: Any) -> None:
    writer, wpool = engines()
    keys = page_keys(5)
    src = wpool.alloc(5 * PAGE)
    fill(wpool, src, seed=2)
    stored = [0, 1, 3, 4]  # page 2 never written
    sel = torch.cat([src[i * PAGE:(i + 1) * PAGE] for i in stored])
    assert writer.batch_set_v1([keys[i] for i in stored], sel) == [True] * 4
    reader, _ = engines()
    assert reader.batch_exists(keys) == 2
    assert reader.batch_exists(keys[3:]) == 2
    assert reader.exists(keys[4]) and not reader.exists(keys[2])


def test_a_page_stored_in_part_is_no_hit(engines: Any, store: Cluster) -> None:
    writer, wpool = engines()
    keys = page_keys(3)
    src = wpool.alloc(3 * PAGE)
    fill(wpool, src, seed=3)
    assert writer.batch_set_v1(keys, src) == [True] * 3
    # Remove the V object of page 1: its K alone is not a page.
    objs = writer._keys.page_keys(keys[1])
    with KVStoreClient(etcd=store.etcd) as c:
        assert c.remove(objs[1])
    reader, _ = engines()
    assert reader.batch_exists(keys) == 1


def test_generic_api_round_trip_and_shared_objects_with_v1(engines: Any) -> None:
    writer, wpool = engines()
    keys = page_keys(4)
    src = wpool.alloc(4 * PAGE)
    fill(wpool, src, seed=4)
    flat = [wpool.get_data_page(s, flat=True) for s in src[::PAGE].tolist()]
    assert writer.batch_set(keys[:2], flat[:2])  # generic write
    assert writer.set(keys[2], flat[2])
    assert writer.batch_set_v1(keys[3:], src[3 * PAGE:]) == [True]  # zero-copy write

    reader, rpool = engines()
    assert reader.batch_exists(keys) == 4
    targets = [rpool.get_dummy_flat_data_page() for _ in keys]
    got = reader.batch_get(keys, targets)  # generic read of all four
    assert all(g is t for g, t in zip(got, targets, strict=True))
    for g, want in zip(got, pages_of(wpool, src), strict=True):
        assert g is not None and torch.equal(g.view(torch.uint8), want)
    # v1 reads what the generic API wrote (page_first: same objects).
    other, opool = engines()
    dst = opool.alloc(4 * PAGE)
    assert other.batch_exists(keys) == 4
    assert other.batch_get_v1(keys, dst) == [True] * 4
    for a, b in zip(pages_of(wpool, src), pages_of(opool, dst), strict=True):
        assert torch.equal(a, b)
    one = reader.get(keys[0], rpool.get_dummy_flat_data_page())
    assert one is not None and torch.equal(one.view(torch.uint8), pages_of(wpool, src)[0])
    assert reader.get(page_keys(1)[0], rpool.get_dummy_flat_data_page()) is None


def test_other_namespaces_miss(engines: Any) -> None:
    writer, wpool = engines()
    keys = page_keys(3)
    src = wpool.alloc(3 * PAGE)
    fill(wpool, src, seed=5)
    assert writer.batch_set_v1(keys, src) == [True] * 3
    same, _ = engines()
    assert same.batch_exists(keys) == 3
    for name, other in [
        ("another model", engines(model="other-model")),
        ("another TP rank", engines(tp_rank=1, tp_size=2)),
        ("another TP size", engines(tp_rank=0, tp_size=2)),
        ("another page size", engines(mha_host_pool(page_size=32))),
        ("another layout", engines(mha_host_pool("page_first_direct"))),
        ("another dtype", engines(mha_host_pool(dtype=torch.bfloat16))),
    ]:
        assert other[0].batch_exists(keys) == 0, name
    # model_id overrides SGLang's model name, to share across differently named paths.
    alias, _ = engines(model="/models/elsewhere/tiny-llama", model_id="tiny-llama")
    assert alias.namespace.digest == same.namespace.digest
    assert alias.batch_exists(keys) == 3
    path, _ = engines(model="/models/elsewhere/tiny-llama")
    assert path.batch_exists(keys) == 0


def test_mla_one_writer_per_group_and_every_rank_reads(engines: Any) -> None:
    keys = page_keys(3)
    r0, p0 = engines(mla_host_pool(), mla=True, tp_rank=0, tp_size=2)
    r1, p1 = engines(mla_host_pool(), mla=True, tp_rank=1, tp_size=2)
    assert r0.namespace.digest == r1.namespace.digest  # MLA KV is the same on every rank
    assert r0.namespace.geometry.objects == 1
    src1 = p1.alloc(3 * PAGE)
    fill(p1, src1, seed=6)
    assert r1.batch_set_v1(keys, src1) == [True] * 3  # not the writer: reported done ...
    assert r1.get_stats().kvstore["pages_write_skipped"] == 3
    assert r0.batch_exists(keys) == 0  # ... and nothing stored
    src0 = p0.alloc(3 * PAGE)
    fill(p0, src0, seed=7)
    assert r0.batch_set_v1(keys, src0) == [True] * 3  # rank 0 writes
    assert r1.batch_exists(keys) == 3
    dst = p1.alloc(3 * PAGE)
    assert r1.batch_get_v1(keys, dst) == [True] * 3
    for a, b in zip(pages_of(p0, src0), pages_of(p1, dst), strict=True):
        assert torch.equal(a, b)


def test_unknown_extra_config_key_is_a_typed_error(store: Cluster) -> None:
    with pytest.raises(ConfigError, match=r"unknown .*'lease_tll'"):
        create(storage_config(store.etcd, lease_tll=5), mha_host_pool())
    with pytest.raises(ConfigError, match="'timeout' must be > 0"):
        create(storage_config(store.etcd, timeout=0), mha_host_pool())


def test_wrong_page_size_is_a_typed_error_or_a_logged_miss(engines: Any,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    backend, pool = engines()
    keys = page_keys(2)
    idx = pool.alloc(2 * PAGE)
    with pytest.raises(PageSizeMismatch, match="need 32 host indices, got 31"):
        backend.batch_get_v1(keys, idx[:-1])
    with pytest.raises(PageSizeMismatch):
        backend.batch_set_v1(keys, idx[:PAGE])
    small = torch.zeros(10, dtype=torch.float16)
    with caplog.at_level(logging.WARNING, logger="kvstore_sglang"):
        assert backend.set(keys[0], small) is False
        assert backend.get(keys[0], small) is None
    assert "tensor of 20 bytes, but a page of this pool is 16384 bytes" in caplog.text
    assert backend.batch_exists(keys) == 0  # nothing was stored


def test_bad_keys_and_layouts_are_typed_errors(store: Cluster, engines: Any) -> None:
    backend, _ = engines()
    with pytest.raises(BadKey, match="non-empty str"):
        backend.batch_exists([""])
    with pytest.raises(UnsupportedLayout, match="--hicache-mem-layout page_first"):
        create(storage_config(store.etcd), mha_host_pool("layer_first"))
    bare = KVStoreHiCacheStorage(storage_config(store.etcd), {})
    try:
        with pytest.raises(NotRegistered):
            bare.batch_exists(page_keys(1))
    finally:
        bare.close()


def test_unreachable_etcd_is_a_logged_miss_not_a_failed_start(
        caplog: pytest.LogCaptureFixture) -> None:
    from kvstore.devcluster import free_port

    with caplog.at_level(logging.WARNING, logger="kvstore_sglang"):
        backend = create(storage_config(f"127.0.0.1:{free_port()}", timeout=0.5,
                                        retry_interval=60), mha_host_pool())
    try:
        assert "unavailable" in caplog.text and "pages are misses" in caplog.text
        pool = backend.mem_pool_host
        keys = page_keys(2)
        idx = pool.alloc(2 * PAGE)
        assert backend.batch_exists(keys) == 0
        assert backend.batch_get_v1(keys, idx) == [False, False]
        assert backend.batch_set_v1(keys, idx) == [False, False]
        assert backend.batch_set(keys, [pool.get_data_page(0), pool.get_data_page(PAGE)]) is False
        assert backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys]) == \
            [None, None]
        assert backend.get_stats().kvstore["store_down"] >= 1
    finally:
        backend.close()


def test_clear_removes_this_namespace_only(engines: Any) -> None:
    a, pa = engines(model="clear-a")
    b, pb = engines(model="clear-b")
    keys = page_keys(3)
    for backend, pool, seed in ((a, pa, 8), (b, pb, 9)):
        idx = pool.alloc(3 * PAGE)
        fill(pool, idx, seed=seed)
        assert backend.batch_set_v1(keys, idx) == [True] * 3
    assert a.clear() is True
    assert a.batch_exists(keys) == 0
    assert b.batch_exists(keys) == 3


def test_get_stats_is_sglangs_storage_metrics(engines: Any) -> None:
    from sglang.srt.observability.metrics_collector import StorageMetrics

    backend, pool = engines()
    keys = page_keys(4)
    idx = pool.alloc(4 * PAGE)
    fill(pool, idx, seed=10)
    assert backend.batch_set_v1(keys, idx) == [True] * 4
    assert backend.batch_exists(keys) == 4
    assert backend.batch_get_v1(keys, idx) == [True] * 4
    m = backend.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [4] and m.prefetch_pgs == [4]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    s = m.kvstore
    assert s["pages_written"] == 4 and s["bytes_written"] == 4 * backend.namespace.page_bytes
    assert s["set_p50_ms"] > 0 and s["get_p50_ms"] > 0 and s["exists_p50_ms"] > 0
    again = backend.get_stats()  # per-call lists drain, counters stay
    assert again.backup_pgs == [] and again.kvstore["pages_written"] == 4
