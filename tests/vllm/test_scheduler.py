"""The connector inside vLLM's real Scheduler (no model, no worker), against a real store.

Each test pre-fills the store with some of a prompt's blocks, lets the scheduler
admit the request, and checks the promise: what was looked up is pinned under one
lease, exactly the blocks vLLM will use reach the workers' plan, and every lease is
released (the master's `active_leases` returns to 0) whatever happens next.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore_client import KVStoreClient
from kvstore_vllm import KVStoreConnector, KVStoreWorkerMetadata
from kvstore_vllm.plans import LoadReport
from tests.conftest import Cluster
from tests.vllm.helpers import (
    BLOCK,
    connector_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    runner_output,
)


def _connector(sched: Any) -> KVStoreConnector:
    c = sched.connector
    assert isinstance(c, KVStoreConnector)
    return c


def _fill(cluster: Cluster, sched: Any, request: Any, blocks: list[int]) -> None:
    """Store the given blocks of the request (every layer's object of each)."""
    side = _connector(sched).scheduler_side
    assert side is not None
    hashes = [bytes(request.block_hashes[b]) for b in blocks]
    keys = side.keys.keys(hashes)
    with KVStoreClient(etcd=cluster.etcd) as c:
        assert c.put_many(keys, [b"kv" * 64] * len(keys)) == [None] * len(keys)


def _leases(cluster: Cluster, sched: Any) -> int:
    _connector(sched).store.flush()
    return int(cluster.status().active_leases)


@contextlib.contextmanager
def _link_busy(conn: KVStoreConnector, seconds: float = 0.5) -> Iterator[None]:
    """Hold the connector's link thread busy (as a slow call would) for `seconds` from
    entry; on exit it is free again and the busy call is over."""
    gate = threading.Event()

    async def slow(_client: Any) -> None:
        gate.wait(5.0)

    busy = conn.link.submit(slow)
    timer = threading.Timer(seconds, gate.set)
    timer.start()
    try:
        yield
    finally:
        gate.set()
        timer.cancel()
        busy.result(5.0)


def _tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 500 + 3 for i in range(n)]


@pytest.fixture
def make(store: Cluster, tiny_model: Path) -> Any:
    made: list[Any] = []

    def build(num_blocks: int = 64, etcd: str | None = None, **extra: Any) -> Any:
        cfg = make_vllm_config(tiny_model, connector_config(etcd or store.etcd, **extra),
                               num_blocks=num_blocks)
        s = make_scheduler(cfg, num_blocks)
        made.append(s)
        return s

    yield build
    for s in made:
        _connector(s).shutdown()


def test_lookup_allocation_metadata_then_release(store: Cluster, make: Any) -> None:
    sched = make()
    req = make_request(_tokens(1, 4 * BLOCK + 5))  # 4 full blocks and a partial one
    _fill(store, sched, req, [0, 1])
    sched.add_request(req)
    out = sched.schedule()

    # Two blocks were promised and are loaded; the rest is computed this step.
    assert out.num_scheduled_tokens[req.request_id] == 2 * BLOCK + 5
    assert out.scheduled_new_reqs[0].num_computed_tokens == 2 * BLOCK
    plan = out.kv_connector_metadata.plan
    (load,) = plan.loads
    table = sched.kv_cache_manager.get_block_ids(req.request_id)[0]
    assert load.block_ids == table[:2]
    assert load.block_hashes == [bytes(h) for h in req.block_hashes[:2]]
    assert load.lease_id and load.lease_ttl_left > 0
    # Blocks 2 and 3 are computed this step and saved; blocks 0 and 1 are not re-saved.
    (save,) = plan.saves
    assert save.block_ids == table[2:4]
    assert _leases(store, sched) == 1

    # The workers report the load: the lease goes.
    meta = KVStoreWorkerMetadata({req.request_id: LoadReport(req.request_id, load.lease_id)})
    engine_out = sched.update_from_output(out, runner_output([req], worker_meta=meta))
    assert _leases(store, sched) == 0
    # The scheduler collects the connector's stats into its own, as vLLM logs them.
    data = next(iter(engine_out.values())).scheduler_stats.kv_connector_stats
    summary = KVStoreConnector.build_kv_connector_stats(data).reduce()
    assert summary["hit_tokens"] == 2 * BLOCK and summary["hit_blocks"] == 2
    assert summary["lookup_count"] == 1 and summary["lookup_to_resume_count"] == 1


