"""The kvstore LMCache plugin against a real cluster, through LMCache's own classes.

Connectors are built by LMCache's plug-in loader (`CreateConnector` ->
`ConnectorManager._remote_adapters_plugin_launcher`, from the README's config) inside
LMCache's `RemoteBackend`, which wraps them in its `InstrumentedRemoteConnector`; the
calls below are the ones LMCache's storage manager makes. Two engines (two
`LocalCPUBackend`s, two connectors, two kvstore clients) stand for two vLLM instances.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from lmcache.v1.storage_backend.connector import CreateConnector

from kvstore.devcluster import free_port
from kvstore.v1 import master_pb2 as pb
from kvstore_client import KVStoreClient
from kvstore_lmcache import ConfigError, KVStoreConnector, KVStoreConnectorAdapter
from tests.conftest import Cluster
from tests.lmcache.conftest import (
    Engine,
    chunk_key,
    lmcache_config,
    lmcache_metadata,
    plugin_extra,
)

MiB = 1 << 20
N = 6  # chunks per prefix


def _poll(pred: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
    """Wait for `pred` (a guard against hanging, not a speed limit)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def _same(a: Any, b: Any) -> bool:
    return bool(torch.equal(a.tensor.reshape(-1).view(torch.uint8),
                            b.tensor.reshape(-1).view(torch.uint8)))


def _write(engine: Engine, keys: list[Any], seed: int = 0) -> list[Any]:
    """Store chunks the way LMCache does (batched_submit_put_task); returns the sources
    (still referenced by the caller: release them with _drop)."""
    objs = [engine.chunk(seed + i) for i in range(len(keys))]
    before = engine.connector.stats.puts
    engine.backend.batched_submit_put_task(keys, objs)
    _poll(lambda: engine.connector.stats.puts >= before + len(keys), "puts done")
    return objs


def _drop(objs: list[Any]) -> None:
    for o in objs:
        if o is not None:
            o.ref_count_down()


def _pins(cluster: Cluster, conn: KVStoreConnector, keys: list[Any]) -> list[int]:
    """Leases pinning each chunk now, as the master counts them."""
    with KVStoreClient(etcd=cluster.etcd) as c:
        reply = c._call("Inspect", pb.KeysRequest(keys=[conn.store_key(k) for k in keys]))
    return [item.object.pins for item in reply.items]


def _flood(cluster: Cluster) -> None:
    """Three times the 64 MiB node's capacity in 1 MiB objects, then check it evicted."""
    with KVStoreClient(etcd=cluster.etcd) as flood:
        for j in range(0, 192, 16):
            batch = [f"flood-{k}".encode() for k in range(j, j + 16)]
            errs = flood.put_many(batch, [bytes([k % 251]) * MiB for k in range(j, j + 16)])
            assert all(e is None for e in errs), errs
    assert json.loads(cluster.status().counters_json)["evictions"] > 0


# -- the loader ---------------------------------------------------------------------------


def test_plugin_loader_builds_the_connector(store: Cluster, engines: Callable[..., Engine]) -> None:
    e = engines(plugin_extra(store.etcd, lease_ttl=12))
    assert e.connector.options.etcd == store.etcd
    assert e.connector.options.lease_ttl == 12.0
    assert e.connector.options.timeout == 2.0
    # class_name may name the connector class too: LMCache then wraps it in its
    # DynamicConnectorAdapter, which constructs it as cls(loop=, local_cpu_backend=, config=).
    extra = plugin_extra(store.etcd)
    extra["remote_storage_plugin.kvstore.class_name"] = "KVStoreConnector"
    d = engines(extra)
    assert d.connector.options.etcd == store.etcd
    # URL mode: a kvstore:// URL (LMCache's remote_url), options as query parameters;
    # the adapter is still loaded by the plug-in loader from the config.
    wrapped = CreateConnector(f"kvstore://{store.etcd}?timeout=3&lease_ttl=7", e.loop, e.cpu,
                              e.config, e.metadata)
    conn = wrapped.getWrappedConnector()
    try:
        assert isinstance(conn, KVStoreConnector)
        assert (conn.options.timeout, conn.options.lease_ttl) == (3.0, 7.0)
        assert e.run(conn.batched_async_contains("x", [chunk_key(999)], pin=True)) == 0
    finally:
        e.run(wrapped.close())


