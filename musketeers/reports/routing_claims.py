"""§4.3's routing claims, each stated for Ours' default team against its shuffled-reward
control on the same seeds: that run takes as many updates on the same items, from the same
init, with each batch's rewards permuted, so routing that moves as much there moved without
reward. The noise is the spread over seeds (SE = std / √n); one seed gets no verdict.
Each channel Ours read (the paper's pooled vectors, or a token channel) gets its own claims,
against the control on the same channel."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from musketeers.cache.tokens import POOLED
from musketeers.config import DEFAULT_TOKEN_LAYER
from musketeers.reports.aggregate import Run, mean_std, spearman_reward_entropy
from musketeers.reports.keys import channel_fields, select
from musketeers.reports.tables import DEFAULT_POOLING, DEFAULT_TEAM, ROUTING_CONTROL
from musketeers.reports.verdicts import NO_CONTROL, claim_line, seeds_text, two_se_clause
from musketeers.tasks.variants import task_title

PAPER_SPEARMAN = -0.48
# the paper's channel as a cell names it: the pooled vectors
PAPER_CHANNEL: dict[str, Any] = channel_fields({"pooling": DEFAULT_POOLING})
# the routing's change over training, per run (aggregate.Run): (claim, Run attribute, the sign
# of "holds", how to say the two means). Signed, with four decimals: at the pocket budget the
# changes are thousandths of a nat, and "fell by -0.001" would read as a fall.
CHANGE_CLAIMS: tuple[tuple[str, str, int, str], ...] = (
    ("routing entropy falls over training", "entropy_drop", 1,
     "H at the start minus H at the end: {o:+.4f} nats in Ours, {c:+.4f} under shuffled "
     "reward"),
    ("expert utilisation concentrates over training", "concentration", 1,
     "max_i u_i at the end minus at the start: {o:+.4f} in Ours, {c:+.4f} under shuffled "
     "reward"),
)


def ours_channels(runs: list[Run], task: str, latents: int) -> list[dict[str, Any]]:
    """Every channel Ours (default team) read on ``task``, as its cells name it: the paper's
    pooled vectors first (another pooling is the pooling ablation's, not a channel), then
    each token channel at each layer it ran."""
    seen: list[dict[str, Any]] = []
    for r in select(runs, task=task, latents=latents, **DEFAULT_TEAM):
        on = {k: r.key.get(k) for k in PAPER_CHANNEL}
        if on not in seen and (on["channel"] != POOLED or on == PAPER_CHANNEL):
            seen.append(on)
    return sorted(seen, key=lambda on: (on != PAPER_CHANNEL, str(on["channel"]),
                                        on["token_layer"] or 0))


def _ours(on: dict[str, Any]) -> str:
    """Ours' name in a claim: the channel said wherever it is not the paper's."""
    if on == PAPER_CHANNEL:
        return "Ours (default team)"
    layer = on["token_layer"]
    at = "" if layer in (None, DEFAULT_TOKEN_LAYER) else f", layer {layer}"
    return f"Ours (default team, {on['channel']} channel{at})"


def routing_claims(runs: list[Run], task: str, latents: int,
                   on: dict[str, Any] = PAPER_CHANNEL) -> list[str]:
    """Every §4.3 claim on ``task`` through the channel ``on``: the routing's changes, then
    ρ(reward, H)."""
    return [*(change_claim(runs, task, latents, *c, on=on) for c in CHANGE_CLAIMS),
            spearman_claim(runs, task, latents, on)]


def _done(runs: list[Run], task: str, latents: int, method: str,
          on: dict[str, Any]) -> dict[int, Run]:
    return {r.seed: r for r in select(runs, task=task, latents=latents,
                                      **{**on, **DEFAULT_TEAM, "method": method})
            if r.status == "done"}


def _verdict(text: str, sign: int, ours: list[float], control: list[float], phrase: str,
             seeds: list[int]) -> str:
    """Holds where sign·mean(ours) > 0 and beyond the control's mean by 2 SE (the two spreads
    over seeds, each / √n)."""
    (o, sd_o), (c, sd_c) = mean_std(ours), mean_std(control)
    detail = phrase.format(o=o, c=c) + f" ({seeds_text(seeds)})"
    if sd_o is None or sd_c is None:
        return claim_line(text, None, f"{detail}; with 1 seed the SE is unknown",
                          verdict="no verdict: 1 seed")
    n = len(seeds)
    noise, why = two_se_clause(sign * o, sign * c, math.hypot(sd_o, sd_c) / math.sqrt(n), "",
                               f"{n} seeds")
    verdict = None
    if sign * o > 0 and noise:
        verdict = "within noise of its control: not evidence"
    elif sign * o > 0 and sign * o < sign * c:
        verdict = "does not clear its control"
    return claim_line(text, sign * o > 0, f"{detail}; {why}", verdict=verdict)


def change_claim(runs: list[Run], task: str, latents: int, what: str, attr: str, sign: int,
                 phrase: str, on: dict[str, Any] = PAPER_CHANNEL) -> str:
    """One change of the routing over training (``attr`` of each run), Ours against its
    shuffled-reward control's same change, through the channel ``on``."""
    text = f"§4.3: on {task_title(task)}, {what}; {_ours(on)} vs shuffled reward"

    def values(method: str) -> dict[int, float]:
        return {s: v for s, r in _done(runs, task, latents, method, on).items()
                if (v := getattr(r, attr)) is not None}

    ours, ctl = values(DEFAULT_TEAM["method"]), values(ROUTING_CONTROL)
    if not ours:
        return claim_line(text, None, "")
    seeds = sorted(ours.keys() & ctl.keys())
    if not seeds:
        o = float(np.mean(list(ours.values())))
        return claim_line(text, None, f"{o:+.3f} in Ours ({seeds_text(ours)}); no "
                          "shuffled-reward run on those seeds (or none where it is defined)",
                          verdict=NO_CONTROL)
    return _verdict(text, sign, [ours[s] for s in seeds], [ctl[s] for s in seeds], phrase,
                    seeds)


