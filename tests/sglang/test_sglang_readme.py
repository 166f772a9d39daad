"""The configuration line of sglang_adapter/README.md, as printed: SGLang's own argument
parser takes it, SGLang's own extra-config parser reads it, and SGLang's factory builds
a working backend from it (only the etcd address is this test cluster's)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch

from kvstore_sglang import KVStoreHiCacheStorage
from tests.conftest import Cluster
from tests.sglang.helpers import PAGE, fill, mha_host_pool, page_keys, pages_of

README = Path(__file__).resolve().parents[2] / "sglang_adapter" / "README.md"


def _printed_command() -> list[str]:
    lines = [ln.strip() for ln in README.read_text().splitlines()
             if ln.strip().startswith("python -m sglang.launch_server")]
    assert len(lines) == 1, "the README prints one launch command"
    return shlex.split(lines[0])[3:]  # the arguments after `python -m sglang.launch_server`


def test_the_readme_configuration_works_as_printed(store: Cluster) -> None:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(_printed_command())
    assert args.enable_hierarchical_cache
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(
        args.hicache_storage_backend_extra_config)
    assert extra["etcd"] == "127.0.0.1:2379" and extra["module_path"] == "kvstore_sglang"
    assert json.loads(args.hicache_storage_backend_extra_config) == extra
    extra["etcd"] = store.etcd  # this test's cluster

    def build() -> KVStoreHiCacheStorage:
        pool = mha_host_pool(args.hicache_mem_layout)
        config = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False,
            is_page_first_layout=args.hicache_mem_layout == "page_first", model_name="MODEL",
            extra_config=dict(extra))
        backend = StorageBackendFactory.create_backend(args.hicache_storage_backend, config, pool)
        backend.register_mem_pool_host(pool)
        assert isinstance(backend, KVStoreHiCacheStorage)
        return backend

    # SGLang's controller switches to the zero-copy calls on this key.
    assert bool(extra.get("interface_v1", 0))
    a, b = build(), build()
    try:
        keys = page_keys(3)
        src = a.mem_pool_host.alloc(3 * PAGE)
        fill(a.mem_pool_host, src, seed=21)
        assert a.batch_set_v1(keys, src) == [True] * 3
        assert b.batch_exists(keys) == 3
        dst = b.mem_pool_host.alloc(3 * PAGE)
        assert b.batch_get_v1(keys, dst) == [True] * 3
        for x, y in zip(pages_of(a.mem_pool_host, src), pages_of(b.mem_pool_host, dst),
                        strict=True):
            assert torch.equal(x, y)
    finally:
        a.close()
        b.close()
