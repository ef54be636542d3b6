"""The policy's teacher-forced passes: log π(y_t | [x ‖ C], y_<t) of completions already known.

Sampling (``Policy.generate``) makes the completions; these passes score them, for the old and
reference log-probs of a rollout and for the loss. Each runs on the batch layout
``Policy.build_inputs`` lays out (every prefix ends at column P, completion token t at column
P + t), in one of two ways that give the same log-probs:

- one forward over [prefix | completion] per completion (``joint_logits``), when each
  completion comes with its own prompt row;
- each group's prefix [x ‖ C] run once and its G completions continued from that prefix's KV
  cache in chunks of similar length (``shared_prefix_logprobs``), when B prompts stand for
  B·G completions (group-major).

The LM head runs over completion positions only, and in chunks of positions where it can
(``chosen_logprobs``): never a [N, T, V] tensor.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from musketeers.cache.backbone import pad
from musketeers.cache.batching import length_batches
from musketeers.method.chosen_logprobs import chunked_head, hidden_out, output_logprobs
from musketeers.method.kv_cache import CACHE_KW, kv_cache

if TYPE_CHECKING:  # a type only: the policy calls these passes, they never build one
    from musketeers.method.policy import Policy

# A forward's own cost, in tokens, when completions are split by length (length_batches): on a
# CPU a pass reads every weight once whatever it computes. Accelerators run one chunk: padding
# is cheap there until the device saturates, and no split was measured on one.
CHUNK_COST = 32


def teacher_forced(policy: Policy, prompts: list[list[int]], context: Tensor | None,
                   completion_ids: list[list[int]], temperature: float) -> tuple[Tensor, Tensor]:
    """(logp [N, T] float32, mask [N, T]) of each completion token under ``policy`` with
    ``context`` in C's positions. prompts/context may have B rows for N = B·G completions
    (group-major); logits are divided by ``temperature`` to match sampling."""
    t = max((len(c) for c in completion_ids), default=0)
    with teacher_forced_attention(policy.model, policy.device):
        if len(prompts) < len(completion_ids) and t > 0:
            return shared_prefix_logprobs(policy, prompts, context, completion_ids, temperature)
        prompts, context = expand(prompts, context, len(completion_ids))
        # the model returns final hidden states, and the head runs in chunks of positions
        # (``chosen_logprobs``): never a [N, T, V] tensor; the full logits where it cannot
        head = chunked_head(policy.model)
        with hidden_out(head):
            out, ids, mask = joint_logits(policy, prompts, context, completion_ids)
            return output_logprobs(out, head, ids, temperature) * mask, mask


@contextmanager
def teacher_forced_attention(model: Any, device: torch.device) -> Iterator[None]:
    """Plain ("eager") attention for the log-prob passes on a CPU, the model's own elsewhere.

    torch's fused CPU attention is slow to differentiate with a padding mask: on a 2-core
    CPU (SmolLM2, 16 × 64 completions after ~250-token prompts) its backward took 1.9 s of
    a 9.4 s reference + training pass, and the eager matmul-softmax-matmul saved ~1.7 s of
    it. Both stay as close to an fp32 forward (mean |Δ log p| 0.033 vs 0.036 in bf16).
    Sampling keeps the fused kernel, which is faster there (one query per row).
    """
    base = model.get_base_model()
    before = getattr(base.config, "_attn_implementation", None)
    if device.type != "cpu" or before in (None, "eager"):
        yield
        return
    base.set_attn_implementation("eager")
    try:
        yield
    finally:
        base.set_attn_implementation(before)


def expand(prompt_ids: list[list[int]], context: Tensor | None,
           n: int) -> tuple[list[list[int]], Tensor | None]:
    """Repeat each of B prompts (and its context) n // B times, group-major."""
    b = len(prompt_ids)
    if n == b:
        return prompt_ids, context
    if n % b:
        raise ValueError(f"{n} completions is not a multiple of {b} prompts")
    g = n // b
    prompts = [p for p in prompt_ids for _ in range(g)]
    return prompts, None if context is None else context.repeat_interleave(g, dim=0)


