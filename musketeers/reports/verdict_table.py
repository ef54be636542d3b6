"""The report's verdict table: every comparison declared once, as data, and tested alike.

A ``Comparison`` names the cell it tests and the control it is tested against, by group
keys (``keys.GROUP_FIELDS``), never by display labels. ``verdict_rows`` finds both cells
on every family where the tested cell ran, pairs them seed by seed, and tests the per-seed
differences with the paired t over seeds (``stats``); p-values are Holm-adjusted across the
whole table. Adding a claim means adding one entry to ``COMPARISONS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from musketeers.design.comparisons import COMPARISONS, Comparison
from musketeers.design.prereg import Preregistration
from musketeers.reports.aggregate import Cell, Run, cell
from musketeers.reports.paired import by_item
from musketeers.reports.stats import (
    ALPHA,
    MOST_SEEDS,
    PLANNED_MDE,
    SeedTest,
    crossed_items,
    holm,
    items_floor,
    paired_seed_test,
    residual_floor,
    seeds_for_mde,
    verdict,
)
from musketeers.run.runlog import eval_files
from musketeers.tasks.variants import task_title


@dataclass
class VerdictRow:
    comparison: Comparison
    task: str
    tested: float  # mean exact over the shared seeds, %
    control: float
    test: SeedTest
    p_adjusted: float | None = None
    refused: str | None = None  # why no seed could be compared (trained in other dtypes)
    left_out: str = ""  # seeds left out of the comparison, and why
    exploratory: str = ""  # why this row is outside the pre-registered family ("": inside)

    @property
    def verdict(self) -> str:
        if self.refused:
            return f"refused: {self.refused}"
        if self.exploratory:
            return (f"exploratory ({self.exploratory}): "
                    + verdict(self.test, self.test.p, family=False) + self.left_out)
        return verdict(self.test, self.p_adjusted) + self.left_out


def _cell(runs: list[Run], task: str, key: dict[str, Any], defaults: dict[str, Any],
          latents: int) -> Cell:
    return cell(runs, task=task, **{"latents": latents, **defaults, **key})


def pair_by_seed(tested: Cell, control: Cell) -> list[tuple[Run, Run]]:
    """(tested run, control run) per shared seed; a control of one run that does not train
    (the untrained policy, whose greedy evaluation has no seed) serves every seed."""
    ctl = {r.seed: r for r in control.graded}
    seedless = [r for r in control.graded if r.spec is not None and not r.spec.trains]
    only = seedless[0] if len(control.graded) == len(seedless) == 1 else None
    return [(r, other) for r in sorted(tested.graded, key=lambda r: r.seed)
            if (other := ctl.get(r.seed, only)) is not None]


def same_dtype(pairs: list[tuple[Run, Run]]) -> tuple[list[tuple[Run, Run]], set[str]]:
    """The pairs whose two runs trained in one dtype (``Run.trained_alike``), and the
    mismatches left out ("float32 vs bfloat16")."""
    kept, refused = [], set()
    for a, b in pairs:
        if a.trained_alike(b):
            kept.append((a, b))
        else:
            refused.add(f"{a.dtype} vs {b.dtype}")
    return kept, refused


def item_noise(pairs: list[tuple[Run, Run]], metric: str = "exact") -> dict[str, Any]:
    """The items' part of a seeds × items comparison (``stats.crossed_items``) and the
    residual's floor (``stats.residual_floor``), over the items graded in every pair, as
    ``paired_seed_test``'s keyword arguments (empty without evaluations to read)."""
    files = [(a.path / eval_files()[1], b.path / eval_files()[1]) for a, b in pairs]
    if not all(fa.is_file() and fb.is_file() for fa, fb in files):
        return {}
    per_pair = []
    for fa, fb in files:
        a, b = by_item(fa, metric), by_item(fb, metric)
        per_pair.append({i: a[i] - b[i] for i in set(a) & set(b)})
    shared = sorted(set.intersection(*(set(p) for p in per_pair)))
    if len(shared) < 2:
        return {}
    d = 100.0 * np.array([[p[i] for i in shared] for p in per_pair])
    var, df = crossed_items(d)
    return {"item_se": float(np.sqrt(var)), "items": len(shared), "item_df": df,
            "floor": residual_floor(d)}


def verdict_rows(runs: list[Run], tasks: list[str], latents: int = 8,
                 comparisons: tuple[Comparison, ...] = COMPARISONS,
                 prereg: Preregistration | None = None) -> list[VerdictRow]:
    """Every comparison on every task where both its cells have a shared seed. Holm-adjusted
    over the pre-registered family on its seeds (``prereg``); every other row is exploratory.
    Without a pre-registration, over the whole table."""
    rows = []
    for c in comparisons:
        for task in tasks:
            tested = _cell(runs, task, c.tested, c.defaults, latents)
            pairs, mismatched = same_dtype(
                pair_by_seed(tested, _cell(runs, task, c.control, c.defaults, latents)))
            if mismatched and not pairs:
                nan = SeedTest(math.nan, math.nan, math.nan, None, 0, None, 0)
                rows.append(VerdictRow(c, task, tested.mean, math.nan, nan, refused=(
                    f"trained in {', '.join(sorted(mismatched))}; a method and its control "
                    "must share one dtype")))
            if not pairs:
                continue
            left_out = (f"; seeds trained in {', '.join(sorted(mismatched))} left out"
                        if mismatched else "")
            if prereg is None:
                rows.append(_row(c, task, pairs, left_out, metric=tested.metric))
                continue
            why = ("" if prereg.registered(c.name) else "not in the confirmatory family")
            if not why and (missing := prereg.arm_missing(c.name)):
                why = f"arm {missing} not registered"
            registered = [(a, b) for a, b in pairs if a.seed in prereg.seeds]
            later = sorted({a.seed for a, _ in pairs} - set(prereg.seeds))
            if registered:
                rows.append(_row(c, task, registered, left_out, why, tested.metric))
            if later:
                added = f"seed{'s' if len(later) > 1 else ''} {', '.join(map(str, later))} " + (
                    "beyond the grid's main seeds" if prereg.implicit else "added after a look")
                rows.append(_row(c, task, pairs, left_out, f"{why}; {added}" if why else added,
                                 tested.metric))
    family = [r for r in rows if not r.exploratory and not r.refused]
    for row, p in zip(family, holm([r.test.p for r in family]), strict=True):
        row.p_adjusted = p
    return rows


