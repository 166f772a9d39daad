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
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore[import-not-found,unused-ignore]
    KVConnectorStats,
)

from kvstore_vllm.keys import KeyPlan, Namespace, RankLayers, seed_digest
from kvstore_vllm.link import StoreLink
from kvstore_vllm.plans import LoadReport, StepPlan, merge_reports
from kvstore_vllm.scheduler_side import SchedulerSide
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


class KVStoreConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """Scheduler -> workers, once per step."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class KVStoreWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Workers -> scheduler, once per step: the loads that finished, per request."""

    def __init__(self, reports: dict[str, LoadReport]) -> None:
        self.reports = reports

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, KVStoreWorkerMetadata):
            merge_reports(self.reports, other.reports)
        return self


@dataclass
class KVStoreConnectorStats(KVConnectorStats):  # type: ignore[misc]
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


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """Loads prefix KV from kvstore instead of recomputing it; saves what it computed."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        assert ktc is not None  # the base class refused a config without one
        self.settings = Settings.from_extra_config(ktc.kv_connector_extra_config)
        self.loads, self.saves = role_flags(ktc.kv_role)
        spec, layers = _single_attention_group(kv_cache_config)
        self.block_size = int(spec.block_size)
        hash_block = getattr(kv_cache_config, "hash_block_size", None) or self.block_size
        pc = vllm_config.parallel_config
        tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
        base = build_namespace(vllm_config, kv_cache_config, spec, tp_rank=0, pp_rank=0,
                               settings=self.settings)
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.link = StoreLink(self.settings, "scheduler")
            self.link.warm_up()
            self.store = LinkStore(self.link)
            by_pp = _layers_by_pp_rank(layers, vllm_config, pp)
            plan = KeyPlan([RankLayers(base.for_rank(t, p), tuple(by_pp[p]))
                            for p in range(pp) for t in range(tp)])
            self.scheduler_side = SchedulerSide(
                self.store, plan, block_size=self.block_size, hash_block_size=hash_block,
                loads=self.loads, saves=self.saves, lease_ttl=self.settings.lease_ttl,
                save_decode=self.settings.save_decode, num_workers=tp * pp,
                log_timeline=self.settings.log_timeline)
            log.info("KVStoreConnector (scheduler, %s) store etcd=%s cluster=%s, %d key(s) per "
                     "block; namespace %s", ktc.kv_role, self.settings.master or self.settings.etcd,
                     self.settings.cluster, plan.keys_per_block, base.describe())
        else:
            tp_rank, pp_rank = _worker_ranks()
            ns = base.for_rank(tp_rank, pp_rank)
            self.link = StoreLink(self.settings, "worker", buffer_size=1 << 20)
            self.worker_side = WorkerSide(
                self.link, RankLayers(ns, tuple(layers)), num_blocks=kv_cache_config.num_blocks,
                layerwise_load=self.settings.layerwise_load,
                staging_bytes=self.settings.staging_bytes)
            log.info("KVStoreConnector (worker tp=%d pp=%d, %s) layerwise_load=%s; namespace %s",
                     tp_rank, pp_rank, ktc.kv_role, self.settings.layerwise_load, ns.describe())

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
        return self.scheduler_side.lookup(request, num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        assert self.scheduler_side is not None
        ids = blocks.get_block_ids()
        self.scheduler_side.after_alloc(request, ids[0] if ids else [], num_external_tokens)

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


# -- building the namespace from vLLM's config ----------------------------------------------


def _single_attention_group(kv_cache_config: Any) -> tuple[Any, list[str]]:
    from vllm.v1.kv_cache_interface import AttentionSpec, SlidingWindowSpec

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, AttentionSpec) or isinstance(
            groups[0].kv_cache_spec, SlidingWindowSpec):
        kinds = [type(g.kv_cache_spec).__name__ for g in groups]
        raise ValueError("KVStoreConnector supports models whose KV cache is one full-attention "
                         f"group; this model has {kinds}")
    return groups[0].kv_cache_spec, list(groups[0].layer_names)


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
                    pp_rank: int, settings: Settings) -> Namespace:
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
    layout = json.dumps({
        "kv_cache_layout": getattr(kv_cache_config, "kv_cache_layout", None) or "default",
        "device": str(current_platform.device_type),
        "attention_backend": str(getattr(backend, "name", backend) or "auto"),
        "spec": type(spec).__name__,
        "num_kv_heads": int(spec.num_kv_heads),
        "head_size": int(spec.head_size),
        "page_bytes": int(spec.page_size_bytes),
        "vllm": version,
    }, sort_keys=True, separators=(",", ":"))
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
