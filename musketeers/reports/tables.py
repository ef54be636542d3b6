"""Table 1 (methods × tasks) and Table 2 (pooling ablation) in the paper's layout.

Each of our cells sits beside the paper's number for the same cell (accuracy in %, mean ±
sample std over seeds). Rows the paper does not report show "n/r" in its column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from musketeers.reports.aggregate import Cell, Run, cell

TASKS = ("algorithmic", "arithmetic", "logic", "gsm8k")
TASK_TITLES = {"algorithmic": "Algorithmic", "arithmetic": "Arithmetic", "logic": "Logic",
               "gsm8k": "GSM8K"}
DEFAULT_LATENTS = 8  # the paper's m
DEFAULT_POOLING = "last"


@dataclass(frozen=True)
class Row:
    label: str
    key: dict[str, Any]  # group-key fields besides task, pooling and latents
    paper: dict[str, tuple[float, float]] | None  # task -> (mean, std); None: not in the paper


TABLE1: tuple[Row, ...] = (
    Row("Single", {"method": "single"}, {
        "algorithmic": (51.56, 0.55), "arithmetic": (52.34, 1.78),
        "logic": (96.88, 1.10), "gsm8k": (64.32, 0.92)}),
    Row("Hard Routing", {"method": "hard_routing", "team": "default"}, {
        "algorithmic": (34.18, 4.18), "arithmetic": (32.47, 5.10),
        "logic": (63.80, 2.39), "gsm8k": (14.52, 1.52)}),
    Row("Output Collaboration", {"method": "output_collab", "team": "default"}, {
        "algorithmic": (51.43, 3.41), "arithmetic": (31.19, 1.16),
        "logic": (66.80, 0.64), "gsm8k": (67.58, 1.03)}),
    Row("Ours w/o Cross-Attn (n=3)", {"method": "no_cross_attn", "team": "default"}, {
        "algorithmic": (51.56, 0.64), "arithmetic": (60.16, 4.38),
        "logic": (89.71, 2.17), "gsm8k": (63.28, 1.03)}),
    Row("Ours Default Team (n=3)", {"method": "perceiver", "team": "default"}, {
        "algorithmic": (51.82, 0.49), "arithmetic": (75.26, 5.62),
        "logic": (82.81, 1.56), "gsm8k": (61.59, 1.25)}),
    Row("Ours Generalist Team (n=5)", {"method": "perceiver", "team": "generalist"}, {
        "algorithmic": (52.02, 2.77), "arithmetic": (65.10, 8.49),
        "logic": (90.23, 5.01), "gsm8k": (41.02, 29.01)}),
    Row("Ours Naive Team (n=4)", {"method": "perceiver", "team": "naive"}, None),
    Row("LLM Team (n=3)", {"method": "perceiver", "team": "llm"}, None),
)

# Table 2: pooling on Arithmetic with the default team. Labels name Eq. 5's h^{(layer)}_{i,token}.
TABLE2: tuple[tuple[str, str, tuple[float, float]], ...] = (
    ("First token (h^(L)_{i,0})", "first_token", (75.13, 1.12)),
    ("First layer (h^(0)_{i,T})", "first_layer", (54.62, 17.82)),
    ("Random token", "random_token", (63.93, 6.33)),
    ("Random layer", "random_layer", (38.09, 25.55)),
    ("Last (ours, n=3)", "last", (75.26, 5.62)),
)
TABLE2_KEY = {"task": "arithmetic", "method": "perceiver", "team": "default"}


def paper_text(value: tuple[float, float] | None) -> str:
    return "n/r" if value is None else f"{value[0]:.2f} ± {value[1]:.2f}"


def table1_cells(runs: list[Run], latents: int = DEFAULT_LATENTS
                 ) -> list[tuple[Row, dict[str, Cell]]]:
    return [(row, {t: cell(runs, task=t, pooling=DEFAULT_POOLING, latents=latents, **row.key)
                   for t in TASKS}) for row in TABLE1]


def table2_cells(runs: list[Run], latents: int = DEFAULT_LATENTS
                 ) -> list[tuple[str, Cell, tuple[float, float]]]:
    return [(label, cell(runs, pooling=pooling, latents=latents, **TABLE2_KEY), paper)
            for label, pooling, paper in TABLE2]


def table1_markdown(runs: list[Run], latents: int = DEFAULT_LATENTS) -> str:
    """Table 1: accuracy (%) per method and task, ours | paper, mean ± std over seeds."""
    header = ["Method"]
    for t in TASKS:
        header += [f"{TASK_TITLES[t]} (ours)", f"{TASK_TITLES[t]} (paper)"]
    lines = [_row(header), _row(["---"] + ["---:"] * (len(header) - 1))]
    for row, cells in table1_cells(runs, latents):
        out = [row.label]
        for t in TASKS:
            out += [cells[t].text(), paper_text(row.paper[t] if row.paper else None)]
        lines.append(_row(out))
    return (
        f"**Table 1.** Validation accuracy (%) by method and task, mean ± sample std (ddof = 1)"
        f" over seeds; last-token pooling, m = {latents}. Paper: Qwen2.5-3B policy, 3 seeds; "
        "n/r = not reported in the paper; FAILED = every seed failed; — = not run. "
        "The n in a row label is the paper's team size; a budget's own teams can differ "
        "(see the report's team list).\n\n"
        + "\n".join(lines) + "\n"
    )


def table2_markdown(runs: list[Run], latents: int = DEFAULT_LATENTS) -> str:
    """Table 2: accuracy (%) on Arithmetic per pooling strategy (Eq. 5), default team."""
    cells = table2_cells(runs, latents)
    header = ["", *(label for label, _, _ in cells)]
    lines = [
        _row(header),
        _row(["---"] + ["---:"] * len(cells)),
        _row(["Accuracy (%), ours", *(c.text() for _, c, _ in cells)]),
        _row(["Accuracy (%), paper", *(paper_text(p) for _, _, p in cells)]),
    ]
    return (
        "**Table 2.** Pooling ablation on Arithmetic (default team, m = "
        f"{latents}): validation accuracy (%), mean ± sample std over seeds.\n\n"
        + "\n".join(lines) + "\n"
    )


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
