"""Tensor parallelism on the worker side: two ranks' KV caches in one process.

Without MLA every rank holds its own shard of the heads: its own objects (the TP rank
is in the key), and a block is a hit only when every rank's are stored. With MLA the
latent KV is the same on every rank: one set of objects (no TP rank in the key),
written by rank 0 only, read by every rank. A TP=1 engine never meets a TP=2 engine's
objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore_client import KVStoreClient
from kvstore_vllm import KVStoreConnector, KVStoreConnectorMetadata
from kvstore_vllm import connector as connector_module
from kvstore_vllm.plans import LoadPlan, SavePlan, StepPlan
from tests.conftest import Cluster
from tests.vllm.helpers import BLOCK, connector_config, kv_cache_config, make_request, make_vllm_config

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
MLA_HEAD = 96  # kv_lora_rank 64 + rope 32: one latent "head" per token


def _role(name: str) -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    return getattr(KVConnectorRole, name)


def _mla_kv_cache_config() -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

    spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=MLA_HEAD,
                            dtype=torch.float32)
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])


@pytest.fixture
def build(store: Cluster, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    made: list[KVStoreConnector] = []

    def make(role: str, kvc: Any, tp: int = 2, rank: int = 0) -> KVStoreConnector:
        cfg = make_vllm_config(tiny_model, connector_config(store.etcd))
        cfg.parallel_config.tensor_parallel_size = tp
        monkeypatch.setattr(connector_module, "_worker_ranks", lambda: (rank, 0))
        c = KVStoreConnector(cfg, _role(role), kvc)
        made.append(c)
        return c

    yield make
    for c in made:
        c.shutdown()


def _step(w: KVStoreConnector, plan: StepPlan) -> None:
    w.bind_connector_metadata(KVStoreConnectorMetadata(plan))
    w.start_load_kv(None)  # type: ignore[arg-type]
    for name in LAYERS:
        w.wait_for_layer_load(name)
        w.save_kv_layer(name, torch.empty(0), None)
    w.wait_for_save()
    w.clear_connector_metadata()


def _load(store: Cluster, sched: KVStoreConnector, reader: KVStoreConnector,
          hashes: list[bytes], ids: list[int]) -> None:
    side = sched.scheduler_side
    assert side is not None
    keys = side.keys.keys(hashes)
    with KVStoreClient(etcd=store.etcd) as c:
        lease = c.lookup(keys, ttl=30)
        assert lease.count == len(keys)  # every rank's share of every block is stored
        _step(reader, StepPlan(loads=[LoadPlan("r", lease.id, 29.0, hashes, ids, 0)]))
        c.release(lease)
    assert reader.get_block_ids_with_load_errors() == set()


def _save_counts(w: KVStoreConnector) -> int:
    stats = w.get_kv_connector_stats()
    return 0 if stats is None else int(stats.reduce().get("save_objects", 0))


def test_two_ranks_keep_their_own_shards(store: Cluster, build: Any) -> None:
    sched = build("SCHEDULER", kv_cache_config())
    side = sched.scheduler_side
    assert side is not None and side.keys.keys_per_block == 2 * len(LAYERS)
    ranks = [build("WORKER", kv_cache_config(), rank=r) for r in (0, 1)]
    keys = [w.worker_side.rank.keys(b"h" * 32) for w in ranks]  # type: ignore[union-attr]
    assert not set(keys[0]) & set(keys[1])
    one = build("WORKER", kv_cache_config(), tp=1)
    assert not set(one.worker_side.rank.keys(b"h" * 32)) & set(keys[0])  # type: ignore[union-attr]

    req = make_request([(i * 17) % 500 + 3 for i in range(3 * BLOCK + 1)])
    hashes = [bytes(h) for h in req.block_hashes[:3]]
    src = [{n: torch.randn(64, 1, BLOCK, 128) for n in LAYERS} for _ in ranks]
    for w, kv in zip(ranks, src, strict=True):
        w.register_kv_caches(kv)
        _step(w, StepPlan(saves=[SavePlan("w", hashes, [1, 2, 3])]))
        assert _save_counts(w) == 3 * len(LAYERS)
    for r in (0, 1):
        dst = {n: torch.zeros(64, 1, BLOCK, 128) for n in LAYERS}
        reader = build("WORKER", kv_cache_config(), rank=r)
        reader.register_kv_caches(dst)
        _load(store, sched, reader, hashes, [7, 8, 9])
        for n in LAYERS:
            assert torch.equal(dst[n][7:10], src[r][n][1:4]), (r, n)  # its own shard


def test_mla_ranks_share_one_set_of_objects(store: Cluster, build: Any) -> None:
    sched = build("SCHEDULER", _mla_kv_cache_config())
    side = sched.scheduler_side
    assert side is not None and side.keys.keys_per_block == len(LAYERS)  # no per-rank keys
    ranks = [build("WORKER", _mla_kv_cache_config(), rank=r) for r in (0, 1)]
    assert all(w.mla for w in ranks)
    req = make_request([(i * 19) % 500 + 3 for i in range(2 * BLOCK + 1)])
    hashes = [bytes(h) for h in req.block_hashes[:2]]
    k0, k1 = (w.worker_side.rank.keys(hashes[0]) for w in ranks)  # type: ignore[union-attr]
    assert k0 == k1 == side.keys.block_keys(hashes[0])
    # Rank 1 saves nothing (rank 0 writes the shared objects); its bytes differ here to
    # show which rank's bytes the store holds.
    src = [{n: torch.randn(64, BLOCK, MLA_HEAD) for n in LAYERS} for _ in ranks]
    ranks[1].register_kv_caches(src[1])
    _step(ranks[1], StepPlan(saves=[SavePlan("w", hashes, [1, 2])]))
    assert _save_counts(ranks[1]) == 0
    with KVStoreClient(etcd=store.etcd) as c:
        assert c.exists(k0) == [False] * len(k0)
    ranks[0].register_kv_caches(src[0])
    _step(ranks[0], StepPlan(saves=[SavePlan("w", hashes, [1, 2])]))
    assert _save_counts(ranks[0]) == 2 * len(LAYERS)
    for r in (0, 1):  # every rank reads the same objects
        dst = {n: torch.zeros(64, BLOCK, MLA_HEAD) for n in LAYERS}
        reader = build("WORKER", _mla_kv_cache_config(), rank=r)
        reader.register_kv_caches(dst)
        _load(store, sched, reader, hashes, [5, 6])
        for n in LAYERS:
            assert torch.equal(dst[n][5:7], src[0][n][1:3]), (r, n)
