"""A run's log: metrics.jsonl rows, optional TensorBoard mirror, and the end-of-run summary
(reward and routing trends, Spearman ρ between the reward and entropy series, paper §4.3)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from musketeers.method.routing import spearman
from musketeers.run.learning import reward_trend
from musketeers.run.step_metrics import mean_or_none


def eval_files(context: bool = True) -> tuple[str, str]:
    """A run's greedy evaluation outputs, with C or without it (Figure 5): the result json
    and its graded completions, one jsonl row per validation item."""
    name = "eval" if context else "eval_no_context"
    return f"{name}.json", f"{name}_samples.jsonl"


def by_source(samples: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """{source dataset: {items, exact, score}} of graded samples, sources in sorted order: a
    mix's total hides which of its datasets a method gained on (eval.json's ``by_source``)."""
    groups: dict[str, list[float]] = {}
    for s in samples:
        groups.setdefault(str(s["source"]), []).append(s["score"])
    return {src: {"items": len(v), "exact": sum(x >= 1.0 for x in v) / len(v),
                  "score": sum(v) / len(v)} for src, v in sorted(groups.items())}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows; a line that is no row (torn by a kill mid-write, an edit, stray
    bytes) is ignored: the rows around it are still the run's."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and type(row.get("step")) is int:
                rows.append(row)
    return rows


def read_samples(path: Path) -> list[dict[str, Any]] | None:
    """An evaluation's kept completions (``eval_files``' second), one row each; None when the
    file is absent or does not parse."""
    try:
        rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return rows if all(isinstance(r, dict) for r in rows) else None


def truncate_metrics(path: Path, steps_done: int) -> None:
    """Drop rows after the checkpoint a resume starts from (a killed run may have logged them)."""
    rows = [r for r in read_metrics(path) if r["step"] <= steps_done]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def tensorboard(run: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(str(run / "tb"))


def log_tb(writer, row: dict[str, Any]) -> None:
    for key, value in row.items():
        if isinstance(value, int | float) and key != "step":
            writer.add_scalar(key, value, row["step"])
    for name, u in row.get("utilisation", {}).items():
        writer.add_scalar(f"utilisation/{name}", u, row["step"])


def summarize(run: Path, total_steps: int | None = None) -> dict[str, Any]:
    """summary.json: final figures and Spearman ρ between the reward and entropy series;
    ``status`` is ``done`` once ``total_steps`` steps are logged, else ``partial``."""
    rows = read_metrics(run / "metrics.jsonl")
    tail = rows[-max(1, len(rows) // 10):]
    steps = rows[-1]["step"] if rows else 0
    summary: dict[str, Any] = {
        "status": "done" if total_steps is not None and steps >= total_steps else "partial",
        "steps": steps,
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last10pct": mean_or_none([r["reward_mean"] for r in tail]),
        "exact_last10pct": mean_or_none([r["exact"] for r in tail]),
        "zero_var_frac": mean_or_none([r["zero_var_frac"] for r in rows]),
        "updates_skipped": sum(bool(r.get("update_skipped")) for r in rows),
    }
    # the routing figures (Eq. 15) are read off the rows here; the trend and ρ below test them
    routing: dict[str, Any] = {}
    if rows and "entropy" in rows[0]:
        routing = {
            "rewards": [r["reward_mean"] for r in rows],
            "entropy": [r["entropy"] for r in rows],
            "entropy_first": rows[0]["entropy"],
            "entropy_last10pct": mean_or_none([r["entropy"] for r in tail]),
            "utilisation_first": rows[0]["utilisation"],
            "utilisation_last10pct": {k: mean_or_none([r["utilisation"][k] for r in tail])
                                      for k in rows[0]["utilisation"]}}
    if (trend := reward_trend(rows)) is not None:
        summary["reward_trend"] = trend.as_dict()
    if routing:
        summary["spearman_reward_entropy"] = spearman(routing.pop("rewards"),
                                                      routing.pop("entropy"))
        summary.update(routing)
    if "spearman_reward_entropy" in summary and math.isnan(summary["spearman_reward_entropy"]):
        summary["spearman_reward_entropy"] = None  # undefined (a constant series): not NaN
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
