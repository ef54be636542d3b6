"""What precompute computes for one row chunk of one expert: the poolings of one backbone pass
(with every prompt token's states at chosen layers), and greedy answers (with their states).

Truncation rule: a prompt longer than the expert's context (or ``max_length``) keeps its
*last* tokens, where the question ends and the answer starts; it is counted in ``truncated``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from musketeers.cache.backbone import Backbone, forward_states, pad
from musketeers.cache.batching import BATCH_OVERHEAD_TOKENS, length_batches
from musketeers.cache.items import Item
from musketeers.cache.layout import HINT_SCORES
from musketeers.cache.pooling import random_positions
from musketeers.cache.prompts import oracle_view, render_prompt

if TYPE_CHECKING:
    from musketeers.cache.precompute import PrecomputeConfig

STATES = "_states"  # the key of {layer: [T_i, d] per row} in a chunk's arrays: not a zarr array
Scorer = Callable[[Item, str], float]  # (item, expert's answer) -> the task's reward in [0, 1]


def context_length(model, max_length: int) -> int:
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return min(max_length, limit) if limit else max_length


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


@torch.inference_mode()
def greedy_answers(model, tokenizer, seqs: list[list[int]], max_new_tokens: int,
                   layers: tuple[int, ...] = ()) -> tuple[list[str], dict[int, list[np.ndarray]]]:
    """The expert's own greedy answers (output-level collaboration baseline), left-padded, and
    at each of ``layers`` the hidden state that produced each answer token ({layer: one
    [n_i, d] per prompt}): the state at the position before it, the prompt's last token for the
    first. ``n_i`` counts the generated tokens up to and including the first end-of-sequence
    token (the text drops it); later positions are padding of a batch still generating."""
    device = next(model.parameters()).device
    ids, mask = pad(seqs, tokenizer.pad_token_id, "left")
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True,
                         output_hidden_states=bool(layers))
    new = out.sequences[:, ids.shape[1]:].cpu()
    texts = tokenizer.batch_decode(new, skip_special_tokens=True)
    if not layers:
        return texts, {}
    eos = _eos_ids(model, tokenizer)
    lengths = []
    for row in new.tolist():
        ends = [j for j, t in enumerate(row) if t in eos]
        lengths.append(ends[0] + 1 if ends else len(row))
    states = {}
    for k in layers:
        # step j's last position produced token j: [B, steps, d]
        steps = torch.stack([step[k][:, -1] for step in out.hidden_states], dim=1).float().cpu()
        states[k] = [steps[r, :n].numpy() for r, n in enumerate(lengths)]
    return texts, states


def greedy_hints(model, tokenizer, seqs: list[list[int]], max_new_tokens: int) -> list[str]:
    """The expert's own greedy answers, text only."""
    return greedy_answers(model, tokenizer, seqs, max_new_tokens)[0]


def prompt_seqs(tokenizer, items: list[Item], limit: int,
                oracle: bool = False) -> tuple[list[list[int]], list[bool]]:
    """Token ids per item under the truncation rule (keep the last ``limit``); which were cut.
    An oracle expert reads each question with its gold answer (``oracle_view``)."""
    seqs, truncated = [], []
    for it in items:
        ids = render_prompt(tokenizer, oracle_view(it) if oracle else it)
        truncated.append(len(ids) > limit)
        seqs.append(ids[-limit:])
    return seqs, truncated


def _scatter(states: dict[int, list], batch: list[int], got: dict[int, list[np.ndarray]],
             n: int) -> None:
    for k, rows in got.items():
        column = states.setdefault(k, [None] * n)
        for i, r in zip(batch, rows, strict=True):
            column[i] = r


def compute_rows(model, tokenizer, items: list[Item], rows: np.ndarray,
                 cfg: PrecomputeConfig, backbone: Backbone | None = None,
                 oracle: bool = False, layers: tuple[int, ...] = ()) -> tuple[dict, int]:
    """Every pooled array for ``items`` (global row indices ``rows``), and the token count;
    with ``layers``, also every prompt token's states there (under ``STATES``).

    ``backbone`` is the model's (possibly compiled) backbone pass; by default the plain one.
    """
    backbone = backbone or Backbone(model)
    seqs, truncated = prompt_seqs(tokenizer, items, context_length(model, cfg.max_length),
                                  oracle)
    n_tok = np.array([len(s) for s in seqs], dtype=np.int32)
    rand = random_positions(rows, n_tok, cfg.seed)
    out: dict = {"n_tokens": n_tok, "truncated": np.array(truncated), "random_pos": rand}
    states: dict[int, list] = {}
    for batch in length_batches(n_tok.tolist(), cfg.batch_tokens):
        pooled, got = forward_states(backbone, [seqs[i] for i in batch], rand[batch],
                                     tokenizer.pad_token_id, layers)
        for k, v in pooled.items():
            out.setdefault(k, np.zeros((len(items),) + v.shape[1:], np.float32))[batch] = v
        _scatter(states, batch, got, len(items))
    if layers:
        out[STATES] = states
    return out, int(n_tok.sum())


def generation_overhead(max_new_tokens: int) -> int:
    """A ``generate`` call's fixed cost in token-equivalents (``length_batches``' overhead): a
    forward call per new token, each costing about what the prefill's one call does, so the
    hints run in as few calls as the token budget allows."""
    return BATCH_OVERHEAD_TOKENS * (1 + max_new_tokens)


def compute_hints(model, tokenizer, items: list[Item], cfg: PrecomputeConfig,
                  oracle: bool = False, layers: tuple[int, ...] = (),
                  tick: Callable[[int], None] | None = None) -> tuple[dict, int]:
    """The ``hints`` array for ``items``: greedy answers, batched like the poolings; their
    scores under ``cfg.scorer`` when one is given; with ``layers``, their states. ``tick(k)``
    is told after each batch of ``k`` answers (generation is the slow part of a store)."""
    seqs, _ = prompt_seqs(tokenizer, items, context_length(model, cfg.max_length), oracle)
    hints = np.empty(len(items), dtype=object)
    states: dict[int, list] = {}
    for batch in length_batches([len(s) for s in seqs], cfg.batch_tokens,
                                generation_overhead(cfg.hint_tokens)):
        texts, got = greedy_answers(model, tokenizer, [seqs[i] for i in batch], cfg.hint_tokens,
                                    layers)
        hints[batch] = texts
        _scatter(states, batch, got, len(items))
        if tick is not None:
            tick(len(batch))
    out: dict = {"hints": hints}
    if cfg.scorer is not None:
        out[HINT_SCORES] = np.array([cfg.scorer(it, str(h)) for it, h in zip(items, hints,
                                                                             strict=True)],
                                    dtype=np.float32)
    if layers:
        out[STATES] = states
    return out, sum(len(s) for s in seqs)
