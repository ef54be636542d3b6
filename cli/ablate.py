"""``musketeers ablate`` (``make ablations``): grids → runs → tables, figures, report."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from musketeers.cache.errors import UserError
from musketeers.cli.tasks import AllowOpt

log = logging.getLogger("musketeers.ablate")


def _int_list(text: str | None, what: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--{what} takes comma-separated integers, e.g. 0,1,2; got {text!r}"
                        ) from None


def ablate(
    budget: Annotated[str, typer.Option(help="smoke, pocket or paper")] = "smoke",
    seeds: Annotated[str | None, typer.Option(help="comma-separated seeds (grid's default)")
                     ] = None,
    tasks: Annotated[str | None, typer.Option(help="comma-separated tasks (all of the grid)")
                     ] = None,
    runs_dir: Annotated[Path, typer.Option(help="where run folders go")] = Path("runs"),
    reports_dir: Annotated[Path, typer.Option(help="reports/<budget>/ is written here")
                           ] = Path("reports"),
    cache_dir: Annotated[Path | None, typer.Option(help="stores root for every run "
                                                   "(default: the grid's)")] = None,
    gsm8k_dir: Annotated[Path | None, typer.Option(help="GSM8K jsonl folder (precompute)")
                         ] = None,
    grid: Annotated[Path | None, typer.Option(help="a custom grid YAML instead of --budget's")
                    ] = None,
    report_only: Annotated[bool, typer.Option(help="only rebuild the report from runs on disk")
                           ] = False,
    hours: Annotated[float | None, typer.Option(
        min=0, help="start no run that would end past this many hours (judged by the longest "
        "run so far); the rest waits for the next invocation")] = None,
    list_runs: Annotated[bool, typer.Option("--list", help="print the grid's run names (the "
                                            "shard's with --shard), one per line, in run "
                                            "order, and stop")] = False,
    shard: Annotated[str | None, typer.Option(
        help="K/N: run worker K of N's share of the grid (runs i with i % N == K-1), publish "
        "it, and leave the report to `--report-only` once every worker is done")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="the policy's dtype in every run: auto (native: bf16 where the CPU computes it), "
        "bfloat16 or float32; another than the grid's makes its own grid (NAME-DTYPE: runs and "
        "report apart), and the report compares a method with its control only in one dtype")
                     ] = None,
    precompute_only: Annotated[bool, typer.Option(
        help="fill the stores the grid needs, then stop (once, before sharded workers start: "
        "they would contend for the stores' writer locks)")] = False,
    allow_unadmitted_reward: AllowOpt = False,
) -> None:
    """Precompute what is missing, run every unfinished run of the grid, evaluate, report.
    Exits 1 when any run failed (its error.txt says why; the next invocation retries it)."""
    from musketeers.design.gridspec import load_grid
    from musketeers.grid.expert_scores import publish_expert_scores
    from musketeers.grid.ledger import ledger_path
    from musketeers.grid.needs import ensure_cache
    from musketeers.grid.pack import opened, pack_of
    from musketeers.grid.publish import (
        adopt_published,
        publish_finished,
        publish_runs,
        same_pack,
        set_aside_published,
    )
    from musketeers.grid.run import run_grid
    from musketeers.grid.shard import parse_shard
    from musketeers.grid.shard import shard as take_shard
    from musketeers.grid.walltime import wall_time_lines
    from musketeers.reports.report import report_dir, write_report

    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    if task_list:
        from musketeers.tasks import check_task

        for t in task_list:
            check_task(t)
    overrides = {"cache_dir": str(cache_dir)} if cache_dir else {}
    if dtype is not None:
        from musketeers.cache.devices import resolve_dtype

        resolve_dtype(dtype, "cpu")  # an unknown dtype: one line naming the valid ones
        overrides["dtype"] = dtype
    g = load_grid(grid or budget, seeds=_int_list(seeds, "seeds"), tasks=task_list,
                  overrides=overrides or None)
    if dtype is not None and dtype != g.defaults.get("dtype"):
        g.name = f"{g.name}-{dtype}"  # never the grid's own runs, ledger or report
        g.runs = [replace(run, name=f"{run.name}-{dtype}") for run in g.runs]
    part = parse_shard(shard) if shard is not None else None
    if part is not None and report_only:
        raise UserError("--report-only builds the whole grid's report; drop --shard")
    if part is not None:
        g = take_shard(g, *part)
    if list_runs:
        for run in g.runs:
            typer.echo(run.name)
        return
    from musketeers.cache.untrusted import confine

    # a report folder symlinked out of --reports-dir would take the published runs with it
    published = confine(report_dir(reports_dir, g), reports_dir, what="report folder") / "runs"
    failed: dict[str, str] = {}
    if not report_only:  # a reward that fails admission is refused before any store or run
        from musketeers.tasks.admission import admit

        for task in dict.fromkeys(str(run.fields.get("task")) for run in g.runs):
            admit(task, allow_unadmitted_reward)
    if precompute_only:
        ensure_cache(g, g.precompute, gsm8k_dir=gsm8k_dir, ledger=ledger_path(runs_dir, g.name))
        publish_expert_scores(g, runs_dir, published)
        typer.echo(f"stores ready for the {len(g.runs)} runs of grid {g.name}")
        return
    if not report_only:
        adopted = adopt_published(g, runs_dir, published)
        if adopted:
            typer.echo(f"{len(adopted)} finished runs adopted from {pack_of(published)} (earlier "
                       "invocations' published results); the grid goes on from there")
        ledger = ledger_path(runs_dir, g.name)
        ensure_cache(g, g.precompute, gsm8k_dir=gsm8k_dir, ledger=ledger)
        publish_expert_scores(g, runs_dir, published)  # the report's headroom after training

        def publish(run, run_dir: Path) -> None:  # each run as it ends: the machine may not
            publish_finished(g, run_dir, runs_dir, published)

        result = run_grid(g, runs_dir, ledger=ledger, on_done=publish, hours=hours,
                          on_stale=lambda name, kept: set_aside_published(published, name,
                                                                          kept.name))
        typer.echo(f"{len(result.trained)} trained, {len(result.evaluated)} evaluated, "
                   f"{len(result.skipped)} already done, {len(result.failed)} failed"
                   + (f", {len(result.stale)} stale (set aside under {runs_dir / 'stale'} "
                      "and run again)" if result.stale else "")
                   + (f"; {len(result.left)} left for the next invocation (--hours {hours:g})"
                      if result.left else ""))
        failed = result.failed
    if part is not None:  # the other workers' runs are not here yet
        copied = publish_runs(g, runs_dir, published)
        typer.echo(f"shard {shard}: the artefacts of {len(copied)} finished runs in "
                   f"{pack_of(published)}; once every worker is done: musketeers ablate "
                   f"{'--grid ' + str(grid) if grid else '--budget ' + budget} --report-only "
                   f"--runs-dir {published}")
    else:
        with opened(runs_dir) as folder:  # the published runs' pack, when named
            path = write_report(g, folder, reports_dir, wall_time=wall_time_lines(g, folder),
                                shown=runs_dir)
        if same_pack(runs_dir, path.parent / "runs"):  # rebuilt from the published runs
            typer.echo(f"report: {path} (rebuilt from the published runs in "
                       f"{pack_of(path.parent / 'runs')})")
        else:
            copied = publish_runs(g, runs_dir, path.parent / "runs")
            typer.echo(f"report: {path} (with the artefacts of {len(copied)} finished runs "
                       f"in {pack_of(path.parent / 'runs')}: commit {path.parent} to publish "
                       "the result)")
    _exit_on_failures(failed, runs_dir)


def _exit_on_failures(failed: dict[str, str], runs_dir: Path) -> None:
    """A grid with a failed run did not do what it was asked: exit 1, naming each failure
    (the next invocation retries them)."""
    if not failed:
        return
    for name, line in failed.items():
        typer.echo(f"FAILED {name}: {line} (see {runs_dir / name / 'error.txt'})", err=True)
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("ablate")(ablate)
