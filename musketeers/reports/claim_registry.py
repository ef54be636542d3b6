"""Every finding of the paper the report tests, declared once as data: what it says, the cells
it reads (by their keys, never by a table's display label), the control it is stated against,
and its test. The report states them in this order (``paper_claims``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from musketeers.reports.ablation_claims import context_claims, latents_claim, pooling_claim
from musketeers.reports.aggregate import Run
from musketeers.reports.claims import (
    BASELINES,
    SINGLE_KEY,
    baseline_claims,
    learns_claim,
    logic_best_claim,
    ours_beats_single_claims,
    reward_claim,
)
from musketeers.reports.learning import rl_moves_claim
from musketeers.reports.routing_claims import PAPER_CHANNEL, ours_channels, routing_claims
from musketeers.reports.tables import (
    DEFAULT_TEAM,
    EXACT_CONTROL,
    ROUTING_CONTROL,
    tasks_of,
)


@dataclass(frozen=True)
class Scope:
    """What every claim's test is given: the runs, the grid's m, and the families the grid
    runs at all (None: any), so a claim on a family it leaves out says so."""

    runs: list[Run]
    latents: int
    families: set[str] | None = None


@dataclass(frozen=True)
class Claim:
    name: str
    says: str  # the finding, as the paper states it
    reads: tuple[dict[str, Any], ...]  # the cells' keys (besides task, pooling and latents)
    control: str | None  # the method (musketeers.method.methods) it is stated against; None: none
    test: Callable[[Scope], list[str]]  # the claim's lines in the report


def _per_task(one: Callable[[list[Run], str, int], str | None]) -> Callable[[Scope], list[str]]:
    """A claim tested on every family it applies to (``one`` returns None where it does not)."""
    return lambda s: [c for t in tasks_of(s.runs) if (c := one(s.runs, t, s.latents)) is not None]


def _routing(s: Scope) -> list[str]:
    """§4.3 on every family and channel where Ours ran (Arithmetic's pooled vectors, the
    paper's, when none did)."""
    where = [(t, on) for t in tasks_of(s.runs) for on in ours_channels(s.runs, t, s.latents)]
    return [line for t, on in where or [("arithmetic", PAPER_CHANNEL)]
            for line in routing_claims(s.runs, t, s.latents, on)]


CLAIMS: tuple[Claim, ...] = (
    Claim("regime", "training raises Single's exact above the untrained policy's",
          (SINGLE_KEY, {"method": "untrained"}), ROUTING_CONTROL, _per_task(learns_claim)),
    Claim("rl_moves", "GRPO raises Single's training reward over its steps",
          (SINGLE_KEY,), None, _per_task(rl_moves_claim)),
    Claim("reward", "reward, not the updates themselves, raises Ours",
          (DEFAULT_TEAM,), ROUTING_CONTROL, _per_task(reward_claim)),
    Claim("ours_beats_single", "§4.2: Ours (Default Team) beats Single on Arithmetic",
          (DEFAULT_TEAM, SINGLE_KEY), EXACT_CONTROL,
          lambda s: ours_beats_single_claims(s.runs, s.latents)),
    Claim("logic_single_best", "§4.2: on Logic, Single is the best method",
          (SINGLE_KEY,), None, lambda s: logic_best_claim(s.runs, s.latents, s.families)),
    Claim("baselines", "Table 1: Ours (Default Team) beats hard routing and no cross-attention",
          (DEFAULT_TEAM, *({"method": b, "team": "default"} for b in BASELINES)),
          EXACT_CONTROL, lambda s: baseline_claims(s.runs, s.latents)),
    Claim("routing", "§4.3: routing entropy falls, utilisation concentrates, ρ(reward, H) < 0",
          (DEFAULT_TEAM,), ROUTING_CONTROL, _routing),
    Claim("pooling", "§4.4: first-token pooling is comparable to last-token pooling",
          ({**DEFAULT_TEAM, "pooling": "first_token"}, {**DEFAULT_TEAM, "pooling": "last"}),
          EXACT_CONTROL, lambda s: [pooling_claim(s.runs, s.latents)]),
    Claim("context", "§4.4 / Figure 5: C raises reward and held-out exact",
          (DEFAULT_TEAM,), EXACT_CONTROL, lambda s: context_claims(s.runs, s.latents)),
    Claim("latents", "§4.4 / Figure 6: exact on Arithmetic peaks at m = 8",
          (DEFAULT_TEAM,), EXACT_CONTROL, lambda s: [latents_claim(s.runs)]),
)


def paper_claims(runs: list[Run], latents: int, families: set[str] | None = None
                 ) -> list[str]:
    """The paper's findings, each tested on our runs (exact, in %): the regime check (does
    Single learn at all?) and the reward check (does reward, not the updates, raise Ours?)
    first, then every claim of ``CLAIMS`` in its order."""
    scope = Scope(runs, latents, families)
    return [line for claim in CLAIMS for line in claim.test(scope)]
