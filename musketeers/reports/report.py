"""reports/<budget>/README.md: what was run, Tables 1–2, Figures 4–6, Spearman ρ, and where
our numbers agree or disagree with the paper's, computed rather than eyeballed."""

from __future__ import annotations

import os
import platform
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from musketeers.cache.untrusted import printable
from musketeers.design.gridspec import Grid
from musketeers.design.prereg import implicit
from musketeers.method.asked import share_percent
from musketeers.method.methods import ignored
from musketeers.reports.aggregate import METRICS, Run, load_runs
from musketeers.reports.by_source import by_source_markdown
from musketeers.reports.c_read import c_read_markdown
from musketeers.reports.claim_registry import paper_claims
from musketeers.reports.claims import cell_comparisons, routed
from musketeers.reports.figures import all_figures
from musketeers.reports.keys import group_key
from musketeers.reports.routing_claims import PAPER_SPEARMAN
from musketeers.reports.run_health import learning_signal
from musketeers.reports.series import mean_spearman
from musketeers.reports.tables import (
    DEFAULT_LATENTS,
    METRIC_TEXT,
    PAPER_METRIC,
    table1_markdown,
    table2_markdown,
    tasks_of,
)
from musketeers.reports.trained_headroom import headroom_markdown, read_scores
from musketeers.reports.verdict_table import verdict_markdown, verdict_rows
from musketeers.tasks.variants import task_title


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


def _halves(runs: list[Run], key: str) -> tuple[list[Any], list[Any]]:
    """``key`` as each trained run recorded it (inputs.json) and as each evaluated run did
    (eval.json), None where absent: the two halves of a run may run on different machines."""
    return ([(r.inputs or {}).get(key) for r in runs if r.summary is not None],
            [(r.eval or {}).get(key) for r in runs if r.eval is not None])


def _tally(labels: list[str], sep: str) -> str:
    """Each distinct label with how many runs carry it ("fp32 ×3, bf16 ×1"), or "—"."""
    return sep.join(f"{label} ×{k}" for label, k in sorted(Counter(labels).items())) or "—"


def _computed_in(runs: list[Run]) -> list[str]:
    """The dtype each half ran in, as resolved on its machine (inputs.json, eval.json): a
    config's `auto` is bf16 on one CPU and fp32 on another, so the config alone cannot say."""
    def count(dtypes: list[str | None]) -> str:
        return _tally([d or "not recorded" for d in dtypes], ", ")
    trained, scored = _halves(runs, "dtype")
    if not trained and not scored:
        return []
    asked = ", ".join(sorted({str(r.config.get("dtype", "auto")) for r in runs}))
    return [f"- Policy dtype as resolved where each half ran (runs): training {count(trained)}; "
            f"evaluation {count(scored)}; asked for in the configs: {asked}"]


def _machines(runs: list[Run]) -> list[str]:
    """Which CPU each half ran on, with its native bf16 and threads (inputs.json, eval.json,
    where recorded): a grid's runs are trained on whatever machine a night lends."""
    def name(m: dict[str, Any] | None) -> str:
        if not m:
            return "not recorded"
        isa = [label for label, key in (("avx512_bf16", "avx512_bf16"), ("AMX", "amx_bf16"))
               if m.get(key)]
        return (f"{m.get('cpu')} ({', '.join(isa) or 'no native bf16'}; "
                f"{m.get('threads')} threads)")

    def count(found: list[dict[str, Any] | None]) -> str:
        return _tally([name(m) for m in found], "; ")
    trained, scored = _halves(runs, "machine")
    if not any(trained + scored):
        return []
    return [f"- Machines (runs): training {count(trained)}; evaluation {count(scored)}"]


# the lines a report's runner adds on what its runs cost in wall time (the analysis reads no
# ledger itself); given the runs the report found
WallTime = Callable[[list[Run]], list[str]]


