"""Eq. 5: every pooling of an expert's hidden states from one backbone forward pass.

The paper pools the last token of the last layer, h_i = h_{i,T_i}^{(L_i)}. The ablations need
more (first token, a random token, the last token at every layer, per-layer means), and all of
them come from the same forward pass, so the expert runs once per prompt whatever is studied.
"""

from __future__ import annotations

import numpy as np
import torch


def random_positions(rows: np.ndarray, n_tokens: np.ndarray, seed: int) -> np.ndarray:
    """A token index in [0, n_tokens) per row, seeded by (seed, row) so batching cannot move it."""
    pairs = zip(rows, n_tokens, strict=True)
    return np.array(
        [np.random.default_rng((seed, int(r))).integers(int(n)) for r, n in pairs], dtype=np.int32
    )


def token_bounds(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, last) real-token index per row, for left or right padding alike."""
    mask = attention_mask.bool()
    t = mask.shape[1]
    first = mask.int().argmax(dim=1)
    last = t - 1 - mask.flip(1).int().argmax(dim=1)
    return first, last


def pool_hidden_states(
    hidden_states: tuple[torch.Tensor, ...],
    attention_mask: torch.Tensor,
    random_pos: torch.Tensor,
) -> dict[str, np.ndarray]:
    """Eq. 5 and its ablation variants from L+1 hidden-state tensors [B, T, d].

    ``random_pos`` counts real tokens from the first one. Returns float32 arrays:
    last/first/random [B, d]; layers_last/layers_mean [B, L+1, d] (index 0 = embeddings).
    Padding positions are excluded with ``where`` (not multiplied) so a NaN in a padded
    position can never leak into a mean. Layers are pooled one at a time: stacking all L+1
    layers in fp32 first costs more memory traffic than the pooling itself.
    """
    b = torch.arange(attention_mask.shape[0])
    first, last = token_bounds(attention_mask)
    rand = first + random_pos.long()
    mask = attention_mask.bool()[:, :, None]
    count = attention_mask.sum(dim=1).clamp(min=1)[:, None].float()
    zero = torch.zeros((), dtype=torch.float32)
    layers_last = torch.stack([h[b, last].float() for h in hidden_states], dim=1)
    layers_mean = torch.stack(
        [torch.where(mask, h.float(), zero).sum(dim=1) / count for h in hidden_states], dim=1)
    top = hidden_states[-1]
    return {
        "last": layers_last[:, -1].numpy(),
        "first": top[b, first].float().numpy(),
        "random": top[b, rand].float().numpy(),
        "layers_last": layers_last.numpy(),
        "layers_mean": layers_mean.numpy(),
    }
