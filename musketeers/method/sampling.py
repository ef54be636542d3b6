"""Autoregressive sampling of G completions per prompt from a shared prefix's KV cache.

This is the decode loop ``Policy.generate`` runs instead of ``transformers``' ``generate``.
Profiling one GRPO step on a 2-core CPU (SmolLM2-135M, 16 rows, ~250-token prompts) put
~0.17 s into each generated token, of which ``torch.multinomial``'s exponential draws over the
49k-entry vocabulary were 22 ms (13 %): it draws one exponential per vocabulary entry per row.
Inverse-CDF sampling draws one uniform per row and does one cumulative sum, the same
distribution for a fraction of the cost. The loop itself is the plain one every GRPO
implementation writes: one forward per new token with the KV cache, no logits processors.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import DynamicLayer, StaticLayer

from musketeers.method.kv_cache import CACHE_KW, kv_cache


def sample_tokens(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | list[torch.Generator] | None = None,
    rows: Tensor | None = None,
    n_rows: int | None = None,
    u: Tensor | None = None,
) -> Tensor:
    """One token per row of ``logits`` [N, V]: argmax when ``greedy``, else a draw from
    softmax(logits / temperature), restricted to the smallest set of tokens whose probability
    reaches ``top_p`` (nucleus sampling; 1.0 keeps the full distribution).

    Inverse CDF: with u ~ U[0, 1) per row, the token is the first index whose cumulative
    probability exceeds u · total. A zero-probability token never is (its cumulative sum equals
    its predecessor's), and u comes from ``generator`` (on the CPU, so a seed gives the same
    draws on every device) or from the global RNG. ``rows``/``n_rows``: the logits are rows
    ``rows`` of a batch of ``n_rows``; u is drawn for all ``n_rows`` and row i takes
    u[rows[i]], so a row's draws do not depend on which other rows are still running.
    A list of generators splits the ``n_rows`` into as many equal consecutive blocks (a
    prompt's G rows, each prompt with its own stream): a prompt's draws then do not depend on
    which other prompts share its batch, or its process under data parallelism.
    """
    if greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.cumsum(dim=-1)
    if u is None:
        u = uniforms(probs.shape[0] if n_rows is None else n_rows, generator)
        u = u if rows is None else u[rows.cpu()]
    u = u.to(cdf.device)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return idx.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def uniforms(n: int, generator: torch.Generator | list[torch.Generator] | None) -> Tensor:
    """[n, 1] draws from U[0, 1): from one stream, or a block of n / k rows from each of k."""
    if not isinstance(generator, list):
        return torch.rand(n, 1, generator=generator)
    if not generator or n % len(generator):
        raise ValueError(f"{n} rows do not split into {len(generator)} generators' blocks")
    per = n // len(generator)
    return torch.cat([torch.rand(per, 1, generator=g) for g in generator])


def token_logprobs(logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / temperature) at ``ids``: [N, T, V], [N, T] → [N, T] float32, the
    distribution ``sample_tokens`` draws from (before top_p), so a sampled token's log-prob
    in the GRPO ratio is that of the draw."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def preallocate(cache, max_len: int):
    """Move a filled ``DynamicCache`` into buffers of ``max_len`` positions, in place.

    A dynamic layer concatenates its whole K/V with each new token: at ~250-token prefixes that
    copy was 16 % of a decode step on a 2-core CPU. ``transformers``' ``StaticLayer`` writes the
    new token into a preallocated buffer instead (attention then spans the buffer, the unwritten
    columns masked). Caches with other layer kinds (sliding windows, …) are left as they are.
    """
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        return cache
    for i, old in enumerate(cache.layers):
        length = old.keys.shape[-2]
        layer = StaticLayer(max_len)
        layer.lazy_initialization(old.keys, old.values)
        layer.keys[:, :, :length] = old.keys
        layer.values[:, :, :length] = old.values
        layer.cumulative_length.fill_(length)
        cache.layers[i] = layer
    return cache


def _select_rows(cache, rows: Tensor) -> bool:
    """Keep only ``rows`` of every layer of ``cache``, in place; False (nothing changed) for a
    cache with a layer kind this does not know how to cut."""
    kinds = {type(layer) for layer in cache.layers}
    if not kinds <= {StaticLayer, DynamicLayer}:
        return False
    for layer in cache.layers:
        if isinstance(layer, StaticLayer):
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]
            layer.batch_size = int(rows.numel())
        else:
            layer.batch_select_indices(rows)
    return True


@torch.no_grad()
def decode(
    model: torch.nn.Module,
    first_logits: Tensor,
    past_key_values,
    attention_mask: Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    **sampling,
) -> Tensor:
    """Continue N rows from a filled KV cache: [N, ≤ max_new_tokens] new token ids.

    ``first_logits`` [N, V] are the prefix's last logits, ``attention_mask`` [N, P] its mask.
    Each new token takes the next position after its row's real tokens (the cumsum rule of
    ``Policy.build_inputs``). A row that emitted an eos leaves the batch (its KV cache rows are
    dropped) and is padded with ``pad_id`` (cut later); the loop stops when every row has one.
    Short answers end long before the longest one: in the pocket regime (mean 12 of 32
    tokens) most decode steps used to run the full batch for a few long rows. Each row's
    random draws are the same as with the full batch (``sample_tokens``' ``rows``).
    """
    n, p = attention_mask.shape
    dev = attention_mask.device
    embed = model.get_input_embeddings()
    mask = torch.cat([attention_mask, attention_mask.new_ones(n, max_new_tokens)], dim=1)
    position = attention_mask.sum(-1, keepdim=True)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=dev)
    past_key_values = preallocate(past_key_values, p + max_new_tokens)
    out_ids = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    live = torch.arange(n, device=dev)  # the batch row each running row came from
    done = torch.zeros(n, dtype=torch.bool, device=dev)  # per running row
    logits, steps = first_logits, 0
    for t in range(max_new_tokens):
        nxt = sample_tokens(logits, rows=live, n_rows=n, **sampling).masked_fill(done, pad_id)
        out_ids[live, t] = nxt
        steps = t + 1
        done = done | torch.isin(nxt, eos)
        if t == max_new_tokens - 1 or bool(done.all()):
            break
        stay = (~done).nonzero().squeeze(-1)
        # a cache kind that cannot be cut keeps its ended rows running, padded
        if stay.numel() < live.numel() and _select_rows(past_key_values, stay):
            live, nxt, mask, position, done = (live[stay], nxt[stay], mask[stay],
                                               position[stay], done[stay])
        out = model(inputs_embeds=embed(nxt[:, None]), attention_mask=mask[:, : p + t + 1],
                    position_ids=position + t, use_cache=True, **{CACHE_KW: past_key_values})
        past_key_values = kv_cache(out)
        logits = out.logits[:, -1]
    return out_ids[:, :steps]
