"""How a verdict is stated: whether a difference clears 2 standard errors of its noise, and
the one line a claim prints. Shared by every claim (musketeers.reports.claims) so that "within
noise" means one thing throughout the report."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from musketeers.reports.aggregate import Cell
from musketeers.reports.paired import paired_cells

NO_CONTROL = "no control run: not evidence"


@dataclass(frozen=True)
class SeedSpread:
    """How far apart two variants of Ours land on one training seed for reasons of the seed
    alone: the sample std of per-seed differences of two cells run on several seeds."""

    sd: float  # points
    source: str  # which cells it was measured on, for the clause


def within_noise(a: Cell, b: Cell, spread: SeedSpread | None = None) -> tuple[bool, str]:
    """Whether two cells differ by no more than their noise, and a clause saying by how much.

    Where both cells' runs kept their graded completions, the two are compared item by item
    on the same seeds (musketeers.reports.paired): |Δ| ≤ 2 SE of the paired difference, or of
    the per-seed differences where that is larger. On one shared seed there are no per-seed
    differences: ``spread`` (measured on other cells' seeds) stands in where it is larger.
    Otherwise |Δ| ≤ 2·sqrt(SE_a² + SE_b²), each SE the Bernoulli bound of ``Cell.item_se``:
    on 64 items a 3 % exact has SE ≈ 2.2 points, so one seed's 1–2 items of difference prove
    nothing either way.
    """
    if (p := paired_cells(a, b)) is not None:
        # one seed has no spread of its own: a measured one, where given and larger, stands in
        if p.runs == 1 and spread is not None and spread.sd > p.noise:
            return two_se_clause(a.mean, b.mean, spread.sd, "points", (
                f"one seed; SE from the seed spread of {spread.source}, sd {spread.sd:.2f} > "
                f"item SE {p.se:.2f}"))
        return two_se_clause(a.mean, b.mean, p.noise, "points", p.counts())
    se_a, se_b = a.item_se, b.item_se
    if se_a is None or se_b is None:
        return False, ""
    return two_se_clause(a.mean, b.mean, math.hypot(se_a, se_b), "points",
                         f"{a.items} and {b.items} graded items")


def two_se_clause(a: float, b: float, se: float, unit: str, counts: str) -> tuple[bool, str]:
    """Whether a − b is within 2 ``se`` (the standard error of the difference), and a
    clause saying so."""
    two_se = 2.0 * se
    diff = abs(a - b)
    # thousandths would print a difference and its 2 SE both as 0.001: show what tells them apart
    f = ".2f" if unit == "points" else (".3f" if max(diff, two_se) >= 0.01 else ".5f")
    size = f"{diff:{f}}" + (f" {unit}" if unit else "")
    if diff == 0:
        return True, f"no difference ({counts})"
    if diff > two_se:
        return False, f"Δ {size} > 2 SE = {two_se:{f}} ({counts})"
    return True, f"Δ {size} ≤ 2 SE = {two_se:{f}} ({counts})"


def claim_line(text: str, holds: bool | None, detail: str, noise: bool = False,
               verdict: str | None = None) -> str:
    """One bullet: the claim and its verdict in bold (``verdict`` overrides the holds/noise
    one), then why, one sub-bullet per clause."""
    if verdict is None:
        # a difference within noise is no finding either way, never a "holds" (nor equivalence)
        verdict = "cannot be checked (runs missing)" if holds is None else (
            f"no evidence either way ({'for' if holds else 'against'} it, within noise)" if noise
            else "holds here" if holds else "does NOT hold here")
    return bullet(f"{text}: **{verdict}**", clauses(detail))


def bullet(head: str, items: Iterable[str]) -> str:
    """A report bullet: ``head`` on its line, then one indented sub-bullet per item, so that a
    finding reads at a glance and its evidence stays one short line each."""
    return f"- {head}" + "".join(f"\n  - {c}" for c in items)


def clauses(detail: str) -> list[str]:
    """``detail`` cut at its top-level "; " (never inside parentheses): one short line each,
    so that a claim reads as a verdict and its evidence, not as one 600-character sentence."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(detail):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and detail.startswith("; ", i):
            out.append(detail[start:i])
            start = i + 2
    return [c.strip() for c in [*out, detail[start:]] if c.strip()]


def seeds_text(seeds: Iterable[int]) -> str:
    seeds = sorted(seeds)
    return f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"


def versus(ours: Cell, other: Cell, name: str, spread: SeedSpread | None = None
           ) -> tuple[bool, bool, str] | None:
    """Ours against one rival on the seeds both have: (ahead, within noise, clause), or None
    when they share no seed."""
    common = ours.seeds & other.seeds
    if not common:
        return None
    a, b = ours.on(common), other.on(common)
    noise, why = within_noise(a, b, spread)
    return a.mean > b.mean, noise, (f"vs {name} ({seeds_text(common)}): {a.mean:.2f} vs "
                                    f"{b.mean:.2f}" + (f", {why}" if why else ""))
