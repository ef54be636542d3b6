"""Where each of an expert's tokens stands: a fixed Fourier code added to its aligned state.

Beyond the paper, which reads one vector per expert, where order does not arise. Attention
over a set of keys is blind to their order: without a position the Perceiver reads an expert's
answer "1234" as it reads "4321", save for what each token's own state says of its neighbours.
The Perceiver's authors add Fourier features of each input's position (Jaegle et al., 2021);
``token_positions`` does the same on the token channels, per expert, counting its real tokens.

The code is zero at position 0, so an expert with one token still reads exactly as its pooled
vector, and padding (whose weight is 0 anyway) gets no code.
"""

from __future__ import annotations

import torch


def real_positions(mask: torch.Tensor) -> torch.Tensor:
    """Each slot's index among its row's real tokens: mask [B, T] bool → [B, T] long, 0 on
    padding (wherever the padding sits)."""
    return ((mask.long().cumsum(dim=1) - 1).clamp_min(0)) * mask.long()


def fourier_code(positions: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """Transformer-style sinusoids shifted to vanish at 0: for k < d/2, ω_k = base^(-2k/d),
    code[2k] = sin(p ω_k), code[2k+1] = cos(p ω_k) − 1. positions [B, T] → [B, T, d] float32
    (an odd d's last dimension is 0)."""
    k = torch.arange(d // 2, dtype=torch.float32, device=positions.device)
    angle = positions.float().unsqueeze(-1) * base ** (-2.0 * k / d)  # [B, T, d/2]
    code = torch.stack([torch.sin(angle), torch.cos(angle) - 1.0], dim=-1).flatten(-2)
    if d % 2:
        code = torch.nn.functional.pad(code, (0, 1))
    return code
