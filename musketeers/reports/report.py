"""reports/<budget>/README.md: what was run, Tables 1–2, Figures 4–6, Spearman ρ, and where
our numbers agree or disagree with the paper's, computed rather than eyeballed."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np

from musketeers.reports.aggregate import Cell, Run, load_runs, mean_spearman, select, series
from musketeers.reports.figures import LATENTS, all_figures
from musketeers.reports.grid import Grid
from musketeers.reports.ledger import PHASES, ledger_path, totals
from musketeers.reports.tables import (
    DEFAULT_LATENTS,
    TASK_TITLES,
    TASKS,
    paper_text,
    table1_cells,
    table1_markdown,
    table2_cells,
    table2_markdown,
)

PAPER_SPEARMAN = -0.48
# §4.3's ρ is over the Perceiver's attention entropy: no_cross_attn has no attention, and
# hard routing's "entropy" is its router's softmax, another quantity
ROUTED = ("perceiver",)


def machine() -> str:
    """This machine in one line (the report's author; runs may come from elsewhere)."""
    parts = [platform.platform(), platform.processor() or platform.machine(),
             f"{os.cpu_count()} CPUs", f"Python {platform.python_version()}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return ", ".join(parts)


def compare(ours: Cell, paper: tuple[float, float] | None) -> str | None:
    """'agrees (within 1 std)', 'above' or 'below' the paper, by how much; None if unknown.

    "Within 1 std" means |ours − paper| ≤ the larger of our and the paper's std.
    """
    if paper is None or not ours.values:
        return None
    diff = ours.mean - paper[0]
    tol = max(ours.std or 0.0, paper[1])
    if abs(diff) <= tol:
        return f"agrees (within 1 std: {diff:+.2f} points, tolerance {tol:.2f})"
    return f"{'above' if diff > 0 else 'below'} the paper by {abs(diff):.2f} points " \
           f"(> 1 std = {tol:.2f})"


def _claim(text: str, holds: bool | None, detail: str) -> str:
    verdict = "cannot be checked (runs missing)" if holds is None else (
        "holds here" if holds else "does NOT hold here")
    return f"- {text}: **{verdict}**{' — ' + detail if detail else ''}."


def paper_claims(runs: list[Run], latents: int) -> list[str]:
    """The paper's qualitative findings, each tested on our runs."""
    t1 = {row.label: cells for row, cells in table1_cells(runs, latents)}
    out = []
    single, ours = t1["Single"]["arithmetic"], t1["Ours Default Team (n=3)"]["arithmetic"]
    ok = single.values and ours.values
    out.append(_claim("§4.2: on Arithmetic, Ours (Default Team) beats Single",
                      ours.mean > single.mean if ok else None,
                      f"{ours.mean:.2f} vs {single.mean:.2f}" if ok else ""))
    logic = {label: cells["logic"] for label, cells in t1.items() if cells["logic"].values}
    if "Single" in logic:
        best = max(logic, key=lambda k: logic[k].mean)
        out.append(_claim("§4.2: on Logic, Single is the best method", best == "Single",
                          f"best is {best} ({logic[best].mean:.2f})"))
    else:
        out.append(_claim("§4.2: on Logic, Single is the best method", None, ""))
    rho, n = mean_spearman([r for r in runs if r.config.get("method") in ROUTED])
    out.append(_claim(f"§4.3: reward and routing entropy correlate negatively "
                      f"(paper: mean ρ = {PAPER_SPEARMAN})", None if rho is None else rho < 0,
                      f"mean ρ = {rho:+.2f} over {n} runs" if rho is not None else ""))
    t2 = {label: c for label, c, _ in table2_cells(runs, latents) if c.values}
    first, last = t2.get("First token (h^(L)_{i,0})"), t2.get("Last (ours, n=3)")
    if first and last:
        tol = max(first.std or 0, last.std or 0)
        out.append(_claim("§4.4: first-token pooling is comparable to last-token pooling",
                          abs(first.mean - last.mean) <= tol,
                          f"{first.mean:.2f} vs {last.mean:.2f}, tolerance {tol:.2f}"))
    else:
        out.append(_claim("§4.4: first-token pooling is comparable to last-token pooling",
                          None, ""))
    for task in ("logic", "arithmetic"):
        rs = [r for r in select(runs, task=task, method="perceiver", team="default",
                                pooling="last", latents=latents) if r.status == "done"]
        steps_c, with_c, _ = series(rs, "reward_mean")
        steps_x, without_c, _ = series(rs, "reward_no_context")
        with_c = with_c[np.isin(steps_c, steps_x)]  # the no-C reward is sampled every N steps
        ok = with_c.size and without_c.size
        out.append(_claim(f"§4.4 / Figure 5: on {TASK_TITLES[task]}, reward with C exceeds "
                          "reward without C (mean over the steps sampled both ways)",
                          float(with_c.mean()) > float(without_c.mean()) if ok else None,
                          f"{with_c.mean():.3f} vs {without_c.mean():.3f}" if ok else ""))
    accs = {}
    for m in LATENTS:
        vals = [r.accuracy for r in select(runs, task="arithmetic", method="perceiver",
                                           team="default", pooling="last", latents=m)
                if r.status == "done" and r.accuracy is not None]
        if vals:
            accs[m] = float(np.mean(vals))
    best = max(accs.values()) if len(accs) > 1 else None
    peaks = [m for m, a in accs.items() if a == best]
    out.append(_claim("§4.4 / Figure 6: accuracy on Arithmetic peaks at m = 8",
                      None if best is None else peaks == [8],
                      "" if best is None else
                      f"peak at m = {', '.join(map(str, peaks))} ({best:.2f}%)"))
    return out


def cell_comparisons(runs: list[Run], latents: int) -> list[str]:
    """Every cell with both our number and the paper's, as one table (a list of 40 bullets
    reads worse than 40 rows)."""
    rows = []
    for row, cells in table1_cells(runs, latents):
        for task in TASKS:
            paper = row.paper[task] if row.paper else None
            verdict = compare(cells[task], paper)
            if verdict:
                rows.append(f"| Table 1 | {row.label} | {TASK_TITLES[task]} | "
                            f"{cells[task].text()} | {paper_text(paper)} | {verdict} |")
    for label, c, paper in table2_cells(runs, latents):
        verdict = compare(c, paper)
        if verdict:
            rows.append(f"| Table 2 | {label} | Arithmetic | {c.text()} | {paper_text(paper)} "
                        f"| {verdict} |")
    if not rows:
        return ["- No cell has both our result and the paper's yet."]
    return ["| table | row | task | ours | paper | verdict |",
            "|---|---|---|---:|---:|---|", *rows]


def _measured_wall_time(runs_dir: Path, budget: str) -> list[str]:
    path = ledger_path(runs_dir, budget)
    t = totals(path)
    if not t:
        return []
    parts = ", ".join(f"{p} {t[p] / 3600:.2f} h" for p in PHASES)
    return [f"- Measured wall time of this grid's commands: {t['total']:.0f} s "
            f"({t['total'] / 3600:.2f} h: {parts}), summed over every call in `{path.name}`, "
            f"across interrupted and resumed invocations; {t['finished'] / 3600:.2f} h of it "
            "in calls that finished (the rest was spent in calls that failed or were stopped)"
            + (f"; not counted: {t['discarded']:.0f} s ({t['discarded'] / 3600:.2f} h) spent on "
               "runs later set aside as stale (their settings changed; kept under "
               "`runs/stale/`) and run again" if t.get("discarded") else "")]


def _what_was_run(grid: Grid, runs: list[Run], runs_dir: Path) -> list[str]:
    cfgs = [r.config for r in runs]
    def values(key: str) -> str:
        vals = sorted({str(c.get(key)) for c in cfgs if c.get(key) is not None})
        return ", ".join(vals) or "—"
    wall = sum(r.wall_time for r in runs)
    steps = sorted({int((r.summary or {}).get("steps") or r.config.get("steps") or 0)
                    for r in runs if r.summary})
    teams = {}
    for r in runs:
        for row in r.metrics[:1]:
            if row.get("utilisation") and r.config.get("team"):
                teams.setdefault(r.config["team"], list(row["utilisation"]))
    lines = [
        f"- Budget: `{grid.budget}` — {grid.description or 'see the grid YAML'}",
        f"- Runs: {len(runs)} found of {len(grid.runs)} in the grid "
        f"({sum(r.status == 'done' for r in runs)} done, "
        f"{sum(r.status == 'failed' for r in runs)} failed, "
        f"{sum(r.status == 'incomplete' for r in runs)} incomplete)",
        f"- Policy: {values('policy')}; roster: {values('roster')}",
        f"- Tasks: {values('task')}; methods: {values('method')}",
        f"- Seeds: {values('seed')}; training steps per run: "
        f"{', '.join(map(str, steps)) or '—'}",
        f"- Total training wall time (sum over runs): {wall:.0f} s ({wall / 3600:.2f} h)",
        *_measured_wall_time(runs_dir, grid.budget),
        *learning_signal(runs),
        f"- Report written on: {machine()}",
    ]
    if grid.estimate:
        lines.append(f"- Budget estimate: {grid.estimate}")
    for team, experts in sorted(teams.items()):
        lines.append(f"- Team `{team}` (n={len(experts)}): {', '.join(experts)}")
    return lines


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _runs_table(runs: list[Run]) -> list[str]:
    # completion length: a policy that stops at its first token (no reward, no signal) shows
    # here; "answered": a policy that never writes <answer> tags scores 0 whatever it knows
    lines = ["| run | status | steps | wall time (s) | train reward | groups without signal "
             "| completion (tokens) | answered (%) | truncated (%) | accuracy (%) "
             "| ρ(reward, H) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        s = r.summary or {}
        wall = r.wall_time if r.metrics or r.summary else None
        lines.append(f"| {r.name} | {r.status.upper() if r.status == 'failed' else r.status} | "
                     f"{s.get('steps', '—')} | {_fmt(wall, '.0f')} | "
                     f"{_fmt(r.train_reward, '.3f')} | {_fmt(r.no_signal, '.0%')} | "
                     f"{_fmt(r.metric_mean('completion_len'), '.1f')} | "
                     f"{_fmt(r.eval_share('answered'), '.0f')} | "
                     f"{_fmt(r.eval_share('truncated'), '.0f')} | {_fmt(r.accuracy, '.2f')} | "
                     f"{_fmt(r.spearman, '+.2f')} |")
    return lines


# Above this mean fraction of zero-variance groups, the report says the runs barely trained.
WEAK_SIGNAL = 0.5


def learning_signal(runs: list[Run]) -> list[str]:
    """A plain statement of how much GRPO signal the grid's training had: with every reward
    of a group equal (all 0, typically) the advantage is 0, and the tables then compare
    policies that barely moved from their initialisation."""
    fracs = [r.no_signal for r in runs if r.no_signal is not None]
    if not fracs:
        return answer_format(runs)
    mean = float(np.mean(fracs))
    line = (f"- Learning signal: on average {mean:.0%} of the sampled groups had G equal "
            f"rewards (zero advantage, no policy gradient), {min(fracs):.0%}–{max(fracs):.0%} "
            "across runs")
    if mean > WEAK_SIGNAL:
        line += ("; most updates carried no reward signal, so these runs stayed close to "
                 "their initial policies and the tables cannot separate the methods: more "
                 "steps, a larger policy or more new tokens (the `paper` budget) give the "
                 "comparison its meaning. Routing still moves in such runs: the KL term's "
                 "gradient is all there is, and Adam scales even a tiny one to lr-sized steps, "
                 "so Figure 4's curves there are not shaped by reward")
    return [line, *answer_format(runs)]


def answer_format(runs: list[Run]) -> list[str]:
    """Why greedy accuracy is low, when it is: completions without an ``<answer>`` score 0,
    and a completion cut off at max_new_tokens rarely reached one."""
    out = []
    for key, what in (("answered", "wrote an `<answer>…</answer>` for the scorer to grade"),
                      ("truncated", "ran out of new tokens before ending")):
        shares = [v for r in runs if (v := r.eval_share(key)) is not None]
        if shares:
            out.append(f"{np.mean(shares):.0f}% {what} ({min(shares):.0f}%–"
                       f"{max(shares):.0f}% over {len(shares)} run{'s' * (len(shares) != 1)} "
                       "with that count)")
    if not out:
        return []
    return [f"- Answer format: of the greedy validation completions, {'; '.join(out)}. "
            "A completion without an answer scores 0 whatever it says; each run's completions "
            "are in its `eval_samples.jsonl`"]


def write_report(grid: Grid, runs_dir: Path, reports_dir: Path) -> Path:
    """Write table1.md, table2.md, the figures and README.md under reports_dir/<budget>."""
    out = Path(reports_dir) / grid.budget
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(Path(runs_dir), names=[g.name for g in grid.runs])
    latents = int(grid.defaults.get("latents", DEFAULT_LATENTS))
    t1, t2 = table1_markdown(runs, latents), table2_markdown(runs, latents)
    (out / "table1.md").write_text(t1)
    (out / "table2.md").write_text(t2)
    figs = all_figures(runs, out, latents)
    # a figure an earlier report drew (e.g. from runs since set aside as stale) must not sit
    # beside this report as if it were current
    drawn = {p.name for paths in figs.values() for p in paths}
    for old in out.glob("figure*.png"):
        if old.name not in drawn:
            old.unlink()
    md = [f"# Ablations — budget `{grid.budget}`", "", "## What was run", "",
          *_what_was_run(grid, runs, Path(runs_dir)), "",
          "Accuracy is greedy validation accuracy in %; "
          "± is the sample standard deviation (ddof = 1) over seeds.", "",
          "## Table 1", "", t1, "## Table 2", "", t2, "## Figures", ""]
    captions = {"figure4": "Figure 4 — utilisation, routing entropy and reward over training",
                "figure5": "Figure 5 — reward with vs. without C",
                "figure6": "Figure 6 — accuracy vs. number of latents m"}
    for key, caption in captions.items():
        if not figs[key]:
            md += [f"*{caption}: no runs with the data it needs.*", ""]
        for path in figs[key]:
            md += [f"![{caption}: {path.stem}]({path.name})", ""]
    md += ["## Spearman ρ(reward, routing entropy) per task", "",
           f"Computed per Perceiver run (Ours: every team, pooling and m) over its training "
           f"trajectory, then averaged (paper: mean ρ = "
           f"{PAPER_SPEARMAN} across tasks).", ""]
    for task in TASKS:
        routed = [r for r in runs if r.config.get("task") == task
                  and r.config.get("method") in ROUTED and r.status == "done"]
        rho, n = mean_spearman(routed)
        if rho is not None:
            rest = len(routed) - n
            text = f"ρ = {rho:+.2f} ({n} runs" + (
                f"; undefined in {rest} more with a constant series)" if rest else ")")
        elif routed:  # e.g. a random policy's reward is 0 at every step: ρ has no meaning
            text = (f"undefined in all {len(routed)} runs (reward or entropy constant over "
                    "training)")
        else:
            text = "— (no Perceiver run finished)"
        md.append(f"- {TASK_TITLES[task]}: {text}")
    md += ["", "## Agreement with the paper", "", "Findings:", "",
           *paper_claims(runs, latents), "", "Cells:", "", *cell_comparisons(runs, latents),
           "", "## Runs", "", *_runs_table(runs), ""]
    failed = [r for r in runs if r.status == "failed"]
    missing = sorted({g.name for g in grid.runs} - {r.name for r in runs})
    md += ["## Failed runs", ""]
    md += [f"- `{r.name}`: {r.error} (full traceback: `{r.path / 'error.txt'}`)"
           for r in failed] or ["- none"]
    if missing:
        md += ["", "## Not run yet", "", *(f"- `{name}`" for name in missing)]
    path = out / "README.md"
    path.write_text("\n".join(md) + "\n")
    return path
