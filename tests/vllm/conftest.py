"""Fixtures for the vLLM connector tests: a tiny local model and one store per module.

These tests need vLLM (`sh vllm_adapter/install_vllm.sh .venv/bin/python`); they are
part of `make test` and are never skipped: a missing vLLM is a failure that says so.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.v1 import master_pb2 as pb
from kvstore_client import KVStoreClient
from tests.conftest import Cluster, require_private_netns

try:
    import vllm  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the vLLM connector tests need vLLM: run "
                      "`sh vllm_adapter/install_vllm.sh .venv/bin/python`") from exc

from tests.vllm.helpers import build_tiny_gemma2, build_tiny_mla, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_gemma2(tmp_path_factory.mktemp("model") / "tiny-gemma2")


@pytest.fixture(scope="session")
def tiny_mla(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mla(tmp_path_factory.mktemp("model") / "tiny-mla")


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


def corrupt_object(cluster: Cluster, key: bytes, node_id: str = "node-0") -> None:
    """Flip bytes of a stored object in the store node's own memory."""
    with KVStoreClient(etcd=cluster.etcd) as c:
        reply = c._call("GetReplicas", pb.GetReplicasRequest(keys=[key]))
        item = reply.items[0]
        assert item.locations, "object not stored"
        c._call("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=reply.lease_id))
    raw = read_key_sync(cluster.etcd, Layout().node(node_id))
    assert raw is not None
    node = NodeRecord.decode(raw)
    fd = os.open(node.shm_path, os.O_RDWR)
    try:
        with mmap.mmap(fd, node.size) as seg:
            off = item.locations[0].addr - node.base_addr + 16
            for i in range(64):
                seg[off + i] ^= 0xFF
    finally:
        os.close(fd)
