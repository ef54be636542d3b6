"""Table 1 (methods × tasks, then the controls) and Table 2 (pooling ablation) in the paper's
layout, for one validation metric at a time (``aggregate.METRICS``).

Each of our cells sits beside the paper's number for the same cell (mean ± sample std over
seeds). Rows the paper does not report show "n/r" in its column, control rows "n/a".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from musketeers.design import experiment
from musketeers.method import methods
from musketeers.reports.aggregate import Cell, Run, cell
from musketeers.tasks.variants import task_title

TASKS = experiment.FAMILIES  # the paper's, in its column order; a grid may run others
DEFAULT_LATENTS = experiment.DEFAULT_LATENTS
DEFAULT_POOLING = experiment.DEFAULT_POOLING
# The method every claim is about; its controls are the registry's methods with
# control_of == OURS. Exact (accuracy) claims are stated against the shuffled-experts control,
# routing claims (§4.3) against the shuffled-reward one (musketeers.method.methods).
OURS = experiment.OURS["method"]
EXACT_CONTROL = "shuffled_experts"
ROUTING_CONTROL = "shuffled_reward"
DEFAULT_TEAM = experiment.OURS
# What each metric is, for captions; the paper's column is always its "accuracy".
METRIC_TEXT = {
    "exact": "exact (% of greedy validation completions scoring 1)",
    "score": "score (mean Reasoning Gym score of the greedy validation completions, %, "
             "with partial credit)",
}
UNKNOWN = "unknown = the runs' eval.json predates this metric"
PAPER_METRIC = ("the paper's numbers are its \"accuracy\": Reasoning Gym's score, as far as "
                "the paper says (it does not define it further)")


@dataclass(frozen=True)
class Row:
    key: dict[str, Any]  # group-key fields besides task, pooling and latents
    paper: dict[str, tuple[float, float]] | None  # task -> (mean, std); None: not in the paper
    suffix: str = ""  # after the method's label: the team and the paper's team size

    @property
    def label(self) -> str:
        return methods.get(self.key["method"]).label + self.suffix

    @property
    def control(self) -> bool:
        return methods.get(self.key["method"]).control_of is not None


PAPER_ROWS: tuple[Row, ...] = (
    Row({"method": "single"}, {
        "algorithmic": (51.56, 0.55), "arithmetic": (52.34, 1.78),
        "logic": (96.88, 1.10), "gsm8k": (64.32, 0.92)}),
    Row({"method": "hard_routing", "team": "default"}, {
        "algorithmic": (34.18, 4.18), "arithmetic": (32.47, 5.10),
        "logic": (63.80, 2.39), "gsm8k": (14.52, 1.52)}),
    Row({"method": "output_collab", "team": "default"}, {
        "algorithmic": (51.43, 3.41), "arithmetic": (31.19, 1.16),
        "logic": (66.80, 0.64), "gsm8k": (67.58, 1.03)}),
    Row({"method": "no_cross_attn", "team": "default"}, {
        "algorithmic": (51.56, 0.64), "arithmetic": (60.16, 4.38),
        "logic": (89.71, 2.17), "gsm8k": (63.28, 1.03)}, " (n=3)"),
    Row(DEFAULT_TEAM, {
        "algorithmic": (51.82, 0.49), "arithmetic": (75.26, 5.62),
        "logic": (82.81, 1.56), "gsm8k": (61.59, 1.25)}, " Default Team (n=3)"),
    Row({"method": OURS, "team": "generalist"}, {
        "algorithmic": (52.02, 2.77), "arithmetic": (65.10, 8.49),
        "logic": (90.23, 5.01), "gsm8k": (41.02, 29.01)}, " Generalist Team (n=5)"),
    Row({"method": OURS, "team": "naive"}, None, " Naive Team (n=4)"),
    Row({"method": OURS, "team": "llm"}, None, " LLM Team (n=3)"),
)


def _controls(runs: Sequence[Run] = ()) -> tuple[Row, ...]:
    """The registry's controls and baselines (not in the paper): Ours' default team with one
    signal broken, and Single's untrained start. A control the design does not run (the
    warm-up-only arm exists only in a grid that warms up) has a row where the runs hold it."""
    designed = {m for part in experiment.DESIGN for m in part.values("method")}
    ran = {r.key.get("method") for r in runs}
    return tuple(Row({"method": m.name, "team": "default"} if m.uses_experts else
                     {"method": m.name}, None)
                 for m in methods.REGISTRY.values()
                 if m.control_of is not None and (m.name in designed or m.name in ran))


def table1_rows(runs: Sequence[Run] = ()) -> tuple[Row, ...]:
    """The paper's rows, then a row per team of each registered method the paper lacks (read
    from the registry when the table is drawn, so a method registered later has its row),
    then the controls."""
    paper = {row.key["method"] for row in PAPER_ROWS}
    extra = []
    for m in methods.REGISTRY.values():
        if m.name in paper or m.control_of is not None:
            continue
        teams = sorted({r.key.get("team") or "" for r in runs
                        if r.key.get("method") == m.name}) or ["default"]
        for team in teams if m.uses_experts else [""]:
            key = {"method": m.name, "team": team or None} if m.uses_experts else {
                "method": m.name}
            extra.append(Row(key, None, f" ({team} team)" if team else ""))
    return (*PAPER_ROWS, *extra, *_controls(runs))


TABLE1: tuple[Row, ...] = table1_rows()

# Table 2: the design's poolings (experiment.PARTS["table2"]), then Table 1's last-token run.
# Labels name Eq. 5's h^{(layer)}_{i,token}; the paper's numbers are keyed by pooling.
PAPER_TABLE2: dict[str, tuple[str, tuple[float, float]]] = {
    "first_token": ("First token (h^(L)_{i,0})", (75.13, 1.12)),
    "first_layer": ("First layer (h^(0)_{i,T})", (54.62, 17.82)),
    "random_token": ("Random token", (63.93, 6.33)),
    "random_layer": ("Random layer", (38.09, 25.55)),
    "last": ("Last (ours, n=3)", (75.26, 5.62)),
}
_T2 = experiment.PARTS["table2"]
TABLE2: tuple[tuple[str, str, tuple[float, float]], ...] = tuple(
    (PAPER_TABLE2[p][0], p, PAPER_TABLE2[p][1]) for p in (*_T2.values("pooling"),
                                                          DEFAULT_POOLING))
TABLE2_KEY = {"task": _T2.values("task")[0], **DEFAULT_TEAM}


def paper_text(value: tuple[float, float] | None, control: bool = False) -> str:
    if value is None:
        return "n/a" if control else "n/r"
    return f"{value[0]:.2f} ± {value[1]:.2f}"


def table1_cells(runs: list[Run], latents: int = DEFAULT_LATENTS, metric: str = "exact",
                 tasks: tuple[str, ...] | None = None) -> list[tuple[Row, dict[str, Cell]]]:
    tasks = tasks_of(runs) if tasks is None else tasks
    return [(row, {t: cell(runs, metric, task=t, pooling=DEFAULT_POOLING, latents=latents,
                           **row.key) for t in tasks}) for row in table1_rows(runs)]


def tasks_of(runs: list[Run]) -> tuple[str, ...]:
    """The paper's tasks, then any other task the runs trained on (rg:NAME, a task file,
    planted): every table, claim and figure covers both, titled by ``task_title``. A variant
    (``arithmetic:easy@direct``) fills its family's column, not one of its own."""
    others = sorted({str(r.key.get("task")) for r in runs} - set(TASKS) - {"None"})
    return (*TASKS, *others)


