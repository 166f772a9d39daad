"""The registered host pool as the backend sees it: which layouts it stores, and per page
the byte ranges of its objects as numpy views of the pool's own memory (the buffers the
zero-copy calls pass to the client)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvstore_sglang.errors import PageSizeMismatch, UnsupportedLayout
from kvstore_sglang.namespace import Geometry

# Layouts whose pages are contiguous buffers in the host pool, and whose flat page
# (the generic API's tensor) is those buffers one after the other, in the order
# get_page_buffer_meta lists them: the generic and the zero-copy calls then store the
# same objects.
LAYOUTS = ("page_first", "page_first_direct")


class PagePool:
    """The registered host pool as the backend sees it: per page, the byte ranges of
    its objects, as numpy views of the registered memory (zero-copy buffers)."""

    def __init__(self, host_pool: Any) -> None:
        layout = getattr(host_pool, "layout", None)
        if layout not in LAYOUTS:
            raise UnsupportedLayout(
                f"KVStoreHiCacheStorage stores host pools with layout {' or '.join(LAYOUTS)}, "
                f"got {layout!r}: start SGLang with --hicache-mem-layout page_first")
        kv = getattr(host_pool, "kv_buffer", None)
        if not isinstance(kv, torch.Tensor) or not kv.is_contiguous() or kv.device.type != "cpu":
            raise UnsupportedLayout(
                f"KVStoreHiCacheStorage needs the host pool's pages in one contiguous CPU "
                f"tensor (kv_buffer); {type(host_pool).__name__} has none")
        self.host_pool = host_pool
        self.layout: str = layout
        self.page_size = int(host_pool.page_size)
        self.tensor = kv
        self.base = int(kv.data_ptr())
        self.flat = kv.view(-1).view(torch.uint8).numpy()  # shares the pool's memory
        ptrs, sizes = host_pool.get_page_buffer_meta(torch.arange(self.page_size))
        if not ptrs or len(ptrs) != len(sizes) or not all(isinstance(p, int) for p in ptrs):
            raise UnsupportedLayout(
                f"{type(host_pool).__name__} describes a page as {len(ptrs)} buffer(s) "
                "this backend cannot store")
        self.object_bytes = [int(n) for n in sizes]
        self.objects = len(ptrs)
        self.page_bytes = sum(self.object_bytes)

    def geometry(self) -> Geometry:
        pool = self.host_pool
        heads = ",".join(f"{a}={getattr(pool, a)}" for a in (
            "head_num", "head_dim", "v_head_dim", "kv_cache_dim", "kv_lora_rank",
            "qk_rope_head_dim") if getattr(pool, a, None) is not None)
        layers = ",".join(f"{a}={getattr(pool, a)}" for a in (
            "layer_num", "start_layer", "end_layer") if getattr(pool, a, None) is not None)
        return Geometry(pool=type(pool).__name__, layout=self.layout, dtype=str(pool.dtype),
                        page_size=self.page_size, layers=layers, heads=heads,
                        objects=self.objects,
                        object_bytes=self.object_bytes[0] if len(set(self.object_bytes)) == 1
                        else sum(self.object_bytes))

    def buffers(self, host_indices: torch.Tensor, pages: int) -> list[np.ndarray]:
        """The object buffers of `pages` pages at `host_indices` (page-size runs)."""
        if host_indices.numel() != pages * self.page_size:
            raise PageSizeMismatch(
                f"{pages} page(s) of {self.page_size} tokens need {pages * self.page_size} "
                f"host indices, got {host_indices.numel()}")
        ptrs, sizes = self.host_pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != pages * self.objects:
            raise PageSizeMismatch(f"the host pool gave {len(ptrs)} buffers for {pages} "
                                   f"page(s), expected {pages * self.objects}")
        flat, base, end = self.flat, self.base, self.flat.nbytes
        out = []
        for p, n in zip(ptrs, sizes, strict=True):
            off = p - base
            if off < 0 or off + n > end:
                raise PageSizeMismatch(f"host index outside the registered pool ({p:#x})")
            out.append(flat[off:off + n])
        return out
