"""lmcache_adapter/README.md's configuration, as printed, through LMCache's config loader."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from lmcache.v1.config import LMCacheEngineConfig

from tests.conftest import Cluster
from tests.lmcache.conftest import Engine, chunk_key

README = Path(__file__).resolve().parents[2] / "lmcache_adapter" / "README.md"


def readme_yaml() -> str:
    (block,) = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    return block


def test_readme_config_as_printed(store: Cluster, engines: Callable[..., Engine],
                                  tmp_path: Path) -> None:
    text = readme_yaml()
    assert "kvstore://127.0.0.1:2379" in text and "max_local_cpu_size: 5\n" in text
    # Changed: the test cluster's etcd port, and a CPU buffer that fits a test machine.
    text = text.replace("127.0.0.1:2379", store.etcd).replace("max_local_cpu_size: 5\n",
                                                              "max_local_cpu_size: 0.02\n")
    path = tmp_path / "lmcache.yaml"
    path.write_text(text)
    config = LMCacheEngineConfig.from_file(str(path))
    a = engines({}, config=config)
    b = engines({}, config=LMCacheEngineConfig.from_file(str(path)))
    assert a.connector.options.etcd == store.etcd
    keys = [chunk_key(5000 + i) for i in range(3)]
    objs = [a.chunk(i) for i in range(3)]
    a.backend.batched_submit_put_task(keys, objs)
    deadline = time.monotonic() + 240  # a guard against hanging, not a speed limit
    while a.connector.stats.puts < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert b.run(b.backend.batched_async_contains("r", keys, pin=True)) == 3
    got = b.run(b.backend.batched_get_non_blocking("r", keys))
    assert len(got) == 3
    assert all(bytes(g.byte_array) == bytes(o.byte_array) for g, o in zip(got, objs, strict=True))
    for o in objs + got:
        o.ref_count_down()
