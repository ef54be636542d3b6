"""The backbone pass's speed-ups compute the same thing: the padding-minimising batcher is
optimal and within budget, and a compiled backbone equals the eager one."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from conftest import make_items, tiny_specs

from musketeers.cache.backbone import Backbone, want_compile
from musketeers.cache.batching import length_batches
from musketeers.cache.errors import UserError
from musketeers.cache.experts import load_expert
from musketeers.cache.precompute import PrecomputeConfig, compute_rows


def cost(batches: list[list[int]], lengths: list[int], overhead: int) -> int:
    return sum(len(b) * max(lengths[i] for i in b) + overhead for b in batches)


def set_partitions(xs: list[int]):
    """Every partition of ``xs`` into non-empty blocks (Bell(n) of them)."""
    if not xs:
        yield []
        return
    head, rest = xs[0], xs[1:]
    for part in set_partitions(rest):
        yield [[head], *part]
        for k in range(len(part)):
            yield [*part[:k], [head, *part[k]], *part[k + 1:]]


def feasible(batches, lengths, budget) -> bool:
    return all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget for b in batches)


@pytest.mark.parametrize("seed", range(12))
def test_length_batches_is_the_cheapest_partition(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 7))]
    budget, overhead = rng.choice([40, 80, 150, 1000]), rng.choice([0, 8, 64])
    got = length_batches(lengths, budget, overhead)
    assert sorted(itertools.chain(*got)) == list(range(len(lengths)))
    assert feasible(got, lengths, budget)
    best = min(cost(p, lengths, overhead) for p in set_partitions(list(range(len(lengths))))
               if feasible(p, lengths, budget))
    assert cost(got, lengths, overhead) == best


def test_length_batches_splits_an_outlier_from_its_neighbours():
    # the greedy fill this replaced padded fifteen ~250-token prompts to the one of 499
    lengths = [499] + [250 + i for i in range(15)]
    batches = length_batches(lengths, 8192)
    assert [0] in batches
    assert cost(batches, lengths, 64) < len(lengths) * 499


def test_hints_are_generated_in_as_few_calls_as_the_token_budget_allows(monkeypatch):
    """A generate call runs a forward per new token, so the hints' batches are costed with that
    overhead: where the token budget has room for every item, one call, and each item's answer
    is the one it gets generated alone."""
    import musketeers.cache.compute as compute

    spec = next(s for s in tiny_specs() if s.name == "tiny-llama")
    model, tok = load_expert(spec, "cpu", torch.float32)
    items = make_items(12)
    lengths = [len(s) for s in compute.prompt_seqs(tok, items, 10**6)[0]]
    budget = len(items) * max(lengths)  # room for every item in one batch
    cfg = PrecomputeConfig(batch_tokens=budget, hint_tokens=6)
    sizes: list[int] = []
    real = compute.greedy_answers

    def counted(model, tokenizer, seqs, *args, **kwargs):
        sizes.append(len(seqs))
        return real(model, tokenizer, seqs, *args, **kwargs)

    monkeypatch.setattr(compute, "greedy_answers", counted)
    batched = compute.compute_hints(model, tok, items, cfg)[0]["hints"]
    # one call, where the prefill's cost model pays some padding to save a call or two
    assert sizes == [len(items)] and len(length_batches(lengths, budget)) > 1
    sizes.clear()
    alone = compute.compute_hints(model, tok, items, PrecomputeConfig(batch_tokens=1,
                                                                       hint_tokens=6))[0]
    assert sizes == [1] * len(items)
    assert list(batched) == list(alone["hints"])


def test_want_compile_modes():
    assert want_compile("on", 1) and not want_compile("off", 10**6, "cuda")
    assert not want_compile("auto", 10, "cuda") and want_compile("auto", 10**6, "cuda")
    assert not want_compile("auto", 10**6, "cpu")  # no measured gain on the CPU
    with pytest.raises(UserError, match="auto, on, off"):
        want_compile("yes", 1)


def test_compile_failure_falls_back_to_eager():
    spec = next(s for s in tiny_specs() if s.name == "tiny-llama")
    model, tok = load_expert(spec, "cpu", torch.float32)
    items, rows, cfg = make_items(3), np.arange(3), PrecomputeConfig(batch_tokens=96)
    eager, _ = compute_rows(model, tok, items, rows, cfg)
    broken = Backbone(model, compiled=True)

    def untraceable(**_):
        raise RuntimeError("dynamo: cannot trace this")

    broken.fn = untraceable
    got, _ = compute_rows(model, tok, items, rows, cfg, broken)
    assert not broken.compiled
    np.testing.assert_array_equal(got["last"], eager["last"])


def test_compiled_backbone_equals_eager():
    """One compiled graph serves every batch shape, a batch of one included (the duplicated
    row), and gives the eager values."""
    spec = next(s for s in tiny_specs() if s.name == "tiny-llama")
    model, tok = load_expert(spec, "cpu", torch.float32)
    items = make_items(9, seed=3)
    rows = np.arange(len(items))
    cfg = PrecomputeConfig(batch_tokens=96)
    eager, _ = compute_rows(model, tok, items, rows, cfg)
    compiled = Backbone(model, compiled=True)
    got, _ = compute_rows(model, tok, items, rows, cfg, compiled)
    got1, _ = compute_rows(model, tok, items[:1], rows[:1], cfg, compiled)
    for k in ("last", "first", "random", "layers_last", "layers_mean"):
        np.testing.assert_allclose(got[k], eager[k], atol=1e-4, rtol=1e-4, err_msg=k)
        np.testing.assert_allclose(got1[k], eager[k][:1], atol=1e-4, rtol=1e-4, err_msg=k)