def _supervised_warmup(cfgs: list[dict]) -> list[str]:
    """The supervised warm-up before GRPO, when the runs had one: it is most of what the
    adapter learnt, so a reader must not take the GRPO rates above for the whole story."""
    seen = sorted({(int(c["adapter_warmup"]), c.get("adapter_warmup_batch"),
                    c.get("adapter_warmup_lr"), c.get("warmup_policy_lr"),
                    float(c.get("warmup_permute_share") or 0))
                   for c in cfgs if c.get("adapter_warmup")
                   and "adapter_warmup" not in ignored(c.get("method"))})
    def asked(share: float) -> str:
        return (f"; {share_percent(share)}% of its rows asked another of those rows' question "
                "(only C scores them)")
    return [f"- Supervised warm-up before GRPO (gold answers; Single's without C): {n} steps "
            f"of {b} items, adapter lr {a}, LoRA lr {p}" + (asked(f) if f else "")
            for n, b, a, p, f in seen]


def _what_was_run(grid: Grid, runs: list[Run], wall_time: WallTime | None) -> list[str]:
    cfgs = [r.config for r in runs]
    def values(key: str) -> str:  # over the runs whose method reads the field
        vals = sorted({str(c.get(key)) for c in cfgs if c.get(key) is not None
                       and key not in ignored(c.get("method"))})
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
        f"- Tasks: {values('task')} (a variant base:level@prompt fills its base task's column, "
        "and its cells are not compared with the paper's numbers); methods: "
        f"{values('method')}",
        f"- Answer extraction: {values('extraction')}; new tokens: {values('max_new_tokens')}; "
        f"G: {values('group_size')}",
        f"- Learning rates: LoRA {values('lr')}, adapter {values('adapter_lr')} (runs that "
        f"read C); β: {values('beta')}; learning-rate warm-up steps: "
        f"{values('warmup_steps')}",
        *_supervised_warmup(cfgs),
        *_computed_in(runs),
        *_machines(runs),
        f"- Seeds: {values('seed')}; training steps per run: "
        f"{', '.join(map(str, steps)) or '—'}",
        f"- Total training wall time (sum over runs): {wall:.0f} s ({wall / 3600:.2f} h)",
        *(wall_time(runs) if wall_time else []),
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


def _share(value: float | None) -> str:
    return _fmt(None if value is None else 100.0 * value, ".0f")


