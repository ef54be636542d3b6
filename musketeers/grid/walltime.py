"""What a grid's runs cost in wall time: the ledger's measured totals, each stage's whole
wall time projected from the runs done so far (a grid outlasts one invocation, so the report
says how long it still needs), and the main comparison's, family by family, against a night."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from musketeers.config import TrainConfig
from musketeers.design.gridspec import Grid
from musketeers.grid.ledger import PHASES, ledger_path, precompute_calls, run_seconds, totals
from musketeers.method import methods
from musketeers.reports.aggregate import Run
from musketeers.reports.keys import group_key
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


# A night of grid work: the pocket grid's main comparison is sized to run one family a night.
NIGHT_HOURS = 10.0


def _projection(grid: Grid, runs: list[Run], secs: dict[str, float]):
    """What each grid run costs: its measured seconds when done, else the median of the done
    runs of its kind (family, steps, evaluations, whether it reads experts; a median, since a
    run that shared its CPU costs twice the others); with none of its kind in its family,
    another family's runs of its kind scaled by how this family's done runs compare with that
    family's (a family with long prompts costs more for every method, and a method that reads
    experts costs more in every family); with none of its kind anywhere, None. Returns
    ``cost(run) -> (seconds or None, done, borrowed)``, or None when no run is done."""
    done = {r.name for r in runs if r.status == "done"} & set(secs)
    if not done:
        return None

    def kind(g) -> tuple[str, tuple]:
        reads = methods.get(str(g.fields.get("method", TrainConfig.method))).uses_experts
        return group_key(g.fields)["task"], (g.fields.get("steps"), g.eval_no_context, reads)

    by: dict[tuple, list[float]] = {}
    for g in grid.runs:
        if g.name in done:
            by.setdefault(kind(g), []).append(secs[g.name])
    typical = {k: float(np.median(v)) for k, v in by.items()}

    def cost(g) -> tuple[float | None, bool, bool]:
        if g.name in done:
            return secs[g.name], True, False
        task, how = kind(g)
        if (task, how) in typical:
            return typical[(task, how)], False, False
        others = sorted({t for t, h in typical if h == how})
        if not others:
            return None, False, False
        other = others[0]
        shared = [h for t, h in typical if t == task and (other, h) in typical]
        scale = np.mean([typical[(task, h)] / typical[(other, h)] for h in shared]) \
            if shared else 1.0
        return typical[(other, how)] * float(scale), False, True

    return cost


def _hours(grid_runs, cost) -> tuple[int, float, float, int, int]:
    """(runs done, their measured seconds, measured + projected seconds, runs borrowed from
    another family, runs with no estimate)."""
    n_done, measured, total, borrowed, unknown = 0, 0.0, 0.0, 0, 0
    for g in grid_runs:
        est, done, other = cost(g)
        n_done += done
        measured += est if done else 0.0
        total += est or 0.0
        borrowed += other
        unknown += est is None
    return n_done, measured, total, borrowed, unknown


def _aside(notes: list[str]) -> str:
    """The non-empty ``notes`` as one parenthesis after a figure, or nothing."""
    notes = [n for n in notes if n]
    return f" ({'; '.join(notes)})" if notes else ""


def _notes(borrowed: int, unknown: int) -> str:
    return _aside([f"{borrowed} from another family's runs of their kind" if borrowed else "",
                   f"{unknown} with no done run of their kind, not counted" if unknown else ""])


def wall_time_by_stage(grid: Grid, runs: list[Run], runs_dir: Path) -> list[str]:
    """Per stage of the grid: its runs done, their measured hours, and the stage's whole
    wall time projected from them (``_projection``), so a grid that outlasts one invocation
    says how long it still needs."""
    cost = _projection(grid, runs, run_seconds(ledger_path(runs_dir, grid.name)))
    if cost is None:
        return []
    parts = []
    for stage in sorted({g.stage for g in grid.runs}):
        stage_runs = [g for g in grid.runs if g.stage == stage]
        n_done, measured, total, borrowed, unknown = _hours(stage_runs, cost)
        text = f"stage {stage}: {n_done} of {len(stage_runs)} runs done in {measured / 3600:.2f} h"
        if n_done < len(stage_runs):
            text += f", {total / 3600:.2f} h projected for all" + _notes(borrowed, unknown)
        parts.append(text)
    return [bullet("Wall time by stage, from each done run's finished training and evaluation "
                   "calls in the ledger, on the machines that ran them", [
                       *parts,
                       "a run not done yet is projected at the median of the done runs of "
                       "its kind (family, steps, evaluations, whether it reads experts); a "
                       "kind not done in its family, from another family's, scaled by the "
                       "kinds both have done"])]


def _stores(grid: Grid, path: Path) -> dict[str, tuple[float, int, int]]:
    """Per task: (seconds, borrowed, missing) of precomputing every expert its store needs:
    this ledger's calls for it, then, for experts whose store was filled before this ledger
    began, another family's call for a subset of those experts (unscaled); ``missing``
    counts the experts left with neither."""
    from musketeers.grid.needs import grid_needs

    calls = precompute_calls(path)
    out = {}
    for need in grid_needs(grid):
        own = [(set(ex), s) for t, ex, s in calls if t == need.task]
        missing = set(need.experts) - set().union(*(ex for ex, _ in own))
        seconds, borrowed = sum(s for _, s in own), 0
        for t, ex, s in calls:
            if t != need.task and ex and set(ex) <= missing:
                seconds, borrowed, missing = seconds + s, borrowed + 1, missing - set(ex)
        out[need.task] = (seconds, borrowed, len(missing))
    return out


def main_comparison_by_family(grid: Grid, runs: list[Run], runs_dir: Path) -> list[str]:
    """The main comparison's cost, one family at a time: every run on the grid's own seeds
    (a part's extra seeds add power beyond it), measured or projected as by stage, plus the
    family's stores' measured precompute, against a night of ``NIGHT_HOURS``."""
    path = ledger_path(runs_dir, grid.name)
    main = [g for g in grid.runs if g.fields.get("seed", 0) in set(grid.seeds)]
    cost = _projection(grid, runs, run_seconds(path))
    if not main or cost is None:
        return []
    stores = _stores(grid, path)
    parts = []
    for task in dict.fromkeys(str(g.fields.get("task")) for g in main):
        family = [g for g in main if g.fields.get("task") == task]
        n_done, _, total, borrowed, unknown = _hours(family, cost)
        store_s, store_borrowed, store_missing = stores.get(task, (0.0, 0, 0))
        night = (total + store_s) / 3600
        fits = night <= NIGHT_HOURS and not (unknown or store_missing)
        store_note = _aside(
            [f"{store_borrowed} of them at another family's measured call" if store_borrowed
             else "",
             f"{store_missing} experts never measured, not counted" if store_missing else ""])
        parts.append(
            f"{group_key(family[0].fields)['task']}: {len(family)} runs ({n_done} done), "
            f"{total / 3600:.2f} h{' projected' if n_done < len(family) else ''}"
            f"{_notes(borrowed, unknown)} + its stores {store_s / 3600:.2f} h"
            f"{store_note} = {night:.2f} h: "
            f"{'fits' if fits else 'does not fit'} a {NIGHT_HOURS:g}-hour night")
    seeds = ", ".join(map(str, grid.seeds))
    return [bullet(f"Main comparison (every cell on the grid's seeds {seeds}), one family a "
                   "night (`--tasks`), from the same measurements", parts)]


def wall_time_lines(grid: Grid, runs_dir: Path) -> Callable[[list[Run]], list[str]]:
    """The report's wall-time lines for ``grid`` run under ``runs_dir``: what its ledger
    measured, then each stage's hours (``write_report``'s ``wall_time``)."""

    def lines(runs: list[Run]) -> list[str]:
        return [*measured_wall_time(runs_dir, grid.name),
                *wall_time_by_stage(grid, runs, runs_dir),
                *main_comparison_by_family(grid, runs, runs_dir)]

    return lines
