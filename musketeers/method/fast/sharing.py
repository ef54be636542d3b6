"""Run what many rows share once: a head all prompts start with and rows picked out of a
shared KV cache (completions in chunks of similar length: ``musketeers.cache.batching``).

These are the bookkeeping of ``Policy``'s prefill and log-prob passes; none of them changes a
row's tokens, positions or attention, only how many padded and repeated tokens the model runs.
"""

from __future__ import annotations

import copy

from torch import Tensor


def common_head(prompts: list[list[int]], limits: list[int]) -> int:
    """How many leading tokens all ``prompts`` share, at most ``limits[i]`` for prompt i (0 for
    fewer than two prompts: there is nothing to share)."""
    if len(prompts) < 2:
        return 0
    first, k, limit = prompts[0], 0, min(limits)
    while k < limit and all(p[k] == first[k] for p in prompts):
        k += 1
    return k


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
