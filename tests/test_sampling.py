"""Inverse-CDF token sampling: the draws follow softmax(logits / T), restricted by top-p."""

import math

import pytest
import torch

from musketeers.method.sampling import sample_tokens

N = 40_000


def frequencies(logits: torch.Tensor, **kw) -> torch.Tensor:
    rows = logits.expand(N, -1)
    draws = sample_tokens(rows, generator=torch.Generator().manual_seed(0), **kw)
    return torch.bincount(draws, minlength=logits.shape[-1]).double() / N


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_draws_follow_softmax_with_temperature(temperature):
    logits = torch.tensor([[2.0, 0.0, -1.0, float("-inf"), 1.0, 0.5]])
    want = torch.softmax(logits.double() / temperature, dim=-1)[0]
    got = frequencies(logits, temperature=temperature)
    sigma = (want * (1 - want) / N).sqrt()
    assert got[3] == 0  # zero probability: never drawn
    assert torch.all((got - want).abs() <= 5 * sigma + 1e-12), (got, want)


def test_top_p_keeps_the_smallest_nucleus_renormalised():
    probs = torch.tensor([0.5, 0.05, 0.3, 0.15])
    logits = probs.log()[None]
    got = frequencies(logits, top_p=0.8)  # {0.5, 0.3} reaches 0.8: the rest is cut
    want = torch.tensor([0.5, 0.0, 0.3, 0.0], dtype=torch.float64) / 0.8
    assert got[1] == 0 and got[3] == 0
    assert torch.allclose(got, want, atol=5 * math.sqrt(0.25 / N))
    # a nucleus reaching past the first token keeps the token that crosses the threshold
    assert (frequencies(logits, top_p=0.6)[[0, 2]] > 0).all()


def test_greedy_and_generator_reproducibility():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sample_tokens(logits, greedy=True), logits.argmax(-1))
    a = sample_tokens(logits, generator=torch.Generator().manual_seed(5))
    b = sample_tokens(logits, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    draws = torch.stack([sample_tokens(logits) for _ in range(20)])
    assert (draws != draws[0]).any()  # the global RNG path does vary


def test_per_prompt_streams_do_not_depend_on_the_batch():
    """With one generator per prompt (a block of G rows), a prompt's draws are the same alone
    or beside others: how an update is cut into batches or ranks changes no sample."""
    logits = torch.zeros(6, 1000)  # uniform: the token is the draw itself, at 1/1000 resolution

    def streams(*seeds: int) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(s) for s in seeds]

    together = sample_tokens(logits, generator=streams(1, 2, 3))  # 3 prompts × G 2
    alone = sample_tokens(logits[:2], generator=streams(2))
    assert torch.equal(together[2:4], alone)
    assert not torch.equal(together[0:2], together[2:4])
    with pytest.raises(ValueError, match="do not split"):
        sample_tokens(logits, generator=streams(1, 2, 3, 4))
