"""``musketeers tasks list|show``: what a task holds, and how it can be gamed, before training."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from musketeers.cache.errors import UserError

SHOW_LIMIT = 4_000  # the validation split's size
AllowOpt = Annotated[bool, typer.Option(
    "--allow-unadmitted-reward",
    help="go on although a dataset's reward fails admission (gold scores 0, a forgery pays)")]

tasks_app = typer.Typer(help="Inspect tasks before training.", no_args_is_help=True)


@tasks_app.command("list")
def list_tasks() -> None:
    """The named tasks (packaged task files), their levels and datasets; rg:NAME and FILE.yaml."""
    import textwrap

    from musketeers.tasks import PROMPT_STYLES, TASKS
    from musketeers.tasks.task_files import packaged, packaged_dir, packaged_files, rg_datasets

    def names(members) -> str:
        return ", ".join(d.name for d in members)

    own = {"gsm8k": "the official GSM8K split (local jsonl)",
           "gsm_symbolic": "Reasoning Gym's gsm_symbolic alone",
           "planted": "the synthetic planted-expert check"}
    for base in TASKS:
        if base not in packaged_files():
            typer.echo(f"{base}: ({own.get(base, 'own generator')})")
            continue
        spec = packaged(base)
        typer.echo(f"{base}: {names(spec.datasets)}")
        for level, members in spec.levels.items():
            typer.echo(f"  {base}:{level}: {names(members)}")
    typer.echo(f"  (task files in {packaged_dir()})")
    every = rg_datasets()
    typer.echo(f"rg:NAME: any of Reasoning Gym's {len(every)} datasets at its defaults, "
               "e.g. rg:chain_sum@direct:")
    typer.echo(textwrap.fill(", ".join(every), width=100, initial_indent="  ",
                             subsequent_indent="  "))
    typer.echo("FILE.yaml[:LEVEL]: a task file in Reasoning Gym's composite form "
               "(name, prompt, datasets: [{name, weight, config}])")
    typer.echo(f"prompt styles (@STYLE): {', '.join(PROMPT_STYLES)}")


@tasks_app.command("show")
def show(
    task: Annotated[str, typer.Argument(
        help="a task: arithmetic:easier@direct, rg:NAME or FILE.yaml")],
    limit: Annotated[int, typer.Option(help="validation items to measure")] = 400,
    examples: Annotated[int, typer.Option(help="example questions per dataset")] = 2,
    allow_unadmitted_reward: AllowOpt = False,
) -> None:
    """Per source dataset of the validation items: share, examples, answer length, duplicates,
    items without a gold answer, the two shortcuts' exact and the forgery battery; then the
    task's admission (refused in one line, after the table, when its reward fails it)."""
    from rich.table import Table

    from musketeers.cache.progress import console as rich_console
    from musketeers.tasks import build_items, check_task
    from musketeers.tasks.admission import admit
    from musketeers.tasks.forgeries import measure

    check_task(task)
    if not 1 <= limit <= SHOW_LIMIT:  # the work grows with it: bounded before any is done
        raise UserError(f"--limit must be 1..{SHOW_LIMIT} validation items, got {limit}")
    if not 0 <= examples <= SHOW_LIMIT:
        raise UserError(f"--examples must be 0..{SHOW_LIMIT}, got {examples}")
    items = build_items(task, "val", limit)
    console = rich_console()
    questions = Counter(it.question for it in items)
    table = Table(title=f"{task}: {len(items)} validation items")
    for col in ("dataset", "share", "answer chars", "duplicates", "no gold", "constant",
                "constant exact", "copy exact", "worst forgery (score)", "shortcut score"):
        table.add_column(col)
    reports = measure(items)
    for r in reports:
        group = [it for it in items if it.source == r.source]
        lengths = [len(it.answer) for it in group if it.answer is not None]
        name, worst = r.worst_forgery
        table.add_row(
            r.source, f"{100 * len(group) / len(items):.0f}%",
            f"{min(lengths, default=0)}-{max(lengths, default=0)}",
            str(sum(questions[it.question] > 1 for it in group)),
            str(sum(it.answer is None for it in group)), repr(r.constant)[:24],
            f"{100 * r.constant_exact:.1f}%", f"{100 * r.copy_exact:.1f}%",
            f"{name} {worst:.2f}" if name else "—", f"{r.shortcut_baseline:.2f}")
    console.print(table)
    for r in reports:
        for it in [it for it in items if it.source == r.source][:examples]:
            q = " ".join(it.question.split())
            console.print(f"[bold]{r.source}[/bold]: {q[:300]} → {it.answer!r}")
    worst = max((r.worst_forgery[1] - r.shortcut_baseline for r in reports), default=0.0)
    if worst > 1e-9:
        console.print(f"[red]a forgery beats the shortcut baseline by {worst:.2f}[/red]")
    verdicts = admit(task, allow_unadmitted_reward)
    failed = [v.dataset for v in verdicts if v.failure]
    console.print(f"admission: {'not admitted: ' + ', '.join(failed) if failed else 'admitted'}"
                  f" ({len(verdicts)} datasets checked)")


