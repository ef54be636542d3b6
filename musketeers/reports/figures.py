"""Figures 4–6 of the paper from run folders (matplotlib, Agg backend, PNG).

Figure 4: per-expert utilisation u_i, routing entropy H (Eq. 15) and reward over training
steps, one PNG per task, one column per team; lines are the mean over seeds, bands ± the
sample std. Figure 5: reward with vs. without the context tokens C. Figure 6: exact (share of
greedy validation completions scoring 1) vs. the number of latent queries m. Each expert
keeps one colour in every figure of a report.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from musketeers.design import experiment  # noqa: E402
from musketeers.reports.aggregate import Run, mean_std  # noqa: E402
from musketeers.reports.keys import select  # noqa: E402
from musketeers.reports.series import experts_of, series  # noqa: E402
from musketeers.reports.tables import (  # noqa: E402
    DEFAULT_POOLING,
    OURS,
    tasks_of,
)
from musketeers.tasks.variants import task_title

TEAM_TITLES = {"default": "Default Team", "naive": "Naive Team", "llm": "LLM Team",
               "generalist": "Generalist Team"}
FIG4_TEAMS = ("default", "naive", "llm", "generalist")
# Figure 6's x axis: the design's m values and the default
LATENTS = tuple(sorted({*experiment.PARTS["figure6"].values("latents"),
                        experiment.DEFAULT_LATENTS}))
DPI = 130


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def expert_colours(runs: list[Run]) -> dict[str, tuple]:
    """One colour per expert name, fixed by sorted name so every figure agrees."""
    cmap = plt.get_cmap("tab10")
    return {name: cmap(i % 10) for i, name in enumerate(sorted(experts_of(runs)))}


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (window ≥ 1), so 500 noisy steps read as a trend."""
    if window <= 1 or values.size == 0:
        return values
    kernel = np.ones(window)
    num = np.convolve(values, kernel)[: values.size]
    den = np.convolve(np.ones(values.size), kernel)[: values.size]
    return num / den