def joint_logits(policy: Policy, prompts: list[list[int]], context: Tensor | None,
                 completion_ids: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Logits predicting each completion token from one forward over [prefix | completion]
    per row: [N, T, V] ([N, T, d] under ``hidden_out``), with the completion ids and mask."""
    inp = policy.build_inputs(prompts, context, completion_ids)
    t = inp.completion_ids.shape[1]
    # logits only at columns P-1 … P+T-2 (the last T+1 minus the final one): the LM head
    # over a large vocabulary dominates the cost otherwise
    out = policy.model(
        inputs_embeds=inp.inputs_embeds,
        attention_mask=inp.attention_mask,
        position_ids=inp.position_ids,
        logits_to_keep=t + 1,
        use_cache=False,
    )
    return out.logits[:, :-1], inp.completion_ids, inp.completion_mask


def shared_prefix_logprobs(policy: Policy, prompts: list[list[int]], context: Tensor | None,
                           completion_ids: list[list[int]], temperature: float
                           ) -> tuple[Tensor, Tensor]:
    """The log-probs ``joint_logits`` gives, with each group's prefix [x ‖ C] run once and the
    completions run in chunks of similar length.

    The chunks are planned first: a chunk is right-padded only to its own longest completion
    (``cache.batching.length_batches``), not to the batch's. Then the B prefixes go through
    the model once (``Policy._shared_prefill``); each chunk of completions continues from its
    rows of that KV cache, and gradients from all G completions of a group flow back into its
    one prefix pass (the sum a G-fold copy would give). Every prefix ends at column P, so the
    prefix pass's last logits predict every completion's first token.
    """
    g = len(completion_ids) // len(prompts)
    if g * len(prompts) != len(completion_ids):
        raise ValueError(f"{len(completion_ids)} completions is not a multiple of "
                         f"{len(prompts)} prompts")
    device, model = policy.device, policy.model
    lengths = [len(c) for c in completion_ids]
    t = max(lengths)
    fixed = CHUNK_COST if policy.share and device.type == "cpu" else None
    chunks = (length_batches(lengths, overhead=fixed) if fixed is not None
              else [range(len(lengths))])
    _, mask = pad(completion_ids, policy.pad_id, "right")
    pieces, order = [], []
    # the model returns final hidden states, the head applied to chunks of them
    # (``chosen_logprobs``); the full logits where it cannot
    head = chunked_head(model)
    with hidden_out(head):
        out, prefix_mask = policy._shared_prefill(prompts, context, 1)
        first = out.logits[:, -1]  # [B, V] (or [B, d] under hidden_out): a first token's
        for chunk in chunks:
            rows = torch.tensor(list(chunk), device=device)
            src = rows // g  # each completion's prompt
            ids, cmask = pad([completion_ids[r] for r in chunk], policy.pad_id, "right")
            ids, cmask = ids.to(device), cmask.to(device)
            pmask = prefix_mask[src]
            # positions continue from each prefix's real-token count (the cumsum rule)
            start = pmask.sum(-1, keepdim=True)
            positions = (start + torch.arange(ids.shape[1], device=device)).masked_fill(
                cmask == 0, 0)
            nxt = model(inputs_embeds=model.get_input_embeddings()(ids),
                        attention_mask=torch.cat([pmask, cmask], dim=1),
                        position_ids=positions,
                        use_cache=True, logits_to_keep=ids.shape[1],
                        **{CACHE_KW: cache_rows(kv_cache(out), src)})
            logits = torch.cat([first[src].unsqueeze(1), nxt.logits[:, :-1]], dim=1)
            del nxt  # its output, freed before the next chunk's
            logp = output_logprobs(logits, head, ids, temperature) * cmask
            pieces.append(torch.nn.functional.pad(logp, (0, t - ids.shape[1])))
            order.extend(chunk)
    back = torch.tensor(order, device=device).argsort()  # rows back in their order
    return torch.cat(pieces)[back], mask.to(device)


def cache_rows(cache, rows: Tensor):
    """A KV cache holding ``rows`` of ``cache``'s batch, which stays as it is (and keeps its
    autograd history: gradients through the copy's rows reach the pass that filled it).

    A layer's ``batch_select_indices`` rebinds its tensors rather than writing into them, so a
    copy of each layer object is enough.
    """
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    out.batch_select_indices(rows)
    return out