def table2_cell(runs: list[Run], pooling: str, latents: int = DEFAULT_LATENTS,
                metric: str = "exact") -> Cell:
    """Table 2's cell of ``pooling``, found by its key (its label is only printed)."""
    return cell(runs, metric, pooling=pooling, latents=latents, **TABLE2_KEY)


def table2_cells(runs: list[Run], latents: int = DEFAULT_LATENTS, metric: str = "exact"
                 ) -> list[tuple[str, Cell, tuple[float, float]]]:
    return [(label, table2_cell(runs, pooling, latents, metric), paper)
            for label, pooling, paper in TABLE2]


def _legend(metric: str) -> str:
    return f"Ours: {METRIC_TEXT[metric]}, mean ± sample std (ddof = 1) over seeds"


def _notes(items: list[str]) -> str:
    """A table's notes under it, one short line each, so its caption stays one line."""
    return "".join(f"\n- {i}" for i in items if i) + "\n"


def table1_markdown(runs: list[Run], latents: int = DEFAULT_LATENTS,
                    metric: str = "exact") -> str:
    """Table 1: ``metric`` per method and task, then the controls; ours | paper."""
    tasks = tasks_of(runs)
    header = ["Method"]
    for t in tasks:
        title = task_title(t)
        header += [f"{title} (ours)", f"{title} (paper)"]
    lines = [_row(header), _row(["---"] + ["---:"] * (len(header) - 1))]
    for row, cells in table1_cells(runs, latents, metric, tasks):
        out = [row.label]
        for t in tasks:
            out += [cells[t].text(), paper_text(row.paper.get(t) if row.paper else None,
                                                row.control)]
        lines.append(_row(out))
    return (f"**Table 1 ({metric}).** {_legend(metric)}; last-token pooling, m = {latents}."
            "\n\n" + "\n".join(lines) + "\n" + _notes([
                f"Paper: Qwen2.5-3B policy, 3 seeds; {PAPER_METRIC}.",
                "n/r = not reported in the paper; n/a = a control (musketeers.method.methods), "
                f"not in the paper; FAILED = every seed failed; — = not run; {UNKNOWN}.",
                "The n in a row label is the paper's team size; a budget's own teams can "
                "differ (see the report's team list).",
                _variants_note(runs, tasks)]))


