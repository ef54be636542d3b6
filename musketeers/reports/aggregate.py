"""Read finished runs and reduce them over seeds.

Reads only ``runs/*/{config.yaml, metrics.jsonl, summary.json, eval*.json, error.txt}``, so
runs made on any machine can be reported together. Two validation metrics (``METRICS``):
``exact``, the share of greedy completions scoring 1, and ``score``, the mean task score
(Reasoning Gym gives partial credit). Over seeds we report the mean and the
*sample* standard deviation (ddof = 1), as the paper's "mean ± std across 3 runs"; with a
single seed the std is undefined and shown as such.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from musketeers.method import methods
from musketeers.method.routing import spearman
from musketeers.reports.keys import group_key, select
from musketeers.run.runfolder import is_finished
from musketeers.run.runlog import by_source, eval_files, read_metrics, read_samples
from musketeers.run.step_metrics import mean_or_none

METRICS = ("exact", "score")


def eval_percent(ev: dict[str, Any] | None, metric: str) -> float | None:
    """``metric`` of an eval.json in percent. An eval.json from before exact was counted holds
    only ``accuracy``, which was the mean score: it reads as ``score``, and its exact is
    unknown (None), never guessed."""
    if ev is None:
        return None
    value = ev.get(metric, ev.get("accuracy") if metric == "score" else None)
    return None if value is None else 100.0 * float(value)


def _tail(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last 10 % of a run's steps (at least one): runlog.summarize's ``*_last10pct``."""
    return rows[-max(1, len(rows) // 10):]


@dataclass
class Run:
    """One run folder as found on disk."""

    name: str
    path: Path
    config: dict[str, Any]
    status: str  # done | failed | incomplete
    error: str | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    eval_no_context: dict[str, Any] | None = None
    inputs: dict[str, Any] | None = None  # inputs.json: rows, constant_experts

    @property
    def key(self) -> dict[str, Any]:
        return group_key(self.config)

    @property
    def spec(self) -> methods.Method | None:
        """The run's method in the registry (None: a name it does not know)."""
        return methods.REGISTRY.get(str(self.config.get("method")))

    @property
    def seed(self) -> int:
        return int(self.config.get("seed") or 0)

    @property
    def dtype(self) -> str | None:
        """The dtype the policy trained in, as resolved where the run ran (inputs.json), else
        the one its config names; None when neither says (``auto``, not recorded)."""
        resolved = (self.inputs or {}).get("dtype")
        asked = self.config.get("dtype")
        return resolved or (None if asked in (None, "auto") else str(asked))

    def trained_alike(self, other: Run) -> bool:
        """Whether the two runs trained in one dtype (a run that recorded none counts as
        alike: older runs ran one dtype per grid). bf16 and fp32 policies differ by more than a
        method does at pocket scale, so runs that do not are never compared."""
        return None in (self.dtype, other.dtype) or self.dtype == other.dtype

    def value(self, metric: str, no_context: bool = False) -> float | None:
        """A validation metric (``METRICS``) in percent, of eval.json or eval_no_context.json."""
        return eval_percent(self.eval_no_context if no_context else self.eval, metric)

    @property
    def exact(self) -> float | None:
        """Share (%) of greedy validation completions scoring 1; None if not counted."""
        return self.value("exact")

    @property
    def score(self) -> float | None:
        """Mean validation score (%), partial credit included."""
        return self.value("score")

    def eval_share(self, key: str) -> float | None:
        """A share of eval.json in percent: ``answered`` (greedy validation completions with an
        ``<answer>`` to grade) or ``truncated`` (cut off at max_new_tokens); None when the
        eval.json was written before evaluation counted it."""
        share = None if self.eval is None else self.eval.get(key)
        if share is None and key == "tagged":
            share = self._tagged_from_samples()
        return None if share is None else 100.0 * float(share)

    @cached_property
    def samples(self) -> list[dict[str, Any]] | None:
        """The kept greedy validation completions with C (``eval_samples.jsonl``), read once
        for every table that counts from them; None when the run kept none or they do not
        parse."""
        return read_samples(self.path / eval_files(True)[1])

    @cached_property
    def samples_no_context(self) -> list[dict[str, Any]] | None:
        """The same without C (``eval_no_context_samples.jsonl``), as ``samples``."""
        return read_samples(self.path / eval_files(False)[1])

    def _tagged_from_samples(self) -> float | None:
        """The share of greedy completions with an ``<answer>…</answer>`` pair, read from the
        kept completions (evaluations before ``tagged`` was counted)."""
        from musketeers.tasks.scoring import extract_answer

        rows = self.samples
        try:
            return sum(extract_answer(r.get("completion"), "strict") is not None
                       for r in rows) / len(rows) if rows else None
        except (AttributeError, TypeError):
            return None

    def by_source(self) -> dict[str, dict[str, float | int]] | None:
        """Validation exact and score per source dataset: eval.json's ``by_source``, or counted
        from the kept completions (evaluations before it was written); None: neither."""
        if self.eval is None:
            return None
        if "by_source" in self.eval:
            return self.eval["by_source"]
        rows = self.samples
        try:
            return by_source(rows) if rows else None
        except (KeyError, TypeError):
            return None

    @property
    def wall_time(self) -> float:
        """Training seconds: the sum of the per-step times."""
        return float(sum(m.get("time_s") or 0.0 for m in self.metrics))

    def metric_mean(self, key: str) -> float | None:
        """Mean of a metrics.jsonl column over the run's steps (None: no step logged it)."""
        return mean_or_none([m[key] for m in self.metrics if m.get(key) is not None])

    @property
    def no_signal(self) -> float | None:
        """Fraction of the run's sampled groups whose G rewards were all equal (GRPO's advantage
        is then 0: no gradient but the KL's), averaged over steps."""
        return self.metric_mean("zero_var_frac")

    @property
    def train_reward(self) -> float | None:
        """Mean sampled reward over the run's training steps."""
        return self.metric_mean("reward_mean")

    @property
    def updates_skipped(self) -> int | None:
        """Updates the trainer skipped for want of signal; None where no step logged it."""
        flags = [m["update_skipped"] for m in self.metrics if m.get("update_skipped") is not None]
        return sum(map(bool, flags)) if flags else None

    def _routing(self, key: str) -> tuple[Any, Any]:
        """(first step's, last 10 %'s) value of a routing log: summary.json's, else computed
        from metrics.jsonl by the same rule (a run summarised before they were kept)."""
        s = self.summary or {}
        if s.get(f"{key}_first") is not None and s.get(f"{key}_last10pct") is not None:
            return s[f"{key}_first"], s[f"{key}_last10pct"]
        rows = [m for m in self.metrics if m.get(key) is not None]
        if not rows:
            return None, None
        tail = _tail(rows)
        if key == "entropy":
            return rows[0][key], mean_or_none([r[key] for r in tail])
        return rows[0][key], {k: mean_or_none([r[key].get(k) for r in tail]) for k in rows[0][key]}

    @property
    def entropy_drop(self) -> float | None:
        """H at the first step − mean H over the last 10 % of steps (> 0: routing sharpened)."""
        first, last = self._routing("entropy")
        return None if first is None or last is None else float(first) - float(last)

    @property
    def concentration(self) -> float | None:
        """max_i u_i over the last 10 % of steps − max_i u_i at the first step (> 0: the
        attention concentrated on some expert)."""
        first, last = self._routing("utilisation")
        if not first or not last:
            return None
        return max(v for v in last.values() if v is not None) - max(first.values())

    @property
    def spearman(self) -> float | None:
        """ρ(reward, entropy) of this run: the summary's, else computed from its metrics."""
        rho = (self.summary or {}).get("spearman_reward_entropy")
        if rho is None:
            rho = spearman_reward_entropy(self.metrics)
        return None if rho is None or math.isnan(rho) else float(rho)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def load_run(path: Path) -> Run | None:
    """A run folder, or None if it has no config (not a run)."""
    cfg_path = path / "config.yaml"
    if not cfg_path.is_file():
        return None
    config = yaml.safe_load(cfg_path.read_text()) or {}
    summary = _read_json(path / "summary.json")
    ev = _read_json(path / eval_files(True)[0])
    error_path = path / "error.txt"
    error = error_path.read_text().splitlines()[0] if error_path.is_file() else None
    if is_finished(path) and ev is not None:
        status = "done"
    elif error:
        status = "failed"
    else:
        status = "incomplete"
    return Run(
        name=path.name, path=path, config=config, status=status, error=error,
        metrics=read_metrics(path / "metrics.jsonl"), summary=summary, eval=ev,
        eval_no_context=_read_json(path / eval_files(False)[0]),
        inputs=_read_json(path / "inputs.json"),
    )


def load_runs(runs_dir: Path, budget: str | None = None,
              names: Iterable[str] | None = None) -> list[Run]:
    """Every run under ``runs_dir`` (optionally only one budget's, or only the named ones)."""
    wanted = set(names) if names is not None else None
    runs = []
    for path in sorted(Path(runs_dir).glob("*/")):
        if wanted is not None and path.name not in wanted:
            continue
        run = load_run(path)
        if run is None or (budget is not None and run.config.get("budget") != budget):
            continue
        runs.append(run)
    return runs


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample std (ddof = 1) over seeds; std is None for a single value."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan, None
    return float(arr.mean()), (float(arr.std(ddof=1)) if arr.size > 1 else None)


def bernoulli_se(p: float, n: int) -> float:
    """sqrt(p(1 − p) / n): the largest standard error of a mean of n scores in [0, 1] with
    mean p (a score in [0, 1] has variance at most p(1 − p), equal for 0/1 scores)."""
    p = min(max(p, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / n)


@dataclass
class Cell:
    """One table cell: a validation metric (``METRICS``) over the seeds of one configuration."""

    runs: list[Run]
    metric: str = "exact"

    @property
    def graded(self) -> list[Run]:
        """The seeds that finished and were evaluated."""
        return [r for r in self.runs if r.status == "done" and r.value(self.metric) is not None]

    @property
    def values(self) -> list[float]:
        return [r.value(self.metric) for r in self.graded]

    @property
    def seeds(self) -> set[int]:
        return {r.seed for r in self.graded}

    def on(self, seeds: set[int]) -> Cell:
        """The same cell restricted to ``seeds`` (to compare two cells seed for seed)."""
        return Cell([r for r in self.runs if r.seed in seeds], self.metric)

    @property
    def unknown(self) -> bool:
        """Evaluated, but no eval.json counted this metric (exact before it was logged)."""
        return any(r.status == "done" and r.eval is not None for r in self.runs)

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if r.status == "failed"]

    @property
    def mean(self) -> float:
        return mean_std(self.values)[0]

    @property
    def std(self) -> float | None:
        return mean_std(self.values)[1]

    @property
    def items(self) -> int:
        """Validation items graded, summed over the seeds that finished."""
        return sum(int((r.eval or {}).get("n") or 0) for r in self.graded)

    @property
    def item_se(self) -> float | None:
        """Standard error (points) of the mean from the finite validation set alone.

        A score lies in [0, 1], so with mean p its variance is at most p(1 − p) (exactly that
        for 0/1 scores): over N graded items, SE ≤ 100·sqrt(p(1 − p) / N). Seeds add their own
        variance on top, so this is the least a difference between two cells must clear. None
        when no run says how many items it graded.
        """
        if not self.values or not self.items:
            return None
        return 100.0 * bernoulli_se(self.mean / 100.0, self.items)

    @property
    def constant_experts(self) -> list[str]:
        """Experts whose vector was the same for every item in some run of the cell."""
        return sorted({e for r in self.runs for e in (r.inputs or {}).get("constant_experts", [])})

    @property
    def variants(self) -> list[str]:
        """The task names its runs trained on that are not the paper's own (variants)."""
        names = {str(r.config.get("task")) for r in self.runs}
        return sorted(n for n in names if ":" in n or "@" in n)

    def text(self) -> str:
        """``75.26 ± 5.62``; ``FAILED`` if no seed finished but one failed; ``unknown`` if the
        runs' eval.json did not count the metric; ``—`` if none ran."""
        if not self.values:
            return "FAILED" if self.failed else "unknown" if self.unknown else "—"
        std = f" ± {self.std:.2f}" if self.std is not None else " (1 seed)"
        extra = f" ({len(self.failed)} FAILED)" if self.failed else ""
        return f"{self.mean:.2f}{std}{extra}"


def cell(runs: list[Run], metric: str = "exact", **key: Any) -> Cell:
    return Cell(select(runs, **key), metric)


def spearman_reward_entropy(metrics: list[dict[str, Any]],
                            entropy_from: list[dict[str, Any]] | None = None) -> float | None:
    """Spearman ρ between a run's reward and routing-entropy series (paper §4.3), by the
    trainer's own rule (``routing.spearman``); None where it is undefined. ``entropy_from``:
    another run's metrics to take the entropy from, step by step (§4.3's control: the same
    reward against a routing that reward did not shape)."""
    if entropy_from is None:
        hs = [m.get("entropy") for m in metrics]
    else:
        by_step = {m.get("step"): m.get("entropy") for m in entropy_from}
        hs = [by_step.get(m.get("step")) for m in metrics]
    pairs = [(m["reward_mean"], h) for m, h in zip(metrics, hs, strict=True)
             if h is not None and m.get("reward_mean") is not None]
    if not pairs:
        return None
    r, h = zip(*pairs, strict=True)
    rho = spearman(r, h)
    return None if math.isnan(rho) else rho