def test_corrupt_objects_are_gone_before_the_recompute_is_planned(store: Cluster,
                                                                 make: Any) -> None:
    # The workers skip saving a block the store still holds (an `exists` check at the
    # start of the step), so a removal that lands after the recompute's step began
    # leaves the block missing for good. The removal must be done when vLLM hears of
    # the failure, even while the link's thread is slow with an earlier call.
    sched = make()
    req = make_request(_tokens(9, 3 * BLOCK + 5))
    _fill(store, sched, req, [0, 1])
    side = _connector(sched).scheduler_side
    assert side is not None
    bad = side.keys.keys([bytes(req.block_hashes[1])])
    sched.add_request(req)
    out = sched.schedule()
    (load,) = out.kv_connector_metadata.plan.loads
    table = sched.kv_cache_manager.get_block_ids(req.request_id)[0]

    with KVStoreClient(etcd=store.etcd) as c:
        report = LoadReport(req.request_id, load.lease_id, failed_block_ids=[table[1]],
                            corrupt_keys=bad)
        with _link_busy(_connector(sched)):
            engine_out = sched.update_from_output(out, runner_output(
                [req], worker_meta=KVStoreWorkerMetadata({req.request_id: report}),
                invalid_block_ids={table[1]}))
            assert c.exists(bad) == [False] * len(bad)
        assert c.exists(side.keys.keys([bytes(req.block_hashes[0])])) == [True] * len(bad)
    assert _leases(store, sched) == 0
    data = next(iter(engine_out.values())).scheduler_stats.kv_connector_stats
    assert KVStoreConnector.build_kv_connector_stats(data).reduce()["corrupt_removed"] == len(bad)


def test_fully_stored_prompt_still_computes_its_last_token(store: Cluster, make: Any) -> None:
    sched = make()
    req = make_request(_tokens(2, 3 * BLOCK))
    _fill(store, sched, req, [0, 1, 2])
    sched.add_request(req)
    out = sched.schedule()
    assert out.num_scheduled_tokens[req.request_id] == 1
    (load,) = out.kv_connector_metadata.plan.loads
    assert len(load.block_ids) == 3  # the last block is loaded whole, its last token recomputed
    assert out.kv_connector_metadata.plan.saves == []
    sched.finish_requests([req.request_id], _finished_status())
    assert _leases(store, sched) == 0


def test_shutdown_sends_the_releases_still_queued(store: Cluster, make: Any) -> None:
    # Releases run in the background, one after the other; an engine that shuts down
    # right after finishing requests must not close the client under the queued ones
    # (they would be lost and the leases would pin their objects until the TTL).
    sched = make()
    conn = _connector(sched)
    reqs = [make_request(_tokens(40 + i, 2 * BLOCK + 1)) for i in range(2)]
    for req in reqs:
        _fill(store, sched, req, [0, 1])
        sched.add_request(req)
        assert conn.get_num_new_matched_tokens(req, 0) == (2 * BLOCK, False)
    assert int(store.status().active_leases) == 2

    with _link_busy(conn):  # when the releases are asked for
        sched.finish_requests([r.request_id for r in reqs], _finished_status())
        conn.shutdown()
    assert int(store.status().active_leases) == 0


def test_allocation_failure_then_retry_leaks_no_lease(store: Cluster, make: Any) -> None:
    sched = make(num_blocks=4)  # 3 usable blocks: a 7-block prompt cannot be admitted
    req = make_request(_tokens(3, 6 * BLOCK + 3))
    _fill(store, sched, req, [0, 1])
    sched.add_request(req)
    for _ in range(3):  # every step looks up again; each lookup replaces the last lease
        out = sched.schedule()
        assert req.request_id not in out.num_scheduled_tokens
        assert out.kv_connector_metadata.plan.loads == []
        assert _leases(store, sched) == 1
    sched.finish_requests([req.request_id], _finished_status())
    assert _leases(store, sched) == 0
    assert _connector(sched).scheduler_side.held_leases() == 0  # type: ignore[union-attr]


