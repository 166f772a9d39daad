"""The worker side against a real store, with KV cache tensors made here (no engine).

Pages go in and out in place when the layout keeps a page contiguous (vLLM's CPU
layout), through one staging copy when it does not (K and V in separate planes); a
block already stored is not written again; a corrupt or lease-expired read marks its
blocks failed, for vLLM to recompute.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kvstore_client import KVStoreClient
from kvstore_vllm.keys import KeyPlan, Namespace, RankLayers
from kvstore_vllm.link import StoreLink
from kvstore_vllm.plans import LoadPlan, SavePlan, StepPlan
from kvstore_vllm.settings import Settings
from kvstore_vllm.timeline import FORWARD_START, TRANSFER_COMPLETE, TRANSFER_SUBMITTED
from kvstore_vllm.worker_side import WorkerSide
from tests.conftest import Cluster
from tests.vllm.conftest import corrupt_object

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
NUM_BLOCKS, HEADS, BS, HD = 16, 2, 32, 64


def _ns(tag: str) -> Namespace:
    return Namespace(model=f"test-{tag}", revision="", kv_dtype="float32", block_size=BS,
                     hash_algo="sha256", hash_seed="0", tp_size=1, tp_rank=0, pp_size=1,
                     pp_rank=0, layout=tag)


def _hashes(tag: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"{tag}-{i}".encode()).digest() for i in range(n)]


def cpu_layout() -> dict[str, torch.Tensor]:
    """vLLM's CPU backend: [num_blocks, kv_heads, block_size, 2 * head_size]."""
    return {n: torch.zeros(NUM_BLOCKS, HEADS, BS, 2 * HD) for n in LAYERS}


def split_layout() -> dict[str, torch.Tensor]:
    """K and V planes apart: [2, num_blocks, block_size, kv_heads, head_size]."""
    return {n: torch.zeros(2, NUM_BLOCKS, BS, HEADS, HD) for n in LAYERS}


@pytest.fixture
def links(store: Cluster) -> Iterator[Any]:
    made: list[StoreLink] = []

    def make(etcd: str | None = None) -> StoreLink:
        link = StoreLink(Settings(etcd=etcd or store.etcd, timeout=2.0, retry_interval=2.0),
                         "worker", buffer_size=1 << 20)
        made.append(link)
        return link

    yield make
    for link in made:
        link.close()


def _worker(link: StoreLink, tag: str, kv: dict[str, torch.Tensor],
            layerwise: bool = False) -> WorkerSide:
    w = WorkerSide(link, RankLayers(_ns(tag), LAYERS), num_blocks=NUM_BLOCKS,
                   layerwise_load=layerwise, staging_bytes=1 << 20)
    w.register(kv)
    return w


def _page(kv: dict[str, torch.Tensor], layer: str, block: int) -> torch.Tensor:
    t = kv[layer]
    return t[block] if t.shape[0] == NUM_BLOCKS else t[:, block]


def _step(w: WorkerSide, plan: StepPlan) -> None:
    """What vLLM does with the worker connector in one step."""
    w.begin_step(plan)
    w.start_loads(plan)
    for name in LAYERS:
        w.wait_layer(name)
        w.save_layer(name)
    w.end_step()


def _save_then_load(store: Cluster, links: Any, tag: str, layout: Any,
                    layerwise: bool = False) -> tuple[WorkerSide, dict[str, torch.Tensor], list[bytes]]:
    src = layout()
    for t in src.values():
        t.normal_()
    hashes = _hashes(tag, 2)
    writer = _worker(links(), tag, src)
    assert writer.pages is not None and writer.pages.zero_copy == (layout is cpu_layout)
    _step(writer, StepPlan(saves=[SavePlan("r1", hashes, [3, 5])]))
    stats = writer.take_stats()["counters"]
    assert stats["save_objects"] == 4 and stats["save_bytes"] == 4 * HEADS * BS * 2 * HD * 4

    dst = layout()
    reader = _worker(links(), tag, dst, layerwise)
    keys = KeyPlan([reader.rank]).keys(hashes)
    with KVStoreClient(etcd=store.etcd) as c:
        lease = c.lookup(keys, ttl=30)
        assert lease.count == 4
        _step(reader, StepPlan(loads=[LoadPlan("r2", lease.id, 29.0, hashes, [7, 9], 0)]))
        c.release(lease)
    assert reader.take_failed_blocks() == set()
    for name in LAYERS:
        assert torch.equal(_page(dst, name, 7), _page(src, name, 3))
        assert torch.equal(_page(dst, name, 9), _page(src, name, 5))
        assert not _page(dst, name, 3).any()  # nothing else was touched
    return reader, src, hashes


