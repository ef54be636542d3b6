"""One GRPO update's samples: rollouts, their rewards, and their old and reference log-probs.

An update is ``grad_accum`` micro-batches of ``prompts_per_micro`` prompts with G completions
each. It is built in three passes, because advantages are a property of the update, not of a
micro-batch:

  1. ``sample``: per micro-batch, C from the adapter (``musketeers.method.context``) and G
     completions per prompt, scored;
     every prompt's draws come from its own stream, seeded by (seed, step, its position in
     the update), so how the update is cut into micro-batches and ranks changes no sample;
  2. between the two, ``musketeers.method.advantages``: rewards of every micro-batch (of
     every rank) → advantages, and the groups that enter the loss;
  3. ``reference_passes``: old and reference log-probs of the groups that enter the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.method.context import RngState, adapter_context, seeded_rng
from musketeers.method.expert_tokens import ExpertInput
from musketeers.runtime.seeds import derived_seed

if TYPE_CHECKING:  # a type only: config imports the method's registries, never the reverse
    from musketeers.config import TrainConfig

# (step, tensor name, tensor) -> tensor: lets tests inject faults (NaN) at named points.
FaultHook = Callable[[int, str, torch.Tensor], torch.Tensor]
# (items, rows) -> pooled vectors: the benchmark's --live-experts path computes them live.
VectorSource = Callable[[list[Item], torch.Tensor], list[ExpertInput]]
_NO_CONTEXT_TAG = 0x0C7A  # derived_seed stream of Figure 5's samples without C
_SAMPLE_TAG = 0x5A3D  # ... of each prompt's completions
_ADAPTER_TAG = 0xAD7A  # ... of a micro-batch's adapter draws (hard routing's Gumbel noise)


class Batches(Protocol):
    """What a rollout reads of a split, passed in by the run (its ``SplitData`` is one)."""

    items: list[Item]  # a dataclass field, so the warm-up can ask rows others' questions

    def __len__(self) -> int: ...

    def batch(self, idx: torch.Tensor
              ) -> tuple[list[Item], list[torch.Tensor], torch.Tensor | None]:
        """The rows ``idx``: their items, pooled vectors per expert, router embeddings."""
        ...


class NonFiniteError(UserError):
    """A NaN/inf in the loss, rewards or gradients: the run stops, last checkpoint kept."""


def check_finite(step: int, name: str, t: torch.Tensor) -> None:
    """``step`` is 0-based inside the loop; the message uses metrics.jsonl's 1-based step."""
    if not torch.isfinite(t).all():
        raise NonFiniteError(f"step {step + 1}: {name} is not finite ({t.flatten()[:4].tolist()})"
                             "; run stopped, the last good checkpoint is kept")


@dataclass
class Rollout:
    """One micro-batch of sampled groups, everything the inner iterations need."""

    items: list[Item]
    vectors: list[ExpertInput]  # pooled [B, d_i], or ExpertTokens on a token channel
    router: torch.Tensor | None
    prompt_ids: Any
    completions: list[list[int]]  # B·G, group-major (row b·G + g)
    rewards: torch.Tensor  # [B, G], the task's scores
    ended: list[bool]  # per completion: stopped on an end-of-turn token (not truncated)
    answered: list[bool]  # per completion: an <answer>…</answer> was found
    context: torch.Tensor | None  # C the completions were sampled with (no grad)
    attention: torch.Tensor | None  # [B, m, n]
    adapter_rng: RngState | None = None  # RNG states before the rollout's adapter call
    adv: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [B, G]
    keep: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.bool))
    old_logp: torch.Tensor | None = None  # [B'·G, T] for kept groups (None when μ = 1)
    ref_logp: torch.Tensor | None = None


def prompt_generators(seed: int, tag: int, step: int, positions: list[int]
                      ) -> list[torch.Generator]:
    """One CPU stream per prompt, seeded by (seed, stream, step, the prompt's position in the
    update): never by the micro-batch or rank it lands in."""
    return [torch.Generator().manual_seed(derived_seed(seed, tag, step, p)) for p in positions]


def kept(rollout: Rollout, context: torch.Tensor | None):
    """Prompt ids, context and completions of the groups in the loss."""
    keep = rollout.keep.tolist()
    if all(keep):
        return rollout.prompt_ids, context, rollout.completions
    g = len(rollout.completions) // len(keep)
    rows = [b for b, k in enumerate(keep) if k]
    prompts = [rollout.prompt_ids[b] for b in rows]
    ctx = context[rows] if context is not None else None
    comps = [rollout.completions[b * g + j] for b in rows for j in range(g)]
    return prompts, ctx, comps


def policy_score(item: Item, text: str, extraction: str = "strict") -> float:
    from musketeers.tasks import score

    return float(score(item, text, extraction))