def _row(c: Comparison, task: str, pairs: list[tuple[Run, Run]], left_out: str,
         exploratory: str = "", metric: str = "exact") -> VerdictRow:
    """One comparison's test over ``pairs`` (tested run, control run)."""
    a = [r.value(metric) for r, _ in pairs]
    b = [k.value(metric) for _, k in pairs]
    test = paired_seed_test([x - y for x, y in zip(a, b, strict=True)],
                            **item_noise(pairs, metric))
    return VerdictRow(c, task, float(np.mean(a)), float(np.mean(b)), test, left_out=left_out,
                      exploratory=exploratory)


def verdict_markdown(rows: list[VerdictRow], prereg: Preregistration | None = None
                     ) -> list[str]:
    """The table a reader sees first, then one short line per row saying what it tests."""
    if not rows:
        return ["No comparison has both of its cells on a shared seed yet."]
    out = ["| claim | task | ours | control | difference | 95 % interval | smallest "
           "detectable | verdict |", "|---|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        t = r.test
        interval = "—" if not t.testable else f"{t.low:+.1f} to {t.high:+.1f}"
        mde = "—" if t.mde is None else f"{t.mde:.1f}"
        name = r.comparison.name + (" (positive control)" if r.comparison.positive_control
                                    else "")
        control, diff = ("—", "—") if r.refused else (f"{r.control:.2f}", f"{t.diff:+.2f}")
        out.append(f"| {name} | {task_title(r.task)} | {r.tested:.2f} | {control} | {diff} | "
                   f"{interval} | {mde} | {r.verdict} |")
    out += ["", "Exact %, means over the seeds both cells ran; the difference is the mean of "
            "the per-seed differences, tested by a paired t over seeds with the items' variance "
            "component added (seeds × items crossed, the residual counted once; "
            "Welch–Satterthwaite degrees of freedom), 95 % interval, p "
            f"{family_text(prereg)}; smallest detectable: "
            "the true difference this test finds with 80 % power. A row on one seed is "
            "descriptive only.", ""]
    out += power_lines(rows)
    seen = set()
    for r in rows:
        if r.comparison.name not in seen:
            seen.add(r.comparison.name)
            out.append(f"- *{r.comparison.name}*: {r.comparison.why}.")
    return out


def family_text(prereg: Preregistration | None) -> str:
    """Over what the p-values are adjusted, for the table's footnote."""
    if prereg is None:
        return ("Holm-adjusted over this table (this grid fixed no confirmatory family in "
                "advance: read every p as exploratory)")
    if prereg.implicit:
        return (f"Holm-adjusted over this table on the grid's main seeds "
                f"({', '.join(map(str, prereg.seeds))}); the grid fixed no confirmatory family "
                "in advance, so read these p-values as exploratory too; a row with a part's "
                "seeds beyond them carries its own p, never a family-wise one")
    return (f"Holm-adjusted over the confirmatory family fixed before any run"
            f"{f' ({prereg.fixed})' if prereg.fixed else ''}: "
            f"{'; '.join(prereg.confirmatory)}, on seeds "
            f"{', '.join(map(str, prereg.seeds))}; a row marked exploratory (outside that "
            "family, or with seeds or arms added after a look) carries its own p, never a "
            "family-wise one")


def power_lines(rows: list[VerdictRow], target: float = PLANNED_MDE) -> list[str]:
    """For each row with no verdict yet that cannot detect ``target`` points: the seeds that
    would, projected from its own spreads (``stats.seeds_for_mde``). A significant row needs
    no more power."""
    out = []
    for r in rows:
        p = r.test.p if r.exploratory else r.p_adjusted
        if (r.refused or not r.test.testable or (r.test.mde or 0.0) <= target
                or (p is not None and p < ALPHA)):
            continue
        k = seeds_for_mde(r.test, target)
        floor = items_floor(r.test)
        if k is not None:
            need = f"{k} seeds"
        elif floor > target:
            need = (f"not within {MOST_SEEDS} seeds: the items' noise alone could detect no "
                    f"less than {floor:.1f} points; grade more items")
        else:
            need = (f"not within {MOST_SEEDS} seeds: its per-seed differences spread by "
                    f"{math.sqrt(r.test.seed_var):.1f} points (sd); steadier runs, not more "
                    "seeds or items")
        out.append(f"- {r.comparison.name}, {task_title(r.task)}: {need} "
                   f"(now {r.test.seeds}, smallest detectable {r.test.mde:.1f})")
    if not out:
        return []
    return [f"Seeds to detect {target:g} points (the effect a grid is sized for) where no "
            "verdict is in yet, projected from each comparison's measured spread over seeds "
            "and items:",
            "", *out, ""]
