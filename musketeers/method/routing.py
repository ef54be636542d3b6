"""Routing observability (paper §4.3, Eq. 15): entropy, utilisation, and Spearman ρ.

A is the adapter's attention matrix [B, m, n] (or [m, n]): row j is latent query j's
distribution over the n experts. With a token channel the adapter attends over every token of
every expert; ``expert_attention`` sums those weights per expert, so A is still [B, m, n].
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy import stats


def expert_attention(weights: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
    """The A that Eq. 15 reads: A_ji = Σ_{t ∈ expert i} w_jt, the attention latent j gives
    all of expert i's tokens. weights [..., T] (rows sum to 1), owner [T] (each slot's expert
    index) → [..., n], rows still summing to 1. With one token per expert (pooled) A = weights.
    """
    a = weights.new_zeros(*weights.shape[:-1], n)
    return a.index_add_(-1, owner, weights)


def routing_entropy(a: torch.Tensor) -> torch.Tensor:
    """Eq. 15: H = (1/m) Σ_j (−Σ_i A_ji log A_ji), per sample. [..., m, n] → [...].

    0 · log 0 is taken as 0 (xlogy), so one-hot rows give H = 0; uniform rows give log n.
    """
    return -torch.special.xlogy(a, a).sum(dim=-1).mean(dim=-1)


def utilisation(a: torch.Tensor) -> torch.Tensor:
    """Eq. 15: u_i = (1/m) Σ_j A_ji, per sample. [..., m, n] → [..., n]; sums to 1 over i."""
    return a.mean(dim=-2)


def batch_routing_stats(a: torch.Tensor | None, expert_names: list[str]) -> dict:
    """Eq. 15's statistics averaged over the batch, as JSON-ready Python floats.

    Returns ``{"attention": batch-mean A as [m][n] list, "entropy": mean H,
    "utilisation": {expert name: mean u_i}}``; ``{}`` when the method has no A (no_cross_attn,
    output_collab, single), so callers can merge it into a metrics row unconditionally.
    """
    if a is None:
        return {}
    a = a.detach().float()
    if a.ndim == 2:
        a = a.unsqueeze(0)
    if a.shape[-1] != len(expert_names):
        raise ValueError(f"A has {a.shape[-1]} expert columns but {len(expert_names)} names")
    u = utilisation(a).mean(dim=0)
    return {
        "attention": a.mean(dim=0).tolist(),
        "entropy": float(routing_entropy(a).mean()),
        "utilisation": {name: float(u_i) for name, u_i in zip(expert_names, u, strict=True)},
    }


def spearman(x, y) -> float:
    """Spearman rank correlation ρ between two series (e.g. reward and H over steps, §4.3).

    Pairs where either value is NaN/inf are dropped. Returns NaN, without a warning, when
    fewer than two pairs remain or either series is constant (ρ is undefined there).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman needs two 1-D series of equal length, got {x.shape}, {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(x, y).statistic)
