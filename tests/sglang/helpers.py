"""Building blocks: SGLang's real storage config, device and host KV pools, its factory."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from tests.sglang.cpu_sglang import prepare

prepare()

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

PAGE = 16  # tokens per page

DYNAMIC = {"backend_name": "kvstore", "module_path": "kvstore_sglang",
           "class_name": "KVStoreHiCacheStorage", "interface_v1": 1}


def storage_config(etcd: str, *, model: str = "tiny-llama", tp_rank: int = 0, tp_size: int = 1,
                   mla: bool = False, page_first: bool = True, **extra: Any) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=page_first,
        model_name=model,
        extra_config={**DYNAMIC, "etcd": etcd, "timeout": 2.0, "retry_interval": 1.0, **extra})


def mha_host_pool(layout: str = "page_first", *, tokens: int = 2048, page_size: int = PAGE,
                  layers: int = 2, heads: int = 2, head_dim: int = 64,
                  dtype: torch.dtype = torch.float16) -> Any:
    """SGLang's MHATokenToKVPoolHost over a CPU MHATokenToKVPool (both real)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    device = MHATokenToKVPool(tokens, page_size, dtype, heads, head_dim, layers, "cpu", False,
                              v_head_dim=head_dim, start_layer=0, end_layer=layers - 1)
    return MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
        pin_memory=False, device="cpu", device_capacity_tokens=device.size,
        start_layer=device.start_layer, end_layer=device.end_layer,
        write_back_staging=device.hicache_write_back_staging)


def mla_host_pool(layout: str = "page_first", *, tokens: int = 1024, page_size: int = PAGE,
                  layers: int = 2, kv_lora_rank: int = 64, rope_dim: int = 32,
                  dtype: torch.dtype = torch.float16) -> Any:
    """SGLang's MLATokenToKVPoolHost over a CPU MLATokenToKVPool (both real)."""
    import inspect

    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    device = MLATokenToKVPool(tokens, page_size, dtype, kv_lora_rank, rope_dim, layers, "cpu",
                              False, start_layer=0, end_layer=layers - 1)
    infos = device.get_device_pool_infos()[0]
    kwargs: dict[str, Any] = dict(pin_memory=False, device="cpu",
                                  device_capacity_tokens=device.size,
                                  start_layer=device.start_layer, end_layer=device.end_layer,
                                  target_layer_num=layers)
    params = inspect.signature(MLATokenToKVPoolHost.__init__).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    return MLATokenToKVPoolHost(infos.buffer_info, 2.0, 0, page_size, layout, **kwargs)


def create(config: HiCacheStorageConfig, host_pool: Any) -> Any:
    """What SGLang's cache controller does on attach: its factory, then the pool."""
    backend = StorageBackendFactory.create_backend("dynamic", config, host_pool)
    backend.register_mem_pool_host(host_pool)
    return backend


_seq = itertools.count(1)


def page_keys(n: int, tag: str = "") -> list[str]:
    """Fresh SGLang-style page keys (64 hex digits)."""
    base = next(_seq)
    return [f"{tag}{base:08x}{i:056x}"[-64:] for i in range(n)]


def fill(host_pool: Any, indices: torch.Tensor, seed: int) -> None:
    """Random bytes in the pages at `indices` (whole K and V of every layer)."""
    g = torch.Generator().manual_seed(seed)
    for start in indices[::host_pool.page_size].tolist():
        page = host_pool.get_data_page(start, flat=True)
        noise = torch.randint(0, 255, (page.numel() * page.element_size(),), generator=g,
                              dtype=torch.uint8)
        host_pool.set_from_flat_data_page(start, noise.view(page.dtype))


def pages_of(host_pool: Any, indices: torch.Tensor) -> list[torch.Tensor]:
    """Copies of the flat pages at `indices`, to compare byte for byte."""
    return [host_pool.get_data_page(s, flat=True).clone().view(torch.uint8)
            for s in indices[::host_pool.page_size].tolist()]