def _window(n_steps: int) -> int:
    return max(1, n_steps // 25)


def _band(ax: Axes, runs: list[Run], path: tuple[str, ...], label: str, colour,
          window: int, linestyle: str = "-", alpha: float = 0.2) -> bool:
    steps, mean, std = series(runs, *path)
    if steps.size == 0:
        return False
    mean, std = smooth(mean, window), smooth(std, window)
    marker = "o" if steps.size < 10 else None
    ax.plot(steps, mean, color=colour, label=label, linestyle=linestyle, marker=marker, lw=1.6)
    ax.fill_between(steps, mean - std, mean + std, color=colour, alpha=alpha, lw=0)
    return True


def _smooth_note(window: int) -> str:
    return f"; moving average over {window} steps" if window > 1 else ""


def _fig4_runs(runs: list[Run], task: str, team: str, latents: int) -> list[Run]:
    return [r for r in select(runs, task=task, method=OURS, team=team,
                              pooling=DEFAULT_POOLING, latents=latents)
            if r.status == "done" and r.metrics]


def figure4(runs: list[Run], out_dir: Path, latents: int = 8) -> list[Path]:
    """Figure 4, one PNG per task: rows utilisation / entropy / reward, columns teams."""
    colours = expert_colours(runs)
    written = []
    for task in tasks_of(runs):
        teams = [t for t in FIG4_TEAMS if _fig4_runs(runs, task, t, latents)]
        if not teams:
            continue
        fig, axes = plt.subplots(3, len(teams), figsize=(max(5.4, 4.6 * len(teams)), 9.5),
                                 squeeze=False, sharex="col")
        for col, team in enumerate(teams):
            team_runs = _fig4_runs(runs, task, team, latents)
            n_steps = max(len(r.metrics) for r in team_runs)
            window = _window(n_steps)
            names = experts_of(team_runs)
            ax_u, ax_h, ax_r = axes[:, col]
            for name in names:
                # light bands: several experts' bands overlap in one panel
                _band(ax_u, team_runs, ("utilisation", name), name, colours[name], window,
                      alpha=0.1)
            ax_u.axhline(1 / max(1, len(names)), color="grey", ls=":", lw=1,
                         label=f"uniform (1/{len(names)})")
            ax_u.set_title(f"{TEAM_TITLES.get(team, team)} (n={len(names)}, "
                           f"{len(team_runs)} seed{'s' * (len(team_runs) > 1)})")
            ax_u.set_ylabel("utilisation u_i (share of attention)")
            ax_u.set_ylim(0, 1)
            ax_u.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.9, title="expert",
                        title_fontsize=7)
            # black, not a tab10 colour: those belong to the experts in the panel above
            _band(ax_h, team_runs, ("entropy",), "H", "black", window)
            if names:
                ax_h.axhline(math.log(len(names)), color="grey", ls=":", lw=1,
                             label=f"uniform (ln {len(names)} = {math.log(len(names)):.2f})")
                ax_h.set_ylim(0, 1.08 * math.log(len(names)))  # H spans 0 (one expert)..ln n
            ax_h.set_ylabel("routing entropy H (nats)")
            ax_h.legend(fontsize=7, loc="lower left")
            _band(ax_r, team_runs, ("reward_mean",), "reward", "black", window)
            ax_r.set_ylabel("mean reward (0–1)")
            ax_r.set_ylim(-0.02, 1.02)  # a flat 0 stays visible
            ax_r.set_xlabel(f"training step (GRPO update){_smooth_note(window)}")
            for ax in (ax_u, ax_h, ax_r):
                ax.grid(alpha=0.3)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # One team column is narrower than the one-line title: break it after the task name.
        sep = " " if len(teams) > 1 else "\n"
        fig.suptitle(f"Figure 4 — {task_title(task)}:{sep}"
                     "expert utilisation, routing entropy and reward over training\n"
                     "(line: mean over seeds; band: ± sample std)")
        written.append(_save(fig, out_dir / f"figure4_{task}.png"))
    return written


def figure5(runs: list[Run], out_dir: Path, latents: int = 8) -> Path | None:
    """Figure 5: training reward of π(y|[x‖C]) vs. π(y|x), default team, per task."""
    per_task = {}
    for task in tasks_of(runs):
        rs = [r for r in _fig4_runs(runs, task, "default", latents)
              if any(m.get("reward_no_context") is not None for m in r.metrics)]
        if rs:
            per_task[task] = rs
    if not per_task:
        return _figure5_eval(runs, out_dir, latents)
    fig, axes = plt.subplots(1, len(per_task), figsize=(max(6.4, 5.2 * len(per_task)), 4),
                             squeeze=False)
    for ax, (task, rs) in zip(axes[0], per_task.items(), strict=True):
        window = _window(max(len(r.metrics) for r in rs))
        _band(ax, rs, ("reward_mean",), "with C: π(y | [x ‖ C])", "tab:blue", window)
        _band(ax, rs, ("reward_no_context",), "without C: π(y | x)", "tab:orange", window,
              linestyle="--")
        ax.set_title(f"{task_title(task)} ({len(rs)} seed{'s' * (len(rs) > 1)})")
        ax.set_xlabel(f"training step (GRPO update){_smooth_note(window)}")
        ax.set_ylabel("mean reward (0–1)")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    # Two lines and a minimum width: a single task gives one panel, narrower than the title.
    fig.suptitle("Figure 5 — reward during training with vs. without context tokens C\n"
                 "(default team; band: ± sample std over seeds)")
    return _save(fig, out_dir / "figure5_context.png")


