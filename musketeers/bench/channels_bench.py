"""What a token channel costs: a pocket step and its peak RSS per channel, and a store's size.

The store of the step rows is built by precompute itself, with every prompt token's state
(``tokens``) and every greedy answer token's (``answer``) at each expert's last layer. Each
channel's steps run in a child process of their own (``worker``), so each peak RSS is its
own; the children run one after another in one bench run, and a channel's figure is read as
a ratio to ``pooled``'s. The store sizes of the pocket grid's tasks are computed: token counts
(each expert's tokenizer over every item of both splits, as precompute renders them) × width ×
the bytes of the grid's precompute dtype; an answer is at most ``hint_tokens`` tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musketeers.cache.tokens import CHANNELS, POOLED, TOKENS

TARGET = 1.5  # a tokens step may take at most 1.5x a pooled step
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def build_store(cache_dir: Path, task: str, items: list, specs: list, dtype,
                hint_tokens: int) -> Path:
    """The step rows' store: pooled arrays, hints, and both token channels at the last layer."""
    from musketeers.cache.precompute import PrecomputeConfig, precompute_task
    from musketeers.tasks import task_spec

    return precompute_task(cache_dir, task, task_spec(task), {"train": items}, specs,
                           PrecomputeConfig(dtype=dtype, router=False, hints=True,
                                            hint_tokens=hint_tokens, token_layers=(-1,)))


def bench_channels(cache_dir: Path, run_root: Path, task: str, device: str, reps: int,
                   warmup: int, overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{channel: the worker's ``run_steps`` result} for every channel, one child each."""
    from musketeers.bench.machine import run_child

    return {ch: run_child("train", {"task": task, "cache_dir": str(cache_dir),
                                    "run_dir": str(run_root / ch), "device": device,
                                    "reps": reps, "warmup": warmup,
                                    "overrides": {**overrides, "channel": ch}})
            for ch in CHANNELS}


def expert_shape(spec) -> tuple[int, int]:
    """(hidden width d, layers L) of an expert, from its config alone (no weights read)."""
    from transformers import AutoConfig

    from musketeers.cache.experts import resolve_local

    cfg = AutoConfig.from_pretrained(resolve_local(spec), local_files_only=True)
    cfg = getattr(cfg, "text_config", None) or cfg
    return int(cfg.hidden_size), int(cfg.num_hidden_layers)


def prompt_tokens(spec, items: list) -> int:
    """Tokens of every item's prompt as precompute renders it for this expert."""
    from musketeers.cache.experts import load_tokenizer
    from musketeers.cache.prompts import render_prompt

    tok = load_tokenizer(spec)
    return sum(len(render_prompt(tok, it)) for it in items)


def store_sizes(tasks: dict[str, str], specs: list, limit: int, dtype: str,
                hint_tokens: int) -> dict[str, dict[str, Any]]:
    """{family: {items, pooled, tokens, answer_max bytes}} of one store per task: ``limit``
    items per split, each expert's pooled arrays (float32: last, first, random [N, d],
    layers_last and layers_mean [N, L+1, d]) and token states in ``dtype``."""
    from musketeers.tasks import build_items

    shapes = [expert_shape(s) for s in specs]
    out = {}
    for family, task in tasks.items():
        items = [it for split in ("train", "val") for it in build_items(task, split, limit=limit)]
        n = len(items)
        tokens = [prompt_tokens(s, items) for s in specs]
        out[family] = {
            "task": task, "items": n, "mean_prompt_tokens": sum(tokens) / len(tokens) / n,
            "pooled": sum(n * d * (3 + 2 * (layers + 1)) * 4 for d, layers in shapes),
            TOKENS: sum(t * d * BYTES[dtype] for t, (d, _) in zip(tokens, shapes, strict=True)),
            "answer_max": sum(n * hint_tokens * d * BYTES[dtype] for d, _ in shapes)}
    return out


def report(rep, res: dict[str, dict[str, Any]]) -> None:
    """The step rows: each channel's s/step and peak RSS, as ratios to ``pooled``'s."""
    from musketeers.bench.machine import median

    for ch, r in res.items():
        if "error" in r:
            rep.skip("channels", f"{ch} step", r["error"])
            return
        rep.measure("channels", f"{ch} step", "s/step", r["step_s"])
        rep.measure("channels", f"{ch} peak RSS (own process)", "MiB", [r["peak_rss_mib"]])
    base = res[POOLED]
    rep.row("channels", f"policy {base['policy']}, team {base['team']}, {base['dtype']}",
            f"{base['completions_per_step']} completions × {base['completion_len'][0]:.0f} "
            "tokens/step")
    rep.row("channels", "s/step " + " | ".join(CHANNELS),
            " | ".join(f"{median(res[ch]['step_s']):.2f}" for ch in CHANNELS))
    rep.row("channels", "peak RSS " + " | ".join(CHANNELS),
            " | ".join(f"{res[ch]['peak_rss_mib']:.0f}" for ch in CHANNELS) + " MiB")
    step = median(base["step_s"])
    for ch in CHANNELS[1:]:
        ratio = median(res[ch]["step_s"]) / step
        rss = res[ch]["peak_rss_mib"] / base["peak_rss_mib"]
        if ch == TOKENS:
            rep.check("channels", f"{ch} step ÷ pooled step", ratio, TARGET, "{:.2f}×",
                      higher_is_better=False)
        else:
            rep.row("channels", f"{ch} step ÷ pooled step", f"{ratio:.2f}×")
        rep.row("channels", f"{ch} peak RSS ÷ pooled", f"{rss:.2f}×")


def report_sizes(rep, sizes: dict[str, dict[str, Any]], dtype: str, hint_tokens: int) -> None:
    for s in sizes.values():
        rep.row("channels", f"store size {s['task']} ({s['items']} items, computed): pooled | "
                f"tokens | answer ≤ ({dtype})",
                f"{s['pooled'] / 2**20:.0f} | {s[TOKENS] / 2**20:.0f} | "
                f"{s['answer_max'] / 2**20:.0f} MiB (prompts {s['mean_prompt_tokens']:.0f} "
                f"tokens, answers ≤ {hint_tokens})")
