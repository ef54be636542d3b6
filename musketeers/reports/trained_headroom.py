"""What an expert could still give after training: the items it answers right where the trained
policy is wrong.

A report is rebuilt from committed artefacts, never from a store, so the experts' own scores on
the validation items (each greedy hint under the task's scorer, ``precompute --hints``) are
published beside the runs as ``expert-scores-<grid>.json``: {task: {expert: {item id: score}}}.
Each run's graded completions say where its policy is right; the two together give the headroom
left after training, per method and expert. Headroom measured before training (``musketeers
tasks headroom``) chose the task; this says whether the policy closed it by itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from musketeers.reports.aggregate import Run
from musketeers.reports.headroom import headroom
from musketeers.reports.tables import DEFAULT_LATENTS, table1_cells, tasks_of
from musketeers.run.runlog import eval_files
from musketeers.tasks.variants import task_title

Scores = dict[str, dict[str, dict[str, float]]]  # task -> expert -> item id -> score


def scores_file(folder: Path, grid_name: str) -> Path:
    """Where a grid's experts' scores lie in its runs folder (local or published)."""
    return Path(folder) / f"expert-scores-{grid_name}.json"


def read_scores(folder: Path, grid_name: str) -> Scores:
    """The published scores, or {} when the grid has none (no expert with hints)."""
    path = scores_file(folder, grid_name)
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}


def run_headroom(run: Run, expert: dict[str, float]) -> tuple[int, float, float, float] | None:
    """(items, policy exact %, expert exact %, headroom %) over the run's graded validation
    items: headroom is the share where the expert's answer scores 1 and the policy's does
    not. None when the run kept no completions or an item has no expert score."""
    try:
        text = (run.path / eval_files(True)[1]).read_text("utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line]
    except (OSError, ValueError):
        return None
    if not rows or any(str(r.get("id")) not in expert for r in rows):
        return None
    policy = [float(r.get("score") or 0.0) >= 1.0 for r in rows]
    right = [expert[str(r["id"])] >= 1.0 for r in rows]
    return (len(rows), 100.0 * float(np.mean(policy)), 100.0 * float(np.mean(right)),
            100.0 * headroom(policy, right))


def _spread(values: list[float]) -> str:
    """Mean over seeds, with the seeds' range where they differ."""
    if min(values) == max(values):
        return f"{values[0]:.1f}"
    return f"{np.mean(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def headroom_markdown(runs: list[Run], scores: Scores,
                      latents: int = DEFAULT_LATENTS) -> list[str]:
    """The report's section: one table per task with published expert scores, for each Table 1
    row and expert the policy's exact, the expert's exact on the same items and the headroom,
    mean over seeds (each run read against the scores of the task variant it ran); no section
    where no expert score matches a graded run (a grid without hints)."""
    out: list[str] = []
    for task in tasks_of(runs):
        lines = []
        for row, cells in table1_cells(runs, latents, tasks=(task,)):
            graded = cells[task].graded
            names = dict.fromkeys(e for r in graded for e in scores.get(_variant(r), {}))
            for name in names:
                found = [h for r in graded
                         if (h := run_headroom(r, scores.get(_variant(r), {}).get(name, {})))]
                if found:
                    n, policy, right, room = (list(col) for col in zip(*found, strict=True))
                    lines.append(f"| {row.label} | {name} | {len(found)} | {int(np.mean(n))} | "
                                 f"{_spread(policy)} | {_spread(right)} | {_spread(room)} |")
        if lines:
            out += [f"**{task_title(task)}**: on each run's graded validation items, the share "
                    "(%) its policy answers right, the share the expert's own greedy answer "
                    "does, and the headroom: the expert right where the policy is wrong. Mean "
                    "over seeds (range).", "",
                    "| Method | Expert | Seeds | Items | Policy exact | Expert exact | "
                    "Headroom |", "|---|---|---:|---:|---:|---:|---:|", *lines, ""]
    return ["## Headroom left after training", "", *out] if out else []


def _variant(run: Run) -> str:
    """The task as the run's config names it (variant included): the scores' key."""
    return str(run.config.get("task"))
