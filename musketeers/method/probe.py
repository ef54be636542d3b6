"""How far zero context tokens move an untrained policy, per placement of C.

Eq. 11 initialises W_out near zero so that C ≈ 0 leaves the initial policy where it was. This
measures whether it does: the KL of the first completion token between π(·|x) and
π(·|[x ‖ 0]), averaged over prompts, for each ``context_position`` (musketeers.method.policy).

    python -m musketeers.bench.zero_context --policy qwen2.5-coder-0.5b-instruct \
        --task arithmetic -n 8
"""

from __future__ import annotations

import torch


def first_token_kl(policy, prompt_ids: list[list[int]], m: int, position: str) -> float:
    """Mean KL(π(·|x) ‖ π(·|[x ‖ 0_m])) over the prompts, in nats, with C at ``position``."""
    saved = policy.context_position

    def log_probs(context: torch.Tensor | None) -> torch.Tensor:
        inp = policy.build_inputs(prompt_ids, context)
        with torch.no_grad():
            # the LM head at the prefix's last position only, as Policy's prefill does
            logits = policy.model(inputs_embeds=inp.inputs_embeds,
                                  attention_mask=inp.attention_mask,
                                  position_ids=inp.position_ids, logits_to_keep=1).logits[:, -1]
        return torch.log_softmax(logits.float(), -1)

    try:
        base = log_probs(None)
        policy.context_position = position
        moved = log_probs(torch.zeros(len(prompt_ids), m, policy.embed_dim))
    finally:
        policy.context_position = saved
    return float((base.exp() * (base - moved)).sum(-1).mean())
