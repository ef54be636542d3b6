"""Per-step series of the runs' logged metrics, aligned over seeds (the figures' curves),
and ρ(reward, H) averaged over runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from musketeers.reports.aggregate import Run


def spearmans(runs: list[Run]) -> list[float]:
    """ρ of each finished run where it is defined."""
    return [r.spearman for r in runs if r.status == "done" and r.spearman is not None]


def mean_spearman(runs: list[Run]) -> tuple[float | None, int]:
    """ρ computed per run, then averaged (the paper's protocol); returns (mean, runs used)."""
    rhos = spearmans(runs)
    return (float(np.mean(rhos)) if rhos else None), len(rhos)


def _get(row: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = row
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return None if value is None else float(value)


def series(runs: list[Run], *path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std) of one metric over seeds, aligned by step.

    ``path`` addresses a metrics field (``"reward_mean"``, or ``"utilisation", "<expert>"``).
    The std is the sample std over the seeds that logged that step (0 where only one did).
    """
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for row in run.metrics:
            v = _get(row, path)
            if v is not None and "step" in row:
                by_step.setdefault(int(row["step"]), []).append(v)
    steps = np.array(sorted(by_step), dtype=int)
    means = np.array([np.mean(by_step[s]) for s in steps], dtype=float)
    stds = np.array([np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else 0.0
                     for s in steps], dtype=float)
    return steps, means, stds


def experts_of(runs: list[Run]) -> list[str]:
    """Expert names in first-seen order of the runs' utilisation logs."""
    names: dict[str, None] = {}
    for run in runs:
        for row in run.metrics:
            for name in (row.get("utilisation") or {}):
                names.setdefault(name, None)
    return list(names)
