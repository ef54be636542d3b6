"""``musketeers tasks list|show``: what a task holds, and how it can be gamed, before training."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import typer

tasks_app = typer.Typer(help="Inspect tasks before training.", no_args_is_help=True)


@tasks_app.command("list")
def list_tasks() -> None:
    """The named tasks, their levels and prompt styles, and each one's datasets."""
    from musketeers.tasks import FAMILIES, PROMPT_STYLES, TASKS
    from musketeers.tasks.variants import LEVELS

    for base in TASKS:
        datasets = ", ".join(name for name, *_ in FAMILIES.get(base, ())) or "(own generator)"
        typer.echo(f"{base}: {datasets}")
        for level, fams in LEVELS.items():
            if base in fams:
                typer.echo(f"  {base}:{level}: {', '.join(n for n, _ in fams[base])}")
    typer.echo(f"prompt styles (@STYLE): {', '.join(PROMPT_STYLES)}")


@tasks_app.command("show")
def show(
    task: Annotated[str, typer.Argument(help="a task name, e.g. arithmetic:easier@direct")],
    limit: Annotated[int, typer.Option(help="validation items to measure")] = 400,
    examples: Annotated[int, typer.Option(help="example questions per dataset")] = 2,
) -> None:
    """Per source dataset of the validation items: share, examples, answer length, duplicates,
    items without a gold answer, the two shortcuts' exact and the forgery battery."""
    from rich.table import Table

    from musketeers.cache.progress import console as rich_console
    from musketeers.tasks import build_items, check_task
    from musketeers.tasks.forgeries import measure

    check_task(task)
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


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
