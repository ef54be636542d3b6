"""Does RL move the policy? The trend of a run's training reward over its GRPO steps.

A run logs one mean sampled reward per step (metrics.jsonl's ``reward_mean``; the supervised
warm-up is logged apart, in warmup.jsonl). Its least-squares line over the steps gives a
fitted **rise**: slope × (last step − first step), the change the line says the run made.

Neighbouring steps' rewards are not independent (the same policy, drifting slowly), so the
ordinary least-squares interval is too narrow. The interval here widens it for the lag-1
autocorrelation r₁ of the residuals, with the effective number of steps
n_eff = n (1 − r₁)/(1 + r₁) and n_eff − 2 degrees of freedom (Santer et al. 2000, J. Geophys.
Res. 105:7337). That is one run's description; whether RL moves the policy is tested across
training seeds, one rise per seed, with k − 1 degrees of freedom (``reports.learning``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

MIN_STEPS = 4  # a line through fewer steps has no residual left to judge it by


@dataclass(frozen=True)
class RewardTrend:
    """The least-squares trend of one run's training reward over its steps."""

    per_step: float  # slope of reward on step
    rise: float  # per_step × (last step − first step): the change the fitted line makes
    low: float  # 95 % interval of the rise, widened for the residuals' autocorrelation
    high: float
    steps: int
    r1: float  # lag-1 autocorrelation of the residuals (0 where negative: never narrowed)
    df: float  # n_eff − 2

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}


def reward_trend(rows: list[dict[str, Any]], key: str = "reward_mean") -> RewardTrend | None:
    """The trend of ``key`` over the logged steps of ``rows`` (metrics.jsonl rows); None with
    fewer than ``MIN_STEPS`` steps that logged it."""
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if len(pts) < MIN_STEPS:
        return None
    x, y = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
    n = len(x)
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx == 0.0:
        return None
    slope = float(xc @ (y - y.mean())) / sxx
    resid = y - y.mean() - slope * xc
    span = float(x[-1] - x[0])
    r1 = _lag1(resid)
    n_eff = n * (1 - r1) / (1 + r1)
    df = n_eff - 2
    if df <= 0:  # the residuals are so correlated that no interval can be given
        return RewardTrend(slope, slope * span, math.nan, math.nan, n, r1, df)
    se = math.sqrt(float(resid @ resid) / df / sxx)
    half = float(sps.t.ppf(0.975, df)) * se * span
    return RewardTrend(slope, slope * span, slope * span - half, slope * span + half, n, r1, df)


def _lag1(resid: np.ndarray) -> float:
    """Lag-1 autocorrelation of the residuals, clamped at 0: a negative one would narrow the
    interval below ordinary least squares', which no drift of a policy justifies."""
    denom = float(resid @ resid)
    if denom == 0.0:
        return 0.0
    r1 = float(resid[1:] @ resid[:-1]) / denom
    return min(max(r1, 0.0), 0.99)
