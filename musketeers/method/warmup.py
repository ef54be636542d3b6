"""The adapter's warm-up (a lever beyond the paper): φ learns to read the experts before RL.

GRPO reinforces what the policy already samples. An adapter that starts as a random map from
the experts' vectors to C gives a pocket run (20 updates of 4 prompts) nothing it could learn
to use, even from an expert that reads the gold answer. The warm-up fits φ alone by teacher
forcing, the policy frozen: it maximises log π(gold completion | [x ‖ C]) on train items. Each
method with an adapter that trains gets the same warm-up on the vectors it reads (its
``shuffled_experts`` control on its deranged ones), so Ours and its controls stay comparable;
only the train split's gold answers are read, never a validation item's.

On a task whose question computes the answer, the policy learns the question's route and C goes
unread, even from an oracle. ``warmup_permute_share`` asks a seeded share of the warm-up's rows
another of those rows' question (``musketeers.method.asked``), drawn afresh each step: they can
be scored only through C. Every arm of a seed warms up on the same rows asked the same
questions, Single too, so the arms still differ only in C; GRPO and the evaluation see the real
task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from musketeers.method import methods
from musketeers.method.asked import permute_share
from musketeers.method.context import adapter_context
from musketeers.method.rollout import Batches
from musketeers.runtime.seeds import derived_seed

if TYPE_CHECKING:  # a type only: config imports the method's registries, never the reverse
    from musketeers.config import TrainConfig

log = logging.getLogger("musketeers.method.warmup")
_WARMUP_TAG = 0x3A2F  # derived_seed stream of the warm-up's item draws
_ASKED_TAG = 0x3A30  # ... of each step's rows asked another question (warmup_permute_share)


def gold_completion(policy, answer: str) -> list[int]:
    """The completion a task's scorer grades as right: the tagged gold, then end of turn."""
    ids = policy.tokenizer(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"]
    return ids + [policy.eos_ids[0]]


def gold_nll(policy, adapter, data: Batches, rows: torch.Tensor, device: str
             ) -> torch.Tensor:
    """Mean per-token NLL of the gold completions of ``rows`` given [x ‖ C] (grad through C)."""
    items, vectors, router = data.batch(rows)
    context, _ = adapter_context(adapter, vectors, router, device)
    golds = [gold_completion(policy, it.answer or "") for it in items]
    logp, mask = policy.completion_logprobs(policy.encode_prompts(items), context, golds)
    return -(logp.sum() / mask.sum())


def asked_at(cfg: TrainConfig, data: Batches, step: int) -> Batches:
    """The warm-up's rows at ``step``: ``warmup_permute_share`` of them asked another of those
    rows' question, by a permutation drawn afresh each step from (seed, step). One fixed for
    the whole warm-up lets the LoRA learn each moved row's (question, target) pair by heart
    over the epochs instead of reading C (docs/channels.md)."""
    if not cfg.warmup_permute_share:
        return data
    return permute_share(data, derived_seed(cfg.seed, _ASKED_TAG, step),
                         cfg.warmup_permute_share)


def warms_up(cfg: TrainConfig, adapter, method: methods.Method) -> bool:
    """Whether this run gets the warm-up: the method trains, and the run has an adapter that
    learns or (``warmup_policy_lr``) a LoRA, so that Single gets the supervised steps Ours does."""
    learns = adapter is not None and any(p.requires_grad for p in adapter.parameters())
    return (cfg.adapter_warmup > 0 and method.trains
            and (learns or cfg.warmup_policy_lr > 0))


def warm_up_adapter(cfg: TrainConfig, policy, adapter, data: Batches) -> list[dict[str, Any]]:
    """``cfg.adapter_warmup`` AdamW steps on φ (lr ``adapter_warmup_lr``), a batch of
    ``adapter_warmup_batch`` train items each (0: one GRPO update's prompts); one metrics row
    per step. The policy's LoRA is frozen meanwhile, or fitted beside φ at ``warmup_policy_lr``
    (alone where there is no adapter); each step's rows as ``asked_at`` gives them. GRPO's
    optimizer and RNG are left as they were."""
    lora = [p for p in policy.model.parameters() if p.requires_grad]
    fits_lora = cfg.warmup_policy_lr > 0
    frozen = [] if fits_lora else lora
    for p in frozen:
        p.requires_grad_(False)
    groups = [{"params": list(adapter.parameters()), "lr": cfg.adapter_warmup_lr}
              ] if adapter is not None else []
    if fits_lora:
        groups.append({"params": lora, "lr": cfg.warmup_policy_lr})
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    g = torch.Generator().manual_seed(derived_seed(cfg.seed, _WARMUP_TAG))
    batch = cfg.adapter_warmup_batch or cfg.prompts_per_micro * cfg.grad_accum
    rows_out = []
    try:
        for step in range(cfg.adapter_warmup):
            rows = torch.randint(0, len(data), (batch,), generator=g)
            loss = gold_nll(policy, adapter, asked_at(cfg, data, step), rows, cfg.device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rows_out.append({"warmup_step": step + 1, "gold_nll": loss.item()})
            if (step + 1) % 10 == 0 or step + 1 == cfg.adapter_warmup:
                recent = [r["gold_nll"] for r in rows_out[-10:]]
                log.info("adapter warm-up %d/%d: gold NLL per token %.3f (last %d steps)",
                         step + 1, cfg.adapter_warmup, sum(recent) / len(recent), len(recent))
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return rows_out
