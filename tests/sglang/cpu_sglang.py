"""Make SGLang's memory-pool modules importable on this CPU-only machine.

`sglang.srt.configs` (reached from `memory_pool` and `pool_host`) imports multimodal
helpers that import torchvision. The only torchvision on PyPI for torch 2.13 is built
against CUDA torch: its C extension does not load here, and torchvision then fails at
import because it registers fake kernels for `torchvision::nms` and `::qnms`
unconditionally. A broken torchvision in the venv would also break the transformers
import that vLLM's tests need, so `install_sglang.sh` puts torchvision into a side
directory instead; `prepare()` puts that directory on sys.path and declares the two op
schemas (declarations only: nothing here calls torchvision's ops). The SGLang classes
the tests use (storage base class, factory, device and host pools) are SGLang's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_prepared = False


def side_dir() -> Path:
    return Path(os.environ.get("KVSTORE_SGLANG_SIDE") or Path(sys.prefix) / "sglang-side")


def prepare() -> None:
    """Idempotent; call before importing anything from sglang.srt."""
    global _prepared
    if _prepared:
        return
    import torch

    side = side_dir()
    if not (side / "torchvision").is_dir():
        raise ImportError(f"no torchvision in {side}: run `sh sglang_adapter/install_sglang.sh "
                          f".venv/bin/python`")
    if str(side) not in sys.path:
        sys.path.append(str(side))
    try:  # a working torchvision (or an earlier call) has declared it already
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
    except RuntimeError:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
        _libs.append(lib)  # a Library drops its definitions when it is collected
    _prepared = True


_libs: list[object] = []
