"""TTFT of a fresh engine with and without store hits, on the tiny CPU model.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m tests.vllm.ttft_bench'

Starts its own store (etcd, master, one node), builds the tiny random Llama, then runs
engines one after another, never two at once (the machine has two cores):
A saves N long prompts; a baseline engine without the connector, engine B (connector,
all layers loaded before the first), and engine C (connector, layerwise loading) each
run N prompts sharing A's prefixes interleaved with N fresh prompts of the same length.
Prints the markdown table of vllm_adapter/README.md.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import Cluster
from tests.vllm.helpers import BLOCK, build_tiny_model, connector_config
from tests.vllm.test_engine import _finish, _start

N = 8
PREFIX_BLOCKS = 31


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ttft-"))
    model = build_tiny_model(tmp / "tiny-llama")
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
            items.append((f"hit{i}", sources[i][:PREFIX_BLOCKS * BLOCK] + prompt(20)))
            items.append((f"miss{i}", prompt(PREFIX_BLOCKS * BLOCK + 20)))

        def spec(kv: dict[str, Any] | None, phases: list[tuple[str, list[int]]],
                 seed: int) -> dict[str, Any]:
            return {"model": str(model), "kv_transfer": kv, "warmup": prompt(40 + seed),
                    "phases": [{"name": n, "prompt": p, "max_tokens": 4} for n, p in phases]}

        ours = connector_config(cluster.etcd, log_timeline=True)
        layerwise = connector_config(cluster.etcd, log_timeline=True, layerwise_load=True)
        _finish(_start(tmp, "A", spec(ours, [(f"src{i}", s) for i, s in enumerate(sources)], 1)))
        base, _ = _finish(_start(tmp, "baseline", spec(None, items, 2)))
        b, _ = _finish(_start(tmp, "B", spec(ours, items, 3)))
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

    print(f"prompt {len(items[0][1])} tokens, shared prefix {PREFIX_BLOCKS * BLOCK} tokens, "
          f"{N} prompts of each kind")
    print("| engine | prompts | TTFT median (ms) | min-max (ms) | tokens from the store |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, rep in (("baseline, no connector", base), ("B: KVStoreConnector", b),
                      ("C: KVStoreConnector, layerwise_load", c)):
        for kind in ("hit", "miss"):
            print(row(name, rep, kind))
    (tmp / "ttft.json").write_text(json.dumps({"baseline": base, "B": b, "C": c}))
    print(f"raw reports and engine logs in {tmp}")


if __name__ == "__main__":
    main()
