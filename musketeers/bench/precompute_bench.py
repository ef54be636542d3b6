"""Precompute throughput per pocket expert: the batched backbone vs a naive loop.

Fast path: ``musketeers.cache.precompute.compute_rows``, exactly what ``musketeers precompute``
runs per chunk (length-sorted, padding-minimising batches, backbone only, every pooling from one
pass), measured eager and with the ``torch.compile``d backbone of ``--compile on`` (its one-off
compile time reported beside it).
Naive path: one prompt at a time through the full model with logits and
``output_hidden_states=True``. Both see the same prompts through the expert's chat template.
Hints: the expert's greedy answers (``--hints``) batched as ``compute_hints`` cuts them, a
generate call costed as the forward per new token it runs, against the prefill's cut, which
costs a call as one forward; the two interleaved, ``HINT_TOKENS`` new tokens at most.

FLOP convention: 2 · (non-embedding parameters) · tokens, the forward cost of every matmul
whose weight is not an embedding table; attention's T² term is left out, so the achieved
fraction is a slight under-estimate at these prompt lengths.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from musketeers.bench.machine import median, repeat
from musketeers.cache.items import Item

log = logging.getLogger("musketeers.bench")
HINT_TOKENS = 32  # the hints rows' answer length (precompute's is 128): a bench of minutes


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


def ceiling_key(dtype: torch.dtype) -> str:
    """The ``matmul.ceilings`` entry a pass in ``dtype`` is a fraction of."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def paired_with_ceiling(fn, reps: int, device: str, label: str,
                        dtype: torch.dtype) -> tuple[list[float], list[float]]:
    """Seconds per call of ``fn``, each paired with the matmul rate in ``dtype`` (the pass's
    own) measured just before.

    A CPU's bf16 rate drifted by 2× within minutes on a shared AMX host, so a fraction taken
    against a ceiling measured once at the start mostly measures the drift; pairing each
    repetition with its own ceiling makes it a like-for-like ratio. The ceiling is the pass's
    dtype's: an fp32 pass against an emulated bf16 rate is no fraction of anything.
    """
    from musketeers.bench.matmul import matmul_flops

    times, ceils = [], []
    for r in range(reps):
        ceils.append(matmul_flops(2048, dtype, device, reps=1)[0])
        times += repeat(fn, 1)
        log.info("%s: repetition %d/%d took %.2f s (%s matmul %.0f GFLOP/s just before)",
                 label, r + 1, reps, times[-1], ceiling_key(dtype), ceils[-1] / 1e9)
    return times, ceils


def bench_expert(spec, items: list[Item], device: str, dtype: torch.dtype, reps: int,
                 naive_reps: int) -> dict[str, Any]:
    """Seconds per repetition of the fast and naive paths over ``items`` for one expert."""
    import time

    from musketeers.cache.backbone import Backbone
    from musketeers.cache.experts import load_expert
    from musketeers.cache.precompute import PrecomputeConfig, compute_rows
    from musketeers.cache.prompts import render_prompt

    model, tok = load_expert(spec, device, dtype)
    cfg = PrecomputeConfig(device=device, dtype=dtype)
    rows = np.arange(len(items))
    seqs = [render_prompt(tok, it) for it in items]
    tokens = sum(len(s) for s in seqs)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def fast() -> None:
        compute_rows(model, tok, items, rows, cfg)
        sync()

    def naive() -> None:
        naive_loop(model, seqs)
        sync()

    compiled = Backbone(model, compiled=True)

    def fast_compiled() -> None:
        compute_rows(model, tok, items, rows, cfg, compiled)
        sync()

    compute_rows(model, tok, items[:4], rows[:4], cfg)  # warm-up: allocator, kernel choice
    naive_loop(model, seqs[:2])
    fast_s, fast_ceil = paired_with_ceiling(fast, reps, device,
                                            f"precompute {spec.name} batched", dtype)
    naive_s = repeat(naive, naive_reps, label=f"precompute {spec.name} naive")
    t0 = time.perf_counter()
    compute_rows(model, tok, items[:4], rows[:4], cfg, compiled)  # compiles the one graph
    compile_s = time.perf_counter() - t0
    compiled_s, compiled_ceil = paired_with_ceiling(fast_compiled, reps, device,
                                                    f"precompute {spec.name} compiled", dtype)
    result = {
        "expert": spec.name,
        "ceiling": ceiling_key(dtype),
        "tokens": tokens,
        "prompts": len(items),
        "mean_len": tokens / len(items),
        "max_len": max(len(s) for s in seqs),
        "params_nonembed": non_embedding_params(model),
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "fast_s": fast_s,
        "naive_s": naive_s,
        "compiled_s": compiled_s,
        "compile_s": compile_s,
        "fast_ceil": fast_ceil,
        "compiled_ceil": compiled_ceil,
    }
    result.update(bench_hints(model, tok, items, device, reps))
    model = None  # free the weights before the next expert loads
    gc.collect()
    return result