def _variants_note(runs: list[Run], tasks: tuple[str, ...]) -> str:
    """Name the variants our columns hold: their items are not the paper's, so the paper's
    column beside them is a reference, not a comparison (claims.compare says the same)."""
    held = [f"{task_title(t)} = " + ", ".join(f"`{v}`" for v in variants)
            for t in tasks if (variants := cell(runs, task=t).variants)]
    if not held:
        return ""
    return ("Our columns hold task variants, not the paper's items (" + "; ".join(held)
            + "): the paper's numbers beside them are a reference, not a comparison.")


def table2_markdown(runs: list[Run], latents: int = DEFAULT_LATENTS,
                    metric: str = "exact") -> str:
    """Table 2: ``metric`` on Arithmetic per pooling strategy (Eq. 5), default team."""
    cells = table2_cells(runs, latents, metric)
    header = ["", *(label for label, _, _ in cells)]
    lines = [
        _row(header),
        _row(["---"] + ["---:"] * len(cells)),
        _row([f"{metric.capitalize()} (%), ours", *(c.text() for _, c, _ in cells)]),
        _row(["Paper's accuracy (%)", *(paper_text(p) for _, _, p in cells)]),
    ]
    constant = [f"{label}: {', '.join(c.constant_experts)}" for label, c, _ in cells
                if c.constant_experts]
    note = ("Same vector for every item (a pooling that reads the chat template, not the "
            "prompt; the cell tests constant expert signatures, not prompt information) — "
            + "; ".join(constant) + ".") if constant else ""
    return (f"**Table 2 ({metric}).** Pooling ablation on Arithmetic (default team, m = "
            f"{latents}). {_legend(metric)}.\n\n" + "\n".join(lines) + "\n"
            + _notes([f"{PAPER_METRIC[0].upper()}{PAPER_METRIC[1:]}; {UNKNOWN}.", note]))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
