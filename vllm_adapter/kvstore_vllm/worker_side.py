"""Worker-side state: moves pages between the KV cache and the store, off the forward.

One step, as vLLM drives it:

    bind_connector_metadata -> begin_step: the step's save candidates are checked
                               against the store (one batched Exists) in the background
    start_load_kv           -> start_loads: every planned load is submitted to the I/O
                               thread (per layer when `layerwise_load`), under its lease
    attention layer l       -> wait_layer(l): blocks until layer l's pages are in (or
                               until all are, without layerwise loading)
                            -> save_layer(l): layer l's new pages are submitted for
                               writing, skipping those the store has
    wait_for_save           -> end_step: waits for this step's writes (the pages must
                               not change under them) and loads; failed blocks and
                               per-request load reports are ready to be taken

A failed, corrupt or lease-expired read marks its block failed: vLLM recomputes it
(kv_load_failure_policy "recompute"). A failed write is a future miss, never an error.

Models with several KV cache groups (sliding window next to full attention): each
layer's pages go to and from its group's block of the plan (-1: the group skips that
block). vLLM 0.32 cannot take failed blocks from such a model, so their loads are
asynchronous to it: submitted when the step's metadata is bound (they run during the
forward of the other requests), waited for at the end of the step, and reported as a
finished receive, or a failed one, for the whole request (vLLM then recomputes it).

MLA: every TP rank holds the same latent KV, so all ranks read the same objects and
only one rank (`writes`) saves them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvstore.devices import engine_devices
from kvstore.errors import CorruptObject, KVStoreError
from kvstore_client import AsyncKVStoreClient, Lease
from kvstore_vllm.keys import RankLayers
from kvstore_vllm.link import StoreLink
from kvstore_vllm.pages import KVPages, Staging, gather, scatter
from kvstore_vllm.plans import LoadPlan, LoadReport, StepPlan, destinations
from kvstore_vllm.timeline import (
    FORWARD_START,
    TRANSFER_COMPLETE,
    TRANSFER_SUBMITTED,
    Timeline,
    add_counter,
    new_stats_data,
    observe,
)

log = logging.getLogger("vllm.kvstore_vllm")

# The worker's view of a lease deadline stays this far inside the scheduler's.
LEASE_MARGIN = 1.0


@dataclass
class _Done:
    """What one I/O job reports back to the main thread."""

    errors: list[KVStoreError | None]  # per key
    nbytes: int = 0
    started: float = 0.0
    finished: float = 0.0
    failure: KVStoreError | None = None  # the whole job failed
    skipped: int = 0  # save: objects the store already had


@dataclass
class _Load:
    plan: LoadPlan
    lease: Lease
    # (layers, local block of each key read, future) per job; every job covers all
    # blocks of the plan that its layers' groups load.
    jobs: list[tuple[tuple[str, ...], list[int], concurrent.futures.Future[_Done]]] = field(
        default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)


GPU_DIRECT = ("auto", "on", "off")


def check_gpu_direct(value: str) -> str:
    if value not in GPU_DIRECT:
        raise ValueError(f"KVStoreConnector: gpu_direct must be one of {GPU_DIRECT}, not {value!r}")
    return value


def movable_devices(gpu_direct: str) -> frozenset[str]:
    """The devices whose pages move in place: those the engine can address, less the
    GPU when GPU-direct is off."""
    return frozenset({"cpu"}) if gpu_direct == "off" else engine_devices()


def _stream_point() -> torch.cuda.Event:
    """An event at the current end of the calling thread's CUDA stream (the forward's)."""
    ready = torch.cuda.Event()
    ready.record()
    return ready


def _outcome(fut: concurrent.futures.Future[_Done]) -> _Done:
    """A job's result; a job that raised (store down, a bug) is a failed job."""
    try:
        return fut.result()
    except KVStoreError as exc:
        return _Done([], failure=exc)
    except Exception as exc:  # degrade to recompute, whatever went wrong
        log.warning("kvstore I/O job failed unexpectedly: %r", exc, exc_info=True)
        return _Done([], failure=KVStoreError(f"unexpected error: {exc!r}"))


