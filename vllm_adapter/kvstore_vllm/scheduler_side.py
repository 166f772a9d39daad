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
from kvstore_vllm.groups import (
    FULL,
    GroupKeys,
    best_hit,
    cdiv,
    checkpoint_boundaries,
    sliding_save_blocks,
)
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

    def exists(self, keys: Sequence[bytes]) -> list[bool]: ...

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
    block_ids: list[int] = field(default_factory=list)  # the first group's (see group_ids)
    timeline: Timeline | None = None
    hit_tokens: int = 0
    # Several KV cache groups: each group's block table, as vLLM gave it.
    group_ids: list[list[int]] = field(default_factory=list)
    # (block index, keys so far) after each group's keys of a block, in the lease's key
    # order: how many keys to keep when the lease is trimmed to fewer blocks.
    lease_order: list[tuple[int, int]] = field(default_factory=list)
    junction: int = 0  # tokens: where the store's full-attention prefix ended at lookup


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
        self.primary = 0  # the group whose block ids plans carry as `block_ids`
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

    def after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int,
                    group_ids: Sequence[Sequence[int]] | None = None) -> None:
        st = self._state(request)
        st.block_ids = list(block_ids)
        if group_ids:
            self._set_block_ids(st, group_ids)
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
        scheduled = self._scheduled(scheduler_output)

        # Asynchronous loads go out in the step that allocated their blocks, in which
        # the request itself is not scheduled.
        for st in [st for st in self.reqs.values() if st.load is not None and st.load.asynchronous]:
            self._hand_load(st, plan, now)
        for req_id, computed, n_new in scheduled:
            st = self.reqs[req_id]
            if st.load is not None:
                self._hand_load(st, plan, now)
            if self.saves:
                save = self._plan_save(st, computed, n_new)
                if save is not None:
                    plan.saves.append(save)
        return plan

    def _scheduled(self, scheduler_output: Any) -> list[tuple[str, int, int]]:
        """This step's scheduled requests of ours, new and cached, each as (req id, tokens
        computed before the step, tokens scheduled in it); the block ids vLLM gave them
        this step are recorded on the way."""
        scheduled: list[tuple[str, int, int]] = []
        n_sched = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self.reqs.get(new.req_id)
            if st is not None:
                if new.block_ids:
                    self._set_block_ids(st, new.block_ids)
                scheduled.append((new.req_id, new.num_computed_tokens, n_sched.get(new.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            st = self.reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:
                self._set_block_ids(st, new_ids or ([],))
            elif new_ids:
                self._add_block_ids(st, new_ids)
            scheduled.append((req_id, cached.num_computed_tokens[i], n_sched.get(req_id, 0)))
        return scheduled

    @staticmethod
    def _add_block_ids(st: _Req, new_ids: Sequence[Sequence[int]]) -> None:
        """A running request's blocks allocated this step, per KV cache group, appended to
        those it has (to block_ids when no group list was recorded)."""
        for g, ids in enumerate(new_ids):
            if g < len(st.group_ids):
                st.group_ids[g].extend(ids)
        if not st.group_ids:
            st.block_ids.extend(new_ids[0])

    def _set_block_ids(self, st: _Req, block_ids: Sequence[Sequence[int]]) -> None:
        st.group_ids = [list(ids) for ids in block_ids]
        st.block_ids = st.group_ids[self.primary] if len(st.group_ids) > self.primary else []

    def _hand_load(self, st: _Req, plan: StepPlan, now: float) -> None:
        load, st.load = st.load, None
        assert load is not None and st.lease is not None
        if load.lease_ttl_left >= 0:
            load.lease_ttl_left = max(0.0, st.lease.expires_at - now)
        else:
            load.lease_ttl_left = 0.0  # doomed (see HybridSchedulerSide.after_alloc)
        plan.loads.append(load)
        st.loading_lease, st.lease = st.lease.id, None
        self._handed.add(st.loading_lease)

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
        return self._save_range(st, hashes, lo, full)

    def _save_range(self, st: _Req, hashes: list[bytes], lo: int, hi: int) -> SavePlan | None:
        return SavePlan(st.request.request_id, hashes[lo:hi], st.block_ids[lo:hi])

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


# Attempts at pinning what an Exists found, when objects go between the two calls.
LOOKUP_ATTEMPTS = 3


class HybridSchedulerSide(SchedulerSide):
    """The scheduler side for a model with several KV cache groups (or one sliding-window
    group).

    A lookup first asks which objects of each group are stored (one batched Exists),
    picks the longest prefix every group can serve (a sliding-window group needs only
    its window at the end of the hit), then pins exactly those objects (one Lookup).
    Loads are asynchronous to vLLM, which takes no failed blocks from such a model: a
    failed load fails the request's receive and vLLM recomputes it. Sliding-window
    pages are saved only around the boundaries a later hit can end at (see groups).
    """

    def __init__(self, store: Store, groups: list[GroupKeys], *, block_size: int,
                 hash_block_size: int, loads: bool, saves: bool, lease_ttl: float,
                 retention_interval: int | None, save_decode: bool = False,
                 num_workers: int = 1, log_timeline: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        full = [g for g in groups if g.spec.kind == FULL]
        primary = full[0] if full else groups[0]
        super().__init__(store, primary.keys, block_size=block_size,
                         hash_block_size=hash_block_size, loads=loads, saves=saves,
                         lease_ttl=lease_ttl, save_decode=save_decode, num_workers=num_workers,
                         log_timeline=log_timeline, clock=clock)
        self.groups = groups
        self.primary = primary.spec.index
        self.retention_interval = retention_interval

    # -- 1. lookup -------------------------------------------------------------------------

    def lookup(self, request: Any, num_computed_tokens: int) -> int:
        if not self.loads:
            return 0
        st = self._state(request)
        if st.lease is not None:  # a retry after a failed allocation
            self._release(st.lease)
            st.lease = None
        st.load, st.hit_blocks, st.hit_tokens, st.junction = None, 0, 0, 0
        # A lookup starts the request over (admission, a failed load, a preemption):
        # nothing of it is known stored until this lookup says so.
        st.saved_blocks = 0
        usable = request.num_tokens - 1
        bs = self.block_size
        first = num_computed_tokens // bs
        hashes = self._block_hashes(request)
        last = min(len(hashes), cdiv(usable, bs))
        if first >= last:
            return 0
        span = hashes[first:last]
        by_group = {g.spec.index: [g.keys.block_keys(h) for h in span] for g in self.groups}
        tl = Timeline()
        tl.mark(LOOKUP_START, self.clock())
        lease: Lease | None = None
        k, tokens = first, 0
        order: list[tuple[int, int]] = []
        try:
            for _ in range(LOOKUP_ATTEMPTS):
                flat = [key for g in self.groups for blk in by_group[g.spec.index] for key in blk]
                found = self.store.exists(flat)
                present: dict[int, list[bool]] = {}
                pos = 0
                for g in self.groups:
                    per = g.keys.keys_per_block
                    present[g.spec.index] = [all(found[pos + i * per:pos + (i + 1) * per])
                                             for i in range(len(span))]
                    pos += per * len(span)
                k, extent = best_hit([g.spec for g in self.groups], present, first=first,
                                     last=last, usable=usable, block_size=bs)
                # The store's full-attention prefix reaches further than any group can
                # serve: this request saves a window there, for the next one.
                st.junction = extent * bs if extent > k else 0
                if k == first:
                    break
                tokens = min(k * bs, usable)
                keys, order = self._hit_keys(by_group, first, k, tokens)
                lease = self.store.lookup(keys, self.lease_ttl)
                if lease.count == len(keys):
                    break
                # Some object went between the Exists and the Lookup: ask again.
                self._release(lease)
                lease, k = None, first
                add_counter(self.stats, "lookup_races")
        except KVStoreError as exc:
            add_counter(self.stats, "lookup_failures")
            log.debug("lookup for %s failed (%s): counted as a miss", request.request_id, exc)
            if lease is not None:
                self._release(lease)
            return 0
        tl.mark(LOOKUP_COMMITTED, self.clock())
        add_counter(self.stats, "lookups")
        add_counter(self.stats, "lookup_blocks", last - first)
        observe(self.stats, "lookup", tl.points[LOOKUP_COMMITTED] - tl.points[LOOKUP_START])
        if lease is None or k == first:
            return 0
        st.lease, st.lookup_first_block, st.hit_blocks, st.timeline = lease, first, k - first, tl
        st.lease_order = order
        st.hit_tokens = tokens - num_computed_tokens
        return max(0, st.hit_tokens)

    def _hit_keys(self, by_group: dict[int, list[list[bytes]]], first: int, k: int,
                  tokens: int) -> tuple[list[bytes], list[tuple[int, int]]]:
        """Every group's keys of a hit of `tokens` tokens ending at block k, block-major
        (so trimming the lease to fewer blocks keeps a prefix of it)."""
        needed = {g.spec.index: g.spec.needed(first, tokens, self.block_size) for g in self.groups}
        keys: list[bytes] = []
        order: list[tuple[int, int]] = []
        for i in range(first, k):
            for g in self.groups:
                if i in needed[g.spec.index]:
                    keys.extend(by_group[g.spec.index][i - first])
                    order.append((i, len(keys)))
        return keys, order

    # -- 2. allocation ---------------------------------------------------------------------

    def after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int,
                    group_ids: Sequence[Sequence[int]] | None = None) -> None:
        st = self._state(request)
        if group_ids:
            self._set_block_ids(st, group_ids)
        st.load = None
        st.expected = -1
        if num_external_tokens <= 0 or st.lease is None:
            if num_external_tokens > 0:
                log.warning("request %s: vLLM asked to load %d tokens this connector did not "
                            "promise; ignoring", request.request_id, num_external_tokens)
            # No hit, another connector's, or the second call after an asynchronous
            # load (the lease went with the workers' report).
            self._release(st.lease)
            st.lease, st.timeline = None, None
            return
        bs = self.block_size
        first = st.lookup_first_block
        tokens = first * bs + num_external_tokens
        n = min(cdiv(tokens, bs) - first, st.hit_blocks)
        pinned = {i for i, _ in st.lease_order}  # blocks with some group's keys pinned
        doomed = False
        if n < st.hit_blocks:
            keep = max((c for i, c in st.lease_order if i < first + n), default=0)
            self._release(st.lease, keep_first=keep)
            st.lease_order = [(i, c) for i, c in st.lease_order if i < first + n]
            pinned = {i for i, _ in st.lease_order}
        st.hit_blocks = n
        group_block_ids: list[list[int]] = [[-1] * n for _ in range(len(st.group_ids))]
        lease_keys = set(st.lease.keys)
        for g in self.groups:
            need = g.spec.needed(first, tokens, bs)
            table = st.group_ids[g.spec.index] if g.spec.index < len(st.group_ids) else []
            hashes_g = self._block_hashes(request)
            for i in need:
                if i >= len(table) or i not in pinned or not all(
                        key in lease_keys for key in g.keys.block_keys(hashes_g[i])):
                    # Fewer tokens than promised moved the window onto blocks this
                    # lease does not hold (vLLM trims hits only for bounded replay):
                    # the load cannot be whole, so it fails and vLLM recomputes.
                    doomed = True
                    continue
                group_block_ids[g.spec.index][i - first] = table[i]
        assert st.timeline is not None
        st.timeline.mark(BLOCKS_ALLOCATED, self.clock())
        hashes = self._block_hashes(request)[first:first + n]
        st.load = LoadPlan(request.request_id, st.lease.id, -1.0 if doomed else 0.0, hashes,
                           st.block_ids[first:first + n], first,
                           group_block_ids=group_block_ids, asynchronous=True)
        st.saved_blocks = first + n
        add_counter(self.stats, "hit_tokens", num_external_tokens)
        add_counter(self.stats, "hit_blocks", n)

    # -- 3. saves --------------------------------------------------------------------------

    def _save_range(self, st: _Req, hashes: list[bytes], lo: int, hi: int) -> SavePlan | None:
        request = st.request
        bs = self.block_size
        junctions = [st.junction, int(getattr(request, "shared_prefix_boundary", 0) or 0)]
        boundaries = checkpoint_boundaries(num_prompt_tokens=request.num_prompt_tokens,
                                           block_size=bs, interval=self.retention_interval,
                                           junctions=junctions)
        prompt_blocks = request.num_prompt_tokens // bs
        group_block_ids: list[list[int]] = [[-1] * (hi - lo) for _ in range(len(st.group_ids))]
        for g in self.groups:
            table = st.group_ids[g.spec.index] if g.spec.index < len(st.group_ids) else []
            keep = set(sliding_save_blocks(g.spec, boundaries, lo, min(hi, prompt_blocks), bs))
            # Blocks filled while decoding (save_decode): no boundary is known yet.
            keep.update(range(max(lo, prompt_blocks), hi))
            for i in keep:
                if i < len(table):
                    group_block_ids[g.spec.index][i - lo] = table[i]
        if all(b < 0 for ids in group_block_ids for b in ids):
            return None
        return SavePlan(request.request_id, hashes[lo:hi], st.block_ids[lo:hi],
                        group_block_ids=group_block_ids)