def bench_hints(model: torch.nn.Module, tok: Any, items: list[Item], device: str,
                reps: int) -> dict[str, Any]:
    """Seconds per pass of the expert's greedy answers over ``items``: batched as
    ``compute_hints`` batches them against the prefill's cut, in alternating repetitions so
    that load on the machine falls on both."""
    from musketeers.cache.batching import length_batches
    from musketeers.cache.compute import (
        context_length,
        generation_overhead,
        greedy_answers,
        prompt_seqs,
    )
    from musketeers.cache.precompute import PrecomputeConfig

    cfg = PrecomputeConfig()
    seqs, _ = prompt_seqs(tok, items, context_length(model, cfg.max_length))
    lengths = [len(q) for q in seqs]
    cuts = {"generation": length_batches(lengths, cfg.batch_tokens,
                                         generation_overhead(HINT_TOKENS)),
            "prefill": length_batches(lengths, cfg.batch_tokens)}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def answers(cut: str) -> Callable[[], None]:
        def run() -> None:
            for b in cuts[cut]:
                greedy_answers(model, tok, [seqs[i] for i in b], HINT_TOKENS)
            sync()
        return run

    times: dict[str, list[float]] = {cut: [] for cut in cuts}
    for r in range(reps):
        for cut in cuts:
            times[cut] += repeat(answers(cut), 1, label=f"hints {cut} cut, repetition {r + 1}")
    return {"hint_batches": {c: len(b) for c, b in cuts.items()}, "hints_s": times}


def summarize(report, r: dict[str, Any], ceil: dict[str, list[float]], section: str,
              targets: dict[str, float]) -> None:
    """Measures and rows of one expert: tok/s, achieved FLOP/s, fraction of the ceilings.

    Targets are checked on the compiled path when it was measured (``--compile on``, the
    closer of the two to the targets on the CPU of BENCHMARKS.md); the eager figures stand
    beside them.
    """
    name, tokens = r["expert"], r["tokens"]
    report.measure(section, f"{name} batched", "s/pass", r["fast_s"])
    report.measure(section, f"{name} naive", "s/pass", r["naive_s"])
    paths = {"eager": median(r["fast_s"])}
    fractions = {"eager": _fractions(r, "fast", ceil)}
    if "compiled_s" in r:
        report.measure(section, f"{name} batched, compiled", "s/pass", r["compiled_s"])
        report.measure(section, f"{name} compile (once)", "s", [r["compile_s"]])
        paths["compiled"] = median(r["compiled_s"])
        fractions["compiled"] = _fractions(r, "compiled", ceil)
    naive_tps = tokens / median(r["naive_s"])
    fp32, key = median(ceil["fp32"]), r["ceiling"]
    report.row(section, f"{name}: prompts × mean len", f"{r['prompts']} × {r['mean_len']:.0f} "
               f"(max {r['max_len']}), {r['params_nonembed'] / 1e6:.0f}M non-emb params")
    report.row(section, f"{name}: tokens/s {' | '.join(paths)} | naive",
               " | ".join(f"{tokens / t:.0f}" for t in paths.values()) + f" | {naive_tps:.0f}")
    for path, t in paths.items():
        flops = forward_flops(r["params_nonembed"], tokens) / t
        report.row(section, f"{name} ({path}): achieved FLOP/s", f"{flops / 1e9:.0f} GFLOP/s "
                   f"= {median(fractions[path]):.0%} of {key} (per-rep "
                   f"{', '.join(f'{x:.0%}' for x in fractions[path])})"
                   + ("" if key == "fp32" else f", {flops / fp32:.0%} of fp32 matmul"))
    label = "compiled" if "compiled" in paths else "eager"
    best = paths[label]
    target = next((v for k, v in targets.items() if k in name), None)
    if target is not None:
        # one decimal: a rounded "70 % ≥ 70 %: MISS" reads as a bug
        report.check(section, f"{name} ({label}): of {key} matmul", median(fractions[label]),
                     target, "{:.1%}")
    report.check(section, f"{name} ({label}): batched vs naive", tokens / best / naive_tps, 5.0,
                 "{:.1f}×")
    if "hints_s" in r:
        gen, pre = (r["hints_s"][c] for c in ("generation", "prefill"))
        batches = r["hint_batches"]
        report.measure(section, f"{name} hints, batched for generation", "s/pass", gen)
        report.measure(section, f"{name} hints, the prefill's cut", "s/pass", pre)
        report.row(section, f"{name}: hints ({r['prompts']} prompts, {HINT_TOKENS} new tokens "
                   "at most), the prefill's cut ÷ batched for generation",
                   f"{median(pre) / median(gen):.2f}× ({batches['prefill']} generate calls "
                   f"against {batches['generation']})")


def _fractions(r: dict[str, Any], path: str, ceil: dict[str, list[float]]) -> list[float]:
    """Achieved FLOP/s over the ceiling of the pass's dtype, per repetition: each against the
    ceiling measured just before it when there is one, else against the suite's."""
    n = forward_flops(r["params_nonembed"], r["tokens"])
    ceilings = r.get(f"{path}_ceil") or [median(ceil[r["ceiling"]])] * len(r[f"{path}_s"])
    return [n / t / c for t, c in zip(r[f"{path}_s"], ceilings, strict=True)]


# The throughput targets, as fractions of the measured matmul rate in the pass's dtype, by
# expert-name substring.
TARGETS = {"qwen2.5-coder-0.5b": 0.70, "smollm2": 0.50}