def test_zero_copy_round_trip(store: Cluster, links: Any) -> None:
    reader, _, _ = _save_then_load(store, links, "zc", cpu_layout)
    (report,) = reader.take_reports().values()
    pts = report.timeline.points
    assert pts[TRANSFER_SUBMITTED] <= pts[FORWARD_START] and TRANSFER_COMPLETE in pts
    assert set(report.timeline.layer_ready) == set(LAYERS)
    assert reader.take_stats()["counters"]["load_blocks"] == 2


def test_staging_copy_round_trip(store: Cluster, links: Any) -> None:
    _save_then_load(store, links, "split", split_layout)


def test_layerwise_load_waits_per_layer(store: Cluster, links: Any) -> None:
    reader, _, _ = _save_then_load(store, links, "lw", cpu_layout, layerwise=True)
    (report,) = reader.take_reports().values()
    assert set(report.timeline.layer_ready) == set(LAYERS)


def test_stored_blocks_are_not_written_again(store: Cluster, links: Any) -> None:
    kv = cpu_layout()
    hashes = _hashes("dup", 3)
    w = _worker(links(), "dup", kv)
    _step(w, StepPlan(saves=[SavePlan("a", hashes[:2], [1, 2])]))
    w.take_stats()
    _step(w, StepPlan(saves=[SavePlan("b", hashes, [1, 2, 3])]))
    c = w.take_stats()["counters"]
    assert c["save_skipped_existing"] == 4 and c["save_objects"] == 2


def test_corrupt_object_fails_its_block(store: Cluster, links: Any) -> None:
    src = cpu_layout()
    for t in src.values():
        t.normal_()
    hashes = _hashes("bad", 3)
    writer = _worker(links(), "bad", src)
    _step(writer, StepPlan(saves=[SavePlan("w", hashes, [1, 2, 3])]))
    keys = KeyPlan([writer.rank]).keys(hashes)
    corrupt_object(store, keys[3])  # block 1, layer 1

    dst = cpu_layout()
    reader = _worker(links(), "bad", dst)
    with KVStoreClient(etcd=store.etcd) as c:
        lease = c.lookup(keys, ttl=30)
        assert lease.count == 6
        _step(reader, StepPlan(loads=[LoadPlan("r", lease.id, 29.0, hashes, [4, 5, 6], 0)]))
        c.release(lease)
    assert reader.take_failed_blocks() == {5}
    (report,) = reader.take_reports().values()
    assert report.failed_block_ids == [5] and report.corrupt_keys == [keys[3]]
    assert torch.equal(dst[LAYERS[0]][4], src[LAYERS[0]][1])


def test_expired_lease_fails_the_whole_load(store: Cluster, links: Any) -> None:
    src = cpu_layout()
    hashes = _hashes("exp", 2)
    w = _worker(links(), "exp", src)
    _step(w, StepPlan(saves=[SavePlan("w", hashes, [1, 2])]))
    keys = KeyPlan([w.rank]).keys(hashes)
    with KVStoreClient(etcd=store.etcd) as c:
        lease = c.lookup(keys, ttl=30)
        # The scheduler built the plan with too little lease left: nothing is trusted.
        _step(w, StepPlan(loads=[LoadPlan("r", lease.id, 0.5, hashes, [8, 9], 0)]))
        c.release(lease)
    assert w.take_failed_blocks() == {8, 9}


def test_store_down_skips_saves_and_fails_loads_quickly(links: Any) -> None:
    w = _worker(links(etcd="127.0.0.1:1"), "down", cpu_layout())
    hashes = _hashes("down", 2)
    t = time.monotonic()
    _step(w, StepPlan(saves=[SavePlan("w", hashes, [1, 2])]))
    _step(w, StepPlan(loads=[LoadPlan("r", 1, 29.0, hashes, [3, 4], 0)]))
    assert w.take_failed_blocks() == {3, 4}
    assert time.monotonic() - t < 8
    c = w.take_stats()["counters"]
    assert c.get("save_objects", 0) == 0 and c["save_failures"] >= 1