class WorkerSide:
    def __init__(self, link: StoreLink, rank: RankLayers, *, num_blocks: int, layerwise_load: bool,
                 staging_bytes: int, layer_groups: dict[str, int] | None = None,
                 writes: bool = True, gpu_direct: str = "auto",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.link = link
        self.rank = rank
        # vLLM's KV cache group of each layer (one group: all 0).
        self.layer_groups = layer_groups or dict.fromkeys(rank.layers, 0)
        self.writes = writes  # False: another rank saves the same objects (MLA)
        self.num_blocks = num_blocks
        self.layerwise_load = layerwise_load
        self.staging_bytes = staging_bytes
        self.gpu_direct = check_gpu_direct(gpu_direct)
        self.clock = clock
        self.pages: KVPages | None = None
        self._staging: Staging | None = None
        self._staging_lock: asyncio.Lock | None = None
        # -- per step
        self._loads: list[_Load] = []
        self._save_plan: list[tuple[bytes, int]] = []  # (block hash, block id) per block
        # Per layer: (key, local block, position in the step's Exists) of each page to save.
        self._save_pages: dict[str, list[tuple[bytes, int, int]]] = {}
        self._exists: concurrent.futures.Future[list[bool]] | None = None
        self._saves: dict[str, concurrent.futures.Future[_Done]] = {}
        self._forward_started: float | None = None
        self._waited_layers: set[str] = set()
        # -- taken by vLLM after each step
        self._failed_blocks: set[int] = set()
        self._finished_recving: set[str] = set()
        self._failed_recving: set[str] = set()
        self._reports: dict[str, LoadReport] = {}
        self.stats = new_stats_data()

    # -- set-up ---------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.rank.layers if n not in kv_caches]
        if missing:
            raise ValueError(f"KVStoreConnector: KV caches for layers {missing} were not "
                             "registered; the model's layers differ from the KV cache config")
        self.pages = KVPages({n: kv_caches[n] for n in self.rank.layers}, self.num_blocks,
                             movable_devices(self.gpu_direct))
        if self.gpu_direct == "on" and self.pages.on_gpu and not self.pages.zero_copy:
            raise ValueError("KVStoreConnector: gpu_direct is 'on' but the GPU KV pages cannot "
                             "move in place (" + self.pages.layout_tag() + "); it needs a CUDA "
                             "build of the Transfer Engine and a layout whose pages are "
                             "contiguous; set gpu_direct to 'auto' to stage them instead")
        for storage in self.pages.storages():
            if self.pages.zero_copy:
                self.link.register(storage)
        if not self.pages.zero_copy:
            self._staging = Staging(self.staging_bytes, self.link.register)
        log.info("KVStoreConnector worker: %d layers, %s", len(self.pages.layers),
                 self.pages.layout_tag())

    # -- one step -------------------------------------------------------------------------

    def begin_step(self, plan: StepPlan) -> None:
        self._loads, self._saves, self._exists = [], {}, None
        self._forward_started = None
        self._waited_layers = set()
        self._save_plan, self._save_pages = [], {}
        if self.writes:
            self._plan_saves(plan)
        if self._save_plan and self.pages is not None:
            keys = [k for k, _, _ in sorted((item for pages in self._save_pages.values()
                                              for item in pages), key=lambda item: item[2])]
            try:
                self._exists = self.link.submit(lambda c: c.exists(keys))
            except KVStoreError:
                self._exists = None
        # Asynchronous loads fill blocks no request of this step reads: start them now,
        # alongside the forward.
        self._start([lp for lp in plan.loads if lp.asynchronous])

    def _plan_saves(self, plan: StepPlan) -> None:
        pos = 0
        for s in plan.saves:
            per_group = {g: destinations(s, g) for g in set(self.layer_groups.values())}
            for j, h in enumerate(s.block_hashes):
                self._save_plan.append((h, s.block_ids[j]))
                for name, key in zip(self.rank.layers, self.rank.keys(h), strict=True):
                    b = per_group[self.layer_groups[name]][j]
                    if b >= 0:
                        self._save_pages.setdefault(name, []).append((key, b, pos))
                        pos += 1

    def start_loads(self, plan: StepPlan) -> None:
        self._start([lp for lp in plan.loads if not lp.asynchronous])

    def _start(self, loads: list[LoadPlan]) -> None:
        if not loads or self.pages is None:
            return
        now = self.clock()
        for lp in loads:
            keys = [k for h in lp.block_hashes for k in self.rank.keys(h)]
            lease = Lease(lp.lease_id, keys, now + lp.lease_ttl_left - LEASE_MARGIN)
            load = _Load(lp, lease)
            load.timeline.mark(TRANSFER_SUBMITTED, now)
            jobs = ([(n,) for n in self.rank.layers] if self.layerwise_load and not lp.asynchronous
                    else [tuple(self.rank.layers)])
            for layers in jobs:
                owners: list[int] = []
                try:
                    fut = self.link.submit(self._load_job(lp, lease, layers, owners))
                except KVStoreError as exc:
                    fut = concurrent.futures.Future()
                    fut.set_result(_Done([], failure=exc))
                load.jobs.append((layers, owners, fut))
            self._loads.append(load)

    def wait_layer(self, layer_name: str) -> None:
        now = self.clock()
        if self._forward_started is None:
            self._forward_started = now
        self._waited_layers.add(layer_name)
        for load in self._loads:
            if load.plan.asynchronous:
                continue  # no request of this step reads those blocks
            for layers, _, fut in load.jobs:
                if layer_name in layers or not self.layerwise_load:
                    t = self.clock()
                    concurrent.futures.wait([fut])
                    load.timeline.load_wait += self.clock() - t

    def save_layer(self, layer_name: str) -> None:
        if self._forward_started is None:
            self._forward_started = self.clock()
        if not self._save_plan or layer_name in self._saves or self.pages is None:
            return
        if layer_name not in self._save_pages:
            return
        self._saves[layer_name] = self._submit_save(layer_name)

    def end_step(self) -> None:
        """Wait for this step's writes and reads; collect failures and reports."""
        wait_started = self.clock()
        if self._save_plan and self.pages is not None:
            for name in self._save_pages:  # layers whose save hook did not run
                if name not in self._saves:
                    self._saves[name] = self._submit_save(name)
        self._collect_saves(wait_started)
        self._collect_loads()
        self._save_plan, self._save_pages, self._saves, self._exists = [], {}, {}, None

    def take_failed_blocks(self) -> set[int]:
        out, self._failed_blocks = self._failed_blocks, set()
        return out

    def take_transfer_results(self) -> tuple[set[str], set[str]]:
        """Asynchronous loads done since the last call: (finished, failed among them)."""
        done, failed = self._finished_recving, self._failed_recving
        self._finished_recving, self._failed_recving = set(), set()
        return done, failed

    def take_reports(self) -> dict[str, LoadReport]:
        out, self._reports = self._reports, {}
        return out

    def take_stats(self) -> dict[str, Any]:
        out, self.stats = self.stats, new_stats_data()
        return out

    # -- loads ----------------------------------------------------------------------------

    def _load_job(self, lp: LoadPlan, lease: Lease, layers: Sequence[str],
                  owners: list[int]) -> Callable[[AsyncKVStoreClient], Any]:
        """The read of `layers`' pages of the plan; fills `owners` with the local block
        (of the first group) that each key's failure fails."""
        assert self.pages is not None
        pages = self.pages
        keys: list[bytes] = []
        targets: list[torch.Tensor] = []
        per_group = {g: destinations(lp, g) for g in set(self.layer_groups.values())}
        for j, h in enumerate(lp.block_hashes):
            for name, key in zip(self.rank.layers, self.rank.keys(h), strict=True):
                b = per_group[self.layer_groups[name]][j]
                if name in layers and b >= 0:
                    keys.append(key)
                    targets.append(pages.layers[name].page(b))
                    owners.append(lp.block_ids[j])

        # GPU-direct: kernels already queued on the forward's stream may still touch the
        # blocks the engine is about to overwrite; the read waits for them.
        ready = _stream_point() if pages.zero_copy and pages.on_gpu else None

        async def job(client: AsyncKVStoreClient) -> _Done:
            started = self.clock()
            if ready is not None:
                await asyncio.to_thread(ready.synchronize)
            try:
                if pages.zero_copy:
                    views = [t.view(torch.uint8).reshape(-1) for t in targets]
                    errs = await client.get_into(keys, views, lease=lease)
                else:
                    errs = await self._staged_read(client, keys, targets, lease)
            except KVStoreError as exc:  # LeaseExpired, Unavailable: none of it is trusted
                return _Done([], started=started, finished=self.clock(), failure=exc)
            nbytes = sum(t.numel() * t.element_size() for t, e in zip(targets, errs, strict=True)
                         if e is None)
            return _Done(errs, nbytes, started, self.clock())

        return job

    async def _staged_read(self, client: AsyncKVStoreClient, keys: list[bytes],
                           targets: list[torch.Tensor], lease: Lease) -> list[KVStoreError | None]:
        staging = self._staging
        assert staging is not None
        if self._staging_lock is None:
            self._staging_lock = asyncio.Lock()
        sizes = [t.numel() * t.element_size() for t in targets]
        errs: list[KVStoreError | None] = []
        async with self._staging_lock:
            for lo, hi in staging.chunks(sizes):
                slots = staging.slots(sizes[lo:hi])
                part = await client.get_into(keys[lo:hi], slots, lease=lease)
                for slot, target, err in zip(slots, targets[lo:hi], part, strict=True):
                    if err is None:
                        scatter(slot, target)
                errs.extend(part)
        return errs

    def _collect_loads(self) -> None:
        for load in self._loads:
            lp, tl = load.plan, load.timeline
            failed: set[int] = set()
            corrupt: list[bytes] = []
            n_objects = 0
            for layers, owners, fut in load.jobs:
                done = _outcome(fut)
                n_objects += len(owners)
                if done.failure is not None or len(done.errors) != len(owners):
                    failed.update(lp.block_ids)
                    add_counter(self.stats, "load_job_failures")
                    log.warning("kvstore: loading %d blocks of request %s failed (%s); vLLM "
                                "recomputes them", len(lp.block_ids), lp.req_id, done.failure)
                else:
                    for owner, err in zip(owners, done.errors, strict=True):
                        if err is not None:
                            failed.add(owner)
                            if isinstance(err, CorruptObject) and err.key is not None:
                                corrupt.append(err.key)
                add_counter(self.stats, "load_bytes", done.nbytes)
                if done.finished:
                    for name in layers:
                        tl.layer_ready[name] = done.finished
            if self._forward_started is not None:
                tl.mark(FORWARD_START, self._forward_started)
            tl.mark(TRANSFER_COMPLETE, max(tl.layer_ready.values(), default=self.clock()))
            transfer = tl.points[TRANSFER_COMPLETE] - tl.points[TRANSFER_SUBMITTED]
            observe(self.stats, "load_transfer", transfer)
            add_counter(self.stats, "load_seconds", transfer)
            add_counter(self.stats, "load_blocks", len(lp.block_ids))
            add_counter(self.stats, "load_objects", n_objects)
            if failed:
                add_counter(self.stats, "load_failed_blocks", len(failed))
                if corrupt:
                    add_counter(self.stats, "load_corrupt_objects", len(corrupt))
                log.warning("kvstore: %d of %d loaded blocks of request %s failed (corrupt: %d); "
                            "vLLM recomputes them", len(failed), len(lp.block_ids), lp.req_id,
                            len(corrupt))
            if lp.asynchronous:
                # vLLM takes no failed blocks from a model with several groups: the
                # whole request is reported failed and recomputed.
                self._finished_recving.add(lp.req_id)
                if failed:
                    self._failed_recving.add(lp.req_id)
            else:
                self._failed_blocks |= failed
            self._reports[lp.req_id] = LoadReport(lp.req_id, lp.lease_id, 1, sorted(failed),
                                                  corrupt, tl, failed=bool(failed))
        self._loads = []

    # -- saves ----------------------------------------------------------------------------

    def _submit_save(self, layer_name: str) -> concurrent.futures.Future[_Done]:
        assert self.pages is not None
        lp = self.pages.layers[layer_name]
        keys, sources, positions = [], [], []
        for key, b, pos in self._save_pages[layer_name]:
            keys.append(key)
            sources.append(lp.page(b))
            positions.append(pos)
        exists = self._exists
        submitted = self.clock()
        # On a GPU the attention kernel that wrote these pages may still be running:
        # the copy out waits for an event recorded on the forward's stream.
        ready = _stream_point() if lp.tensor.device.type == "cuda" else None

        async def job(client: AsyncKVStoreClient) -> _Done:
            started = self.clock()
            present = [False] * len(keys)
            if exists is not None:
                try:
                    found = await asyncio.wrap_future(exists)
                except KVStoreError as exc:  # the store is down: nothing is saved
                    return _Done([], started=started, finished=self.clock(), failure=exc)
                present = [found[p] for p in positions]
            if ready is not None:
                await asyncio.to_thread(ready.synchronize)
            todo = [i for i, p in enumerate(present) if not p]
            errs: list[KVStoreError | None] = [None] * len(keys)
            nbytes = 0
            if todo:
                k = [keys[i] for i in todo]
                src = [sources[i] for i in todo]
                if self.pages is not None and self.pages.zero_copy:
                    part = await client.put_from(k, [s.view(torch.uint8).reshape(-1) for s in src])
                else:
                    part = await self._staged_write(client, k, src)
                for i, e in zip(todo, part, strict=True):
                    errs[i] = e
                    if e is None:
                        nbytes += sources[i].numel() * sources[i].element_size()
            return _Done(errs, nbytes, started, self.clock(), skipped=len(keys) - len(todo))

        try:
            fut = self.link.submit(job)
        except KVStoreError as exc:
            fut = concurrent.futures.Future()
            fut.set_result(_Done([], started=submitted, finished=submitted, failure=exc))
        return fut

    async def _staged_write(self, client: AsyncKVStoreClient, keys: list[bytes],
                            sources: list[torch.Tensor]) -> list[KVStoreError | None]:
        staging = self._staging
        assert staging is not None
        if self._staging_lock is None:
            self._staging_lock = asyncio.Lock()
        sizes = [s.numel() * s.element_size() for s in sources]
        errs: list[KVStoreError | None] = []
        async with self._staging_lock:
            for lo, hi in staging.chunks(sizes):
                slots = staging.slots(sizes[lo:hi])
                for slot, src in zip(slots, sources[lo:hi], strict=True):
                    gather(src, slot)
                errs.extend(await client.put_from(keys[lo:hi], slots))
        return errs

    def _collect_saves(self, wait_started: float) -> None:
        if not self._saves:
            return
        futs = list(self._saves.values())
        done_set, pending = concurrent.futures.wait(futs, timeout=self.link.settings.timeout * 3 + 5)
        waited = self.clock() - wait_started
        observe(self.stats, "save_wait", waited)
        if pending:
            # The store hangs; the pages may change under these writes, which the
            # checksum taken before the write will then expose to any reader.
            add_counter(self.stats, "save_timeouts", len(pending))
            self.link.mark_down("saves did not finish in time")
        first_start, last_end = None, 0.0
        for fut in done_set:
            done = _outcome(fut)
            if done.failure is not None:
                add_counter(self.stats, "save_failures", 1)
                continue
            add_counter(self.stats, "save_bytes", done.nbytes)
            add_counter(self.stats, "save_objects", sum(1 for e in done.errors if e is None)
                        - done.skipped)
            add_counter(self.stats, "save_skipped_existing", done.skipped)
            bad = sum(1 for e in done.errors if e is not None)
            if bad:
                add_counter(self.stats, "save_failed_objects", bad)
            first_start = done.started if first_start is None else min(first_start, done.started)
            last_end = max(last_end, done.finished)
        add_counter(self.stats, "save_blocks", len(self._save_plan))
        if first_start is not None:
            observe(self.stats, "save_transfer", last_end - first_start)
            add_counter(self.stats, "save_seconds", last_end - first_start)
            # Saves that finished before wait_for_save was called ran alongside the forward.
            add_counter(self.stats, "save_seconds_overlapped",
                        max(0.0, min(last_end, wait_started) - first_start))
