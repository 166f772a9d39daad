"""Fixtures for the SGLang HiCache backend tests: SGLang's own classes, a real store.

These tests need SGLang (`sh sglang_adapter/install_sglang.sh .venv/bin/python`); they
are part of `make test` and are never skipped: a missing SGLang is a failure that says so.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Cluster, require_private_netns
from tests.sglang.cpu_sglang import prepare

try:
    prepare()
    import sglang.srt.mem_cache.hicache_storage  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the SGLang backend tests need SGLang: run "
                      "`sh sglang_adapter/install_sglang.sh .venv/bin/python`") from exc


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd + master + one 256 MiB store node, shared by a module's tests."""
    require_private_netns()
    c = Cluster(tmp_path_factory.mktemp("store"))
    c.start_etcd()
    try:
        c.start_master()
        c.start_store("256MiB")
        c.wait_nodes(1)
        yield c
    finally:
        c.stop()