def test_put_and_read_back_zero_copy(store: Cluster, engines: Callable[..., Engine]) -> None:
    a = engines(plugin_extra(store.etcd))
    b = engines(plugin_extra(store.etcd))
    keys = [chunk_key(100 + i) for i in range(N)]
    src = _write(a, keys, seed=1)
    assert b.run(b.connector.exists(keys[0]))
    assert b.connector.exists_sync(keys[-1])
    assert not b.connector.exists_sync(chunk_key(1))
    got = b.backend.batched_get_blocking(keys)
    assert all(g is not None for g in got)
    assert all(_same(s, g) for s, g in zip(src, got, strict=True))
    one = b.backend.get_blocking(keys[2])  # the single get: RemoteConnector.get
    assert one is not None and _same(src[2], one)
    # Zero-copy both ways: LMCache's CPU buffer is registered, nothing was staged.
    assert a.connector.stats.zero_copy_writes == N
    assert b.connector.stats.zero_copy_reads == N + 1
    listed = b.run(b.connector.list())
    assert {k.to_string() for k in keys} <= set(listed)
    assert b.connector.remove_sync(keys[0])
    assert not b.connector.exists_sync(keys[0])
    _drop(src + got + [one])


# -- the promise --------------------------------------------------------------------------


def test_async_pinned_lookup_survives_a_flood(small: Cluster, engines: Callable[..., Engine]) -> None:
    """put from one engine; batched_async_contains(pin=True) from another; a flood of
    three times the store's capacity; batched_get_non_blocking: every reported chunk."""
    a = engines(plugin_extra(small.etcd))
    b = engines(plugin_extra(small.etcd))
    keys = [chunk_key(200 + i) for i in range(N)]
    control = [chunk_key(300 + i) for i in range(N)]  # looked up without pinning
    src = _write(a, keys, seed=10)
    ctl = _write(a, control, seed=20)

    assert b.run(b.backend.batched_async_contains("req-1", keys, pin=True)) == N
    assert b.run(b.backend.batched_async_contains("req-2", control, pin=False)) == N
    assert _pins(small, b.connector, keys) == [1] * N
    assert _pins(small, b.connector, control) == [0] * N

    _flood(small)

    got = b.run(b.backend.batched_get_non_blocking("req-1", keys))
    assert len(got) == N, f"{N - len(got)} promised chunks lost"
    assert all(_same(s, g) for s, g in zip(src, got, strict=True))
    # The matching get released the lease (one-way: on the master's connection from b,
    # not this test's, so it is waited for).
    _poll(lambda: _pins(small, b.connector, keys) == [0] * N, "the lease released")
    assert b.connector.stats.leases_released == b.connector.stats.leases_taken == 1
    # The flood was real: what no lease pinned is gone.
    lost = b.run(b.backend.batched_get_non_blocking("req-2", control))
    assert len(lost) < N
    _drop(src + ctl + got + lost)


def test_sync_lookup_pins_until_the_blocking_get(small: Cluster,
                                                 engines: Callable[..., Engine]) -> None:
    """LMCache's synchronous path: batched_contains (the lookup), then the retrieve's
    batched_get_blocking; the flood in between loses nothing counted."""
    a = engines(plugin_extra(small.etcd))
    b = engines(plugin_extra(small.etcd))
    keys = [chunk_key(400 + i) for i in range(N)]
    src = _write(a, keys, seed=30)
    assert b.backend.batched_contains([*keys, chunk_key(499)]) == N  # a prefix: the miss stops it
    assert _pins(small, b.connector, keys) == [1] * N
    _flood(small)
    got = b.backend.batched_get_blocking(keys)
    assert all(g is not None for g in got), "promised chunks lost"
    assert all(_same(s, g) for s, g in zip(src, got, strict=True))
    # Released one-way on b's connection: this test reads the pins on its own.
    _poll(lambda: _pins(small, b.connector, keys) == [0] * N, "the lease released")
    _drop(src + got)


def test_unclaimed_pins_expire(store: Cluster, engines: Callable[..., Engine]) -> None:
    a = engines(plugin_extra(store.etcd))
    b = engines(plugin_extra(store.etcd, lease_ttl=1))
    keys = [chunk_key(500 + i) for i in range(3)]
    src = _write(a, keys, seed=40)
    assert b.run(b.backend.batched_async_contains("never-read", keys, pin=True)) == 3
    assert _pins(store, b.connector, keys) == [1] * 3
    _poll(lambda: _pins(store, b.connector, keys) == [0] * 3, "the unread lease expired")
    # A get after the TTL still reads what is there (unpinned, checksum-verified).
    got = b.run(b.backend.batched_get_non_blocking("never-read", keys))
    assert len(got) == 3 and all(_same(s, g) for s, g in zip(src, got, strict=True))
    _drop(src + got)


# -- the store down -----------------------------------------------------------------------


