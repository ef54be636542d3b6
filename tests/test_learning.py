"""Does RL move the policy: a run's reward trend (autocorrelation-widened) and the claim that
tests the seeds' rises with k − 1 degrees of freedom."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from musketeers.reports.aggregate import Run
from musketeers.reports.learning import rl_moves_claim
from musketeers.run import learning
from musketeers.run.learning import reward_trend
from musketeers.run.runlog import summarize


def rows(values) -> list[dict]:
    return [{"step": i + 1, "reward_mean": float(v)} for i, v in enumerate(values)]


def ar1(rng: np.random.Generator, reps: int, n: int, phi: float) -> np.ndarray:
    """``reps`` series of unit-variance AR(1) noise, no trend."""
    e = np.empty((reps, n))
    e[:, 0] = rng.normal(size=reps)
    for i in range(1, n):
        e[:, i] = phi * e[:, i - 1] + rng.normal(size=reps) * np.sqrt(1 - phi ** 2)
    return e


def test_a_clean_line_gives_its_rise_and_an_interval_that_excludes_zero():
    rng = np.random.default_rng(0)
    y = 0.2 + 0.01 * np.arange(30) + rng.normal(0, 0.02, 30)
    t = reward_trend(rows(y))
    assert t is not None and t.steps == 30
    assert t.rise == pytest.approx(0.29, abs=0.03)  # 0.01 a step over 29 steps
    assert 0 < t.low < t.rise < t.high


def test_too_few_steps_or_a_missing_column_give_no_trend():
    assert reward_trend(rows([0.1, 0.2, 0.3])) is None
    assert reward_trend([{"step": i} for i in range(10)]) is None


def test_autocorrelated_noise_widens_the_interval_so_a_flat_run_rarely_reads_as_a_rise(
        monkeypatch):
    # a flat run whose steps drift together (AR(1), φ = 0.6): ordinary least squares calls a
    # third of them a trend; the widened interval keeps that near its nominal 5 %
    series = ar1(np.random.default_rng(1), 1000, 50, 0.6)

    def rejections() -> float:
        ts = [reward_trend(rows(y)) for y in series]
        return float(np.mean([t.low > 0 or t.high < 0 for t in ts]))

    widened = rejections()
    monkeypatch.setattr(learning, "_lag1", lambda resid: 0.0)  # the correction removed
    plain = rejections()
    assert widened < 0.13 and plain > 0.25, (widened, plain)


def run(seed: int, values, task: str = "arithmetic", tmp: Path = Path(".")) -> Run:
    return Run(name=f"s{seed}", path=tmp, status="done", metrics=rows(values),
               config={"task": task, "method": "single", "seed": seed, "latents": 8})


def test_the_claim_holds_when_every_seed_rises_and_not_when_they_are_flat():
    rising = [run(s, 0.2 + 0.02 * np.arange(20) + 0.01 * np.sin(np.arange(20) + s))
              for s in range(3)]
    line = rl_moves_claim(rising, "arithmetic", 8)
    assert line is not None and "**holds here**" in line
    assert "(t, df 2)" in line and "smallest detectable" in line
    flat = [run(s, 0.5 + 0.05 * np.sin(np.arange(20) * (s + 1))) for s in range(3)]
    line = rl_moves_claim(flat, "arithmetic", 8)
    assert "no evidence either way" in line and "holds here" not in line


def test_one_seed_is_descriptive_and_a_task_without_single_has_no_claim():
    line = rl_moves_claim([run(0, 0.2 + 0.02 * np.arange(20))], "arithmetic", 8)
    assert "one seed: descriptive only" in line
    assert rl_moves_claim([run(0, np.arange(20))], "logic", 8) is None


def test_the_run_summary_records_its_reward_trend(tmp_path: Path):
    logged = [dict(r, exact=0.0, zero_var_frac=0.0) for r in rows(0.1 + 0.01 * np.arange(12))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    trend = summarize(tmp_path, 12)["reward_trend"]
    assert trend["rise"] == pytest.approx(0.11) and trend["steps"] == 12
    assert json.loads((tmp_path / "summary.json").read_text())["reward_trend"] == trend
