"""The headroom table (``musketeers tasks headroom``): one row per task, as JSON, a markdown
table and one figure, written under ``--out``."""

from __future__ import annotations

import json
from pathlib import Path

from musketeers.reports.headroom import ANY, ProbeCell, TaskHeadroom

RESULT_FILE, TABLE_FILE, FIGURE_FILE = "headroom.json", "headroom.md", "headroom.png"


def pct(x: float | None) -> str:
    return "not measured" if x is None else f"{100 * x:.1f}"


def _probe_text(cells: list[ProbeCell], expert: str, target: str) -> str:
    """``channel acc/majority (n)`` for each channel probed, or — when no class was probed."""
    parts = [f"{c.channel} {pct(c.accuracy)}/{pct(c.majority)} (n={c.n})"
             for c in cells if c.expert == expert and c.target == target]
    return "; ".join(parts) or "—"


def columns(rows: list[TaskHeadroom]) -> list[str]:
    """The table's columns: the experts' are named after every expert of any row."""
    experts = list(dict.fromkeys(e for r in rows for e in r.expert_exact))
    cols = ["task", "policy", "items", "constant exact", "copy exact", "policy exact",
            "policy after warm-up"]
    for e in experts:
        cols += [f"{e} exact", f"{e} headroom", f"{e} probe gold (acc/maj)",
                 f"{e} probe last digit (acc/maj)"]
    return [*cols, f"headroom ({ANY})", f"headroom after warm-up ({ANY})"]


def cells(row: TaskHeadroom, experts: list[str]) -> list[str]:
    """One row's cells, in ``columns``' order."""
    out = [row.task, row.policy, str(row.items), pct(row.constant_exact), pct(row.copy_exact),
           pct(row.policy_exact), pct(row.warmup_exact)]
    for e in experts:
        if e not in row.expert_exact:
            out += ["—"] * 4
            continue
        out += [pct(row.expert_exact[e]), pct(row.headroom[e]),
                _probe_text(row.probes, e, "gold answer"),
                _probe_text(row.probes, e, "answer_last_digit")]
    warmed = None if row.warmup_headroom is None else row.warmup_headroom[ANY]
    return [*out, pct(row.headroom[ANY]), pct(warmed)]


def experts_of(rows: list[TaskHeadroom]) -> list[str]:
    return list(dict.fromkeys(e for r in rows for e in r.expert_exact))


def markdown(rows: list[TaskHeadroom]) -> str:
    """The rows as one markdown table (percentages of the row's items)."""
    experts = experts_of(rows)
    head = columns(rows)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells(r, experts)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def figure(rows: list[TaskHeadroom], path: Path) -> None:
    """Per task: the policy's exact, each expert's exact and the team's headroom, as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    experts = experts_of(rows)
    series = {"policy exact": [r.policy_exact for r in rows]}
    if any(r.warmup_exact is not None for r in rows):
        series["policy after warm-up"] = [r.warmup_exact for r in rows]
    series |= {f"{e} exact": [r.expert_exact.get(e) for r in rows] for e in experts}
    series[f"headroom ({ANY})"] = [r.headroom[ANY] for r in rows]
    if any(r.warmup_headroom is not None for r in rows):
        series[f"headroom after warm-up ({ANY})"] = [
            None if r.warmup_headroom is None else r.warmup_headroom[ANY] for r in rows]
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4))
    for k, (name, values) in enumerate(series.items()):
        at = x + k * width
        ax.bar(at, [np.nan if v is None else 100 * v for v in values], width, label=name)
        for where, v in zip(at, values, strict=True):
            if v is None:  # not measured: marked, so it does not read as 0
                ax.text(where, 0.2, "n/m", rotation=90, fontsize=5, ha="center", va="bottom")
    ax.axhline(15, color="grey", linestyle="--", linewidth=0.8, label="15 % target")
    ax.set_xticks(x + 0.4 - width / 2, [f"{r.task}\n({r.policy})" for r in rows], rotation=60,
                  ha="right", fontsize=7)
    ax.set_ylabel("% of validation items")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: list[TaskHeadroom], out: Path, plot: bool = True) -> list[Path]:
    """headroom.json (every figure and the per-item right/wrong), headroom.md, headroom.png."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / RESULT_FILE, out / TABLE_FILE]
    paths[0].write_text(json.dumps([r.to_json() for r in rows], indent=1) + "\n")
    paths[1].write_text(markdown(rows))
    if plot and rows:
        figure(rows, out / FIGURE_FILE)
        paths.append(out / FIGURE_FILE)
    return paths


def read_rows(path: Path) -> list[TaskHeadroom]:
    """Rows written by ``write_report`` (to merge runs of several pairings into one table)."""
    rows = []
    for d in json.loads(path.read_text("utf-8")):
        d["probes"] = [ProbeCell(**c) for c in d.get("probes", [])]
        rows.append(TaskHeadroom(**d))
    return rows
