"""Publish the experts' own scores on a grid's validation items beside its runs.

The store is machine-local; the report is rebuilt from committed artefacts. So once the stores
are ready, each expert's per-item hint score (its greedy answer under the task's scorer) is
written to the runs folder and its pack (``reports.trained_headroom.scores_file``), where the
report reads the headroom left after training.
"""

from __future__ import annotations

import json
from pathlib import Path

from musketeers.cache.errors import UserError
from musketeers.cache.reader import read_hint_scores, read_items
from musketeers.design.gridspec import Grid
from musketeers.grid.needs import grid_needs
from musketeers.grid.pack import editing, opened
from musketeers.reports.trained_headroom import Scores, scores_file


def expert_scores(grid: Grid) -> Scores:
    """{task: {expert: {item id: score}}} on the validation split, for every expert of the
    grid whose hints are stored (an expert without them has no headroom to report)."""
    out: Scores = {}
    for need in grid_needs(grid):
        if not need.hint_experts:
            continue
        ids = [item.id for item in read_items(need.cache_dir, need.task, "val")]
        for name in need.hint_experts:
            try:
                (scores,) = read_hint_scores(need.cache_dir, need.task, "val", [name])
            except UserError:
                continue
            out.setdefault(need.task, {})[name] = {
                i: float(s) for i, s in zip(ids, scores, strict=True)}
    return out


def publish_expert_scores(grid: Grid, runs_dir: Path, published: Path) -> Path | None:
    """Merge the grid's expert scores into ``runs_dir`` and the pack of ``published``; returns
    the local file, or None when no expert of the grid has hints. Merged, never replaced: a
    shard's worker (or a machine whose stores lack an expert) knows only some of the experts,
    and what another worker published stays."""
    scores = expert_scores(grid)
    if not scores:
        return None
    with opened(published) as folder:
        before = _read(scores_file(folder, grid.name))
    text = _dumps(_merge(before, scores))
    if _dumps(before) != text:
        with editing(published) as folder:  # re-read under the pack's lock: a worker may
            path = scores_file(folder, grid.name)  # have published since
            text = _dumps(_merge(_read(path), scores))
            path.write_text(text)
    local = scores_file(runs_dir, grid.name)
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_text(text)
    return local


def _merge(old: Scores, new: Scores) -> Scores:
    """``old`` with every (task, expert) of ``new`` put in its place."""
    out = {task: dict(experts) for task, experts in old.items()}
    for task, experts in new.items():
        out.setdefault(task, {}).update(experts)
    return out


def _dumps(scores: Scores) -> str:
    return json.dumps(scores, sort_keys=True) + "\n"


def _read(path: Path) -> Scores:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
