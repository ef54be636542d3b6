"""The loss forward and backward of one micro-batch in chunks of completion rows.

A loss pass holds every row's activations until its backward: for the pocket step (32 rows of
~105 tokens through 24 layers of Qwen2.5-Coder-0.5B in fp32) about 4 GiB, most of the step's
peak. Split into chunks, each chunk's forward is followed at once by its backward, so only one
chunk's activations are alive. The micro-batch's loss is a sum over rows divided by one
denominator for the whole update (``grpo.loss_denominator``: tokens, sequences or N · L_max),
so the chunks' losses sum to the unchunked loss and their gradients accumulate to its gradient.

A chunk holds whole groups when it has room for one (``rows`` ≥ G), else part of one group, so
each chunk's completions continue one shared prefix per prompt (``Policy`` runs a group's
prefix once). Chunks of whole groups run every prefix once, as before: the extra compute is
the chat template's common head, one row a chunk.

C, produced by the adapter once per micro-batch, is cut from its graph for the chunks: their
gradients with respect to C accumulate on a leaf, and one backward through the adapter follows.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from torch import Tensor

from musketeers.method.grpo import grpo_loss
from musketeers.method.rollout import FaultHook, Rollout, check_finite, kept

if TYPE_CHECKING:  # a type only: config imports the method's registries, never the reverse
    from musketeers.config import TrainConfig

# (rows of the completions, logp [n, T'], mask [n, T']) → (loss, stats with "kl")
ChunkLoss = Callable[[slice, Tensor, Tensor], tuple[Tensor, dict[str, float]]]
Phase = Callable[[str], AbstractContextManager[Any]]


def row_chunks(prompts: int, group_size: int, rows: int) -> list[tuple[slice, slice]]:
    """(prompts, completion rows) of each chunk of at most ``rows`` completions, in order
    (0: one chunk). Completions are group-major: prompt b owns rows b·G … b·G + G - 1."""
    total = prompts * group_size
    if rows <= 0 or rows >= total:
        return [(slice(0, prompts), slice(0, total))]
    if rows >= group_size:
        k = rows // group_size
        return [(slice(b, min(b + k, prompts)), slice(b * group_size,
                                                      min(b + k, prompts) * group_size))
                for b in range(0, prompts, k)]
    return [(slice(b, b + 1), slice(b * group_size + j, b * group_size + min(j + rows,
                                                                               group_size)))
            for b in range(prompts) for j in range(0, group_size, rows)]


def _context_leaf(context: Tensor | None, chunked: bool) -> Tensor | None:
    if context is None or not chunked or not context.requires_grad:
        return context
    return context.detach().requires_grad_(True)


def chunked_loss_backward(policy: Any, prompts: list[list[int]], context: Tensor | None,
                          completions: list[list[int]], loss_of: ChunkLoss, *, rows: int,
                          temperature: float, phase: Phase) -> tuple[float, float]:
    """Forward and backward of one micro-batch's loss, ``rows`` completions at a time
    (``row_chunks``); the parameters' gradients are those of the whole micro-batch's loss.

    ``loss_of`` turns a chunk's log-probs into its loss over the update's denominator.
    ``phase`` names the time spent (``PhaseClock.phase``: forward, backward). Returns the
    micro-batch's loss and its token-mean KL."""
    g = len(completions) // max(len(prompts), 1)
    chunks = row_chunks(len(prompts), g, rows)
    leaf = _context_leaf(context, len(chunks) > 1)
    total, kl_sum, tokens = 0.0, 0.0, 0.0
    for p, c in chunks:
        with phase("forward"):
            ctx = None if leaf is None else leaf[p]
            logp, mask = policy.completion_logprobs(prompts[p], ctx, completions[c],
                                                    temperature=temperature)
            loss, stats = loss_of(c, logp, mask)
        with phase("backward"):
            loss.backward()
        n = float(mask.sum())
        total += float(loss.detach())
        kl_sum, tokens = kl_sum + stats["kl"] * n, tokens + n
    if leaf is not context and leaf.grad is not None:
        with phase("backward"):
            context.backward(leaf.grad)  # type: ignore[union-attr]
    return total, kl_sum / max(tokens, 1.0)


def micro_batch_backward(cfg: TrainConfig, step: int, policy: Any, r: Rollout,
                         context: Tensor | None, denominator: float, *,
                         fault: FaultHook | None, phase: Phase) -> tuple[float, float]:
    """Eq. 4's loss of rollout ``r``'s kept groups (``grpo.grpo_loss`` over the update's
    ``denominator``), back-propagated ``cfg.loss_rows`` completions at a time; its value and
    token-mean KL. ``fault`` may replace each chunk's loss (the tests' fault injection)."""
    adv = r.adv[r.keep].reshape(-1)

    def loss_of(rows: slice, logp: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, float]]:
        t = logp.shape[1]  # a chunk pads to its own longest completion
        old = r.old_logp[rows, :t] if r.old_logp is not None else logp.detach()
        ref = None if r.ref_logp is None else r.ref_logp[rows, :t].float()
        loss, stats = grpo_loss(
            logp.float(), old.float(), ref, adv[rows].to(logp.device), mask, beta=cfg.beta,
            clip_low=cfg.clip_low, clip_high=cfg.clip_high, loss_norm=cfg.loss_norm,
            max_len=cfg.max_new_tokens, denominator=denominator)
        if fault is not None:
            loss = fault(step, "loss", loss)
        check_finite(step, "loss", loss.detach())
        return loss, stats

    return chunked_loss_backward(policy, *kept(r, context), loss_of, rows=cfg.loss_rows,
                                 temperature=cfg.temperature, phase=phase)
