"""What the adapter reads of one expert: its pooled vector, or its token states with a mask.

Channel ``pooled`` (the paper's) gives each expert one vector per item, a tensor [B, d_i].
Channels ``tokens`` and ``answer`` give each expert a ragged set of token states per item,
zero-padded to the batch's longest: ``ExpertTokens(states [B, T, d_i], mask [B, T])``, the
mask True on real tokens. Every consumer of a batch (the rollout, the warm-up, the evaluation,
the benches) handles either through ``rows_in`` and ``to_device``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertTokens:
    """One expert's token states for a batch: ``states`` [B, T, d_i], ``mask`` [B, T] bool
    (True = a real token, False = padding)."""

    states: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self) -> None:
        if self.states.ndim != 3 or tuple(self.mask.shape) != tuple(self.states.shape[:2]):
            raise ValueError(f"ExpertTokens needs states [B, T, d] and mask [B, T], got "
                             f"{list(self.states.shape)} and {list(self.mask.shape)}")
        if self.mask.dtype != torch.bool:
            raise ValueError(f"ExpertTokens' mask must be bool, got {self.mask.dtype}")

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def __getitem__(self, idx) -> ExpertTokens:
        """Rows ``idx`` (a slice, an index tensor or list), as a tensor's rows would be."""
        return ExpertTokens(self.states[idx], self.mask[idx])

    def to(self, device) -> ExpertTokens:
        return ExpertTokens(self.states.to(device), self.mask.to(device))


ExpertInput = torch.Tensor | ExpertTokens  # pooled [B, d_i], or token states with a mask


def rows_in(x: ExpertInput) -> int:
    """The batch size B of one expert's input, pooled or tokens."""
    return len(x) if isinstance(x, ExpertTokens) else int(x.shape[0])


def to_device(inputs: list[ExpertInput], device) -> list[ExpertInput]:
    return [x.to(device) for x in inputs]
