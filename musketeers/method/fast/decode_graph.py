"""Decode with fixed shapes, so that a GPU can replay each step's forward as one CUDA graph.

On a GPU the eager loop (``sampling.decode``) is bound by kernel launches, not by memory:
about 1.4 ms a layer whatever its width (docs/benchmarks-history.md, "the paper step
measured on one GPU"). A CUDA graph replays a step's hundreds of kernels as one launch, but
it needs fixed shapes and no reads back to the host inside the step. So here:

- no row leaves the batch: an ended row decodes padding, its tokens thrown away;
- the attention mask spans the KV cache's full length from the start, each new column
  opened before the step that writes it;
- every row's uniforms are drawn before the first step, in the order ``decode`` draws them,
  so a row samples what it samples there (its generator is left further on: the training
  loop's generators are fresh for every call).

On a CPU the same loop runs eagerly (``graph=False``): the tests check it against ``decode``.
There it is slower than ``decode`` (ended rows keep running), so ``Policy`` graphs on CUDA only.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import DynamicLayer, StaticLayer

from musketeers.method.kv_cache import CACHE_KW
from musketeers.method.sampling import preallocate, sample_tokens, uniforms

# how often (in steps) the loop reads back whether every row has ended: each read drains the
# queue of launched work, which is what a graph exists to keep full
CHECK_EVERY = 8


def why_not_graphed(model: torch.nn.Module, cache) -> str | None:
    """Why this model and KV cache cannot decode with fixed shapes, or None when they can:
    the mask is handed over as a 4-D tensor, which only sdpa and eager attention read as
    is, and only full-attention layers keep every key a graph's fixed mask can address."""
    impl = model.config._attn_implementation
    if impl not in ("sdpa", "eager"):
        return f"graphed decoding needs sdpa or eager attention, not {impl}"
    if not {type(layer) for layer in cache.layers} <= {DynamicLayer, StaticLayer}:
        return "graphed decoding needs a KV cache of full-attention layers only"
    return None


def fixed_mask(model: torch.nn.Module, open_cols: Tensor) -> Tensor:
    """The [N, 1, 1, L] mask of one query token from a bool [N, L] of the key columns it
    may read, in the form the model's attention takes (``sdpa``: keep where True, a view of
    ``open_cols``; ``eager``: an additive bias)."""
    mask = open_cols[:, None, None, :]
    if model.config._attn_implementation == "eager":
        dtype = model.get_input_embeddings().weight.dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    return mask


@torch.no_grad()
def decode_fixed(
    model: torch.nn.Module,
    first_logits: Tensor,
    past_key_values,
    attention_mask: Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    graph: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | list[torch.Generator] | None = None,
) -> Tensor:
    """``sampling.decode``'s [N, ≤ max_new_tokens] new token ids, every step on all N rows;
    ``graph``: steps after the first replay a CUDA graph of the first (CUDA only)."""
    n, p = attention_mask.shape
    dev = attention_mask.device
    reason = why_not_graphed(model, past_key_values)
    if reason:
        raise ValueError(f"{reason}; run without --decode-graphs")
    cache = preallocate(past_key_values, p + max_new_tokens)
    cols = torch.zeros(n, p + max_new_tokens, dtype=torch.bool, device=dev)
    cols[:, :p] = attention_mask.bool()
    mask = fixed_mask(model, cols)
    position = attention_mask.sum(-1, keepdim=True)  # each row's next position (cumsum rule)
    token = torch.full((n, 1), pad_id, dtype=torch.long, device=dev)
    embed = model.get_input_embeddings()

    def step() -> Tensor:  # reads token, position, mask and the cache: all fixed buffers
        out = model(inputs_embeds=embed(token), attention_mask=mask, position_ids=position,
                    use_cache=True, **{CACHE_KW: cache})
        return out.logits[:, -1]

    u = None if greedy else torch.stack([uniforms(n, generator)
                                         for _ in range(max_new_tokens)]).to(dev)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=dev)
    out_ids = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    logits, replay, steps = first_logits, None, 0
    for t in range(max_new_tokens):
        nxt = sample_tokens(logits, temperature=temperature, top_p=top_p, greedy=greedy,
                            u=None if u is None else u[t]).masked_fill(done, pad_id)
        out_ids[:, t] = nxt
        steps = t + 1
        done |= torch.isin(nxt, eos)
        if t == max_new_tokens - 1 or ((t + 1) % CHECK_EVERY == 0 and bool(done.all())):
            break
        token.copy_(nxt[:, None])
        # open the column this step's key and value are written to
        mask[:, :, :, p + t] = True if mask.dtype == torch.bool else 0.0
        if t > 0:
            position.add_(1)
        if replay is not None:
            replay[0].replay()
            logits = replay[1]
        elif graph:
            logits, replay = _first_and_graph(step)
        else:
            logits = step()
    return out_ids[:, :steps]


def _first_and_graph(step) -> tuple[Tensor, tuple[torch.cuda.CUDAGraph, Tensor]]:
    """Run ``step`` once for real, on a side stream (capture wants its kernels warmed),
    then capture it: (that step's logits, (the graph, the logits each replay refills)).
    Capture runs nothing, so the cache's write position moves once, as it should."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = step().clone()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    return first, (graph, logits)
