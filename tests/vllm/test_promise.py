"""The promise, through the connector: blocks counted as hits survive an eviction storm.

Between the scheduler's lookup and the worker's load, another client floods a small
store three times over. The master evicts, but nothing the connector's lease pins: the
worker then loads every promised block intact. Also: with two workers (TP=2), the lease
is released only once both have reported their load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvstore_client import KVStoreClient, Lease
from kvstore_vllm import KeyPlan, KVStoreConnector, KVStoreConnectorMetadata, Namespace, RankLayers
from kvstore_vllm.plans import LoadReport, SavePlan, StepPlan
from kvstore_vllm.scheduler_side import SchedulerSide
from tests.conftest import Cluster, require_private_netns
from tests.vllm.helpers import (
    BLOCK,
    connector_config,
    kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
)

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


def _worker_role() -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    return KVConnectorRole.WORKER


def _run_step(worker: KVStoreConnector, meta: KVStoreConnectorMetadata, layers: list[str]) -> None:
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)  # type: ignore[arg-type]
    for name in layers:
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, torch.empty(0), None)
    worker.wait_for_save()
    worker.clear_connector_metadata()


def test_leased_blocks_survive_a_flood(small: Cluster, tiny_model: Path) -> None:
    cfg = make_vllm_config(tiny_model, connector_config(small.etcd))
    sched = make_scheduler(cfg)
    kvc = kv_cache_config()
    layers = list(kvc.kv_cache_groups[0].layer_names)
    writer = KVStoreConnector(cfg, _worker_role(), kvc)
    reader = KVStoreConnector(cfg, _worker_role(), kv_cache_config())
    try:
        src = {n: torch.randn(64, 2, BLOCK, 128) for n in layers}
        dst = {n: torch.zeros(64, 2, BLOCK, 128) for n in layers}
        writer.register_kv_caches(src)
        reader.register_kv_caches(dst)
        req = make_request([(i * 11) % 500 + 3 for i in range(4 * BLOCK + 5)])
        hashes = [bytes(h) for h in req.block_hashes[:4]]
        _run_step(writer, KVStoreConnectorMetadata(StepPlan(saves=[SavePlan("w", hashes,
                                                                            [1, 2, 3, 4])])), layers)

        sched.add_request(req)
        out = sched.schedule()
        (load,) = out.kv_connector_metadata.plan.loads
        assert len(load.block_ids) == 4

        with KVStoreClient(etcd=small.etcd) as flood:
            for j in range(0, 192, 16):
                batch = [f"flood-{k}".encode() for k in range(j, j + 16)]
                errs = flood.put_many(batch, [bytes([k % 251]) * MiB for k in range(j, j + 16)])
                assert all(e is None for e in errs), errs
        assert json.loads(small.status().counters_json)["evictions"] > 0

        _run_step(reader, out.kv_connector_metadata, layers)
        assert reader.get_block_ids_with_load_errors() == set()
        for name in layers:
            for s, d in zip([1, 2, 3, 4], load.block_ids, strict=True):
                assert torch.equal(dst[name][d], src[name][s])
    finally:
        for c in (writer, reader, sched.connector):
            c.shutdown()


class _FakeStore:
    def __init__(self) -> None:
        self.released: list[int] = []

    def lookup(self, keys: Any, ttl: float) -> Lease:
        return Lease(42, list(keys), 1e18)

    def release(self, lease: Lease, keep_first: int | None = None) -> None:
        if keep_first is None:
            self.released.append(lease.id)

    def remove(self, keys: Any) -> int:
        return len(keys)


def test_lease_released_after_every_worker_reported() -> None:
    ns = Namespace(model="m", revision="", kv_dtype="float32", block_size=BLOCK, hash_algo="sha256",
                   hash_seed="s", tp_size=2, tp_rank=0, pp_size=1, pp_rank=0, layout="x")
    plan = KeyPlan([RankLayers(ns.for_rank(t, 0), ("l0", "l1")) for t in range(2)])
    store = _FakeStore()
    side = SchedulerSide(store, plan, block_size=BLOCK, hash_block_size=BLOCK, loads=True,
                         saves=True, lease_ttl=30, num_workers=2)
    req = make_request([(i * 5) % 500 + 3 for i in range(2 * BLOCK + 3)])
    assert side.lookup(req, 0) == 2 * BLOCK
    side.after_alloc(req, [5, 6, 7], 2 * BLOCK)

    out = SimpleNamespace(
        finished_req_ids=set(), num_scheduled_tokens={req.request_id: 3},
        scheduled_new_reqs=[SimpleNamespace(req_id=req.request_id, block_ids=([5, 6, 7],),
                                            num_computed_tokens=2 * BLOCK)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[]))
    step = side.build_step(out)
    assert [lp.block_ids for lp in step.loads] == [[5, 6]]
    side.on_reports({req.request_id: LoadReport(req.request_id, 42)})
    assert store.released == []  # one of two workers
    side.on_reports({req.request_id: LoadReport(req.request_id, 42)})
    assert store.released == [42]
    side.finished(req)
    assert store.released == [42] and side.held_leases() == 0
