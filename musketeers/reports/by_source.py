"""Exact per source dataset: a mix's total hides which of its datasets a method gained on.

One table per task that ran a mix: Table 1's rows that ran it, a column per source dataset,
each cell the mean exact (%) over seeds (with how many seeds). A method gaining only on the
dataset a shortcut answers shows up here, not in the total."""

from __future__ import annotations

import numpy as np

from musketeers.reports.aggregate import Cell, Run
from musketeers.reports.tables import DEFAULT_LATENTS, table1_cells, tasks_of
from musketeers.tasks.variants import task_title


def _mean_by_source(c: Cell) -> dict[str, tuple[float, int]]:
    """{source: (mean exact % over the seeds that report it, seeds)} of one cell."""
    per: dict[str, list[float]] = {}
    for r in c.graded:
        for src, part in (r.by_source() or {}).items():
            per.setdefault(src, []).append(100.0 * float(part["exact"]))
    return {src: (float(np.mean(v)), len(v)) for src, v in per.items()}


def by_source_markdown(runs: list[Run], latents: int = DEFAULT_LATENTS) -> list[str]:
    """The per-source tables, one per task whose runs hold more than one source dataset."""
    out: list[str] = []
    table = table1_cells(runs, latents)
    for task in tasks_of(runs):
        rows = [(row.label, _mean_by_source(cells[task])) for row, cells in table
                if cells[task].graded]
        sources = sorted({src for _, means in rows for src in means})
        if len(sources) < 2:
            continue
        out += [f"**{task_title(task)}**, exact (%) per source dataset, mean over seeds "
                "(n = seeds; items per dataset in eval.json's by_source):", "",
                "| Method | " + " | ".join(sources) + " |",
                "|---|" + "---:|" * len(sources)]
        for label, means in rows:
            cells = [f"{means[s][0]:.1f} (n={means[s][1]})" if s in means else "—"
                     for s in sources]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return out or ["No task ran a mix of source datasets with graded runs."]
