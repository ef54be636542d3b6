"""Log-probs of the chosen tokens from the final hidden states, the LM head applied in chunks.

``log softmax(h W^T / τ)[y]`` over a whole batch is a [N, T, V] float32 tensor: 642 MiB for
the pocket step (32 completions × 33 positions × Qwen's 151,936 tokens), held once by the
head, again by the cast and the softmax, and again by autograd for the backward. Here the head
runs over ``chunk_rows(V)`` positions at a time, each chunk's logits freed before the next,
so no intermediate grows past ``CHUNK_ELEMENTS`` values whatever the batch.

The backward needs d log p_y / d h = (e_y − softmax(h W^T / τ)) W / τ: each chunk computes it
in its forward, while its logits are at hand (the matmul autograd would run anyway), and the
backward only scales it by the incoming gradient. Values and gradients are those of
``sampling.token_logprobs`` over the full logits (tests/test_chosen_logprobs.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from musketeers.method.sampling import token_logprobs

# 32 Mi values (128 MiB in float32) per chunk of logits: the head's weight is read once per
# chunk, so a larger chunk reads it less often; at Qwen's vocabulary this is 220 positions
CHUNK_ELEMENTS = 2**25
# config fields that transform the head's output (soft-capping, scaling): with any of them
# set, the logits are not the head's matmul alone and the plain path runs instead
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def chunk_rows(vocab: int, elements: int | None = None) -> int:
    """Positions per chunk: as many as keep one chunk's logits within ``elements`` values
    (``CHUNK_ELEMENTS`` unless given)."""
    return max(1, (elements or CHUNK_ELEMENTS) // max(vocab, 1))


class _ChosenLogprobs(torch.autograd.Function):
    """[n, d] hidden states → [n] float32 log-probs of ``ids`` under a frozen linear head."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor,
                temperature: float, rows: int) -> Tensor:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        unit = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        for s in range(0, hidden.shape[0], rows):
            logits = F.linear(hidden[s:s + rows], weight, bias).float()
            if temperature != 1.0:
                logits = logits / temperature
            chosen = ids[s:s + rows].unsqueeze(-1)
            picked = logits.gather(-1, chosen)
            # log-sum-exp as torch computes it (max + log Σ exp(x − max)), but its exponentials
            # kept in place of the logits: the softmax below reuses them instead of a second
            # V-sized subtraction and exp
            top = logits.amax(dim=-1, keepdim=True)
            exps = logits.sub_(top).exp_()
            total = exps.sum(dim=-1, keepdim=True)
            out[s:s + rows] = (picked - top - total.log()).squeeze(-1)
            if unit is not None:
                # e_y − softmax, in the same buffer
                grad = exps.div_(total).neg_()
                grad.scatter_add_(-1, chosen, torch.ones_like(chosen, dtype=grad.dtype))
                if temperature != 1.0:
                    grad = grad / temperature
                unit[s:s + rows] = grad.to(weight.dtype) @ weight
            del logits, exps
        ctx.save_for_backward(unit)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        (unit,) = ctx.saved_tensors
        grad = None if unit is None else g.unsqueeze(-1).to(unit.dtype) * unit
        return grad, None, None, None, None, None


def chosen_logprobs(hidden: Tensor, head: nn.Linear, ids: Tensor, temperature: float,
                    elements: int | None = None) -> Tensor:
    """log softmax(head(hidden) / temperature) at ``ids``: [N, T, d], [N, T] → [N, T] float32,
    as ``sampling.token_logprobs`` of the full logits, the head run over chunks of positions.
    The head must be frozen (its weight gets no gradient here); gradients reach ``hidden``."""
    if head.weight.requires_grad:
        raise ValueError("chosen_logprobs differentiates through a frozen LM head only")
    n, t, d = hidden.shape
    rows = chunk_rows(head.weight.shape[0], elements)
    flat = _ChosenLogprobs.apply(hidden.reshape(n * t, d), head.weight.detach(),
                                 None if head.bias is None else head.bias.detach(),
                                 ids.reshape(n * t), float(temperature), rows)
    return flat.reshape(n, t)


def chunked_head(model: Any) -> nn.Linear | None:
    """The LM head ``chosen_logprobs`` can stand in for: a frozen ``nn.Linear`` whose output
    the model does not transform further; None when the full logits must be computed."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.weight.requires_grad:
        return None
    if any(getattr(base.config, f, None) not in (None, 1.0) for f in _LOGIT_TRANSFORMS):
        return None
    return head


@contextmanager
def hidden_out(head: nn.Linear | None) -> Iterator[None]:
    """Inside the block the model's ``logits`` are its final hidden states: the head returns
    its input (after ``logits_to_keep``'s slice), and ``chosen_logprobs`` applies it later."""
    if head is None:
        yield
        return
    head.forward = _identity  # type: ignore[method-assign]
    try:
        yield
    finally:
        del head.forward  # the class's forward again


def output_logprobs(out: Tensor, head: nn.Linear | None, ids: Tensor,
                    temperature: float) -> Tensor:
    """Log-probs of ``ids`` from a model's output: its final hidden states under
    ``hidden_out(head)`` (``head`` given), its logits otherwise (``head`` None)."""
    if head is None:
        return token_logprobs(out, ids, temperature)
    return chosen_logprobs(out, head, ids, temperature)


def _identity(x: Tensor) -> Tensor:
    return x
