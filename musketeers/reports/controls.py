"""The control cells every claim for Ours is read against (musketeers.method.methods): its
shuffled-experts control for exact, its shuffled-reward control for the regime and the
reward, and the seed spread a one-seed cell is weighed against."""

from __future__ import annotations

import math

from musketeers.reports.aggregate import Cell, Run, cell
from musketeers.reports.paired import paired_cells
from musketeers.reports.tables import (
    DEFAULT_LATENTS,
    DEFAULT_POOLING,
    DEFAULT_TEAM,
    EXACT_CONTROL,
    ROUTING_CONTROL,
)
from musketeers.reports.verdicts import SeedSpread
from musketeers.tasks.variants import task_title


def reward_control(runs: list[Run], task: str, latents: int) -> Cell:
    """Ours' (default team) shuffled-reward control on ``task``: the regime's and the
    reward's control alike."""
    return cell(runs, task=task, pooling=DEFAULT_POOLING, latents=latents,
                **{**DEFAULT_TEAM, "method": ROUTING_CONTROL})


def exact_control(runs: list[Run], task: str, latents: int) -> Cell:
    """Ours' (default team) shuffled-experts control on ``task``: every exact claim's."""
    return cell(runs, task=task, pooling=DEFAULT_POOLING, latents=latents,
                **{**DEFAULT_TEAM, "method": EXACT_CONTROL})


def seed_spread(runs: list[Run], task: str, latents: int = DEFAULT_LATENTS
                ) -> SeedSpread | None:
    """The noise a one-seed cell (Table 2's, Figure 6's, a baseline's) has beyond its items':
    the spread of Ours' per-seed differences from its shuffled-experts control, the
    several-seed pair most like a one-seed variant of Ours against Ours. None without ≥ 2
    seeds of both."""
    p = paired_cells(cell(runs, task=task, pooling=DEFAULT_POOLING, latents=latents,
                          **DEFAULT_TEAM), exact_control(runs, task, latents))
    if p is None or p.seed_se is None:
        return None
    return SeedSpread(p.seed_se * math.sqrt(p.runs),
                      f"Ours against shuffled experts on {task_title(task)} over {p.runs} seeds")
