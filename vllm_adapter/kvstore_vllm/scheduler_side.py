"""Scheduler-side state: which blocks the store promised, where they go, what to save.

Life of one request here:

1. `lookup` (from get_num_new_matched_tokens): one batched Lookup of every key of the
   full blocks past the locally computed tokens; the store pins the longest stored
   prefix under a lease. A repeated call for the same request (vLLM retries after a
   failed block allocation) first releases the previous lease. The store being down
   is a miss.
2. `after_alloc` (update_state_after_alloc): vLLM says how many external tokens it
   will use; the lease is trimmed to exactly the blocks that hold them (or released
   when it uses none: a MultiConnector sibling may have won), and the destination
   block ids are recorded. Whether to load is decided from `num_external_tokens`
   alone, never from the blocks being allocated.
3. `build_step` (build_connector_meta): pending loads go to the workers with the lease
   id; full blocks computed this step (and not loaded from the store) are planned
   for saving.
4. `on_reports` (update_connector_output): once every worker has reported a load,
   its lease is released and the request's timeline is complete. Objects that read
   back corrupt are removed after the release, before this returns: vLLM schedules
   the recompute next, and its save must find them gone to store them anew.
5. `finished` (request_finished): whatever lease the request still holds is released.

No I/O happens here except through the `Store` given to the constructor, so the
logic can be driven by tests with a fake store as well as a real one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstore.errors import KVStoreError
from kvstore_client import Lease
from kvstore_vllm.keys import KeyPlan, block_hashes_for_blocks
from kvstore_vllm.plans import LoadPlan, LoadReport, SavePlan, StepPlan
from kvstore_vllm.timeline import (
    BLOCKS_ALLOCATED,
    LOOKUP_COMMITTED,
    LOOKUP_START,
    REQUEST_RESUMED,
    Timeline,
    add_counter,
    new_stats_data,
    observe,
)

log = logging.getLogger("vllm.kvstore_vllm")


class Store(Protocol):
    """The control calls the scheduler side makes (see link.SchedulerStore)."""

    def lookup(self, keys: Sequence[bytes], ttl: float) -> Lease: ...

    def release(self, lease: Lease, keep_first: int | None = None) -> None: ...

    def remove(self, keys: Sequence[bytes]) -> int:
        """Remove now (after earlier releases); how many were removed. A key another
        lease still pins stays."""
        ...


@dataclass
class _Req:
    request: Any  # vllm Request: request_id, num_tokens, num_prompt_tokens, block_hashes
    lease: Lease | None = None
    lookup_first_block: int = 0  # first block index the lookup covered
    hit_blocks: int = 0
    load: LoadPlan | None = None  # planned, not yet sent to the workers
    loading_lease: int = 0  # lease handed to the workers, released once they report
    saved_blocks: int = 0  # leading blocks known stored (loaded, saved or planned)
    expected: int = -1  # computed tokens after the last planned step (-1: not scheduled yet)
    block_ids: list[int] = field(default_factory=list)
    timeline: Timeline | None = None
    hit_tokens: int = 0


class SchedulerSide:
    def __init__(self, store: Store, keys: KeyPlan, *, block_size: int, hash_block_size: int,
                 loads: bool, saves: bool, lease_ttl: float, save_decode: bool = False,
                 num_workers: int = 1, log_timeline: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.keys = keys
        self.block_size = block_size
        self.hash_block_size = hash_block_size
        self.loads = loads
        self.saves = saves
        self.lease_ttl = lease_ttl
        self.save_decode = save_decode
        self.num_workers = num_workers
        self.timeline_level = logging.INFO if log_timeline else logging.DEBUG
        self.clock = clock
        self.reqs: dict[str, _Req] = {}
        self._reports: dict[str, LoadReport] = {}
        self._handed: set[int] = set()  # leases sent to the workers, not yet released
        self.stats = new_stats_data()

    # -- helpers --------------------------------------------------------------------------

    def _state(self, request: Any) -> _Req:
        st = self.reqs.get(request.request_id)
        if st is None:
            st = self.reqs[request.request_id] = _Req(request)
        else:
            st.request = request
        return st

    def _block_hashes(self, request: Any) -> list[bytes]:
        return block_hashes_for_blocks(request.block_hashes, self.block_size, self.hash_block_size)

    def _release(self, lease: Lease | None, keep_first: int | None = None) -> None:
        if lease is None or not lease.id:
            return
        try:
            self.store.release(lease, keep_first)
            add_counter(self.stats, "leases_released" if keep_first is None else "leases_trimmed")
        except KVStoreError as exc:
            # The lease expires on its own; a failed release leaks nothing for long.
            add_counter(self.stats, "release_failures")
            log.debug("releasing lease %d failed: %s", lease.id, exc)

    # -- 1. lookup -------------------------------------------------------------------------

    def lookup(self, request: Any, num_computed_tokens: int) -> int:
        """External tokens available beyond `num_computed_tokens` (block aligned)."""
        if not self.loads:
            return 0
        st = self._state(request)
        if st.lease is not None:  # a retry after a failed allocation
            self._release(st.lease)
            st.lease = None
        st.load, st.hit_blocks, st.hit_tokens = None, 0, 0
        # The last prompt token is always computed: vLLM needs its logits.
        usable = request.num_tokens - 1
        first = num_computed_tokens // self.block_size
        hashes = self._block_hashes(request)
        # Blocks that hold at least one usable token, among those with a hash (full).
        last = min(len(hashes), -(-usable // self.block_size))
        if first >= last:
            return 0
        keys = self.keys.keys(hashes[first:last])
        tl = Timeline()
        tl.mark(LOOKUP_START, self.clock())
        try:
            lease = self.store.lookup(keys, self.lease_ttl)
        except KVStoreError as exc:
            add_counter(self.stats, "lookup_failures")
            log.debug("lookup for %s failed (%s): counted as a miss", request.request_id, exc)
            return 0
        tl.mark(LOOKUP_COMMITTED, self.clock())
        add_counter(self.stats, "lookups")
        add_counter(self.stats, "lookup_blocks", last - first)
        observe(self.stats, "lookup", tl.points[LOOKUP_COMMITTED] - tl.points[LOOKUP_START])
        hit = self.keys.whole_blocks(lease.count)
        if hit == 0:
            self._release(lease)
            return 0
        if lease.count != hit * self.keys.keys_per_block:
            self._release(lease, keep_first=hit * self.keys.keys_per_block)
        st.lease, st.lookup_first_block, st.hit_blocks, st.timeline = lease, first, hit, tl
        st.hit_tokens = min((first + hit) * self.block_size, usable) - num_computed_tokens
        return max(0, st.hit_tokens)

    # -- 2. allocation ---------------------------------------------------------------------

    def after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        st = self._state(request)
        st.block_ids = list(block_ids)
        st.load = None
        st.expected = -1  # (re-)admitted: the next scheduled step is its first
        if num_external_tokens <= 0 or st.lease is None:
            if num_external_tokens > 0:
                log.warning("request %s: vLLM asked to load %d tokens this connector did not "
                            "promise; ignoring", request.request_id, num_external_tokens)
            # Not ours to load (no hit, or another connector's): keep nothing pinned.
            self._release(st.lease)
            st.lease, st.timeline = None, None
            return
        first = st.lookup_first_block
        local = first * self.block_size
        end_block = -(-(local + num_external_tokens) // self.block_size)
        n = min(end_block - first, st.hit_blocks)
        kpb = self.keys.keys_per_block
        if n < st.hit_blocks:
            self._release(st.lease, keep_first=n * kpb)
        st.hit_blocks = n
        assert st.timeline is not None
        st.timeline.mark(BLOCKS_ALLOCATED, self.clock())
        hashes = self._block_hashes(request)[first:first + n]
        st.load = LoadPlan(request.request_id, st.lease.id, 0.0, hashes,
                           st.block_ids[first:first + n], first)
        st.saved_blocks = first + n
        add_counter(self.stats, "hit_tokens", num_external_tokens)
        add_counter(self.stats, "hit_blocks", n)

    # -- 3. the step's plan ----------------------------------------------------------------

    def build_step(self, scheduler_output: Any) -> StepPlan:
        plan = StepPlan()
        now = self.clock()
        for req_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._drop(req_id)
        scheduled: list[tuple[str, int, int]] = []  # (req id, computed before, scheduled)
        n_sched = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self.reqs.get(new.req_id)
            if st is not None:
                st.block_ids = list(new.block_ids[0]) if new.block_ids else st.block_ids
                scheduled.append((new.req_id, new.num_computed_tokens, n_sched.get(new.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            st = self.reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            scheduled.append((req_id, cached.num_computed_tokens[i], n_sched.get(req_id, 0)))

        for req_id, computed, n_new in scheduled:
            st = self.reqs[req_id]
            if st.load is not None:
                load, st.load = st.load, None
                assert st.lease is not None
                load.lease_ttl_left = max(0.0, st.lease.expires_at - now)
                plan.loads.append(load)
                st.loading_lease, st.lease = st.lease.id, None
                self._handed.add(st.loading_lease)
            if self.saves:
                save = self._plan_save(st, computed, n_new)
                if save is not None:
                    plan.saves.append(save)
        return plan

    def _plan_save(self, st: _Req, computed: int, n_new: int) -> SavePlan | None:
        request = st.request
        if st.expected < 0:
            # First step: what is computed already came from the local prefix cache or
            # from the store; neither needs saving.
            st.saved_blocks = max(st.saved_blocks, computed // self.block_size)
        elif computed < st.expected:
            # vLLM rolled the request back (a block failed to load): save from there on.
            st.saved_blocks = min(st.saved_blocks, computed // self.block_size)
        st.expected = computed + n_new
        limit = request.num_tokens if self.save_decode else request.num_prompt_tokens
        full = min(computed + n_new, limit) // self.block_size
        hashes = self._block_hashes(request)
        # Newer vLLM may hold back trailing hashes (EAGLE); store only published ones.
        published = getattr(request, "num_publishable_block_hashes", None)
        if isinstance(published, int):
            hashes = hashes[:published * self.hash_block_size // self.block_size]
        full = min(full, len(hashes), len(st.block_ids))
        if full <= st.saved_blocks:
            return None
        lo, st.saved_blocks = st.saved_blocks, full
        return SavePlan(request.request_id, hashes[lo:full], st.block_ids[lo:full])

    # -- 4. worker reports ----------------------------------------------------------------

    def on_reports(self, reports: dict[str, LoadReport]) -> None:
        now = self.clock()
        for req_id, rep in reports.items():
            got = self._reports.get(req_id)
            if got is None:
                self._reports[req_id] = got = rep
            else:
                got.merge(rep)
            if got.workers < self.num_workers:
                continue
            del self._reports[req_id]
            st = self.reqs.get(req_id)
            if got.lease_id in self._handed:
                self._handed.discard(got.lease_id)
                self._release(Lease(got.lease_id, [], 0.0))
            if st is not None and st.loading_lease == got.lease_id:
                st.loading_lease = 0
            if got.corrupt_keys:
                try:
                    removed = self.store.remove(got.corrupt_keys)
                    add_counter(self.stats, "corrupt_removed", removed)
                    if removed < len(got.corrupt_keys):
                        # Pinned by another request's lease: that load finds it corrupt
                        # too, and removes it after its own release.
                        log.debug("%d of %d corrupt objects not removed (pinned or gone)",
                                  len(got.corrupt_keys) - removed, len(got.corrupt_keys))
                except KVStoreError as exc:
                    log.debug("removing corrupt objects failed: %s", exc)
            if got.failed_block_ids:
                add_counter(self.stats, "load_failed_blocks", len(got.failed_block_ids))
            if st is not None and st.timeline is not None:
                tl = st.timeline
                tl.merge(got.timeline)
                tl.mark(REQUEST_RESUMED, now)
                for name, secs in tl.intervals().items():
                    # Every lookup is observed when it happens, hit or miss.
                    if name != "lookup":
                        observe(self.stats, name, secs)
                add_counter(self.stats, "loads_overlapping_forward" if tl.overlapped() else
                            "loads_done_before_needed" if tl.load_wait < 1e-3 else
                            "loads_waited_for")
                log.log(self.timeline_level,
                        "kvstore timeline request=%s hit_tokens=%d blocks=%d failed_blocks=%d %s",
                        req_id, st.hit_tokens, st.hit_blocks, len(got.failed_block_ids),
                        tl.describe())
                st.timeline = None

    # -- 5. the end -----------------------------------------------------------------------

    def finished(self, request: Any) -> None:
        self._drop(request.request_id)

    def _drop(self, req_id: str) -> None:
        st = self.reqs.pop(req_id, None)
        if st is None:
            return
        self._release(st.lease)
        if st.loading_lease in self._handed:
            # Loads finish within their step; a report still on its way is moot.
            self._handed.discard(st.loading_lease)
            self._release(Lease(st.loading_lease, [], 0.0))

    def held_leases(self) -> int:
        return sum(1 for st in self.reqs.values() if st.lease is not None) + len(self._handed)
