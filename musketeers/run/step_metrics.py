"""One update's metrics.jsonl row: each rank's share of the step's rollouts, merged in rank
order, turned into the logged figures (reward, exact, KL, loss, lengths, the batch-mean A with
its entropy H and utilisation u_i of Eq. 15, C's scale)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from musketeers.method.grpo import zero_variance_groups
from musketeers.method.routing import batch_routing_stats


def mean_or_none(xs: list[float]) -> float | None:
    """A figure's mean, None when nothing was measured (an update with no loss, a run with
    no routing): a row or summary says "none", never a made-up 0."""
    return float(np.mean(xs)) if xs else None


def step_parts(rollouts, active, kls: list[float]) -> dict[str, Any]:
    """What this rank's share adds to the step's metrics; ``merge_parts`` joins the ranks'.

    ``zero_adv``: per group entering the loss, whether its advantages are all zero (it adds
    tokens to the normaliser and no gradient)."""
    contexts = [r.context.float() for r in rollouts if r.context is not None]
    return {
        "rewards": [r.rewards for r in rollouts],
        "lengths": [len(c) for r in rollouts for c in r.completions],
        "ended": [e for r in rollouts for e in r.ended],
        "answered": [a for r in rollouts for a in r.answered],
        "attention": [r.attention.cpu() for r in rollouts if r.attention is not None],
        "zero_adv": [bool((r.adv[b] == 0).all()) for r in active
                     for b in range(len(r.items)) if r.keep[b]],
        "kls": kls,
        "context_sq": sum(float(c.pow(2).sum()) for c in contexts),
        "context_n": sum(c.numel() for c in contexts),
    }


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' ``step_parts`` as one update's, in rank order."""
    return {k: (sum(p[k] for p in parts) if k.startswith("context_")
                else [x for p in parts for x in p[k]]) for k in parts[0]}


def context_scale(sum_sq: float, n: int, embedding_rms: float) -> dict[str, float]:
    """C's root mean square (from the sum of its squared entries over ``n`` entries), alone
    and against the policy's token embeddings': how loud the experts speak next to the
    prompt's own tokens (C starts near zero, Eq. 11)."""
    rms = (sum_sq / n) ** 0.5
    return {"context_rms": rms, "context_rms_ratio": rms / embedding_rms}


def metrics_row(cfg, step, parts, names, losses, norms, optimizer, wall,
                embedding_rms: float) -> dict[str, Any]:
    """The metrics.jsonl row. ``reward_mean`` is the mean task score of the sampled
    completions (the reward GRPO maximises), ``exact`` the share scoring 1; ``zero_var_frac``
    (TRL's frac_reward_zero_std), ``truncated_frac`` and ``answered_frac`` say why a reward
    is what it is. ``solved_frac`` is the share of groups whose G samples all scored 1: the
    zero-variance groups that were too easy, so the rest of ``zero_var_frac`` is (nearly all)
    groups too hard for any sample, and the two call for opposite changes of difficulty.
    With a context, C's scale against the policy's ``embedding_rms`` (``context_scale``)."""
    groups = torch.cat(parts["rewards"])  # [B, G] over the whole update
    rewards = groups.flatten()
    # groups whose rewards all agree: the same before and after a within-group shuffle
    zero_var = zero_variance_groups(groups).float()
    row: dict[str, Any] = {
        "step": step + 1,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0)),
        "exact": float((rewards >= 1.0).float().mean()),
        "kl": mean_or_none(parts["kls"]),
        "loss": mean_or_none(losses),
        "grad_norm": mean_or_none(norms),
        "completion_len": float(np.mean(parts["lengths"])),
        "zero_var_frac": float(zero_var.mean()),
        "solved_frac": float((groups >= 1.0).all(-1).float().mean()),
        "truncated_frac": float(np.mean([not e for e in parts["ended"]])),
        "answered_frac": float(np.mean(parts["answered"])),
        "lr": optimizer.param_groups[0]["lr"],
        "time_s": wall,
    }
    if parts["context_n"]:
        row.update(context_scale(parts["context_sq"], parts["context_n"], embedding_rms))
    if parts["attention"]:
        row.update(batch_routing_stats(torch.cat(parts["attention"]), names))
    return row