def test_store_down_means_misses(cluster_factory: Cluster, engines: Callable[..., Engine]) -> None:
    cluster = cluster_factory
    cluster.start_master()
    cluster.start_store("128MiB")
    cluster.wait_nodes(1)
    # retry_interval=0: every call below really goes to the (dead) store.
    a = engines(plugin_extra(cluster.etcd, retry_interval=0))
    keys = [chunk_key(600 + i) for i in range(3)]
    src = _write(a, keys, seed=50)
    assert a.backend.batched_contains(keys) == 3
    cluster.stop()  # etcd, master and store node, all gone
    # Everything answers, as misses; LMCache's backend keeps its connection.
    assert a.backend.batched_contains(keys) == 0
    assert a.run(a.backend.batched_async_contains("y", keys, pin=True)) == 0
    assert a.backend.batched_get_blocking(keys) == [None] * 3
    # Single-key reads, twice: the client's quick path segfaulted on the second one.
    assert a.backend.get_blocking(keys[0]) is None
    assert a.backend.get_blocking(keys[1]) is None
    assert not a.backend.contains(keys[0])
    more = [a.chunk(60 + i) for i in range(2)]
    before = a.connector.stats.put_skipped
    a.backend.batched_submit_put_task([chunk_key(700), chunk_key(701)], more)
    _poll(lambda: a.connector.stats.put_skipped >= before + 2, "puts dropped")
    assert a.backend.connection is not None
    assert a.connector.stats.store_down > 0
    _drop(src + more)


def test_unreachable_etcd_at_start(engines: Callable[..., Engine]) -> None:
    e = engines(plugin_extra(f"127.0.0.1:{free_port()}", timeout=0.5, retry_interval=0.5))
    assert e.backend.connection is not None  # created: the store is contacted in the background
    keys = [chunk_key(800)]
    assert e.backend.batched_contains(keys) == 0
    assert e.backend.batched_get_blocking(keys) == [None]
    obj = e.chunk(1)
    e.backend.batched_submit_put_task(keys, [obj])
    _poll(lambda: e.connector.stats.put_skipped >= 1, "put dropped")
    _drop([obj])


# -- bad input ----------------------------------------------------------------------------


def test_unknown_option_is_a_typed_error(store: Cluster, engines: Callable[..., Engine],
                                         caplog: pytest.LogCaptureFixture) -> None:
    extra = plugin_extra(store.etcd, lease_tll=5)  # sic: a typo
    loop = asyncio.new_event_loop()
    try:
        config, metadata = lmcache_config(extra), lmcache_metadata()
        ctx = _context(loop, config, metadata)
        with pytest.raises(ConfigError, match="lease_tll"):
            KVStoreConnectorAdapter().create_connector(ctx)
        for bad_url, match in [("kvstore://127.0.0.1", "no etcd endpoint"),
                               ("redis://127.0.0.1:1", "not a kvstore URL"),
                               (f"kvstore://{store.etcd}?timeout=soon", "timeout")]:
            with pytest.raises(ConfigError, match=match):
                KVStoreConnectorAdapter().create_connector(_context(loop, config, metadata,
                                                                    url=bad_url))
        no_url = {k: v for k, v in plugin_extra(store.etcd).items() if not k.endswith(".url")}
        with pytest.raises(ConfigError, match="no etcd endpoint"):
            KVStoreConnectorAdapter().create_connector(_context(loop, lmcache_config(no_url),
                                                                metadata))
    finally:
        loop.close()
    # Through LMCache: its backend logs the error and runs without this remote store.
    e = engines(extra)
    assert e.backend.connection is None
    assert e.backend.batched_contains([chunk_key(1)]) == 0


def _context(loop: asyncio.AbstractEventLoop, config: Any, metadata: Any,
             url: str = "plugin://kvstore") -> Any:
    from lmcache.v1.storage_backend.connector import ConnectorContext

    return ConnectorContext(url=url, loop=loop, local_cpu_backend=None, config=config,
                            metadata=metadata, plugin_name="kvstore" if url.startswith("plugin") else None)


