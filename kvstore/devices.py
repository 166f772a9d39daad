"""Which memory the installed Transfer Engine can move: host memory always, GPU memory
only with a CUDA build of it.

The build is read off the installed distribution (`mooncake-transfer-engine` and
`mooncake-transfer-engine-cuda13` are CUDA builds, `mooncake-transfer-engine-non-cuda`
is not), once per process: a CUDA tensor handed to a CPU build would be registered as
a host address and every transfer into it would crash the engine, so it is refused
before anything is registered.
"""

from __future__ import annotations

import functools
from importlib import metadata

CUDA_BUILDS = ("mooncake-transfer-engine", "mooncake-transfer-engine-cuda13",
               "mooncake-transfer-engine-cuda12")
CPU_BUILD = "mooncake-transfer-engine-non-cuda"


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


@functools.cache
def engine_devices() -> frozenset[str]:
    """The device types (torch's names) whose memory the engine can register."""
    if any(_installed(n) for n in CUDA_BUILDS):
        return frozenset({"cpu", "cuda"})
    return frozenset({"cpu"})


def cuda_build_hint() -> str:
    return ("install a CUDA build of the Transfer Engine (`pip install "
            "'kvstore[te-cuda13]'` for CUDA 13, `'kvstore[te-cuda12]'` for CUDA 12) "
            "in place of " + CPU_BUILD)
