"""The run's expert team: its specs and the names its store is keyed by.

Kept apart from ``musketeers.run.build``, which loads models: the run folder's checks read the
team's names without importing the policy's libraries.
"""

from __future__ import annotations

from musketeers.config import TrainConfig
from musketeers.method.methods import Method
from musketeers.teams import run_team


def team_specs(cfg: TrainConfig) -> list:
    """The run's expert specs: --experts / --team-file replace the named team (which always
    has a default)."""
    return run_team(cfg.team, cfg.roster, cfg.experts, cfg.team_file)


def expert_names_for(cfg: TrainConfig, method: Method) -> list[str]:
    """The team's expert names (stores are keyed by them); none for a method that reads no
    expert (``single``)."""
    if not method.uses_experts:
        return []
    return [s.name for s in team_specs(cfg)]
