"""``musketeers demo oracle`` (C from an oracle expert against its shuffled control, on real
pocket models) and ``musketeers demo planted`` (the planted-expert check)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from musketeers.cache.errors import UserError

demo_app = typer.Typer(help="Self-contained demonstrations.", no_args_is_help=True)


@demo_app.command("planted")
def planted(
    seeds: Annotated[str | None, typer.Option(
        help="comma-separated seeds, at least 3 for a verdict (default: the variant's, "
        "musketeers.checks.planted.MARGINS)")] = None,
    steps: Annotated[int | None, typer.Option(
        help="GRPO steps per run (default: the variant's, musketeers.checks.planted.MARGINS, "
        "which the check's margins are sized for)")] = None,
    workdir: Annotated[Path | None, typer.Option(
        help="where the synthetic store and runs go (default: a temporary folder)")] = None,
    variant: Annotated[str, typer.Option(
        help="plain: one-token answers, β = 0, no chat template; chat: a chat template, "
        "multi-token answers and β > 0 (musketeers.checks.planted_chat)")] = "plain",
) -> None:
    """Train a tiny policy on a store where only one expert knows the answer.

    With C (perceiver) the reward must rise above chance (0.1) by more than in its
    shuffled_reward control on every seed, and over the seeds the informative expert's
    utilisation must rise and ρ(reward, H) fall by more than in the control, beyond a paired
    t test over the seeds; without C (single) it stays at chance.
    """
    from musketeers.checks.planted import (
        CONTROL,
        MARGINS,
        VARIANTS,
        check_rows,
        paired_verdicts,
        print_table,
        run_planted,
    )

    if variant not in VARIANTS:
        raise UserError(f"--variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    steps = MARGINS[variant].steps if steps is None else steps
    if seeds is None:
        seeds = ",".join(map(str, MARGINS[variant].seeds))

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    if not seed_list or steps < 2:
        raise UserError("--seeds needs at least one seed and --steps at least 2")
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        rows = run_planted(seed_list, steps, workdir or Path(tmp), variant=variant)
    print_table(rows)
    # every verdict with its measured margin, passed or not: how far it is from its noise
    for v in paired_verdicts(rows, MARGINS[variant]):
        typer.echo(f"Ours − {CONTROL}, {v.line()}")
    failed = check_rows(rows)
    for line in failed:
        typer.echo(f"FAILED: {line}")
    if failed:
        raise typer.Exit(1)
    typer.echo(f"planted-expert check ({variant}) passed on seeds {seeds}")


@demo_app.command("oracle")
def oracle(
    task: Annotated[str, typer.Option(help="a short-answer task the policy cannot compute")] = "",
    team_file: Annotated[Path | None, typer.Option(
        help="the oracle's team file (default: musketeers/checks/oracle_demo.team.yaml)")] = None,
    policy: Annotated[str, typer.Option(help="the policy model")] = "",
    limit: Annotated[int | None, typer.Option(help="items per split precomputed")] = None,
    warmup: Annotated[int | None, typer.Option(help="supervised warm-up steps per arm")] = None,
    steps: Annotated[int | None, typer.Option(help="GRPO steps per arm")] = None,
    eval_items: Annotated[int | None, typer.Option(help="validation items both arms are "
                                                   "graded on")] = None,
    seed: Annotated[int, typer.Option(help="the seed both arms share")] = 0,
    pooling: Annotated[str, typer.Option(
        help="which of the oracle's stored vectors C reads (default: layer:12)")] = "",
    cache_dir: Annotated[Path | None, typer.Option(
        help="stores root (env MUSKETEERS_CACHE_DIR; ./stores)")] = None,
    runs: Annotated[Path, typer.Option(help="where the two runs go")] = Path("runs"),
) -> None:
    """Ours with C from an oracle expert against its shuffled-experts control, same seed.

    Defaults (musketeers.checks.oracle_demo): SmolLM2-135M policy on count_bits over 1-255, a
    SmolLM2 oracle that reads the gold answer; prints each arm's exact on the same validation
    items, the paired difference with its 95 % interval, and the best constant answer's exact.
    Re-running with the same settings reuses the runs.
    """
    import time

    from musketeers.checks import oracle_demo as od

    start = time.monotonic()
    kw = dict(task=task or od.TASK, team_file=team_file or od.TEAM_FILE,
              policy=policy or od.POLICY, limit=od.LIMIT if limit is None else limit,
              warmup=od.WARMUP if warmup is None else warmup,
              steps=od.STEPS if steps is None else steps,
              eval_items=od.EVAL_ITEMS if eval_items is None else eval_items)
    comparison, const = od.run_demo(**kw, seed=seed, cache_dir=cache_dir, runs=runs,
                                    pooling=pooling or od.POOLING)
    for line in od.report(comparison, const, task=kw["task"], warmup=kw["warmup"],
                          steps=kw["steps"], seed=seed, policy=kw["policy"],
                          minutes=(time.monotonic() - start) / 60):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.add_typer(demo_app, name="demo")