def sample(cfg: TrainConfig, step: int, policy, adapter, data: Batches,
           chunks: list[tuple[torch.Tensor, list[int]]], together: list[list[int]],
           fault: FaultHook | None, vector_source: VectorSource | None) -> list[Rollout]:
    """Pass 1: sample G completions for each prompt of each micro-batch ``(rows, positions
    in the update)`` and score them; one Rollout per micro-batch.

    The micro-batches of each list in ``together`` decode as one batch (the run's
    ``decode_batches``, ``cfg.decode_prompts`` prompts at a time): every prompt draws from its
    own stream and keeps its own C, so this changes how many rows share a decode step, not
    what any row samples."""
    from musketeers.tasks import extract_answer

    parts = [_prepare(cfg, step, policy, adapter, data, rows, positions, vector_source)
             for rows, positions in chunks]
    sampled = _decode_together(cfg, step, policy, parts, [p for _, p in chunks], together)
    g, eos, rollouts = cfg.group_size, set(policy.eos_ids), []
    for part, (comps, texts) in zip(parts, sampled, strict=True):
        rewards = torch.tensor([[policy_score(it, texts[b * g + j], cfg.extraction)
                                 for j in range(g)]
                                for b, it in enumerate(part.items)], dtype=torch.float32)
        if fault is not None:
            rewards = fault(step, "rewards", rewards)
        check_finite(step, "rewards", rewards)
        rollouts.append(replace(
            part, completions=comps, rewards=rewards,
            ended=[bool(c) and c[-1] in eos for c in comps],
            answered=[extract_answer(t, cfg.extraction) is not None for t in texts]))
    return rollouts


def _prepare(cfg: TrainConfig, step: int, policy, adapter, data: Batches, rows: torch.Tensor,
             positions: list[int], vector_source: VectorSource | None) -> Rollout:
    """A micro-batch's prompts and C, before anything is sampled."""
    items, vectors, router = data.batch(rows)
    if vector_source is not None:
        vectors = vector_source(items, rows)
    adapter_rng = seeded_rng(cfg.device, derived_seed(cfg.seed, _ADAPTER_TAG, step, positions[0]))
    with torch.no_grad():
        context, attention = adapter_context(adapter, vectors, router, cfg.device, adapter_rng)
    return Rollout(items, vectors, router, policy.encode_prompts(items), [],
                   torch.empty(0), [], [], context=context, attention=attention,
                   adapter_rng=adapter_rng)


def _decode_together(cfg: TrainConfig, step: int, policy, parts: list[Rollout],
                     positions: list[list[int]], together: list[list[int]]
                     ) -> list[tuple[list[list[int]], list[str]]]:
    """Each part's B·G completions and their texts, the parts of each list in ``together``
    decoded as one batch."""
    out: list[tuple[list[list[int]], list[str]]] = []
    for batch in together:
        contexts = [parts[i].context for i in batch]
        with torch.no_grad():
            comps, texts = policy.sample_texts(
                [p for i in batch for p in parts[i].prompt_ids],
                None if contexts[0] is None else torch.cat(contexts),
                group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature, greedy=False,
                generator=prompt_generators(cfg.seed, _SAMPLE_TAG, step,
                                            [p for i in batch for p in positions[i]]))
        for i in batch:
            n = len(parts[i].items) * cfg.group_size
            out.append((comps[:n], texts[:n]))
            comps, texts = comps[n:], texts[n:]
    return out


def reference_passes(cfg: TrainConfig, policy, r: Rollout) -> None:
    """Pass 3: old log-probs (μ > 1) and reference log-probs (β > 0) of the kept groups."""
    if not r.keep.any():
        return
    prompts, ctx, comps = kept(r, r.context)
    with torch.no_grad():
        if cfg.inner_iters > 1:
            r.old_logp, _ = policy.completion_logprobs(prompts, ctx, comps,
                                                       temperature=cfg.temperature)
        if cfg.beta > 0:
            r.ref_logp, _ = policy.completion_logprobs(prompts, ctx, comps, reference=True,
                                                       temperature=cfg.temperature)


def no_context_reward(cfg: TrainConfig, step: int, policy, data: Batches,
                      rows: torch.Tensor, positions: list[int] | None = None) -> float:
    """Mean reward of π_θ(y | x) — the policy alone, no context positions — on the step's own
    prompts (the paper's Figure 5 against π_θ(y | [x ‖ C])); see ``no_context_scores``."""
    return float(np.mean(no_context_scores(cfg, step, policy, data, rows, positions)))


def no_context_scores(cfg: TrainConfig, step: int, policy, data: Batches,
                      rows: torch.Tensor, positions: list[int] | None = None) -> list[float]:
    """The scores behind ``no_context_reward``, G per prompt of ``rows`` (at ``positions`` of
    the update; default 0, 1, ...).

    Sampled from streams seeded by (seed, step, position), never from the training streams,
    so a run that logs it trains exactly like one that does not, and resume stays exact.
    """
    items, _, _ = data.batch(rows)
    positions = list(range(len(items))) if positions is None else positions
    with torch.no_grad():
        completions = policy.generate(
            policy.encode_prompts(items), None, group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, greedy=False,
            generator=prompt_generators(cfg.seed, _NO_CONTEXT_TAG, step, positions))
    g = cfg.group_size
    return [policy_score(items[i // g], policy.decode(c), cfg.extraction)
            for i, c in enumerate(completions)]
