"""The claims a grid's report tests: each a tested cell against its control, in exact.

Declared here, with the experiment's design, so that a grid's pre-registration
(``design.prereg``) can name its confirmatory family before any run exists, and the report
(``reports.verdict_table``) tests the same comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from musketeers.cache.tokens import CHANNELS, POOLED
from musketeers.config import DEFAULT_TOKEN_LAYER
from musketeers.method.asked import share_label

OURS: dict[str, Any] = {"method": "perceiver", "team": "default"}


@dataclass(frozen=True)
class Comparison:
    """One claim: ``tested`` beats ``control`` in exact on the same seeds."""

    name: str  # short, for the table's first column
    tested: dict[str, Any]  # group-key fields of the tested cell (pooling, latents: defaults)
    control: dict[str, Any]
    why: str  # what a difference would show, for the details under the table
    positive_control: bool = False  # must hold, or the setup cannot see help at all
    # the cells' other group-key fields: the paper's channel unless a comparison names one
    defaults: dict[str, Any] = field(default_factory=lambda: {"pooling": "last",
                                                              "channel": POOLED})


def channel_comparisons(channel: str) -> tuple[Comparison, ...]:
    """Claims through a token channel (at the default layer): the positive control (the oracle
    read through ``channel``) and the default team read through it, each against Single and
    against its own shuffled experts on that channel; then the default team against its
    shuffled-reward control on that channel."""
    on = {"channel": channel, "token_layer": DEFAULT_TOKEN_LAYER}
    oracle = {**OURS, "team": "oracle"}
    return (
        Comparison(f"oracle ({channel}) > Single", oracle, {"method": "single"},
                   f"expert help that surely exists passes through the {channel} channel",
                   positive_control=True, defaults=on),
        Comparison(f"oracle ({channel}) > its shuffled experts", oracle,
                   {**oracle, "method": "shuffled_experts"},
                   f"the gain through the {channel} channel comes from the item's own states",
                   positive_control=True, defaults=on),
        Comparison(f"Ours ({channel}) > Single", OURS, {"method": "single"},
                   f"the default team's states help through the {channel} channel",
                   defaults=on),
        Comparison(f"Ours ({channel}) > shuffled experts", OURS,
                   {**OURS, "method": "shuffled_experts"},
                   f"what the experts' {channel} states say about this item helps",
                   defaults=on),
        Comparison(f"reward: Ours ({channel}) > shuffled reward", OURS,
                   {**OURS, "method": "shuffled_reward"},
                   f"the reward, not the updates themselves, raises Ours through the {channel} "
                   "channel", defaults=on),
    )


# warm-up shares of rows asked another question (``warmup_permute_share``) that claims are
# declared for: a cell that names none is the plain warm-up (share 0)
TAUGHT_SHARES = (0.5,)


def taught_comparisons(channel: str, share: float) -> tuple[Comparison, ...]:
    """Claims on warm-ups that teach the read through ``channel`` (``share`` of each step's
    rows asked another row's question, every arm alike): the positive control against Single
    on that warm-up and against the oracle on the plain one, and the default team's."""
    on = {"channel": channel, "token_layer": DEFAULT_TOKEN_LAYER}
    taught = {"warmup_permute_share": share}
    oracle = {**OURS, "team": "oracle"}
    tag = share_label(share)
    return (
        Comparison(f"oracle ({channel}, {tag}) > Single ({tag})", {**oracle, **taught},
                   {"method": "single", **taught},
                   f"taught to read C, the oracle's help passes through the {channel} channel",
                   positive_control=True, defaults=on),
        Comparison(f"oracle ({channel}, {tag}) > oracle ({channel})", {**oracle, **taught},
                   oracle, "teaching the read adds to what the plain warm-up lets through",
                   defaults=on),
        Comparison(f"Ours ({channel}, {tag}) > Single ({tag})", {**OURS, **taught},
                   {"method": "single", **taught},
                   f"taught to read C, the default team's states help through {channel}",
                   defaults=on),
    )


def share_cost(share: float) -> Comparison:
    """What asking ``share`` of the warm-up's rows another question costs Single's own route:
    one claim per share, whatever channel the other arms read."""
    return Comparison(f"Single ({share_label(share)}) > Single",
                      {"method": "single", "warmup_permute_share": share}, {"method": "single"},
                      "the permuted rows do not cost the policy's own route")


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("regime: Single > untrained", {"method": "single"}, {"method": "untrained"},
               "training teaches the policy something at this budget"),
    Comparison("RL: Single > warm-up only", {"method": "single"}, {"method": "warmup_only"},
               "GRPO adds to what the supervised warm-up taught"),
    Comparison("reward: Ours > shuffled reward", OURS, {**OURS, "method": "shuffled_reward"},
               "the reward, not the updates themselves, raises Ours"),
    Comparison("oracle > Single", {**OURS, "team": "oracle"}, {"method": "single"},
               "expert help, where it surely exists, is visible at all", positive_control=True),
    Comparison("oracle > its shuffled experts", {**OURS, "team": "oracle"},
               {**OURS, "team": "oracle", "method": "shuffled_experts"},
               "the gain comes from the item's own vectors, not their presence",
               positive_control=True),
    Comparison("Ours > Single (§4.2)", OURS, {"method": "single"},
               "the default team's hidden states help"),
    Comparison("Ours > shuffled experts", OURS, {**OURS, "method": "shuffled_experts"},
               "what the experts say about this item helps"),
    Comparison("strong team > Single", {**OURS, "team": "strong"}, {"method": "single"},
               "an expert stronger than the policy helps"),
    Comparison("strong team > its shuffled experts", {**OURS, "team": "strong"},
               {**OURS, "team": "strong", "method": "shuffled_experts"},
               "the stronger expert's item information helps"),
    Comparison("Ours > hard routing", OURS, {**OURS, "method": "hard_routing"},
               "Table 1: soft cross-attention beats one routed expert"),
    Comparison("Ours > no cross-attention", OURS, {**OURS, "method": "no_cross_attn"},
               "Table 1: cross-attention beats a token-wise FFN"),
    *(c for channel in CHANNELS if channel != POOLED for c in channel_comparisons(channel)),
    *(c for channel in CHANNELS if channel != POOLED for share in TAUGHT_SHARES
      for c in taught_comparisons(channel, share)),
    *(share_cost(share) for share in TAUGHT_SHARES),
)


def comparison_names() -> tuple[str, ...]:
    return tuple(c.name for c in COMPARISONS)


def arm(key: dict[str, Any]) -> str:
    """A cell's arm label, ``method`` or ``method/team``: what a pre-registration lists."""
    team = key.get("team")
    return f"{key['method']}/{team}" if team else str(key["method"])
