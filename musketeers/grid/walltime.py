"""What a grid's runs cost in wall time: the ledger's measured totals, and each stage's whole
wall time projected from the runs done so far (a grid outlasts one invocation, so the report
says how long it still needs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from musketeers.config import TrainConfig
from musketeers.design.gridspec import Grid
from musketeers.grid.ledger import PHASES, ledger_path, run_seconds, totals
from musketeers.method import methods
from musketeers.reports.aggregate import Run, group_key
from musketeers.reports.verdicts import bullet


def measured_wall_time(runs_dir: Path, grid_name: str) -> list[str]:
    path = ledger_path(runs_dir, grid_name)
    t = totals(path)
    if not t:
        return []
    items = [", ".join(f"{p} {t[p] / 3600:.2f} h" for p in PHASES),
             f"{t['finished'] / 3600:.2f} h of it in calls that finished (the rest in calls "
             "that failed or were stopped)"]
    if t.get("discarded"):
        items.append(f"not counted: {t['discarded']:.0f} s ({t['discarded'] / 3600:.2f} h) on "
                     "runs later set aside as stale (their settings changed; kept under "
                     "`runs/stale/`) and run again, and on stores computed again on a later "
                     "machine")
    return [bullet(f"Measured wall time of this grid's commands: {t['total']:.0f} s "
                   f"({t['total'] / 3600:.2f} h), summed over every call in `{path.name}` "
                   "across interrupted and resumed invocations", items)]


def wall_time_by_stage(grid: Grid, runs: list[Run], runs_dir: Path) -> list[str]:
    """Per stage of the grid: its runs done, their measured hours, and the stage's whole
    wall time projected from them, so a grid that outlasts one invocation says how long it
    still needs. A run not done yet costs the mean of the done runs of its kind (family, steps,
    evaluations, whether it reads experts); with none of its kind in its family, another
    family's runs of its kind scaled by how this family's done runs compare with that
    family's (a family with long prompts costs more for every method, and a method that
    reads experts costs more in every family); with none of its kind anywhere, it is left out."""
    secs = run_seconds(ledger_path(runs_dir, grid.name))
    done = {r.name for r in runs if r.status == "done"} & set(secs)
    if not done:
        return []

    def kind(g) -> tuple[str, tuple]:
        reads = methods.get(str(g.fields.get("method", TrainConfig.method))).uses_experts
        return group_key(g.fields)["task"], (g.fields.get("steps"), g.eval_no_context, reads)

    by: dict[tuple, list[float]] = {}
    for g in grid.runs:
        if g.name in done:
            by.setdefault(kind(g), []).append(secs[g.name])
    means = {k: float(np.mean(v)) for k, v in by.items()}

    def estimate(g) -> tuple[float | None, bool]:
        task, how = kind(g)
        if (task, how) in means:
            return means[(task, how)], False
        others = sorted({t for t, h in means if h == how})
        if not others:
            return None, False
        other = others[0]
        shared = [h for t, h in means if t == task and (other, h) in means]
        scale = np.mean([means[(task, h)] / means[(other, h)] for h in shared]) if shared \
            else 1.0
        return means[(other, how)] * float(scale), True

    parts = []
    for stage in sorted({g.stage for g in grid.runs}):
        stage_runs = [g for g in grid.runs if g.stage == stage]
        measured = sum(secs[g.name] for g in stage_runs if g.name in done)
        n_done = sum(g.name in done for g in stage_runs)
        total, other, unknown = measured, 0, 0
        for g in stage_runs:
            if g.name in done:
                continue
            est, borrowed = estimate(g)
            other += borrowed
            unknown += est is None
            total += est or 0.0
        text = f"stage {stage}: {n_done} of {len(stage_runs)} runs done in {measured / 3600:.2f} h"
        if n_done < len(stage_runs):
            text += f", {total / 3600:.2f} h projected for all"
            notes = ([f"{other} from another family's runs of their kind"] if other else []) + (
                [f"{unknown} with no done run of their kind, not counted"] if unknown else [])
            text += f" ({'; '.join(notes)})" if notes else ""
        parts.append(text)
    return [bullet("Wall time by stage, from each done run's finished training and evaluation "
                   "calls in the ledger, on the machines that ran them", [
                       *parts,
                       "a run not done yet is projected at the mean of the done runs of its "
                       "kind (family, steps, evaluations, whether it reads experts); a kind "
                       "not done in its family, from another family's, scaled by the kinds "
                       "both have done"])]


def wall_time_lines(grid: Grid, runs_dir: Path) -> Callable[[list[Run]], list[str]]:
    """The report's wall-time lines for ``grid`` run under ``runs_dir``: what its ledger
    measured, then each stage's hours (``write_report``'s ``wall_time``)."""

    def lines(runs: list[Run]) -> list[str]:
        return [*measured_wall_time(runs_dir, grid.name),
                *wall_time_by_stage(grid, runs, runs_dir)]

    return lines
