"""The same measurements on a CUDA device, when one is present (never required by tests).

No weights can be fetched on a lent GPU, so the paper-roster shapes are built from their
configs with seeded random weights: right for throughput and memory, meaningless for accuracy
(every GPU row says so). Prompts are random token ids with the pocket prompts' lengths.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import torch

from musketeers.bench.machine import repeat

# Shapes of the paper's experts (their published config.json), built with random weights.
PAPER_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-math-1.5b (random weights)": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-3b (random weights)": dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-coder-7b (random weights)": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064),
}


def random_model(shape: dict[str, Any], dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", tie_word_embeddings=False, **shape)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to("cuda").eval()


def bench_gpu_expert(name: str, lengths: list[int], reps: int, naive_reps: int
                     ) -> dict[str, Any]:
    """Batched backbone (the precompute path, token budget 32k) vs the naive loop, on CUDA."""
    from musketeers.bench.precompute_bench import ceiling_key, naive_loop, non_embedding_params
    from musketeers.cache.backbone import Backbone, forward_pool
    from musketeers.cache.batching import length_batches

    model = random_model(PAPER_SHAPES[name], torch.bfloat16)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(100, 30000, n).tolist() for n in lengths]
    rand = np.zeros(len(seqs), dtype=np.int32)
    backbone = Backbone(model)

    def fast() -> None:
        for batch in length_batches(lengths, 32768):
            forward_pool(backbone, [seqs[i] for i in batch], rand[batch], 0)
        torch.cuda.synchronize()

    def naive() -> None:
        naive_loop(model, seqs)
        torch.cuda.synchronize()

    fast()
    result = {"expert": name, "ceiling": ceiling_key(torch.bfloat16), "tokens": sum(lengths),
              "prompts": len(seqs),
              "mean_len": float(np.mean(lengths)), "max_len": max(lengths),
              "params_nonembed": non_embedding_params(model),
              "fast_s": repeat(fast, reps), "naive_s": repeat(naive, naive_reps)}
    model = None  # free the weights before the next expert loads
    gc.collect()
    torch.cuda.empty_cache()
    return result
