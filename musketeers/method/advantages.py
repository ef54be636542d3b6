"""One update's advantages: every rank's rewards → A over the whole update, and the groups that
enter the loss (paper Eq. 4's group-relative A with the RLOO+ options of ``grpo``).

Advantages are a property of the update, not of a micro-batch: RLOO+'s per-task
standardisation pools every prompt of a task in the update (per micro-batch, most prompts had
no other of their dataset and LOO only rescaled GRPO). Under data parallelism each rank
gathers every rank's rewards first (``musketeers.runtime.distributed``) and keeps its own
slice. The ``shuffled_reward`` control permutes each group's rewards here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from musketeers.method.grpo import compute_advantages, loss_denominator, zero_variance_groups
from musketeers.runtime.distributed import World
from musketeers.runtime.seeds import derived_seed

if TYPE_CHECKING:  # types only: config imports the method's registries, never the reverse
    from musketeers.config import TrainConfig
    from musketeers.method.methods import Method
    from musketeers.method.rollout import Rollout

_SHUFFLE_TAG = 0x5F1E  # derived_seed stream of the shuffled_reward control


def shuffle_within_groups(rewards: torch.Tensor, seed: int) -> torch.Tensor:
    """The ``shuffled_reward`` control's rewards: each group's [G] row permuted on its own.

    Every group keeps its multiset of rewards, so the same groups carry signal and the
    advantages keep their magnitudes; only which completion earned which is lost. (Permuting
    across the update instead changes which groups carry signal, and damages the policy.)
    """
    g = torch.Generator().manual_seed(seed)
    perm = torch.argsort(torch.rand(rewards.shape, generator=g), dim=1)
    return torch.gather(rewards, 1, perm)


class UpdateSignal(NamedTuple):
    """What the whole update's samples hold, the same on every rank."""

    any_kept: bool  # some group enters the loss
    signal: bool  # ... and one of those carries a non-zero advantage (a policy gradient)
    denominator: float  # the loss normaliser over the kept completions (``loss_denominator``)


def assign_advantages(cfg: TrainConfig, step: int, rollouts: list[Rollout], method: Method,
                      world: World | None = None) -> UpdateSignal:
    """Advantages over the whole update (every micro-batch of every rank), and which groups
    enter the loss, set on each of this rank's rollouts (``adv`` and ``keep``). The
    ``shuffled_reward`` control permutes each group's rewards first, from a stream seeded by
    (seed, step) alone, so it samples exactly what Ours samples.

    The ranks exchange their rewards and completion lengths once: the loss's one normaliser
    for the whole update (so that its micro-batches' losses sum to the loss of the batch they
    split, not a mean of per-micro-batch token means) counts every rank's kept completions."""
    world = world or World()
    mine = ([r.rewards for r in rollouts], [it.source for r in rollouts for it in r.items],
            [torch.tensor([len(c) for c in r.completions], dtype=torch.long)
             .view(len(r.items), -1) for r in rollouts])
    gathered = world.all_gather(mine)
    rewards = torch.cat([t for ranks_rewards, _, _ in gathered for t in ranks_rewards])  # [B, G]
    sources = [src for _, ranks_sources, _ in gathered for src in ranks_sources]
    lengths = torch.cat([n for _, _, ranks_lengths in gathered for n in ranks_lengths])  # [B, G]
    start = sum(len(s) for _, s, _ in gathered[:world.rank])  # this rank's first prompt
    if method.shuffle_rewards:
        rewards = shuffle_within_groups(rewards, derived_seed(cfg.seed, _SHUFFLE_TAG, step))
    adv = compute_advantages(rewards, advantage=cfg.advantage, reward_norm=cfg.reward_norm,
                             sources=sources)
    # a permutation within groups keeps which groups agree: the same groups as unshuffled
    zero_var = zero_variance_groups(rewards)
    keep = ~zero_var if cfg.dynamic_sampling else torch.ones(len(sources), dtype=torch.bool)
    for r in rollouts:
        b = len(r.items)
        r.adv, r.keep = adv[start:start + b], keep[start:start + b]
        start += b
    denominator = loss_denominator(lengths[keep].flatten().tolist(), cfg.loss_norm,
                                   cfg.max_new_tokens)
    return UpdateSignal(bool(keep.any()), bool(keep.any()) and bool((adv[keep] != 0).any()),
                        denominator)