def test_wrong_size_objects_are_misses(store: Cluster, engines: Callable[..., Engine],
                                       caplog: pytest.LogCaptureFixture) -> None:
    b = engines(plugin_extra(store.etcd))
    conn = b.connector
    big, small_, good = chunk_key(900), chunk_key(901), chunk_key(902)
    a = engines(plugin_extra(store.etcd))
    src = _write(a, [good], seed=90)
    with KVStoreClient(etcd=store.etcd) as c:
        c.put(conn.store_key(big), b"\x01" * (conn.chunk_bytes + 4096))
        c.put(conn.store_key(small_), b"\x02" * (conn.chunk_bytes // 2))
    caplog.set_level(logging.WARNING, logger="kvstore_lmcache")
    got = b.backend.batched_get_blocking([good, big, small_])
    assert got[0] is not None and _same(src[0], got[0])
    assert got[1:] == [None, None]
    assert "bytes" in caplog.text and "smaller" in caplog.text  # the larger object
    assert f"holds {conn.chunk_bytes // 2} bytes" in caplog.text  # the smaller one
    # A chunk of the wrong size handed to put is not stored (LMCache's partial chunk).
    part = a.cpu.allocate(a.metadata.get_shapes(CHUNK_HALF), a.metadata.get_dtypes())
    a.backend.batched_submit_put_task([chunk_key(903)], [part])
    _poll(lambda: a.connector.stats.put_skipped >= 1, "partial chunk refused")
    assert not b.connector.exists_sync(chunk_key(903))
    _drop(src + got + [part])


CHUNK_HALF = 16


def test_foreign_namespace(store: Cluster, engines: Callable[..., Engine],
                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvstore_lmcache")
    a = engines(plugin_extra(store.etcd))
    keys = [chunk_key(1000 + i) for i in range(2)]
    src = _write(a, keys, seed=100)
    # Another deployment namespace sees none of it.
    other = engines(plugin_extra(store.etcd, namespace="tenant-b"))
    assert other.backend.batched_contains(keys) == 0
    assert other.backend.batched_get_blocking(keys) == [None, None]
    # A key of another model is refused with a sentence, never looked up or stored.
    foreign = chunk_key(1000, model="other-model")
    assert a.backend.batched_contains([foreign]) == 0
    assert a.backend.batched_get_blocking([foreign]) == [None]
    assert "other-model" in caplog.text
    obj = a.chunk(7)
    skipped = a.connector.stats.put_skipped
    a.backend.batched_submit_put_task([foreign], [obj])
    _poll(lambda: a.connector.stats.put_skipped > skipped, "foreign put refused")
    _drop([*src, obj])


def test_calls_from_many_threads(store: Cluster, engines: Callable[..., Engine]) -> None:
    """LMCache's lookup threads and its loop call at once; one worker owns the client."""
    a = engines(plugin_extra(store.etcd))
    keys = [chunk_key(1100 + i) for i in range(4)]
    src = _write(a, keys, seed=110)
    errors: list[BaseException] = []
    counts: list[int] = []

    def lookups() -> None:
        try:
            for _ in range(20):
                counts.append(a.backend.batched_contains(keys))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=lookups) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(10):
        got = a.backend.batched_get_blocking(keys)
        assert all(g is not None for g in got)
        _drop(got)
    for t in threads:
        t.join()
    assert not errors and counts == [4] * 80
    _drop(src)


def test_long_model_names_are_hashed_into_the_key(store: Cluster,
                                                 engines: Callable[..., Engine]) -> None:
    model = "org/" + "m" * 1100  # the key string alone passes the store's 1 KiB key limit
    a = engines(plugin_extra(store.etcd), model=model)
    b = engines(plugin_extra(store.etcd), model=model)
    keys = [chunk_key(1200 + i, model=model) for i in range(2)]
    assert len(a.connector.store_key(keys[0])) < 1024
    src = _write(a, keys, seed=120)
    got = b.backend.batched_get_blocking(keys)
    assert all(g is not None and _same(s, g) for s, g in zip(src, got, strict=True))
    _drop(src + got)


def test_options_from_strings() -> None:
    from kvstore_lmcache import options_for_url

    o = options_for_url("kvstore://10.0.0.1:2379?zero_copy=false&replicas=2&lease_ttl=7.5"
                        "&namespace=t1&transport=grpc&same_host=0")
    assert (o.etcd, o.zero_copy, o.replicas, o.lease_ttl, o.namespace, o.transport,
            o.same_host) == ("10.0.0.1:2379", False, 2, 7.5, "t1", "grpc", False)
    for bad, match in [("kvstore://h:1?zero_copy=maybe", "not a boolean"),
                       ("kvstore://h:1?lease_ttl=0", "lease_ttl"),
                       ("kvstore://h:1?timeout=nan", "finite"),
                       ("kvstore://h:1?transport=udp", "transport"),
                       ("kvstore://h:1/path", "no path"),
                       ("kvstore://h:1?timeout=1&timeout=2", "2 times"),
                       ("kvstore://h:99999", "port")]:
        with pytest.raises(ConfigError, match=match):
            options_for_url(bad)
