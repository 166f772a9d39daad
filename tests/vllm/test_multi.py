"""Composed with a P/D connector in vLLM's MultiConnector: the other child wins the
load, and ours starts no load for it (it decides from num_external_tokens alone, even
though it still sees the request's real blocks) and keeps nothing pinned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvstore_client import KVStoreClient
from kvstore_vllm import KVStoreConnector, KVStoreConnectorMetadata
from tests.conftest import Cluster
from tests.vllm import fake_p2p
from tests.vllm.helpers import (
    BLOCK,
    connector_config,
    kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
)


def _multi(etcd: str, p2p_tokens: int) -> dict[str, Any]:
    ours = connector_config(etcd)
    ours.pop("kv_load_failure_policy")
    p2p = {"kv_connector": "FakeP2PConnector", "kv_connector_module_path": "tests.vllm.fake_p2p",
           "kv_role": "kv_both", "kv_connector_extra_config": {"tokens": p2p_tokens}}
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"connectors": [p2p, ours]}}


def test_no_load_for_tokens_another_child_supplies(store: Cluster, tiny_model: Path) -> None:
    cfg = make_vllm_config(tiny_model, _multi(store.etcd, p2p_tokens=3 * BLOCK))
    sched = make_scheduler(cfg)
    ours = sched.connector.sub_connectors[1]
    assert isinstance(ours, KVStoreConnector)
    try:
        # Our store has the first two blocks: a real hit, which the P2P child outbids
        # by coming first in the list.
        req = make_request([(i * 13) % 500 + 3 for i in range(4 * BLOCK + 3)])
        side = ours.scheduler_side
        assert side is not None
        keys = side.keys.keys([bytes(h) for h in req.block_hashes[:2]])
        with KVStoreClient(etcd=store.etcd) as c:
            assert c.put_many(keys, [b"x" * 64] * len(keys)) == [None] * len(keys)
        fake_p2p.CALLS.clear()
        sched.add_request(req)
        out = sched.schedule()
        assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
        assert ("alloc", req.request_id, 3 * BLOCK) in fake_p2p.CALLS
        ours_meta = out.kv_connector_metadata.metadata[1]
        assert isinstance(ours_meta, KVStoreConnectorMetadata)
        assert ours_meta.plan.loads == []
        # Blocks the P2P child delivered are not ours to save; what is computed here is.
        assert [len(s.block_ids) for s in ours_meta.plan.saves] == [1]
        ours.store.flush()
        assert store.status().active_leases == 0

        # A worker given this metadata starts no read at all.
        worker = KVStoreConnector(cfg_for_worker(cfg), _worker_role(), kv_cache_config())
        try:
            kv = {n: torch.zeros(64, 2, BLOCK, 128) for n in
                  ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]}
            worker.register_kv_caches(kv)
            worker.bind_connector_metadata(KVStoreConnectorMetadata(
                type(ours_meta.plan)(loads=ours_meta.plan.loads, saves=[])))
            worker.start_load_kv(None)  # type: ignore[arg-type]
            assert worker.worker_side is not None and worker.worker_side._loads == []
            worker.wait_for_save()
            assert worker.get_block_ids_with_load_errors() == set()
        finally:
            worker.shutdown()
    finally:
        for c in sched.connector.sub_connectors:
            c.shutdown()


def cfg_for_worker(cfg: Any) -> Any:
    import copy

    from vllm.config import KVTransferConfig

    child = copy.copy(cfg)
    child.kv_transfer_config = KVTransferConfig(**connector_config(
        cfg.kv_transfer_config.kv_connector_extra_config["connectors"][1][
            "kv_connector_extra_config"]["etcd"]))
    return child


def _worker_role() -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    return KVConnectorRole.WORKER
