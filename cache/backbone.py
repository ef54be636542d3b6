"""The expert's backbone pass: length-batched, right-padded, optionally compiled.

Everything here is about speed; what is computed is Eq. 5 (``pooling.py``). Tests pin that a
batched pass equals one prompt at a time (``tests/test_cache_pooling.py``), that the batching
(``batching.py``) is optimal and that a compiled pass equals the eager one
(``tests/test_cache_backbone.py``).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from musketeers.cache.errors import UserError
from musketeers.cache.pooling import pool_hidden_states

log = logging.getLogger("musketeers.precompute")

COMPILE_MIN_ITEMS = 2000
"""``--compile auto`` compiles CUDA runs of at least this many prompts per expert.

On the 2-core CPU of BENCHMARKS.md a compile takes 1–2 min per expert and its gain was inside
the run-to-run noise for Qwen2.5-0.5B and SmolLM2 (clear only for Gemma-3-270M, +18–34 %),
so ``auto`` leaves CPU runs eager; ``--compile on`` forces it."""

COMPILE_MODES = ("auto", "on", "off")


def want_compile(mode: str, n_items: int, device: str = "cpu") -> bool:
    if mode not in COMPILE_MODES:
        raise UserError(f"unknown --compile {mode!r}; use one of {', '.join(COMPILE_MODES)}")
    auto = device == "cuda" and n_items >= COMPILE_MIN_ITEMS
    return mode == "on" or (mode == "auto" and auto)


class Backbone:
    """``model.base_model`` (no LM head) returning every hidden state, compiled on request.

    The compiled graph is separate from ``model``: generation (``--hints``) runs the plain
    model, whose growing KV cache would otherwise recompile at every step.
    """

    def __init__(self, model, compiled: bool = False):
        self.device = next(model.parameters()).device
        self.compiled = compiled
        self.eager = model.base_model
        self.fn = torch.compile(self.eager, dynamic=True) if compiled else self.eager

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Dynamo specialises dimensions of size 1, so a batch of one prompt would compile a
        # second graph (~90 s); running it twice is far cheaper.
        single = self.compiled and ids.shape[0] == 1
        if single:
            ids, mask = ids.repeat(2, 1), mask.repeat(2, 1)
        kwargs = dict(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                      output_hidden_states=True, use_cache=False)
        try:
            out = self.fn(**kwargs)
        except Exception as exc:  # noqa: BLE001 - an architecture Dynamo cannot trace
            if not self.compiled:
                raise
            log.warning("torch.compile failed on this expert (%s); running it eagerly",
                        str(exc).splitlines()[0][:200])
            self.fn, self.compiled = self.eager, False
            out = self.fn(**kwargs)
        return tuple(h[:1].cpu() if single else h.cpu() for h in out.hidden_states)


def pad(seqs: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for r, s in enumerate(seqs):
        sl = slice(t - len(s), t) if side == "left" else slice(0, len(s))
        ids[r, sl] = torch.tensor(s)
        mask[r, sl] = 1
    return ids, mask


@torch.inference_mode()
def forward_pool(backbone: Backbone, seqs: list[list[int]], rand: np.ndarray,
                 pad_id: int) -> dict:
    """One backbone pass over a right-padded batch → every pooling (Eq. 5 and variants)."""
    return forward_states(backbone, seqs, rand, pad_id)[0]


@torch.inference_mode()
def forward_states(backbone: Backbone, seqs: list[list[int]], rand: np.ndarray, pad_id: int,
                   layers: tuple[int, ...] = ()) -> tuple[dict, dict[int, list[np.ndarray]]]:
    """One backbone pass over a right-padded batch → every pooling (Eq. 5 and variants), and
    every real token's hidden state at each of ``layers`` ({layer: one [T_i, d] per prompt}).

    Right padding keeps every real token at its unpadded position, so no position ids are
    needed and causal attention never lets a real token see padding.
    """
    ids, mask = pad(seqs, pad_id, "right")
    hidden = backbone(ids, mask)
    pooled = pool_hidden_states(hidden, mask, torch.from_numpy(rand))
    states = {k: [hidden[k][r, :len(s)].float().numpy() for r, s in enumerate(seqs)]
              for k in layers}
    return pooled, states
