"""Several KV cache groups (Gemma 2: sliding window + full attention) in vLLM's real
Scheduler, against a real store; MLA and TP ranks on the worker side.

A block counts as a hit only where every group can load what it needs: the whole
prefix for the full-attention group, only the window at the hit's end for the
sliding-window group. The lease pins exactly that, and nothing evicts it before the
workers have loaded it. Other group kinds (Mamba) are refused at start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvstore_client import KVStoreClient
from kvstore_vllm import KVStoreConnector, KVStoreConnectorMetadata, KVStoreWorkerMetadata
from kvstore_vllm.groups import SLIDING, GroupKeys
from kvstore_vllm.plans import LoadReport, SavePlan, StepPlan
from kvstore_vllm.scheduler_side import HybridSchedulerSide
from tests.conftest import Cluster, require_private_netns
from tests.vllm.helpers import (
    BLOCK,
    connector_config,
    hybrid_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    runner_output,
)

SW, FULL_G = 0, 1  # group ids in hybrid_kv_cache_config
MiB = 1 << 20


def _tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 37) % 500 + 3 for i in range(n)]


def _side(sched: Any) -> HybridSchedulerSide:
    side = sched.connector.scheduler_side
    assert isinstance(side, HybridSchedulerSide)
    return side


def _group(side: HybridSchedulerSide, index: int) -> GroupKeys:
    (g,) = [g for g in side.groups if g.spec.index == index]
    return g


def _keys(side: HybridSchedulerSide, request: Any, group: int, blocks: Any) -> list[bytes]:
    g = _group(side, group)
    return [k for b in blocks for k in g.keys.block_keys(bytes(request.block_hashes[b]))]


def _fill(cluster: Cluster, keys: list[bytes]) -> None:
    with KVStoreClient(etcd=cluster.etcd) as c:
        assert c.put_many(keys, [b"kv" * 64] * len(keys)) == [None] * len(keys)


def _leases(cluster: Cluster, sched: Any) -> int:
    sched.connector.store.flush()
    return int(cluster.status().active_leases)


@pytest.fixture
def make(store: Cluster, tiny_gemma2: Path) -> Iterator[Any]:
    made: list[Any] = []

    def build(etcd: str | None = None, num_blocks: int = 64, **extra: Any) -> Any:
        cfg = make_vllm_config(tiny_gemma2, connector_config(etcd or store.etcd, **extra),
                               num_blocks=num_blocks)
        s = make_scheduler(cfg, num_blocks, kv_config=hybrid_kv_cache_config(num_blocks))
        made.append(s)
        return s

    yield build
    for s in made:
        s.connector.shutdown()


def test_a_hit_one_group_cannot_serve_is_not_counted(store: Cluster, make: Any) -> None:
    sched = make()
    side = _side(sched)
    assert {g.spec.kind for g in side.groups} == {SLIDING, "full"}
    req = make_request(_tokens(1, 6 * BLOCK + 5))
    # Full attention has all six blocks; the sliding window only blocks 2-3, its window
    # at a hit of four blocks (tokens 65..127 are inside the window of token 128).
    full_keys = _keys(side, req, FULL_G, range(6))
    _fill(store, full_keys + _keys(side, req, SW, [2, 3]))
    conn = sched.connector
    assert conn.get_num_new_matched_tokens(req, 0) == (4 * BLOCK, True)
    lease = side.reqs[req.request_id].lease
    assert lease is not None
    # Pinned: full attention's four blocks and the window's two, nothing else.
    assert set(lease.keys) == set(_keys(side, req, FULL_G, range(4))
                                  + _keys(side, req, SW, [2, 3]))
    assert side.reqs[req.request_id].junction == 6 * BLOCK  # where full attention ended

    sched.add_request(req)
    out = sched.schedule()
    # Loaded asynchronously: not scheduled this step, its blocks are allocated.
    assert req.request_id not in out.num_scheduled_tokens
    (load,) = out.kv_connector_metadata.plan.loads
    assert load.asynchronous and len(load.block_hashes) == 4
    sw_table, full_table = sched.kv_cache_manager.get_block_ids(req.request_id)
    null = sched.kv_cache_manager.block_pool.null_block.block_id
    # vLLM itself gives the sliding-window group no blocks outside the window.
    assert sw_table[:2] == [null, null]
    assert load.group_block_ids[SW] == [-1, -1, sw_table[2], sw_table[3]]
    assert load.group_block_ids[FULL_G] == full_table[:4] == load.block_ids
    assert _leases(store, sched) == 1

    # The workers report the load done: the lease goes, the request resumes at 4 blocks.
    meta = KVStoreWorkerMetadata({req.request_id: LoadReport(req.request_id, load.lease_id)})
    sched.update_from_output(out, runner_output([], worker_meta=meta,
                                                finished_recving={req.request_id}))
    assert _leases(store, sched) == 0
    out2 = sched.schedule()
    assert out2.num_scheduled_tokens[req.request_id] == 2 * BLOCK + 5
    (save,) = out2.kv_connector_metadata.plan.saves
    sw_table, full_table = sched.kv_cache_manager.get_block_ids(req.request_id)
    # Full attention saves blocks 4-5; the window saved is the one at the prompt's end
    # (and the junction, the same boundary here): blocks 4-5.
    assert save.group_block_ids[FULL_G] == full_table[4:6]
    assert save.group_block_ids[SW] == sw_table[4:6]


def test_miss_when_the_window_is_missing_and_saves_where_the_next_can_hit(
        store: Cluster, make: Any) -> None:
    sched = make()
    side = _side(sched)
    stored = make_request(_tokens(2, 9 * BLOCK + 3))
    _fill(store, _keys(side, stored, FULL_G, range(8)))  # no sliding-window page at all
    req = make_request(_tokens(2, 8 * BLOCK) + _tokens(99, 3 * BLOCK + 7))  # shares 8 blocks
    sched.add_request(req)
    out = sched.schedule()
    assert out.num_scheduled_tokens[req.request_id] == 11 * BLOCK + 7  # a miss: all computed
    assert out.kv_connector_metadata.plan.loads == []
    (save,) = out.kv_connector_metadata.plan.saves
    sw = save.group_block_ids[SW]
    # Windows saved: at the junction (8 blocks: 6, 7) and at the prompt's end (11: 9, 10).
    assert [i for i, b in enumerate(sw) if b >= 0] == [6, 7, 9, 10]
    assert all(b >= 0 for b in save.group_block_ids[FULL_G])
    assert _leases(store, sched) == 0


def test_lease_trimmed_per_group(store: Cluster, make: Any) -> None:
    sched = make()
    side = _side(sched)
    conn = sched.connector
    req = make_request(_tokens(3, 6 * BLOCK + 9))
    _fill(store, _keys(side, req, FULL_G, range(6)) + _keys(side, req, SW, range(6)))
    assert conn.get_num_new_matched_tokens(req, 0) == (6 * BLOCK, True)
    st = side.reqs[req.request_id]
    assert st.lease is not None
    # Every block is stored in both groups, yet only the window at the end is pinned.
    assert set(st.lease.keys) == set(_keys(side, req, FULL_G, range(6))
                                     + _keys(side, req, SW, [4, 5]))

    # vLLM uses fewer tokens than promised (bounded replay would): the lease keeps only
    # the blocks still used. The window moves onto blocks it never pinned, so the load
    # is marked to fail (recompute) rather than read unpinned objects.
    sched.add_request(req)
    blocks = SimpleNamespace(get_block_ids=lambda: ([0, 0, 11, 12, 13, 14, 15],
                                                    [21, 22, 23, 24, 25, 26, 27]))
    conn.update_state_after_alloc(req, blocks, 3 * BLOCK)  # type: ignore[arg-type]
    conn.store.flush()
    assert set(st.lease.keys) == set(_keys(side, req, FULL_G, range(3)))
    assert st.load is not None and st.load.lease_ttl_left < 0
    sched.finish_requests([req.request_id], _aborted())
    assert _leases(store, sched) == 0


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Cluster]:
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


def _layers() -> list[str]:
    return [n for g in hybrid_kv_cache_config().kv_cache_groups for n in g.layer_names]


def _run_step(worker: KVStoreConnector, meta: KVStoreConnectorMetadata) -> Any:
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)  # type: ignore[arg-type]
    for name in _layers():
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, torch.empty(0), None)
    worker.wait_for_save()
    results = worker.get_transfer_results(set())
    worker.clear_connector_metadata()
    return results


def test_eviction_flood_between_lookup_and_load_loses_nothing_promised(
        small: Cluster, tiny_gemma2: Path) -> None:
    cfg = make_vllm_config(tiny_gemma2, connector_config(small.etcd))
    sched = make_scheduler(cfg, 64, kv_config=hybrid_kv_cache_config(64))
    writer = KVStoreConnector(cfg, _worker_role(), hybrid_kv_cache_config(64))
    reader = KVStoreConnector(cfg, _worker_role(), hybrid_kv_cache_config(64))
    try:
        src = {n: torch.randn(64, 2, BLOCK, 128) for n in _layers()}
        dst = {n: torch.zeros(64, 2, BLOCK, 128) for n in _layers()}
        writer.register_kv_caches(src)
        reader.register_kv_caches(dst)
        req = make_request(_tokens(4, 5 * BLOCK + 5))
        hashes = [bytes(h) for h in req.block_hashes[:5]]
        # The writer saves all five blocks of full attention and the window at 5 (3-4).
        save = SavePlan("w", hashes, [1, 2, 3, 4, 5],
                        group_block_ids=[[-1, -1, -1, 4, 5], [1, 2, 3, 4, 5]])
        _run_step(writer, KVStoreConnectorMetadata(StepPlan(saves=[save])))

        sched.add_request(req)
        out = sched.schedule()
        (load,) = out.kv_connector_metadata.plan.loads
        assert len(load.block_hashes) == 5

        with KVStoreClient(etcd=small.etcd) as flood:
            for j in range(0, 192, 16):
                batch = [f"flood-{k}".encode() for k in range(j, j + 16)]
                errs = flood.put_many(batch, [bytes([k % 251]) * MiB for k in range(j, j + 16)])
                assert all(e is None for e in errs), errs
        assert json.loads(small.status().counters_json)["evictions"] > 0

        results = _run_step(reader, out.kv_connector_metadata)
        assert results.finished_recving == {req.request_id} and results.failed_recving == set()
        assert reader.get_block_ids_with_load_errors() == set()
        sw_layers = hybrid_kv_cache_config().kv_cache_groups[SW].layer_names
        for name in _layers():
            g = SW if name in sw_layers else FULL_G
            for j, (s, d) in enumerate(zip(save.group_block_ids[g], load.group_block_ids[g],
                                           strict=True)):
                if d >= 0:
                    assert torch.equal(dst[name][d], src[name][s]), (name, j)
        sw_dst = load.group_block_ids[SW]
        # The sliding-window group read only its window (blocks 3, 4 of the hit).
        assert [j for j, d in enumerate(sw_dst) if d >= 0] == [3, 4]
        stats = reader.get_kv_connector_stats()
        assert stats is not None and stats.reduce()["load_objects"] == 5 * 2 + 2 * 2
        meta = reader.build_connector_worker_meta()
        sched.update_from_output(out, runner_output([], worker_meta=meta,
                                                    finished_recving=results.finished_recving))
        sched.connector.store.flush()
        assert small.status().active_leases == 0
    finally:
        for c in (writer, reader, sched.connector):
            c.shutdown()


def test_a_failed_load_fails_the_request_receive(store: Cluster, tiny_gemma2: Path) -> None:
    # vLLM takes no failed blocks from a model with several groups: the worker reports
    # the request's receive failed instead (vLLM then recomputes it).
    cfg = make_vllm_config(tiny_gemma2, connector_config(store.etcd))
    reader = KVStoreConnector(cfg, _worker_role(), hybrid_kv_cache_config(64))
    try:
        reader.register_kv_caches({n: torch.zeros(64, 2, BLOCK, 128) for n in _layers()})
        req = make_request(_tokens(5, 3 * BLOCK + 1))
        hashes = [bytes(h) for h in req.block_hashes[:2]]
        from kvstore_vllm.plans import LoadPlan

        plan = LoadPlan(req.request_id, 12345, 20.0, hashes, [1, 2], 0,
                        group_block_ids=[[1, 2], [3, 4]], asynchronous=True)  # nothing stored
        results = _run_step(reader, KVStoreConnectorMetadata(StepPlan(loads=[plan])))
        assert results.finished_recving == {req.request_id}
        assert results.failed_recving == {req.request_id}
        assert reader.get_block_ids_with_load_errors() == set()
    finally:
        reader.shutdown()


def test_mamba_groups_are_refused_at_start(store: Cluster, tiny_gemma2: Path) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec

    kvc = hybrid_kv_cache_config()
    kvc.kv_cache_groups[0] = KVCacheGroupSpec(
        ["model.layers.0.mixer"], MambaSpec(block_size=BLOCK, shapes=((4, 8),),
                                            dtypes=(torch.float32,)))
    cfg = make_vllm_config(tiny_gemma2, connector_config(store.etcd))
    with pytest.raises(ValueError, match=r"MambaSpec group \(Mamba / linear-attention state\)"):
        KVStoreConnector(cfg, KVConnectorRole.SCHEDULER, kvc)


def _aborted() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED

