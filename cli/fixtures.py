"""``musketeers fixtures``: the small committed stores under tests/fixtures/ (``make fixtures``).

Tiny seeded random experts over ~32 train / 16 val items per task, every pooling, router
embeddings and short hints. They are built and fingerprint-checked like real stores, so a
re-run skips what is complete and refuses what no longer matches (use --force to rebuild).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

FIXTURE_TASKS = ("arithmetic", "algorithmic", "logic", "gsm8k", "gsm_symbolic")
SIZES = {"train": 32, "val": 16}
HINT_TOKENS = 16  # fixture hints only exercise the plumbing; real runs use 128
CHUNK_ROWS = 16  # several chunks per split, so chunk logic is covered by the fixtures


def fixtures(
    out: Annotated[Path, typer.Option(help="where the stores go")] = Path("tests/fixtures"),
    gsm8k_dir: Annotated[Path | None, typer.Option(help="GSM8K jsonl folder")] = None,
    force: Annotated[bool, typer.Option(help="rebuild instead of refusing a mismatch")] = False,
) -> None:
    """Build the fixture stores from tiny random-weight experts."""
    import torch

    from musketeers.cache.precompute import PrecomputeConfig, precompute_task
    from musketeers.tasks import build_items, task_spec
    from musketeers.teams import TEAMS, resolve_team

    # Every member of every team's tiny roster, so each team trains on the fixtures.
    experts = list({s.name: s for t in TEAMS for s in resolve_team(t, "tiny")}.values())

    cfg = PrecomputeConfig(dtype=torch.float32, chunk_rows=CHUNK_ROWS, hints=True,
                           hint_tokens=HINT_TOKENS, force=force)
    for task in FIXTURE_TASKS:
        splits = {s: build_items(task, s, n, gsm8k_dir) for s, n in SIZES.items()}
        path = precompute_task(out, task, task_spec(task), splits, experts, cfg)
        typer.echo(f"{task}: {path}")


def register(app: typer.Typer) -> None:
    app.command("fixtures")(fixtures)