def _runs_table(runs: list[Run]) -> list[str]:
    # training: updates skipped (no signal), sampled completions cut off / with an answer,
    # mean reward, groups without signal (zero-std) and completion length (a policy that
    # stops at its first token shows here); then the greedy validation completions: answered
    # (a policy that never writes <answer> tags scores 0 whatever it knows), truncated, exact
    # and score. "unknown": an eval.json from before exact was counted.
    lines = ["| run | status | steps | wall time (s) | updates skipped | truncated in training "
             "(%) | answered in training (%) | train reward | groups without signal "
             "| completion (tokens) | answered (%) | truncated (%) | exact (%) | score (%) "
             "| ρ(reward, H) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        s = r.summary or {}
        wall = r.wall_time if r.metrics or r.summary else None
        exact = "unknown" if r.eval and r.exact is None else _fmt(r.exact, ".2f")
        lines.append(f"| {r.name} | {r.status.upper() if r.status == 'failed' else r.status} | "
                     f"{s.get('steps', '—')} | {_fmt(wall, '.0f')} | "
                     f"{_fmt(r.updates_skipped, 'd')} | "
                     f"{_share(r.metric_mean('truncated_frac'))} | "
                     f"{_share(r.metric_mean('answered_frac'))} | "
                     f"{_fmt(r.train_reward, '.3f')} | {_fmt(r.no_signal, '.0%')} | "
                     f"{_fmt(r.metric_mean('completion_len'), '.1f')} | "
                     f"{_fmt(r.eval_share('answered'), '.0f')} | "
                     f"{_fmt(r.eval_share('truncated'), '.0f')} | {exact} | "
                     f"{_fmt(r.score, '.2f')} | {_fmt(r.spearman, '+.2f')} |")
    return lines


def _old_evals(runs: list[Run]) -> list[str]:
    """Say which runs' exact is unknown: their eval.json predates it (its ``accuracy`` was
    the mean score, read as score)."""
    old = [r.name for r in runs if r.eval and r.exact is None]
    if not old:
        return []
    return [f"Exact is unknown for {len(old)} run{'s' * (len(old) != 1)} whose eval.json "
            "predates it ({}): their `accuracy` was the mean score and reads as score; "
            "evaluate them again (`musketeers eval`) for exact.".format(", ".join(old)), ""]


def shortcut_lines(grid: Grid, limit: int = 400) -> list[str]:
    """Each task of the grid beside what it gives away: the exact of the better shortcut (one
    constant answer, or copying the input) per source dataset, on its first validation items,
    so a method's exact is read against it (``musketeers tasks show`` has the details)."""
    from musketeers.tasks import build_items
    from musketeers.tasks.forgeries import measure

    tasks = sorted({str(r.fields.get("task")) for r in grid.runs if r.fields.get("task")})
    lines = []
    for task in tasks:
        try:
            reports = measure(build_items(task, "val", limit), forgeries=False)
        except Exception as exc:  # noqa: BLE001 - a task this machine cannot build (GSM8K files)
            lines.append(f"- `{task}`: shortcuts not measured ({type(exc).__name__})")
            continue
        n = sum(r.items for r in reports)
        overall = sum(r.shortcut_exact * r.items for r in reports) / n
        worst = max(reports, key=lambda r: r.shortcut_exact)
        lines.append(f"- `{task}`: a shortcut scores {100 * overall:.1f} % exact over {n} "
                     f"validation items (highest: {worst.source}, {100 * worst.shortcut_exact:.1f}"
                     " %)")
    if not lines:
        return []
    return ["Shortcut baselines (best of one constant answer and copying the input, per "
            "dataset):", "", *lines, ""]


# the published runs beside this report are one xz tarball (musketeers.grid.pack)
PACK_NOTE = ["Each run's artefacts are in `runs.tar.xz` beside this file. Unpack them all with "
             "`mkdir -p /tmp/runs && tar -xJf runs.tar.xz -C /tmp/runs`, print one file with "
             "`tar -xJOf runs.tar.xz RUN/eval.json`, list them with `tar -tJf runs.tar.xz`.", ""]


def report_dir(reports_dir: Path, grid: Grid) -> Path:
    """Where a grid's report (and its published runs, ``runs.tar.xz``) live: reports_dir/<name>
    (the budget unless the grid YAML names itself)."""
    return Path(reports_dir) / grid.name


def write_report(grid: Grid, runs_dir: Path, reports_dir: Path,
                 wall_time: WallTime | None = None, shown: Path | None = None) -> Path:
    """Write table1.md, table2.md, the figures and README.md under reports_dir/<budget>;
    ``wall_time`` adds the runner's wall-time lines (``musketeers.grid.walltime``); ``shown``
    is the runs folder the report names (default ``runs_dir``: another when the runs were
    unpacked from a pack into a temporary folder)."""
    out = report_dir(reports_dir, grid)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(Path(runs_dir), names=[g.name for g in grid.runs])
    latents = int(grid.defaults.get("latents", DEFAULT_LATENTS))
    # exact leads; the same tables for score follow
    t1 = {m: table1_markdown(runs, latents, m) for m in METRICS}
    t2 = {m: table2_markdown(runs, latents, m) for m in METRICS}
    # every cell may hold a value read from a run's files: control characters escaped
    (out / "table1.md").write_text(printable("\n".join(t1.values()), keep="\n"))
    (out / "table2.md").write_text(printable("\n".join(t2.values()), keep="\n"))
    figs = all_figures(runs, out, latents)
    # a figure an earlier report drew (e.g. from runs since set aside as stale) must not sit
    # beside this report as if it were current
    drawn = {p.name for paths in figs.values() for p in paths}
    for old in out.glob("figure*.png"):
        if old.name not in drawn:
            old.unlink()
    prereg = grid.prereg or implicit(grid.seeds)
    title = f"`{grid.budget}`" + (f" (grid `{grid.name}`)" if grid.name != grid.budget else "")
    md = [f"# Ablations — budget {title}", "", "## Verdicts", "",
          *verdict_markdown(verdict_rows(runs, list(tasks_of(runs)), latents,
                                         prereg=prereg), prereg), "",
          *shortcut_lines(grid), "## What was run", "",
          *_what_was_run(grid, runs, wall_time), "",
          f"Two metrics of the greedy validation completions: {METRIC_TEXT['exact']}, and "
          f"{METRIC_TEXT['score']}; {PAPER_METRIC}. ± is the sample standard deviation "
          "(ddof = 1) over seeds.", "", *_old_evals(runs),
          "## Table 1", "", t1["exact"], "## Exact by source dataset", "",
          *by_source_markdown(runs, latents),
          *headroom_markdown(runs, read_scores(Path(runs_dir), grid.name)),
          *c_read_markdown(runs),
          "## Table 2", "", t2["exact"],
          "## Tables 1 and 2 by score", "", t1["score"], t2["score"], "## Figures", ""]
    captions = {"figure4": "Figure 4 — utilisation, routing entropy and reward over training",
                "figure5": "Figure 5 — reward with vs. without C",
                "figure6": "Figure 6 — exact vs. number of latents m"}
    for key, caption in captions.items():
        if not figs[key]:
            md += [f"*{caption}: no runs with the data it needs.*", ""]
        for path in figs[key]:
            md += [f"![{caption}: {path.stem}]({path.name})", ""]
    md += ["## Spearman ρ(reward, routing entropy) per task", "",
           f"Computed per Perceiver run (Ours: every team, pooling and m; no control) over its "
           f"training trajectory, then averaged (paper: mean ρ = {PAPER_SPEARMAN} across "
           "tasks); the claims below state it against the shuffled-reward control.", ""]
    for task in tasks_of(runs):
        ours = [r for r in runs if r.key.get("task") == task  # a variant fills its family
                and routed(r) and r.status == "done"]
        rho, n = mean_spearman(ours)
        if rho is not None:
            rest = len(ours) - n
            text = f"ρ = {rho:+.2f} ({n} runs" + (
                f"; undefined in {rest} more with a constant series)" if rest else ")")
        elif ours:  # e.g. a random policy's reward is 0 at every step: ρ has no meaning
            text = (f"undefined in all {len(ours)} runs (reward or entropy constant over "
                    "training)")
        else:
            text = "— (no Perceiver run finished)"
        md.append(f"- {task_title(task)}: {text}")
    md += ["", "## Agreement with the paper", "",
           "Findings, in exact. \"Within noise\": the difference is at most 2 SE, no evidence "
           "either way. The SE is the paired difference's over the same items and seeds "
           "(Bernoulli bounds where completions were not kept; for one seed, the measured seed "
           "spread where larger). A claim whose control did not run is \"not evidence\".", "",
           *paper_claims(runs, latents, {group_key(r.fields)["task"] for r in grid.runs}), "",
           "Cells (ours: exact; the paper's: its accuracy):", "", *cell_comparisons(runs, latents),
           "", "## Runs", "", *PACK_NOTE, *_runs_table(runs), ""]
    failed = [r for r in runs if r.status == "failed"]
    missing = sorted({g.name for g in grid.runs} - {r.name for r in runs})
    md += ["## Failed runs", ""]
    md += [f"- `{r.name}`: {r.error} (full traceback: "
           f"`{Path(shown or runs_dir) / r.path.name / 'error.txt'}`)"
           for r in failed] or ["- none"]
    if missing:
        md += ["", "## Not run yet", "", *(f"- `{name}`" for name in missing)]
    path = out / "README.md"
    path.write_text(printable("\n".join(md) + "\n", keep="\n"))
    return path
