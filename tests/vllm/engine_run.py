"""One vLLM engine, in its own process: run a few greedy generations, write a report.

    python -m tests.vllm.engine_run SPEC.json REPORT.json

SPEC: {"model": DIR, "kv_transfer": {...} or null, "warmup": [tokens],
       "phases": [{"name": str, "prompt": [tokens], "max_tokens": int}, ...],
       optional "tp": tensor-parallel size, "dtype" (default float32),
       "env": {variable: value} set before vLLM loads}
REPORT: {"phases": {name: {"tokens": [...], "cached": int, "ttft": seconds}}}

Run with VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 and a fixed
PYTHONHASHSEED (the block hashes, and so the store keys, depend on it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import os

    # Set before vLLM reads them (e.g. VLLM_CPU_OMP_THREADS_BIND for TP > 1).
    os.environ.update(spec.get("env", {}))
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {}
    if spec.get("kv_transfer"):
        kwargs["kv_transfer_config"] = KVTransferConfig(**spec["kv_transfer"])
    if spec.get("tp", 1) > 1:
        kwargs.update(tensor_parallel_size=spec["tp"], distributed_executor_backend="mp")
    llm = LLM(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True, block_size=32,
              dtype=spec.get("dtype", "float32"), max_model_len=2048, max_num_seqs=4,
              max_num_batched_tokens=2048,
              seed=0, enable_prefix_caching=True, disable_log_stats=False, **kwargs)
    if spec.get("warmup"):
        llm.generate([{"prompt_token_ids": spec["warmup"]}],
                     SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    report: dict[str, Any] = {"phases": {}}
    for phase in spec["phases"]:
        params = SamplingParams(temperature=0, max_tokens=phase["max_tokens"], ignore_eos=True)
        t = time.monotonic()
        (out,) = llm.generate([{"prompt_token_ids": phase["prompt"]}], params, use_tqdm=False)
        wall = time.monotonic() - t
        m = out.metrics
        ttft = getattr(m, "first_token_latency", 0.0) if m is not None else 0.0
        report["phases"][phase["name"]] = {
            "tokens": list(out.outputs[0].token_ids),
            "cached": int(out.num_cached_tokens or 0),
            "ttft": float(ttft or 0.0),
            "wall": wall,
        }
        if spec.get("log_stats_each_phase"):
            # vLLM's own "KV Transfer metrics" line, from the connector's stats.
            llm.llm_engine.do_log_stats()
    llm.llm_engine.do_log_stats()
    return report


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(run(spec)))
