"""`KVStoreConnector`: vLLM's KVConnectorBase_V1 over kvstore (vLLM 0.32 and 0.33).

vLLM builds this class twice: once in the scheduler process (role SCHEDULER) and once
in every worker (role WORKER). Each instance delegates to the state of its side,
`SchedulerSide` or `WorkerSide`, which never meet: the scheduler's plan for a step
travels to the workers as `KVStoreConnectorMetadata`, the workers' load outcomes come
back as `KVStoreWorkerMetadata`.

A positive lookup is a promise: the looked-up blocks stay pinned in the store under a
lease from `get_num_new_matched_tokens` until every worker has loaded them. Anything
that fails on the way (store down, lease expired, corrupt object) becomes a miss or a
block vLLM recomputes, never a failed request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found,unused-ignore]
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found,unused-ignore]
        KVConnectorTransferResults,
    )
except ImportError:  # a vLLM without it reads get_finished only
    @dataclass
    class KVConnectorTransferResults:  # type: ignore[no-redef]
        finished_sending: set[str] = field(default_factory=set)
        finished_recving: set[str] = field(default_factory=set)
        failed_recving: set[str] = field(default_factory=set)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore[import-not-found,unused-ignore]
    KVConnectorStats,
)

from kvstore_vllm.groups import FULL, SLIDING, GroupKeys, GroupSpec
from kvstore_vllm.keys import KeyPlan, Namespace, RankLayers, seed_digest
from kvstore_vllm.link import StoreLink
from kvstore_vllm.plans import LoadReport, StepPlan, merge_reports
from kvstore_vllm.scheduler_side import HybridSchedulerSide, SchedulerSide
from kvstore_vllm.scheduler_store import LinkStore
from kvstore_vllm.settings import Settings, role_flags
from kvstore_vllm.timeline import merge_stats_data, new_stats_data, reduce_stats, stats_empty
from kvstore_vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig  # type: ignore[import-not-found,unused-ignore]
    from vllm.forward_context import ForwardContext  # type: ignore[import-not-found,unused-ignore]
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # type: ignore[import-not-found,unused-ignore]
    from vllm.v1.core.sched.output import SchedulerOutput  # type: ignore[import-not-found,unused-ignore]
    from vllm.v1.kv_cache_interface import KVCacheConfig  # type: ignore[import-not-found,unused-ignore]
    from vllm.v1.outputs import KVConnectorOutput  # type: ignore[import-not-found,unused-ignore]
    from vllm.v1.request import Request  # type: ignore[import-not-found,unused-ignore]

log = logging.getLogger("vllm.kvstore_vllm")


class KVStoreConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per step."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class KVStoreWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler, once per step: the loads that finished, per request."""

    def __init__(self, reports: dict[str, LoadReport]) -> None:
        self.reports = reports

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, KVStoreWorkerMetadata):
            merge_reports(self.reports, other.reports)
        return self


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    """Counters and timeline histograms; `data` is plain dicts and lists (see timeline)."""

    data: dict[str, Any] = field(default_factory=new_stats_data)

    def __post_init__(self) -> None:
        if not self.data:
            self.data = new_stats_data()

    def reset(self) -> None:
        self.data = new_stats_data()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merge_stats_data(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        return reduce_stats(self.data)

    def is_empty(self) -> bool:
        return stats_empty(self.data)


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads prefix KV from kvstore instead of recomputing it; saves what it computed."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        assert ktc is not None  # the base class refused a config without one
        self.settings = Settings.from_extra_config(ktc.kv_connector_extra_config)
        self._failed_recving: set[str] = set()  # failed asynchronous loads, not yet reported
        self.loads, self.saves = role_flags(ktc.kv_role)
        groups = connector_groups(kv_cache_config)
        spec = groups[0][1]
        layers = [name for _, _, names in groups for name in names]
        self.block_size = int(spec.block_size)
        # One sliding-window group, or several groups: vLLM takes no failed blocks from
        # such a model, so loads go through its asynchronous path (see HybridSchedulerSide).
        self.hybrid = len(groups) > 1 or any(kind != FULL for _, kind, _, _ in _kinds(groups))
        # MLA: the latent KV is the same on every TP rank; all ranks share one set of
        # objects (tp_rank -1 in the namespace) and only TP rank 0 writes it.
        self.mla = all(_is_mla(g_spec) for _, g_spec, _ in groups)
        if self.hybrid and not hasattr(KVConnectorBase_V1, "get_transfer_results"):
            # Without it a failed load of such a model could not be reported at all.
            raise ValueError("KVStoreConnector: this vLLM cannot report failed asynchronous "
                             "loads (no get_transfer_results), which models with several KV "
                             f"cache groups need; vLLM {_vllm_version()}")
        hash_block = getattr(kv_cache_config, "hash_block_size", None) or self.block_size
        pc = vllm_config.parallel_config
        tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
        base = build_namespace(vllm_config, kv_cache_config, spec, tp_rank=0, pp_rank=0,
                               settings=self.settings, groups=groups if self.hybrid else None)
        key_ranks = [-1] if self.mla else list(range(tp))
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        log.info("KVStoreConnector: vLLM %s here; tested with vLLM %s (engine) and %s (scheduler "
                 "and connector API)", _vllm_version(), TESTED_VLLM[0], TESTED_VLLM[1])
        if role == KVConnectorRole.SCHEDULER:
            self.link = StoreLink(self.settings, "scheduler")
            self.link.warm_up()
            self.store = LinkStore(self.link)
            if self.hybrid:
                group_keys = []
                for index, kind, names, window in _kinds(groups):
                    by_pp = _layers_by_pp_rank(list(names), vllm_config, pp)
                    ranks = [RankLayers(base.for_rank(t, p), tuple(by_pp[p]))
                             for p in range(pp) for t in key_ranks if by_pp[p]]
                    group_keys.append(GroupKeys(GroupSpec(index, kind, tuple(names), window),
                                                KeyPlan(ranks)))
                self.scheduler_side = HybridSchedulerSide(
                    self.store, group_keys, block_size=self.block_size, hash_block_size=hash_block,
                    loads=self.loads, saves=self.saves, lease_ttl=self.settings.lease_ttl,
                    retention_interval=retention_interval(self.settings, vllm_config,
                                                          kv_cache_config),
                    save_decode=self.settings.save_decode, num_workers=tp * pp,
                    log_timeline=self.settings.log_timeline)
                per_block = sum(g.keys.keys_per_block for g in group_keys)
            else:
                by_pp = _layers_by_pp_rank(layers, vllm_config, pp)
                plan = KeyPlan([RankLayers(base.for_rank(t, p), tuple(by_pp[p]))
                                for p in range(pp) for t in key_ranks])
                self.scheduler_side = SchedulerSide(
                    self.store, plan, block_size=self.block_size, hash_block_size=hash_block,
                    loads=self.loads, saves=self.saves, lease_ttl=self.settings.lease_ttl,
                    save_decode=self.settings.save_decode, num_workers=tp * pp,
                    log_timeline=self.settings.log_timeline)
                per_block = plan.keys_per_block
            log.info("KVStoreConnector (scheduler, %s) store etcd=%s cluster=%s, %d key(s) per "
                     "block; groups %s; namespace %s", ktc.kv_role,
                     self.settings.master or self.settings.etcd, self.settings.cluster, per_block,
                     _describe_groups(groups), base.describe())
        else:
            tp_rank, pp_rank = _worker_ranks()
            ns = base.for_rank(-1 if self.mla else tp_rank, pp_rank)
            self.link = StoreLink(self.settings, "worker", buffer_size=1 << 20)
            self.worker_side = WorkerSide(
                self.link, RankLayers(ns, tuple(layers)), num_blocks=kv_cache_config.num_blocks,
                layerwise_load=self.settings.layerwise_load,
                staging_bytes=self.settings.staging_bytes,
                layer_groups={name: index for index, _, names in groups for name in names},
                writes=not self.mla or tp_rank == 0, gpu_direct=self.settings.gpu_direct)
            log.info("KVStoreConnector (worker tp=%d pp=%d, %s) layerwise_load=%s%s; namespace %s",
                     tp_rank, pp_rank, ktc.kv_role, self.settings.layerwise_load,
                     "" if not self.mla else " mla(writes=%s)" % (tp_rank == 0), ns.describe())

    # -- properties vLLM asks ---------------------------------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a dropped save is a future miss, nothing is owed to anyone.
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # save_kv_layer / wait_for_layer_load run Python per layer.
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KVStoreConnectorStats(data=data or new_stats_data())

    # -- scheduler side -------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.scheduler_side is not None
        n = self.scheduler_side.lookup(request, num_computed_tokens)
        return n, self.hybrid and n > 0

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        assert self.scheduler_side is not None
        ids = blocks.get_block_ids()
        self.scheduler_side.after_alloc(request, ids[0] if ids else [], num_external_tokens,
                                        group_ids=ids)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self.scheduler_side is not None
        return KVStoreConnectorMetadata(self.scheduler_side.build_step(scheduler_output))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KVStoreWorkerMetadata) and self.scheduler_side is not None:
            self.scheduler_side.on_reports(meta.reports)

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self.scheduler_side is not None:
            self.scheduler_side.finished(request)
        # Saves finish within their step (wait_for_save): nothing to hold the blocks for.
        return False, None

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, block_ids[0] if block_ids else [])

    # -- worker side ----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.worker_side is not None
        self.worker_side.register(kv_caches)
        self.link.warm_up()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker_side is not None and isinstance(connector_metadata, KVStoreConnectorMetadata):
            self.worker_side.begin_step(connector_metadata.plan)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if self.worker_side is not None and isinstance(meta, KVStoreConnectorMetadata):
            self.worker_side.start_loads(meta.plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.worker_side is not None:
            self.worker_side.wait_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        if self.worker_side is not None:
            self.worker_side.save_layer(layer_name)

    def wait_for_save(self) -> None:
        if self.worker_side is not None:
            self.worker_side.end_step()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.worker_side is None:
            return None, None
        done, failed = self.worker_side.take_transfer_results()
        self._failed_recving |= failed
        return None, (done or None)

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        # vLLM 0.32: failed receives travel with the finished ones (a model with several
        # KV cache groups cannot report failed blocks).
        _, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recving = self._failed_recving, set()
        return KVConnectorTransferResults(finished_recving=set(recving or ()),
                                          failed_recving=failed & set(recving or ()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.worker_side is None:
            return set()
        return self.worker_side.take_failed_blocks()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self.worker_side is None:
            return None
        reports = self.worker_side.take_reports()
        return KVStoreWorkerMetadata(reports) if reports else None

    # -- both -----------------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.worker_side is not None:
            data = self.worker_side.take_stats()
        elif self.scheduler_side is not None:
            data, self.scheduler_side.stats = self.scheduler_side.stats, new_stats_data()
        else:
            return None
        return None if stats_empty(data) else KVStoreConnectorStats(data=data)

    def shutdown(self) -> None:
        store = getattr(self, "store", None)
        if isinstance(store, LinkStore):
            # Releases still queued go out before the client closes: lost, they would pin
            # their objects until the lease TTL ran out.
            store.flush(timeout=self.settings.timeout * 2 + 1)
        link = getattr(self, "link", None)
        if link is not None:
            link.close()


# -- KV cache groups, and the namespace, from vLLM's config -----------------------------------

# vLLM versions this connector was tested with: a real engine, and (CUDA wheel, no
# engine here) its scheduler and connector base.
TESTED_VLLM = ("0.32.0", "0.33.0")


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def _is_mla(spec: Any) -> bool:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return type(spec) is MLAAttentionSpec


def connector_groups(kv_cache_config: Any) -> list[tuple[int, Any, list[str]]]:
    """(vLLM group id, spec, layer names) of every group the connector moves.

    Full attention (also MLA) and sliding window are supported; any other kind is
    refused here, at start, with a sentence naming it.
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    supported = (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec)
    out: list[tuple[int, Any, list[str]]] = []
    kinds = [type(g.kv_cache_spec).__name__ for g in kv_cache_config.kv_cache_groups]
    for index, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        if not getattr(g, "enable_kv_transfer", True):
            continue  # an accelerator-side replica vLLM rebuilds from its source group
        if type(spec) not in supported:
            raise ValueError(_refusal(type(spec).__name__, kinds))
        out.append((index, spec, list(g.layer_names)))
    if not out:
        raise ValueError(f"KVStoreConnector: this model has no KV cache group to store ({kinds})")
    if len({int(spec.block_size) for _, spec, _ in out}) != 1:
        raise ValueError("KVStoreConnector needs one block size across KV cache groups; this "
                         f"model's groups have {[int(s.block_size) for _, s, _ in out]}")
    if len({_is_mla(spec) for _, spec, _ in out}) != 1:
        raise ValueError(f"KVStoreConnector: MLA next to other attention kinds ({kinds}) is not "
                         "supported")
    return out


def _refusal(kind: str, kinds: list[str]) -> str:
    if "Mamba" in kind:
        what = (f"a {kind} group (Mamba / linear-attention state): its state is one "
                "per-request block that vLLM rewrites in place, which this connector does not "
                "yet save or restore")
    else:
        what = f"a {kind} group, which this connector does not store"
    return (f"KVStoreConnector supports full-attention, MLA and sliding-window KV cache groups; "
            f"this model has {what} (all groups: {kinds}). Run it without the connector.")


def _kinds(groups: list[tuple[int, Any, list[str]]]) -> list[tuple[int, str, list[str], int]]:
    """(group id, FULL or SLIDING, layers, window tokens) per group."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    out = []
    for index, spec, names in groups:
        if isinstance(spec, SlidingWindowSpec):
            window = int(spec.sliding_window) + int(getattr(spec, "extra_retained_tokens", 0) or 0)
            out.append((index, SLIDING, names, window))
        else:
            out.append((index, FULL, names, 0))
    return out


def _describe_groups(groups: list[tuple[int, Any, list[str]]]) -> str:
    out = []
    for i, spec, names in groups:
        window = getattr(spec, "sliding_window", None)
        out.append(f"{i}:{type(spec).__name__}" + (f"(window={window})" if window else "")
                   + f"x{len(names)}")
    return ",".join(out)


def retention_interval(settings: Settings, vllm_config: Any, kv_cache_config: Any) -> int | None:
    """Where sliding-window groups save their windows (see groups.checkpoint_boundaries):
    the `sliding_window_checkpoints` option, else vLLM's own prefix-cache retention."""
    opt = settings.sliding_window_checkpoints.strip().lower()
    if opt == "dense":
        return None
    if opt:
        return int(opt)
    resolved = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if resolved is not None:
        return int(resolved)
    configured = getattr(vllm_config.cache_config, "prefix_cache_retention_interval", 0)
    return None if configured is None else int(configured)


def _worker_ranks() -> tuple[int, int]:
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank()), int(get_pp_group().rank_in_group)
    except (AssertionError, ImportError, AttributeError):  # not initialised: one process
        return 0, 0


def _layers_by_pp_rank(layers: list[str], vllm_config: Any, pp: int) -> list[list[str]]:
    if pp == 1:
        return [list(layers)]
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.models.utils import extract_layer_index

    n = vllm_config.model_config.get_total_num_hidden_layers()
    out: list[list[str]] = [[] for _ in range(pp)]
    for name in layers:
        i = extract_layer_index(name)
        for r in range(pp):
            lo, hi = get_pp_indices(n, r, pp)
            if lo <= i < hi:
                out[r].append(name)
                break
    return out


def model_identity(model: str, settings: Settings) -> str:
    """The model's name or path, plus a fingerprint of a local checkpoint's description.

    A local directory is fingerprinted by its config.json and the names and sizes of
    its weight files, so two copies of one checkpoint share and a different checkpoint
    at the same path does not. (Hashing the weights themselves would cost minutes on a
    large model; set `model_id` to name the weights explicitly.)
    """
    if settings.model_id:
        return settings.model_id
    path = Path(model)
    if not path.is_dir():
        return model
    h = hashlib.sha256()
    cfg = path / "config.json"
    if cfg.exists():
        h.update(cfg.read_bytes())
    for f in sorted(path.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{path.name}@{h.hexdigest()[:16]}"


def build_namespace(vllm_config: Any, kv_cache_config: Any, spec: Any, *, tp_rank: int,
                    pp_rank: int, settings: Settings,
                    groups: list[tuple[int, Any, list[str]]] | None = None) -> Namespace:
    import vllm
    from vllm.platforms import current_platform

    try:
        from vllm.v1.core.kv_cache_utils import get_none_hash_seed

        seed = get_none_hash_seed()
    except ImportError:  # older vLLM: the seed is PYTHONHASHSEED or a fixed default
        seed = os.environ.get("PYTHONHASHSEED", "default")
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    version = ".".join(str(vllm.__version__).split(".")[:2])
    fields: dict[str, Any] = {
        "kv_cache_layout": getattr(kv_cache_config, "kv_cache_layout", None) or "default",
        "device": str(current_platform.device_type),
        "attention_backend": str(getattr(backend, "name", backend) or "auto"),
        "spec": type(spec).__name__,
        "num_kv_heads": int(spec.num_kv_heads),
        "head_size": int(spec.head_size),
        "page_bytes": int(spec.page_size_bytes),
        "vllm": version,
    }
    if _is_mla(spec):
        fields["mla"] = True
    if groups is not None:
        # Several groups: each one's geometry (layer names already tell them apart in
        # the keys; a changed window or head count must not meet the old objects).
        fields["groups"] = [[type(g).__name__, int(g.num_kv_heads), int(g.head_size),
                             int(g.page_size_bytes), int(getattr(g, "sliding_window", 0) or 0)]
                            for _, g, _ in groups]
    layout = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return Namespace(
        model=model_identity(str(mc.model), settings),
        revision=str(mc.revision or ""),
        kv_dtype=str(spec.dtype).removeprefix("torch."),
        block_size=int(spec.block_size),
        hash_algo=str(getattr(cc, "prefix_caching_hash_algo", "sha256")),
        hash_seed=seed_digest(str(seed)),
        tp_size=int(pc.tensor_parallel_size),
        tp_rank=tp_rank,
        pp_size=int(pc.pipeline_parallel_size),
        pp_rank=pp_rank,
        layout=layout,
    )