def _figure5_eval(runs: list[Run], out_dir: Path, latents: int) -> Path | None:
    """Figure 5 without per-step no-C rewards: final validation exact with vs. without C."""
    rows = []
    for task in tasks_of(runs):
        rs = [r for r in _fig4_runs(runs, task, "default", latents)
              if r.exact is not None and r.value("exact", no_context=True) is not None]
        if rs:
            with_c = [r.exact for r in rs]
            without = [r.value("exact", no_context=True) for r in rs]
            rows.append((task, with_c, without))
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6.4, 2.2 * len(rows) + 1.5), 4.4))
    x = np.arange(len(rows))
    top = 0.0
    for offset, idx, label, colour in ((-0.2, 1, "with C: π(y | [x ‖ C])", "tab:blue"),
                                       (0.2, 2, "without C: π(y | x)", "tab:orange")):
        vals = [row[idx] for row in rows]
        stats = [mean_std(v) for v in vals]
        means = [m for m, _ in stats]
        errs = [s or 0.0 for _, s in stats]
        bars = ax.bar(x + offset, means, 0.4, yerr=errs, capsize=3, label=label, color=colour)
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)  # a 0 % bar is otherwise blank
        top = max([top] + [m + e for m, e in zip(means, errs, strict=True)])
    ax.set_xticks(x, [f"{task_title(t)}\n({len(w)} seed{'s' * (len(w) > 1)})"
                      for t, w, _ in rows])
    ax.set_ylim(0, max(10.0, 1.2 * top))
    ax.set_ylabel("exact (%)")
    ax.set_title("Figure 5 — trained policy with vs. without\ncontext tokens C (default team, "
                 "end of training)\nbar: mean over seeds; whisker: ± sample std", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, out_dir / "figure5_context.png")


def figure6(runs: list[Run], out_dir: Path) -> Path | None:
    """Figure 6: validation exact vs. number of latent queries m (default team)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    plotted, top = False, 0.0
    for i, task in enumerate(tasks_of(runs)):
        xs, ys, es, ns, dots = [], [], [], [], []
        for m in LATENTS:
            acc = [r.exact for r in select(runs, task=task, method=OURS, team="default",
                                           pooling=DEFAULT_POOLING, latents=m)
                   if r.status == "done" and r.exact is not None]
            if acc:
                mean, std = mean_std(acc)
                xs.append(m)
                ys.append(mean)
                es.append(std or 0.0)
                ns.append(len(acc))
                dots += [(m, a) for a in acc]
        if len(xs) < 2:
            continue
        plotted = True
        color = plt.get_cmap("Dark2")(i)
        # each seed too: m cells may run on fewer seeds than m = 8, and a claim that reads
        # them on their shared seeds should be checkable against the figure
        ax.scatter(*zip(*dots, strict=True), s=14, facecolors="none", alpha=0.7,
                   edgecolors=color, zorder=3)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color,
                    label=f"{task_title(task)} ({min(ns)}–{max(ns)} seeds)"
                    if min(ns) != max(ns) else
                    f"{task_title(task)} ({ns[0]} seed{'s' * (ns[0] > 1)})")
        top = max([top] + [y + e for y, e in zip(ys, es, strict=True)])
    if not plotted:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_xticks(LATENTS, [str(m) for m in LATENTS])
    ax.axvline(8, color="grey", ls=":", lw=1, label="paper's default m = 8")
    ax.set_ylim(0, max(10.0, 1.15 * top))
    ax.set_xlabel("number of latent queries m (log scale)")
    ax.set_ylabel("exact (%)")
    ax.set_title("Figure 6 — exact vs. number of latents m\n"
                 "(default team; mean ± sample std over seeds, circles: each seed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_dir / "figure6_latents.png")


def all_figures(runs: list[Run], out_dir: Path, latents: int = 8) -> dict[str, list[Path]]:
    """Write every figure the runs allow; returns {"figure4": [...], "figure5": [...], ...}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    f5, f6 = figure5(runs, out_dir, latents), figure6(runs, out_dir)
    return {"figure4": figure4(runs, out_dir, latents),
            "figure5": [f5] if f5 else [], "figure6": [f6] if f6 else []}