def test_abort_after_lookup_before_scheduling_releases(store: Cluster, make: Any) -> None:
    sched = make()
    req = make_request(_tokens(4, 3 * BLOCK + 1))
    _fill(store, sched, req, [0, 1, 2])
    conn = _connector(sched)
    sched.add_request(req)
    assert conn.get_num_new_matched_tokens(req, 0) == (3 * BLOCK, False)
    assert _leases(store, sched) == 1
    sched.finish_requests([req.request_id], _finished_status())  # aborted while waiting
    assert _leases(store, sched) == 0
    assert sched.schedule().kv_connector_metadata.plan.loads == []


def test_partial_hit_stops_at_the_hole(store: Cluster, make: Any) -> None:
    sched = make()
    req = make_request(_tokens(5, 5 * BLOCK + 2))
    _fill(store, sched, req, [0, 1, 3, 4])  # block 2 missing
    sched.add_request(req)
    out = sched.schedule()
    (load,) = out.kv_connector_metadata.plan.loads
    assert len(load.block_ids) == 2
    assert out.scheduled_new_reqs[0].num_computed_tokens == 2 * BLOCK
    # The lease pins exactly the two loaded blocks' objects.
    assert _connector(sched).scheduler_side.keys.keys_per_block == 2  # type: ignore[union-attr]
    status = store.status()
    assert status.active_leases == 1
    sched.finish_requests([req.request_id], _finished_status())
    assert _leases(store, sched) == 0


def test_store_down_means_misses_and_the_request_runs(make: Any) -> None:
    # Nothing listens there; the link stays down far longer than the test runs.
    sched = make(etcd="127.0.0.1:1", retry_interval=60.0)
    link = _connector(sched).link
    req = make_request(_tokens(6, 3 * BLOCK + 4))
    sched.add_request(req)
    t = time.monotonic()
    out = sched.schedule()
    assert out.num_scheduled_tokens[req.request_id] == 3 * BLOCK + 4
    assert out.kv_connector_metadata.plan.loads == []
    assert link.down
    # The next request does not wait for the dead store again: its lookup fails at once,
    # without reaching the link's thread. (Counted, not timed: a fresh CI machine once took
    # a second over a schedule that sent nothing.)
    sent: list[Any] = []
    submit = link.submit

    def counted(op: Any) -> Any:
        sent.append(op)
        return submit(op)

    link.submit = counted  # type: ignore[method-assign]
    req2 = make_request(_tokens(7, 2 * BLOCK + 4))
    sched.add_request(req2)
    out2 = sched.schedule()
    assert out2.num_scheduled_tokens[req2.request_id] == 2 * BLOCK + 4
    assert out2.kv_connector_metadata.plan.loads == []
    assert sent == []
    assert time.monotonic() - t < 10
    stats = _connector(sched).get_kv_connector_stats()
    assert stats is not None and stats.reduce().get("lookup_failures", 0) == 2


def test_producer_role_never_looks_up(store: Cluster, make: Any) -> None:
    sched = make(kv_role="kv_producer")
    req = make_request(_tokens(8, 2 * BLOCK + 1))
    _fill(store, sched, req, [0, 1])
    sched.add_request(req)
    out = sched.schedule()
    assert out.num_scheduled_tokens[req.request_id] == 2 * BLOCK + 1
    assert out.kv_connector_metadata.plan.loads == []
    assert len(out.kv_connector_metadata.plan.saves) == 1
    assert _leases(store, sched) == 0


def test_consumer_role_never_saves(store: Cluster, make: Any) -> None:
    sched = make(kv_role="kv_consumer")
    req = make_request(_tokens(9, 3 * BLOCK + 1))
    _fill(store, sched, req, [0])
    sched.add_request(req)
    out = sched.schedule()
    assert len(out.kv_connector_metadata.plan.loads) == 1
    assert out.kv_connector_metadata.plan.saves == []
    sched.finish_requests([req.request_id], _finished_status())
    assert _leases(store, sched) == 0


def _finished_status() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED
