"""The planted checks' policy model: a tiny random llama over a given tokenizer (the plain
check's word-level one, or the chat variant's)."""

from __future__ import annotations

from typing import Any

import torch

from musketeers.cache.devices import resolve_dtype
from musketeers.config import TrainConfig


def tiny_llama(cfg: TrainConfig, tokenizer: Any):
    """A tiny random llama over ``tokenizer``'s vocabulary, seeded by ``cfg.seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False,
                         # a frozen head initialised at 0.02 caps logit gaps near 1, and LoRA
                         # (q, v only) cannot widen them: the policy could never be confident
                         initializer_range=0.2)
    # initialised in float32 whatever the dtype, so a seed draws the same weights in each
    model = LlamaForCausalLM(config).to(cfg.device, resolve_dtype(cfg.dtype, cfg.device))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
