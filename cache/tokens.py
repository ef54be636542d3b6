"""Ragged per-token hidden states of one expert on one split, read lazily row by row.

Besides the pooled vector per expert (channel ``pooled``), a store may hold the hidden state of
every prompt token (``tokens``) or of every token of the expert's own greedy answer
(``answer``) at chosen layers. Rows are ragged, so a channel is a flat ``[T_total, d]`` array
plus offsets ``[N+1]``: row ``i`` is ``flat[offsets[i]:offsets[i+1]]``. ``TokenRows`` slices only
the rows asked for, so a split's tokens are never loaded whole: at most the stored chunks one
batch covers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

POOLED, TOKENS, ANSWER = "pooled", "tokens", "answer"
CHANNELS: tuple[str, ...] = (POOLED, TOKENS, ANSWER)  # the one declaration; config checks it


@dataclass(frozen=True)
class TokenRows:
    """One expert's ragged token states on one split: row i's tokens are
    ``flat[offsets[i]:offsets[i+1]]``."""

    offsets: np.ndarray  # [N+1] int64, offsets[0] == 0, non-decreasing
    flat: Any  # [T_total, d] array-like (a zarr.Array in a store, np.ndarray in tests)

    def __post_init__(self) -> None:
        off = np.asarray(self.offsets)
        if off.ndim != 1 or len(off) < 1 or off[0] != 0 or (np.diff(off) < 0).any():
            raise ValueError("offsets must be [N+1], start at 0 and never decrease")
        if len(self.flat.shape) != 2 or off[-1] != self.flat.shape[0]:
            raise ValueError(f"offsets end at {off[-1]} but flat holds shape {self.flat.shape}")
        object.__setattr__(self, "offsets", off.astype(np.int64, copy=False))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def dim(self) -> int:
        return int(self.flat.shape[1])

    def lengths(self) -> np.ndarray:
        """Tokens per row, [N]."""
        return np.diff(self.offsets)

    def rows(self, idx: Sequence[int]) -> list[np.ndarray]:
        """Rows ``idx``, each ``[T_i, d]`` float32; reads only their slices of ``flat``, all
        at once where ``flat`` can (``read_slices``: a store's, each stored chunk decoded once
        however many of the rows it holds)."""
        n = len(self)
        spans = []
        for i in idx:
            i = int(i)
            if not 0 <= i < n:
                raise IndexError(f"row {i} out of range for {n} rows")
            spans.append((int(self.offsets[i]), int(self.offsets[i + 1])))
        read = getattr(self.flat, "read_slices", None)
        parts = read(spans) if read is not None else [self.flat[lo:hi] for lo, hi in spans]
        return [np.asarray(p, dtype=np.float32).reshape(hi - lo, self.dim)
                for p, (lo, hi) in zip(parts, spans, strict=True)]

    def padded(self, idx: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``idx`` zero-padded to the longest: ``([B, T_max, d] float32, [B, T_max] bool)``,
        the mask True on real tokens; ``T_max >= 1`` so an empty batch row still has a slot."""
        rows = self.rows(idx)
        t_max = max([1, *(len(r) for r in rows)])
        states = np.zeros((len(rows), t_max, self.dim), dtype=np.float32)
        mask = np.zeros((len(rows), t_max), dtype=bool)
        for b, r in enumerate(rows):
            states[b, :len(r)] = r
            mask[b, :len(r)] = True
        return states, mask


def offsets_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[N+1]`` offsets of rows with these token counts."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if (lengths < 0).any():
        raise ValueError("token counts cannot be negative")
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def from_arrays(rows: Sequence[np.ndarray]) -> TokenRows:
    """A ``TokenRows`` over per-row ``[T_i, d]`` arrays in memory (tests, stores from memory)."""
    if not rows:
        raise ValueError("from_arrays needs at least one row")
    d = np.asarray(rows[0]).shape[-1]
    flat = np.concatenate([np.asarray(r, dtype=np.float32).reshape(-1, d) for r in rows])
    return TokenRows(offsets_from_lengths([len(r) for r in rows]), flat)
