"""Whether each trained policy reads C at all: every item's gold NLL with C and without it.

A greedy answer flips only once C moves the gold past every other answer; the gold's
teacher-forced NLL (``evaluate.gold_nll_per_item``, kept per item in both evaluations'
completions) moves long before. So a null on exact can mean "C is not read" or "C is read,
not yet enough". Per cell evaluated both ways: the mean NLL with and without C on the items
graded in every seed, and their difference, paired by item. Its interval over items speaks of
these trained checkpoints; over seeds (``stats.paired_seed_test``, the items' noise added) of
the method. Runs evaluated before the NLL was kept have no row.

Only a negative difference is a finding: C makes the gold likelier, so it is read. A positive
one is no verdict: a policy that trusts C is confidently wrong where C misleads it, a mean NLL
weighs those mistakes heavily, and a policy trained beside C meets an unfamiliar prompt without
it. The shuffled-experts row is the control. A policy that answers outside the tags (the
planted check's one-token policy) makes the number meaningless.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats as sps

from musketeers.reports.aggregate import Run
from musketeers.reports.stats import crossed_items, mde, paired_seed_test, residual_floor
from musketeers.reports.tables import tasks_of
from musketeers.reports.trained_headroom import labelled_cells
from musketeers.tasks.variants import task_title


def _nll(rows: list[dict] | None) -> dict[str, float]:
    """{item id: gold NLL} of an evaluation's completions ({} where it kept none)."""
    return {str(r["id"]): float(r["gold_nll"]) for r in rows or []
            if r.get("gold_nll") is not None}


def nll_matrices(runs: list[Run]) -> tuple[np.ndarray, np.ndarray] | None:
    """(with C, without C), each [seeds, items] over the items every run graded both ways;
    None under 2 such items."""
    pairs = [(a, b) for r in runs
             if (a := _nll(r.samples)) and (b := _nll(r.samples_no_context))]
    if not pairs:
        return None
    shared = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs)))
    if len(shared) < 2:
        return None
    return (np.array([[a[i] for i in shared] for a, _ in pairs]),
            np.array([[b[i] for i in shared] for _, b in pairs]))


def items_interval(d: np.ndarray) -> tuple[float, float, float]:
    """(low, high, MDE) of the seed-averaged per-item difference's mean: a t over items,
    n − 1 df (conditional on these seeds' checkpoints)."""
    per_item = d.mean(axis=0)
    n = len(per_item)
    se = float(per_item.std(ddof=1)) / math.sqrt(n)
    half = float(sps.t.ppf(0.975, n - 1)) * se
    mean = float(per_item.mean())
    return mean - half, mean + half, mde(se, n - 1)


def _row(label: str, with_c: np.ndarray, without: np.ndarray) -> str:
    d = with_c - without
    low, high, least = items_interval(d)
    var, df = crossed_items(d)
    test = paired_seed_test(d.mean(axis=1).tolist(), item_se=math.sqrt(var),
                            items=d.shape[1], item_df=df, floor=residual_floor(d))
    seeds = ("one seed" if not test.testable else
             f"{test.low:+.2f} to {test.high:+.2f} (df {test.df:.1f}, p {test.p:.3f})")
    return (f"| {label} | {d.shape[0]} | {d.shape[1]} | {with_c.mean():.2f} | "
            f"{without.mean():.2f} | {d.mean():+.2f} | {low:+.2f} to {high:+.2f} "
            f"(MDE {least:.2f}) | {seeds} |")


def c_read_markdown(runs: list[Run]) -> list[str]:
    """The report's section: one table per task, a row per cell evaluated with and without C
    whose completions kept the gold NLL; none where no run did."""
    out: list[str] = []
    for task in tasks_of(runs):
        lines = [_row(label, *m) for label, cell in labelled_cells(runs, task).items()
                 if (m := nll_matrices(cell))]
        if lines:
            out += [f"**{task_title(task)}**: each item's gold completion, teacher-forced, NLL "
                    "in nats (summed over its tokens), with C and without it on the same "
                    "checkpoint and items. A negative difference says C is read (it makes the gold "
                    "likelier); a positive one is no verdict (a policy confidently wrong with C "
                    "loses more than it gains), and the shuffled-experts row is the control.",
                    "", "| Method | Seeds | Items | NLL with C | without C | with − without | "
                    "95 % over items | 95 % over seeds |",
                    "|---|---:|---:|---:|---:|---:|---|---|", *lines, ""]
    return ["## Is C read? The gold's likelihood with and without C", "", *out] if out else []
