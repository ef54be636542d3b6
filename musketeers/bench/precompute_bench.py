"""Precompute throughput per pocket expert: the batched backbone vs a naive loop (issue 2).

Fast path: ``musketeers.cache.precompute.compute_rows``, exactly what ``musketeers precompute``
runs per chunk (length-sorted token-budget batches, backbone only, every pooling from one pass).
Naive path: one prompt at a time through the full model with logits and
``output_hidden_states=True``. Both see the same prompts through the expert's chat template.

FLOP convention: 2 · (non-embedding parameters) · tokens, the forward cost of every matmul
whose weight is not an embedding table; attention's T² term is left out, so the achieved
fraction is a slight under-estimate at these prompt lengths.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import numpy as np
import torch

from musketeers.bench.machine import median, repeat
from musketeers.cache.items import Item

log = logging.getLogger("musketeers.bench")


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside every embedding table: input, output (LM head) and any other
    ``nn.Embedding`` (e.g. learned positions). A tied table is counted once, as excluded.

    The LM head is excluded whether or not it is tied: it is a ``vocab × d`` table that
    precompute never runs, and the matmul-rate convention counts the backbone.
    """
    skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    out_emb = model.get_output_embeddings()
    if out_emb is not None:
        skip.add(id(out_emb.weight))
    # parameters() yields a shared (tied) tensor once
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def forward_flops(n_params: int, tokens: int) -> float:
    """2 · N · tokens: one multiply and one add per non-embedding weight per token."""
    return 2.0 * n_params * tokens


@torch.inference_mode()
def naive_loop(model: torch.nn.Module, seqs: list[list[int]]) -> None:
    """The baseline: one prompt at a time, full model with logits, every hidden state."""
    device = next(model.parameters()).device
    for s in seqs:
        out = model(input_ids=torch.tensor([s], device=device), output_hidden_states=True)
        out.hidden_states[-1][0, -1].float().cpu()


def bench_expert(spec, items: list[Item], device: str, dtype: torch.dtype, reps: int,
                 naive_reps: int) -> dict[str, Any]:
    """Seconds per repetition of the fast and naive paths over ``items`` for one expert."""
    from musketeers.cache.experts import load_expert
    from musketeers.cache.precompute import PrecomputeConfig, compute_rows, prompt_ids

    model, tok = load_expert(spec, device, dtype)
    cfg = PrecomputeConfig(device=device, dtype=dtype)
    rows = np.arange(len(items))
    seqs = [prompt_ids(tok, it) for it in items]
    tokens = sum(len(s) for s in seqs)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def fast() -> None:
        compute_rows(model, tok, items, rows, cfg)
        sync()

    def naive() -> None:
        naive_loop(model, seqs)
        sync()

    compute_rows(model, tok, items[:4], rows[:4], cfg)  # warm-up: allocator, kernel choice
    naive_loop(model, seqs[:2])
    fast_s = repeat(fast, reps, label=f"precompute {spec.name} batched")
    naive_s = repeat(naive, naive_reps, label=f"precompute {spec.name} naive")
    result = {
        "expert": spec.name,
        "tokens": tokens,
        "prompts": len(items),
        "mean_len": tokens / len(items),
        "max_len": max(len(s) for s in seqs),
        "params_nonembed": non_embedding_params(model),
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "fast_s": fast_s,
        "naive_s": naive_s,
    }
    model = None  # free the weights before the next expert loads
    gc.collect()
    return result


def summarize(report, r: dict[str, Any], ceil: dict[str, list[float]], section: str,
              targets: dict[str, float]) -> None:
    """Measures and rows of one expert: tok/s, achieved FLOP/s, fraction of the ceilings."""
    name, tokens = r["expert"], r["tokens"]
    report.measure(section, f"{name} batched", "s/pass", r["fast_s"])
    report.measure(section, f"{name} naive", "s/pass", r["naive_s"])
    tps = tokens / median(r["fast_s"])
    naive_tps = tokens / median(r["naive_s"])
    flops = forward_flops(r["params_nonembed"], tokens) / median(r["fast_s"])
    bf16, fp32 = median(ceil["bf16"]), median(ceil["fp32"])
    report.row(section, f"{name}: prompts × mean len", f"{r['prompts']} × {r['mean_len']:.0f} "
               f"(max {r['max_len']}), {r['params_nonembed'] / 1e6:.0f}M non-emb params")
    report.row(section, f"{name}: tokens/s batched | naive", f"{tps:.0f} | {naive_tps:.0f}")
    report.row(section, f"{name}: achieved FLOP/s", f"{flops / 1e9:.0f} GFLOP/s "
               f"= {flops / fp32:.0%} of fp32 matmul")
    target = next((v for k, v in targets.items() if k in name), None)
    if target is None:
        report.row(section, f"{name}: of bf16 matmul", f"{flops / bf16:.0%}")
    else:
        report.check(section, f"{name}: of bf16 matmul", flops / bf16, target, "{:.0%}")
    report.check(section, f"{name}: batched vs naive", tps / naive_tps, 5.0, "{:.1f}×")


# Issue 2's targets, as fractions of the measured bf16 matmul rate, by expert-name substring.
TARGETS = {"qwen2.5-coder-0.5b": 0.70, "smollm2": 0.50}
