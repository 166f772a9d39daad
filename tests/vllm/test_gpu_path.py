"""The connector's choice of path for GPU KV caches, device-agnostic: pages move in
place when the engine can address their device and each page is contiguous, through
host staging otherwise; `gpu_direct` decides and the start-up log says which.

No GPU here: `meta` tensors stand for KV caches on a device (real tensors with shapes
and strides, no memory); the engine's reach is what `movable` says. The same choice on
real CUDA KV caches is part of bench/gpu_check.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvstore_vllm.keys import Namespace, RankLayers
from kvstore_vllm.pages import KVPages
from kvstore_vllm.settings import Settings
from kvstore_vllm.worker_side import WorkerSide, movable_devices

NUM_BLOCKS = 8
LAYERS = ("l0", "l1")


def _caches(device: str, split_kv: bool) -> dict[str, torch.Tensor]:
    # vLLM's GPU layout keeps K and V in separate planes (2, blocks, ...): a page is two
    # runs; the block-outermost layout (blocks, 2, ...) keeps a page contiguous.
    shape = (2, NUM_BLOCKS, 32, 2, 64) if split_kv else (NUM_BLOCKS, 2, 32, 2, 64)
    return {n: torch.empty(shape, dtype=torch.float16, device=device) for n in LAYERS}


@pytest.mark.parametrize(("movable", "split_kv", "path"), [
    (frozenset({"cpu"}), False, "staged through host memory"),        # CPU engine build
    (frozenset({"cpu", "meta"}), False, "GPU-direct"),                 # CUDA build
    (frozenset({"cpu", "meta"}), True, "staged through host memory"),  # split K/V planes
])
def test_device_pages_move_in_place_only_when_the_engine_reaches_them(
        movable: frozenset[str], split_kv: bool, path: str) -> None:
    pages = KVPages(_caches("meta", split_kv), NUM_BLOCKS, movable)
    assert pages.on_gpu and pages.path() == path
    assert pages.zero_copy == (path == "GPU-direct")
    assert f"path={path}" in pages.layout_tag()


def test_cpu_pages_keep_their_zero_copy_path() -> None:
    pages = KVPages(_caches("cpu", False), NUM_BLOCKS)
    assert pages.zero_copy and not pages.on_gpu and pages.path() == "zero-copy"
    assert len(pages.storages()) == len(LAYERS)


def test_gpu_direct_off_keeps_the_gpu_out_of_the_engine() -> None:
    assert movable_devices("off") == frozenset({"cpu"})
    assert "cpu" in movable_devices("auto")


def _worker(gpu_direct: str, link: Any = None) -> WorkerSide:
    ns = Namespace(model="gpu-path", revision="", kv_dtype="float16", block_size=32,
                   hash_algo="sha256", hash_seed="0", tp_size=1, tp_rank=0, pp_size=1,
                   pp_rank=0, layout="test")
    return WorkerSide(link, RankLayers(ns, LAYERS), num_blocks=NUM_BLOCKS, layerwise_load=False,
                      staging_bytes=1 << 20, gpu_direct=gpu_direct)


def test_gpu_direct_on_refuses_to_start_without_it() -> None:
    # These machines carry the CPU build of the engine: GPU pages cannot move in place.
    with pytest.raises(ValueError, match=r"gpu_direct is 'on'.*CUDA build"):
        _worker("on").register(_caches("meta", False))


def test_auto_stages_what_cannot_move_in_place() -> None:
    registered: list[torch.Tensor] = []

    class Link:
        def register(self, buffer: torch.Tensor) -> None:
            registered.append(buffer)

    w = _worker("auto", Link())
    w.register(_caches("meta", False))
    assert w.pages is not None and not w.pages.zero_copy
    # only the host staging buffer is registered, never the device memory
    assert [t.device.type for t in registered] == ["cpu"]


def test_a_bad_gpu_direct_value_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="gpu_direct must be one of"):
        _worker("yes")
    assert Settings.from_extra_config({"gpu_direct": "off"}).gpu_direct == "off"