@tasks_app.command("headroom")
def headroom(
    task: Annotated[list[str], typer.Option("--task", help="a task with a store; repeat it")],
    policy: Annotated[str, typer.Option(help="the policy: a registry name or alias")],
    team: Annotated[str | None, typer.Option(help="named team (its experts' hints)")] = None,
    roster: Annotated[str, typer.Option(help="pocket, paper or tiny")] = "pocket",
    experts: Annotated[str | None, typer.Option(help="comma-separated expert names")] = None,
    limit: Annotated[int, typer.Option(help="validation items per task")] = 64,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", help="stores root (env MUSKETEERS_CACHE_DIR; ./stores)")] = None,
    out: Annotated[Path, typer.Option(help="where the table goes")] = Path("reports/headroom"),
    append: Annotated[bool, typer.Option(
        help="keep the rows already in OUT (another pairing's); a task and policy measured "
             "again replace their row")] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    warmup_grid: Annotated[Path | None, typer.Option(
        help="also measure the policy after this grid's supervised warm-up, as its Single arm "
             "gets it (needs the store's train split); without it: not measured")] = None,
) -> None:
    """Where can an expert help, before training: per task, the shortcuts, the policy's
    greedy exact (untrained, and after a grid's warm-up with --warmup-grid), each expert's own
    exact and answer probes, and the headroom (the share of items an expert answers right
    where the policy is wrong), against the untrained and the warmed-up policy."""
    from rich.table import Table

    from musketeers.cache.progress import console as rich_console
    from musketeers.reports.headroom import measure_task, warmup_config
    from musketeers.reports.headroom_report import (
        RESULT_FILE,
        cells,
        columns,
        experts_of,
        read_rows,
        write_report,
    )
    from musketeers.run.features import cache_root
    from musketeers.tasks import check_task
    from musketeers.teams import resolve_team

    for t in task:
        check_task(t)
    if not 1 <= limit <= SHOW_LIMIT:
        raise UserError(f"--limit must be 1..{SHOW_LIMIT} validation items, got {limit}")
    names = [e.strip() for e in experts.split(",") if e.strip()] if experts else None
    specs = [s.name for s in resolve_team(team, roster, names) if not s.oracle]
    if not specs:
        raise UserError("no real expert to measure: pass --team or --experts")
    root = cache_root(cache_dir)
    warmups = {t: warmup_config(warmup_grid, t, policy, root, device) if warmup_grid else None
               for t in task}  # a bad grid is named before any model loads
    rows = [measure_task(t, policy, specs, root, limit, device=device, warmup=warmups[t])
            for t in task]
    if append and (out / RESULT_FILE).is_file():
        mine = {(r.task, r.policy) for r in rows}
        rows = [r for r in read_rows(out / RESULT_FILE) if (r.task, r.policy) not in mine] + rows
    table = Table(title=f"headroom: % of each task's first {limit} validation items")
    for col in columns(rows):
        table.add_column(col)
    for r in rows:
        table.add_row(*cells(r, experts_of(rows)))
    rich_console().print(table)
    for path in write_report(rows, out):
        typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