def spearman_claim(runs: list[Run], task: str, latents: int,
                   on: dict[str, Any] = PAPER_CHANNEL) -> str:
    """"Reward and routing entropy correlate negatively" (paper: mean ρ = −0.48) over Ours'
    training steps, against the same reward series correlated with the shuffled-reward
    control's entropy, step by step. Both runs draw the same items at each step from the same
    init, so the control's entropy holds all that a step's items put into H (steps whose items
    the team routes sharply can be the steps the policy solves) and nothing that Ours' reward
    did to the routing: where Ours' own ρ is no more negative, the correlation is the items',
    not routing shaped by reward. (The control's ρ with its own reward is no comparison: a
    policy that learns less has rewards that track the items less.)"""
    text = (f"§4.3: on {task_title(task)}, reward and routing entropy correlate negatively "
            f"(paper: mean ρ = {PAPER_SPEARMAN}); {_ours(on)} vs Ours' reward against "
            "the shuffled-reward control's entropy on the same steps")
    ours, ctl = _done(runs, task, latents, DEFAULT_TEAM["method"], on), _done(
        runs, task, latents, ROUTING_CONTROL, on)
    own = {s: r.spearman for s, r in ours.items() if r.spearman is not None}
    if not own:
        return claim_line(text, None, "")
    cross = {s: x for s in own.keys() & ctl.keys()
             if (x := spearman_reward_entropy(ours[s].metrics, ctl[s].metrics)) is not None}
    if not cross:
        return claim_line(text, None, f"mean ρ(reward, H) = {np.mean(list(own.values())):+.2f} "
                          f"in Ours ({seeds_text(own)}); no shuffled-reward run on those seeds "
                          "(or none where it is defined)", verdict=NO_CONTROL)
    seeds = sorted(cross)
    return _verdict(text, -1, [own[s] for s in seeds], [cross[s] for s in seeds],
                    "mean ρ(reward, H) = {o:+.2f} in Ours and {c:+.2f} with the control's "
                    "entropy in its place", seeds)
