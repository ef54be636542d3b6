"""How much GRPO signal an untrained policy gets, per task, prompt style, extraction and budget.

    python -m musketeers.bench.signal --tasks arithmetic,arithmetic:easy@direct \\
        --policy qwen2.5-coder-0.5b-instruct --prompts 16 --group 4,8 --tokens 24,48,128 \\
        --temperature 1.0,0.7

For each task and temperature it samples G completions of the policy alone, π(y | x), for the first
``--prompts`` train items, once, at the largest token budget. A smaller budget's completions
are their first T tokens (sampling is autoregressive, so that is exactly what a run with
``max_new_tokens = T`` would draw), graded with both extractions. One row per (task, budget,
extraction): mean reward (= mean task score), exact (share scoring 1), the share of groups
whose G rewards differ (the only groups GRPO learns from), truncated and answered shares, and
seconds per completion at the full budget. Rows go to stdout as a Markdown table and, with
``--out``, to a JSONL file.

Group size is a lever too (the more samples, the likelier one differs), and it is measured
from the same draws: ``--group 4,8,16`` samples 16 per prompt and gives the share of groups
with signal at each size as its exact expectation over the subsets of those 16
(``groups_with_signal``).

Temperature is the third lever: a policy whose greedy answer is often right can still sample
few right answers at T = 1, and a group of wrong ones is as silent as a group of right ones.
Each ``--temperature`` is a fresh draw from the same seed.

A family is a mix of Reasoning Gym datasets, and one the policy never solves adds only silent
groups: ``--by-source`` adds a row per dataset (source "all" is the whole task), which is how
the ``easier`` level's knobs were chosen.
"""

from __future__ import annotations

import argparse
import json
import time
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
import torch


def groups_with_signal(scores: np.ndarray, g: int) -> float:
    """The share of groups of ``g`` samples whose rewards differ (the only groups GRPO learns
    from), given ``scores`` [P, G ≥ g] sampled for P prompts: the mean over prompts of its
    expectation over every g-subset of the G samples.

    A subset carries no signal iff its g rewards are all one value v, so for a prompt whose G
    samples score v n_v times, P(no signal) = Σ_v C(n_v, g) / C(G, g). Averaging over subsets
    of i.i.d. draws is unbiased for a fresh group of g (a U-statistic), so one draw at the
    largest G measures every smaller group size.
    """
    total = comb(scores.shape[1], g)
    silent = []
    for row in scores:
        _, counts = np.unique(np.round(row, 6), return_counts=True)
        silent.append(sum(comb(int(n), g) for n in counts) / total)
    return 1.0 - float(np.mean(silent))


def measure(task: str, policy, prompts: int, groups: list[int], budgets: list[int],
            temperature: float = 1.0, seed: int = 0,
            by_source: bool = False) -> list[dict[str, Any]]:
    """Rows for one task (see the module docstring), sampled at the largest of ``groups``;
    with ``by_source`` also one row per dataset of the family (source "all" is the whole)."""
    from musketeers.tasks import EXTRACTIONS, build_items, extract_answer, score

    items = build_items(task, "train", limit=prompts)
    group = max(groups)
    generator = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    with torch.no_grad():
        comps = policy.generate(policy.encode_prompts(items), None, group_size=group,
                                max_new_tokens=max(budgets), temperature=temperature, greedy=False,
                                generator=generator)
    per_completion = (time.perf_counter() - t0) / len(comps)
    eos = set(policy.eos_ids)
    # rows for the whole task and, with by_source, for each of its Reasoning Gym datasets
    subsets = {"all": np.arange(len(items))}
    if by_source:
        for source in sorted({it.source for it in items}):
            subsets[source] = np.array([i for i, it in enumerate(items) if it.source == source])
    rows = []
    for budget in budgets:
        cut = [c[:budget] for c in comps]
        ended = np.array([bool(c) and c[-1] in eos for c in cut]).reshape(len(items), group)
        texts = [policy.decode(c) for c in cut]
        lengths = np.array([len(c) for c in cut]).reshape(len(items), group)
        for extraction in EXTRACTIONS:
            scores = np.array([score(items[i // group], t, extraction)
                               for i, t in enumerate(texts)]).reshape(len(items), group)
            answered = np.array([extract_answer(t, extraction) is not None
                                 for t in texts]).reshape(len(items), group)
            for source, rows_of in subsets.items():
                s = scores[rows_of]
                rows.append({
                    "task": task, "source": source, "temperature": temperature,
                    "max_new_tokens": budget, "extraction": extraction,
                    "reward_mean": float(s.mean()), "exact": float((s >= 1).mean()),
                    "groups_with_signal": groups_with_signal(s, group),
                    "signal_by_group": {g: groups_with_signal(s, g) for g in sorted(groups)},
                    "truncated": float(1 - ended[rows_of].mean()),
                    "answered": float(answered[rows_of].mean()),
                    "completion_len": float(lengths[rows_of].mean()),
                    "s_per_completion": per_completion if budget == max(budgets) else None,
                    "prompts": len(rows_of), "group": group,
                })
    return rows


def markdown(rows: list[dict[str, Any]], policy: str) -> str:
    head = ("| policy | task | source (prompts) | T | tokens | extraction | reward | exact | "
            "groups w/ signal, by G | truncated | answered | s / completion |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        s = "" if r["s_per_completion"] is None else f"{r['s_per_completion']:.2f}"
        by_g = ", ".join(f"{g}: {v:.2f}" for g, v in r["signal_by_group"].items())
        lines.append(f"| {policy} | {r['task']} | {r['source']} ({r['prompts']}) | "
                     f"{r['temperature']:g} | {r['max_new_tokens']} | "
                     f"{r['extraction']} | "
                     f"{r['reward_mean']:.3f} | {r['exact']:.3f} | "
                     f"{by_g} | {r['truncated']:.2f} | "
                     f"{r['answered']:.2f} | {s} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from musketeers.config import TrainConfig
    from musketeers.run.build import build_policy

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", required=True, help="comma-separated task names")
    p.add_argument("--policy", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", default="4", help="comma-separated group sizes; one draw at "
                   "the largest measures them all")
    p.add_argument("--tokens", default="24,48,128", help="comma-separated token budgets")
    p.add_argument("--temperature", default="1.0", help="comma-separated sampling temperatures "
                   "(each > 0), each a fresh draw")
    p.add_argument("--by-source", action="store_true", help="also a row per dataset of each "
                   "family: which of its generators give signal")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None, help="append rows to this JSONL file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = sorted({int(t) for t in args.tokens.split(",")})
    groups = sorted({int(g) for g in args.group.split(",")})
    if min(groups) < 1:
        p.error("--group: every group size must be at least 1")
    temperatures = [float(t) for t in args.temperature.split(",") if t]
    if not temperatures or min(temperatures) <= 0:
        p.error("--temperature: give one or more temperatures, each > 0 (e.g. 1.0,0.7)")
    policy = build_policy(TrainConfig(policy=args.policy, dtype=args.dtype))
    rows = []
    for task, temperature in [(t, x) for t in args.tasks.split(",") if t for x in temperatures]:
        got = measure(task, policy, args.prompts, groups, budgets, temperature,
                      by_source=args.by_source)
        rows += got
        print(markdown(got, args.policy), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.writelines(json.dumps({"policy": args.policy, **r}) + "\n" for r in got)


if __name__ == "__main__":
    main()
