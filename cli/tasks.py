"""``musketeers tasks list|show``: what a task holds, and how it can be gamed, before training."""

from __future__ import annotations

from collections import Counter
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


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
