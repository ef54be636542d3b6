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
import math
from pathlib import Path

import numpy as np

from musketeers.method.asked import share_label
from musketeers.reports.aggregate import Run
from musketeers.reports.headroom import headroom
from musketeers.reports.keys import SHARE
from musketeers.reports.tables import tasks_of
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


def run_headroom(run: Run, expert: dict[str, float]
                 ) -> tuple[int, float, float, float, float] | None:
    """(items, policy exact %, expert exact %, headroom %, policy exact % on the items the
    expert answers right) over the run's graded validation items: headroom is the share where
    the expert's answer scores 1 and the policy's does not. The last is where a method that
    reads the expert should gain over its controls, if what it reads is the expert's answer
    (NaN when the expert is right on none). None when the run kept no completions or an item
    has no expert score."""
    rows = run.samples
    if not rows or any(str(r.get("id")) not in expert for r in rows):
        return None
    policy = [float(r.get("score") or 0.0) >= 1.0 for r in rows]
    right = [expert[str(r["id"])] >= 1.0 for r in rows]
    taken = [p for p, e in zip(policy, right, strict=True) if e]
    return (len(rows), 100.0 * float(np.mean(policy)), 100.0 * float(np.mean(right)),
            100.0 * headroom(policy, right),
            100.0 * float(np.mean(taken)) if taken else math.nan)


def _spread(values: list[float]) -> str:
    """Mean over seeds, with the seeds' range where they differ ("—": no seed has one)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    if min(values) == max(values):
        return f"{values[0]:.1f}"
    return f"{np.mean(values):.1f} ({min(values):.1f}–{max(values):.1f})"


# the group fields a row's label names where the task's runs set them to more than one value
# (the method always)
LABEL_FIELDS = ("team", "channel", "pooling", "token_layer", "token_positions", "latents", SHARE)


def _label_part(field: str, value: object) -> str:
    if field == SHARE:
        return share_label(value)  # type: ignore[arg-type]
    if field == "token_positions":
        return "positions" if value else "no positions"
    return f"{field} {value}"


def labelled_cells(runs: list[Run], task: str) -> dict[str, list[Run]]:
    """The task's graded runs by cell (every group field but the seed: two warm-up shares
    never share a row), each labelled by its method and the fields that tell the task's cells
    apart: any channel, team, pooling, positions or share, not only Table 1's."""
    graded = [r for r in runs if r.key["task"] == task and r.exact is not None]
    varying = [f for f in LABEL_FIELDS
               if len({str(r.key[f]) for r in graded if r.key.get(f) is not None}) > 1]
    cells: dict[str, list[Run]] = {}
    for r in sorted(graded, key=lambda r: r.name):
        cells.setdefault(repr(sorted(r.key.items(), key=str)), []).append(r)
    out: dict[str, list[Run]] = {}
    for cell in cells.values():
        r = cell[0]
        parts = [_label_part(f, r.key[f]) for f in varying if r.key.get(f) is not None]
        label = ", ".join([r.spec.label if r.spec else str(r.key["method"]), *parts])
        out[label if label not in out else f"{label} ({cell[0].name})"] = cell
    return out


def headroom_markdown(runs: list[Run], scores: Scores) -> list[str]:
    """The report's section: one table per task with published expert scores, for each cell
    and expert the policy's exact, the expert's exact on the same items, the headroom and the
    policy's exact where the expert is right, mean over seeds (each run read against the
    scores of the task variant it ran); no section where no expert score matches a graded run
    (a grid without hints)."""
    out: list[str] = []
    for task in tasks_of(runs):
        lines = []
        for label, graded in labelled_cells(runs, task).items():
            names = dict.fromkeys(e for r in graded for e in scores.get(_variant(r), {}))
            for name in names:
                found = [h for r in graded
                         if (h := run_headroom(r, scores.get(_variant(r), {}).get(name, {})))]
                if found:
                    n, *shares = (list(col) for col in zip(*found, strict=True))
                    lines.append(f"| {label} | {name} | {len(found)} | {int(np.mean(n))} | "
                                 + " | ".join(_spread(v) for v in shares) + " |")
        if lines:
            out += [f"**{task_title(task)}**: on each run's graded validation items, the share "
                    "(%) its policy answers right, the share the expert's own greedy answer "
                    "does, the headroom (the expert right where the policy is wrong), and the "
                    "policy's exact on the items the expert answers right: a method that reads "
                    "the expert's answer gains there over its controls. Mean over seeds "
                    "(range); descriptive, not a test.", "",
                    "| Method | Expert | Seeds | Items | Policy exact | Expert exact | "
                    "Headroom | Policy exact where the expert is right |",
                    "|---|---|---:|---:|---:|---:|---:|---:|", *lines, ""]
    return ["## Headroom left after training", "", *out] if out else []


def _variant(run: Run) -> str:
    """The task as the run's config names it (variant included): the scores' key."""
    return str(run.config.get("task"))
