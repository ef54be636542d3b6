"""What a token channel costs: a pocket step and its peak RSS per channel, and a store's size.

The store of the step rows is built by precompute itself, with every prompt token's state
(``tokens``) and every greedy answer token's (``answer``) at each expert's last layer. Each
channel's steps run in a child process of their own (``worker``), so each peak RSS is its
own. The children run in alternating rounds (pooled, tokens, answer, pooled, …;
``rounds.alternate``), so load that comes and goes on the machine falls on every channel. Every
child runs the same steps on the same items, so a channel's step k of round r pairs with
pooled's: a channel's step is read as the median of those pairs' ratios, only when they lie
within ``report.STEADY`` of it (``report.paired_ratio``); otherwise the row says the machine
was too noisy. The steps' own spread (a step's items set its prompt lengths) falls on both
sides of a pair alike.

The store sizes of the pocket grid's tasks are computed: token counts (each expert's tokenizer
over every item of both splits, as precompute renders them) × width × the bytes of the grid's
precompute dtype; an answer is at most ``hint_tokens`` tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musketeers.bench.report import STEADY, paired_ratio, spread
from musketeers.bench.rounds import Child, alternate
from musketeers.cache.tokens import CHANNELS, POOLED, TOKENS

TARGET = 1.5  # a tokens step may take at most 1.5x a pooled step
ROUNDS = 2  # alternating rounds of children per channel, as the TRL rows run
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
                   warmup: int, overrides: dict[str, Any], rounds: int = ROUNDS
                   ) -> dict[str, dict[str, Any]]:
    """{channel: the worker's ``run_steps`` results, merged}: ``rounds`` alternating rounds
    (pooled, tokens, answer, pooled, …) of a fresh child per channel, ``reps`` steps each."""
    from musketeers.bench.machine import run_child

    def child(ch: str) -> Child:
        return lambda k: run_child("train", {
            "task": task, "cache_dir": str(cache_dir), "run_dir": str(run_root / f"{ch}{k}"),
            "device": device, "reps": reps, "warmup": warmup,
            "overrides": {**overrides, "channel": ch}})

    return alternate({ch: child(ch) for ch in CHANNELS}, rounds)


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
    """The step rows: each channel's s/step, the spread of its repetitions and its peak RSS;
    a step ratio to ``pooled``'s only where both sides are steady (``steady_ratio``)."""
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
    rounds = max(base["round"]) + 1
    rep.row("channels", f"s/step {' | '.join(CHANNELS)} ({rounds} alternating rounds)",
            " | ".join(f"{median(res[ch]['step_s']):.2f}" for ch in CHANNELS))
    rep.row("channels", f"spread of the repetitions {' | '.join(CHANNELS)}",
            " | ".join(f"±{spread(res[ch]['step_s']):.0%}" for ch in CHANNELS)
            + " of the medians (the steps' own items vary their work)")
    rep.row("channels", "peak RSS " + " | ".join(CHANNELS),
            " | ".join(f"{res[ch]['peak_rss_mib']:.0f}" for ch in CHANNELS) + " MiB")
    rep.notes.append(
        f"channels: {rounds} alternating rounds ({', '.join(CHANNELS)}, {CHANNELS[0]}, …) of a "
        f"fresh child per channel, {len(base['step_s']) // rounds} timed steps each, the same "
        f"items in every child; a ratio to {POOLED}: the median of the same steps' ratios, "
        f"only where each lies within ±{STEADY:.0%} of it; peak RSS: the largest of a "
        "channel's children")
    for ch in CHANNELS[1:]:
        metric = f"{ch} step ÷ pooled step"
        ratio, why = paired_ratio(res[ch]["step_s"], base["step_s"])
        if ratio is None:  # a noisy side: no ratio, so no PASS/MISS either
            rep.skip("channels", metric, why)
        elif ch == TOKENS:
            rep.check("channels", metric, ratio, TARGET, "{:.2f}×", higher_is_better=False)
        else:
            rep.row("channels", metric, f"{ratio:.2f}×")
        rss = res[ch]["peak_rss_mib"] / base["peak_rss_mib"]
        rep.row("channels", f"{ch} peak RSS ÷ pooled", f"{rss:.2f}×")


def report_sizes(rep, sizes: dict[str, dict[str, Any]], dtype: str, hint_tokens: int) -> None:
    for s in sizes.values():
        rep.row("channels", f"store size {s['task']} ({s['items']} items, computed): pooled | "
                f"tokens | answer ≤ ({dtype})",
                f"{s['pooled'] / 2**20:.0f} | {s[TOKENS] / 2**20:.0f} | "
                f"{s['answer_max'] / 2**20:.0f} MiB (prompts {s['mean_prompt_tokens']:.0f} "
                f"tokens, answers ≤ {hint_tokens})")
