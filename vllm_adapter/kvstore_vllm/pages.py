"""Where one layer's KV for one block lives in vLLM's KV cache tensors.

An object in the store is one *page*: the bytes of one layer for one block, in the
order the engine's layout keeps them (the layout is part of the key namespace).

- Zero-copy: when a page is one contiguous run of memory the Transfer Engine can move
  (host memory; GPU memory too with a CUDA build of the engine, "GPU-direct"), the
  client reads and writes it in place: the KV tensors are registered once.
- Staging: otherwise (K and V split into separate planes, GPU memory with a CPU build
  of the engine, or `gpu_direct: "off"`) each page is gathered into, or scattered
  from, a registered host staging buffer with one copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class LayerPages:
    name: str
    tensor: torch.Tensor
    block_dim: int
    page_bytes: int
    contiguous: bool  # every page is one contiguous run the engine can move

    def page(self, block_id: int) -> torch.Tensor:
        return self.tensor.select(self.block_dim, block_id)


def _block_dim(t: torch.Tensor, num_blocks: int) -> int:
    # Layouts put the block dimension first, or second behind a K/V plane of size 2.
    for d, n in enumerate(t.shape):
        if n == num_blocks:
            return d
    raise ValueError(f"no dimension of size num_blocks={num_blocks} in a KV cache tensor of "
                     f"shape {tuple(t.shape)}")


class KVPages:
    """The registered KV cache of one worker, by layer name.

    `movable`: the device types whose memory the engine moves in place (kvstore.devices;
    "cpu" alone with a CPU build of the engine or with `gpu_direct: "off"`).
    """

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int,
                 movable: frozenset[str] = frozenset({"cpu"})) -> None:
        self.layers: dict[str, LayerPages] = {}
        for name, t in kv_caches.items():
            d = _block_dim(t, num_blocks)
            sample = t.select(d, 0)
            contiguous = t.device.type in movable and sample.is_contiguous()
            self.layers[name] = LayerPages(name, t, d, sample.numel() * sample.element_size(),
                                           contiguous)
        self.zero_copy = all(lp.contiguous for lp in self.layers.values())
        self.on_gpu = any(lp.tensor.device.type != "cpu" for lp in self.layers.values())

    def storages(self) -> list[torch.Tensor]:
        """Each distinct allocation behind the KV tensors, once, as a uint8 tensor on
        its device.

        Layers often share one allocation; registering each layer's view separately
        would register overlapping ranges.
        """
        seen: dict[int, torch.Tensor] = {}
        for lp in self.layers.values():
            st = lp.tensor.untyped_storage()
            if st.data_ptr() not in seen:
                seen[st.data_ptr()] = torch.empty(0, dtype=torch.uint8,
                                                  device=lp.tensor.device).set_(
                    st, 0, (st.nbytes(),), (1,))
        return list(seen.values())

    def path(self) -> str:
        """How pages move, in the words of the start-up log."""
        if not self.zero_copy:
            return "staged through host memory"
        return "GPU-direct" if self.on_gpu else "zero-copy"

    def layout_tag(self) -> str:
        """The physical page geometry, for the start-up log."""
        lp = next(iter(self.layers.values()))
        return (f"shape={tuple(lp.tensor.shape)} dtype={lp.tensor.dtype} "
                f"device={lp.tensor.device} block_dim={lp.block_dim} "
                f"page_bytes={lp.page_bytes} zero_copy={self.zero_copy} path={self.path()}")


class Staging:
    """A registered host buffer for pages that cannot be moved in place."""

    def __init__(self, size: int, register: Any) -> None:
        self.buffer = torch.empty(size, dtype=torch.uint8)
        register(self.buffer)
        self.size = size

    def chunks(self, sizes: Sequence[int]) -> list[tuple[int, int]]:
        """Index ranges [lo, hi) of `sizes` that fit in the buffer at once."""
        out: list[tuple[int, int]] = []
        lo, used = 0, 0
        for i, n in enumerate(sizes):
            if n > self.size:
                raise ValueError(f"a KV page of {n} bytes does not fit the {self.size}-byte "
                                 "staging buffer; raise staging_bytes")
            if used + n > self.size:
                out.append((lo, i))
                lo, used = i, 0
            used += n
        if lo < len(sizes):
            out.append((lo, len(sizes)))
        return out

    def slots(self, sizes: Sequence[int]) -> list[torch.Tensor]:
        out, pos = [], 0
        for n in sizes:
            out.append(self.buffer[pos:pos + n])
            pos += n
        return out


def gather(page: torch.Tensor, slot: torch.Tensor) -> None:
    """Copy a (possibly strided, possibly device) page into a staging slot."""
    slot.view(page.dtype).view(page.shape).copy_(page)


def scatter(slot: torch.Tensor, page: torch.Tensor) -> None:
    page.copy_(slot.view(page.dtype).view(page.shape))
