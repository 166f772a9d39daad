"""TTFT of a fresh engine with and without store hits, on the tiny CPU models.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m tests.vllm.ttft_bench'
    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m tests.vllm.ttft_bench --model gemma2'

`--model gemma2` runs the hybrid Gemma-2-style model (sliding-window and full-attention
KV cache groups) instead: A saves, A_dense saves other prompts with every sliding-window
block (`sliding_window_checkpoints: dense`) for the bytes comparison, then the baseline
and B as below (no layerwise engine: hybrid loads finish before the request's step).
It also prints the bytes stored per block, from the connector's save counters.

Starts its own store (etcd, master, one node), builds the tiny random Llama, then runs
engines one after another, never two at once (the machine has two cores):
A saves N long prompts; a baseline engine without the connector, engine B (connector,
all layers loaded before the first), and engine C (connector, layerwise loading) each
run N prompts sharing A's prefixes interleaved with N fresh prompts of the same length.
Prints the markdown table of vllm_adapter/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import Cluster
from tests.vllm.helpers import BLOCK, build_tiny_gemma2, build_tiny_model, connector_config
from tests.vllm.test_engine import _finish, _start

N = 8
PREFIX_BLOCKS = 31


def _saved(log: str) -> tuple[int, int]:
    """(save_bytes, save_blocks) from the engine's last 'KV Transfer metrics' line."""
    lines = [ln for ln in log.splitlines() if "KV Transfer metrics" in ln and "save_bytes" in ln]
    if not lines:
        return 0, 0

    def num(name: str) -> int:
        m = re.search(rf"\b{name}=([0-9.]+)", lines[-1])
        return int(float(m.group(1))) if m else 0

    return num("save_bytes"), num("save_blocks")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("llama", "gemma2"), default="llama")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ttft-"))
    hybrid = args.model == "gemma2"
    model = build_tiny_gemma2(tmp / "tiny-gemma2") if hybrid else build_tiny_model(tmp / "tiny-llama")
    cluster = Cluster(tmp)
    cluster.start_etcd()
    try:
        cluster.start_master()
        cluster.start_store("512MiB")
        cluster.wait_nodes(1)
        rng = random.Random(7)

        def prompt(n: int) -> list[int]:
            return [rng.randrange(3, 500) for _ in range(n)]

        sources = [prompt(32 * BLOCK + 10) for _ in range(N)]
        items: list[tuple[str, list[int]]] = []
        for i in range(N):
            if hybrid:
                # The next turn of a conversation: the whole stored prompt (32 blocks,
                # the sliding window saved at its end) and 20 new tokens.
                items.append((f"hit{i}", sources[i] + prompt(20)))
                items.append((f"miss{i}", prompt(len(sources[i]) + 20)))
            else:
                items.append((f"hit{i}", sources[i][:PREFIX_BLOCKS * BLOCK] + prompt(20)))
                items.append((f"miss{i}", prompt(PREFIX_BLOCKS * BLOCK + 20)))

        def spec(kv: dict[str, Any] | None, phases: list[tuple[str, list[int]]],
                 seed: int) -> dict[str, Any]:
            return {"model": str(model), "kv_transfer": kv, "warmup": prompt(40 + seed),
                    "phases": [{"name": n, "prompt": p, "max_tokens": 4} for n, p in phases]}

        ours = connector_config(cluster.etcd, log_timeline=True)
        layerwise = connector_config(cluster.etcd, log_timeline=True, layerwise_load=True)
        _, a_log = _finish(_start(tmp, "A", spec(ours, [(f"src{i}", s) for i, s in
                                                       enumerate(sources)], 1)))
        saved = {"A": _saved(a_log)}
        if hybrid:
            dense = connector_config(cluster.etcd, sliding_window_checkpoints="dense")
            others = [(f"dense{i}", prompt(len(s))) for i, s in enumerate(sources)]
            _, d_log = _finish(_start(tmp, "A_dense", spec(dense, others, 5)))
            saved["A_dense"] = _saved(d_log)
        base, _ = _finish(_start(tmp, "baseline", spec(None, items, 2)))
        b, _ = _finish(_start(tmp, "B", spec(ours, items, 3)))
        c: dict[str, Any] | None = None
        if not hybrid:
            # C must miss on B's saves of the fresh prompts: new fresh prompts for it.
            c_items = [(n, p if n.startswith("hit") else prompt(len(p))) for n, p in items]
            c, _ = _finish(_start(tmp, "C", spec(layerwise, c_items, 4)))
    finally:
        cluster.stop()

    def row(name: str, rep: dict[str, Any], kind: str) -> str:
        ms = [rep[f"{kind}{i}"]["ttft"] * 1e3 for i in range(N)]
        cached = {rep[f"{kind}{i}"]["cached"] for i in range(N)}
        return (f"| {name} | {kind}: {'shared prefix' if kind == 'hit' else 'fresh prompt'} | "
                f"{statistics.median(ms):.1f} | {min(ms):.1f}-{max(ms):.1f} | "
                f"{','.join(str(x) for x in sorted(cached))} |")

    shared = 32 * BLOCK if hybrid else PREFIX_BLOCKS * BLOCK
    print(f"model {args.model}, prompt {len(items[0][1])} tokens, shared prefix {shared} tokens, "
          f"{N} prompts of each kind")
    print("| engine | prompts | TTFT median (ms) | min-max (ms) | tokens from the store |")
    print("| --- | --- | ---: | ---: | ---: |")
    engines = [("baseline, no connector", base), ("B: KVStoreConnector", b)]
    if c is not None:
        engines.append(("C: KVStoreConnector, layerwise_load", c))
    for name, rep in engines:
        for kind in ("hit", "miss"):
            print(row(name, rep, kind))
    print()
    print("| saving engine | blocks saved | bytes saved | bytes per block |")
    print("| --- | ---: | ---: | ---: |")
    for name, (nbytes, blocks) in saved.items():
        per = f"{nbytes / blocks / 1024:.1f} KiB" if blocks else "-"
        print(f"| {name} | {blocks} | {nbytes} | {per} |")
    (tmp / "ttft.json").write_text(json.dumps({"baseline": base, "B": b, "C": c,
                                               "saved": saved}))
    print(f"raw reports and engine logs in {tmp}")


if __name__ == "__main__":
    main()
