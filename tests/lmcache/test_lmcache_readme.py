"""lmcache_adapter/README.md's configuration, as printed, through LMCache's config loader."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from lmcache.v1.config import LMCacheEngineConfig

from tests.conftest import Cluster
from tests.lmcache.conftest import Engine, chunk_key

README = Path(__file__).resolve().parents[2] / "lmcache_adapter" / "README.md"


def readme_yaml() -> list[str]:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 2, "the README shows the config as a block and as one line"
    return blocks


@pytest.mark.parametrize("which", [0, 1], ids=["block", "one-line"])
def test_readme_config_as_printed(store: Cluster, engines: Callable[..., Engine],
                                  tmp_path: Path, which: int) -> None:
    text = readme_yaml()[which]
    assert "kvstore://127.0.0.1:2379" in text and re.search(r"max_local_cpu_size: 5\b", text)
    # Changed: the test cluster's etcd port, and a CPU buffer that fits a test machine.
    text = text.replace("127.0.0.1:2379", store.etcd)
    text = re.sub(r"max_local_cpu_size: 5\b", "max_local_cpu_size: 0.02", text)
    path = tmp_path / "lmcache.yaml"
    path.write_text(text)
    config = LMCacheEngineConfig.from_file(str(path))
    a = engines({}, config=config)
    b = engines({}, config=LMCacheEngineConfig.from_file(str(path)))
    assert a.connector.options.etcd == store.etcd
    keys = [chunk_key(5000 + 10 * which + i) for i in range(3)]
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
