"""Fixtures for the LMCache plugin tests: real LMCache engine parts around a real cluster.

Each "engine" is what LMCache builds for one vLLM instance's remote tier: an
`LMCacheEngineConfig` carrying the plug-in config as printed in the README, the engine's
`LMCacheMetadata`, a `LocalCPUBackend` (its CPU buffer and allocator), an event loop in a
thread, and LMCache's own `RemoteBackend`, which creates the connector through LMCache's
plug-in loader. These tests need lmcache (`sh lmcache_adapter/install_lmcache.sh
.venv/bin/python`); they are part of `make test` and are never skipped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import Cluster, require_private_netns

try:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the LMCache plugin tests need lmcache: run "
                      "`sh lmcache_adapter/install_lmcache.sh .venv/bin/python`") from exc

from kvstore_lmcache import KVStoreConnector

CHUNK = 32  # tokens per LMCache chunk
MODEL = "tiny-llama"
# (layers, 2 (K and V), tokens per chunk, kv heads, head size): 64 KiB float32 chunks.
KV_SHAPE = (2, 2, CHUNK, 2, 64)


def plugin_extra(etcd: str, **options: Any) -> dict[str, Any]:
    """The README's plug-in configuration, with the test's etcd and options."""
    extra: dict[str, Any] = {
        "remote_storage_plugin.kvstore.module_path": "kvstore_lmcache",
        "remote_storage_plugin.kvstore.class_name": "KVStoreConnectorAdapter",
        "remote_storage_plugin.kvstore.url": f"kvstore://{etcd}",
        "remote_storage_plugin.kvstore.timeout": 2.0,
    }
    extra.update({f"remote_storage_plugin.kvstore.{k}": v for k, v in options.items()})
    return extra


def lmcache_config(extra: dict[str, Any]) -> Any:
    return LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True,
                                             max_local_cpu_size=0.02,
                                             remote_storage_plugins=["kvstore"],
                                             extra_config=extra)


def lmcache_metadata(model: str = MODEL) -> Any:
    return LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.float32, kv_shape=KV_SHAPE,
                           chunk_size=CHUNK)


def chunk_key(i: int, model: str = MODEL) -> Any:
    return CacheEngineKey(model_name=model, world_size=1, worker_id=0, chunk_hash=i,
                          dtype=torch.float32)


@dataclass
class Engine:
    """One LMCache instance's remote tier: its CPU backend, loop and RemoteBackend."""

    config: Any
    metadata: Any
    cpu: Any
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    backend: Any

    @property
    def connector(self) -> KVStoreConnector:
        """Our connector inside LMCache's InstrumentedRemoteConnector wrapper."""
        conn = self.backend.connection.getWrappedConnector()
        assert isinstance(conn, KVStoreConnector), conn
        return conn

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the engine's loop and wait for it (a hang is left to
        pytest's timeout: no speed limit here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def chunk(self, seed: int) -> Any:
        """A MemoryObj from this engine's CPU buffer holding a seeded random chunk."""
        obj = self.cpu.allocate(self.metadata.get_shapes(), self.metadata.get_dtypes())
        assert obj is not None
        gen = torch.Generator().manual_seed(seed)
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen))
        return obj

    def close(self) -> None:
        if self.backend is not None and self.backend.connection is not None:
            self.backend.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.cpu.close()  # frees its CPU buffer


def start_engine(extra: dict[str, Any], model: str = MODEL, config: Any = None) -> Engine:
    """An engine from the plug-in options `extra`, or from a whole LMCache `config`."""
    config = config if config is not None else lmcache_config(extra)
    metadata = lmcache_metadata(model)
    cpu = LocalCPUBackend(config, metadata)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="lmcache-loop")
    thread.start()
    backend = RemoteBackend(config, metadata, loop, cpu, plugin_name="kvstore")
    return Engine(config, metadata, cpu, loop, thread, backend)


@pytest.fixture
def engines() -> Iterator[Callable[..., Engine]]:
    """Start LMCache engines (closed at the end of the test)."""
    started: list[Engine] = []

    def start(extra: dict[str, Any], model: str = MODEL, config: Any = None) -> Engine:
        e = start_engine(extra, model, config)
        started.append(e)
        return e

    yield start
    for e in reversed(started):
        e.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd + master + one 256 MiB store node, shared by a module's tests."""
    yield from _cluster(tmp_path_factory.mktemp("store"), "256MiB")


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Cluster]:
    """One 64 MiB node: a flood of 1 MiB objects pushes it far past its watermark."""
    yield from _cluster(tmp_path, "64MiB")


def _cluster(tmp: Path, dram: str) -> Iterator[Cluster]:
    require_private_netns()
    c = Cluster(tmp)
    c.start_etcd()
    try:
        c.start_master()
        c.start_store(dram)
        c.wait_nodes(1)
        yield c
    finally:
        c.stop()
