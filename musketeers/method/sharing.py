"""Run what many rows share once: a head all prompts start with, rows picked out of a shared
KV cache, and completions in chunks of similar length.

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


def length_chunks(lengths: list[int], fixed_cost: int) -> list[list[int]]:
    """Row indices in chunks of similar length (longest first) that minimise the tokens the
    chunks run: each chunk pads its rows to its longest, and costs ``fixed_cost`` tokens more
    (a forward's own cost, such as reading every weight once).

    Sampled completions are ragged: in the pocket regime a batch of 32 averaged ~13 of its
    32 columns, so one right-padded batch ran ~2.5× the tokens it scored. The split is the
    exact optimum over the sorted rows (dynamic programming, O(N²) for N rows).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    n = len(order)
    best, cut = [0] + [None] * n, [0] * (n + 1)
    for j in range(1, n + 1):  # best[j]: the cheapest split of the j longest rows
        for i in range(j):  # its last chunk is order[i:j], padded to lengths[order[i]]
            cost = best[i] + (j - i) * lengths[order[i]] + fixed_cost
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], n
    while j:
        chunks.append(order[cut[j]:j])
        j = cut[j]
    return chunks[::-1]
