"""Cache effectiveness through real processes: a replay slice with an SSD tier reaches
the offline infinite-cache hit rate, and a client that never releases its leases cannot
block another client's puts (the pin cap)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from bench.lru_sim import StoreSim
from kvstore_client import KVStoreClient
from tests.conftest import Cluster

KiB = 1 << 10
MiB = 1 << 20


def conversations(seed: int, n: int) -> list[list[int]]:
    """Conversation-like requests: shared system prompts, growing multi-turn prefixes."""
    rng = random.Random(seed)
    next_id = 1
    convs: list[list[int]] = []
    out: list[list[int]] = []
    for _ in range(n):
        if convs and rng.random() < 0.6:
            conv = rng.choice(convs)
            conv += range(next_id, next_id + rng.randint(1, 4))
            next_id = conv[-1] + 1
        else:
            conv = [rng.randrange(3) * 10**9, *range(next_id, next_id + rng.randint(1, 8))]
            next_id = conv[-1] + 1
            convs.append(conv)
            if len(convs) > 40:
                convs.pop(rng.randrange(len(convs)))
        out.append(list(conv))
    return out


def block(h: int, size: int) -> bytes:
    return (h.to_bytes(8, "little") * (size // 8))[:size]


def test_a_replay_slice_with_an_ssd_tier_reaches_the_infinite_cache_hit_rate(
        cluster_factory: Cluster, tmp_path: Path) -> None:
    c = cluster_factory
    c.start_master()
    ssd_dir = tmp_path / "ssd"
    ssd_dir.mkdir()
    # 512 KiB of DRAM holds 128 blocks; the slice touches several times that.
    c.start_store("512KiB", "--ssd-dir", str(ssd_dir), "--ssd", "64MiB", "--ssd-no-fsync",
                  node_id="tiered")
    c.wait_nodes(2)
    size = 4 * KiB
    trace = conversations(seed=5, n=250)
    unique = {h for r in trace for h in r}
    assert len(unique) * size > 4 * 512 * KiB
    bound = StoreSim.infinite()
    dram_only = StoreSim.watermark([512 * KiB], size)
    hits = blocks = 0
    with KVStoreClient(etcd=c.etcd) as client:
        dst = torch.zeros(max(len(r) for r in trace) * size, dtype=torch.uint8)
        client.register(dst)
        for req in trace:
            keys = [b"blk-%d" % h for h in req]
            bound.request(req)
            dram_only.request(req)
            with client.lookup(keys, ttl=30) as lease:
                n = lease.count
                if n:
                    slices = [dst[i * size:(i + 1) * size] for i in range(n)]
                    errs = client.get_into(keys[:n], slices, lease=lease)
                    n = next((i for i, e in enumerate(errs) if e is not None), n)
                    for i in range(n):  # every hit is the block's own bytes
                        assert bytes(slices[i].numpy()) == block(req[i], size)
                errs = client.put_many(keys[n:], [block(h, size) for h in req[n:]])
                assert errs == [None] * len(errs), errs
            hits += n
            blocks += len(keys)
    rate = hits / blocks
    assert bound.stats.block_hit_rate - rate <= 0.01, (rate, bound.stats.block_hit_rate)
    # And the SSD tier is what got it there: DRAM alone would hit far less.
    assert bound.stats.block_hit_rate - dram_only.stats.block_hit_rate > 0.05
    counters = json.loads(c.status().counters_json)
    assert counters["demotions"] > 100 and counters["promotions"] > 0


def test_a_client_that_never_releases_cannot_block_another_clients_puts(
        cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_master()
    c.start_store("16MiB")
    c.wait_nodes(1)
    keys = [b"held-%d" % i for i in range(15)]
    with KVStoreClient(etcd=c.etcd) as stuck, KVStoreClient(etcd=c.etcd) as other:
        assert stuck.put_many(keys, [block(i, MiB) for i in range(15)]) == [None] * 15
        # Looks up everything and never releases: only half the pool may stay pinned.
        lease = stuck.lookup(keys, ttl=60)
        assert lease.count == 8  # 8 MiB of the 16 MiB pool
        assert sum(n.pinned for n in c.status().nodes) <= 8 * MiB
        for j in range(5):  # another client writes twice the pool meanwhile
            batch = [b"w-%d-%d" % (j, i) for i in range(6)]
            assert other.put_many(batch, [block(100 + i, MiB) for i in range(6)]) == [None] * 6
        assert other.exists(batch) == [True] * 6
        assert stuck.exists(keys[:8]) == [True] * 8  # what it pinned is still there
        counters = json.loads(c.status().counters_json)
        assert counters["pin_capped"] == 1 and counters["pin_capped_keys"] == 7
        stuck.release(lease)
