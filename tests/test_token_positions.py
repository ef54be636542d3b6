"""Token positions (``token_positions``): the Perceiver reads an expert's tokens as a set
without them and as a sequence with them; the code vanishes at the first token, so the
pooled channel is still the one-token case; padding gets none, wherever it sits."""

import math

import numpy as np
import pytest
import torch

from musketeers.cache.errors import UserError
from musketeers.config import resolve_config
from musketeers.design.gridspec import run_name
from musketeers.method.adapter import ExpertTokens, PerceiverAdapter
from musketeers.method.token_positions import fourier_code, real_positions

DIMS = [3, 5]


def _tokens(batch: int = 4, t: int = 5, seed: int = 0) -> list[ExpertTokens]:
    g = torch.Generator().manual_seed(seed)
    return [ExpertTokens(torch.randn(batch, t, d, generator=g),
                         torch.ones(batch, t, dtype=torch.bool)) for d in DIMS]


def _adapter(positions: bool) -> PerceiverAdapter:
    torch.manual_seed(7)
    return PerceiverAdapter(DIMS, 6, latents=3, d_model=8, heads=2, out_init_std=0.5,
                            positions=positions)


def test_fourier_code_against_the_formula():
    pos = torch.tensor([[0, 1, 2, 7]])
    code = fourier_code(pos, 6).numpy()[0]
    for j, p in enumerate([0, 1, 2, 7]):
        for k in range(3):
            w = 10000.0 ** (-2 * k / 6)
            assert code[j, 2 * k] == pytest.approx(math.sin(p * w), abs=1e-6)
            assert code[j, 2 * k + 1] == pytest.approx(math.cos(p * w) - 1, abs=1e-6)
    assert np.all(code[0] == 0)  # the first token carries no code
    assert fourier_code(pos, 5).shape == (1, 4, 5) and (fourier_code(pos, 5)[..., -1] == 0).all()


def test_real_positions_count_real_tokens_wherever_padding_sits():
    mask = torch.tensor([[True, True, False, False], [False, True, True, True]])
    assert real_positions(mask).tolist() == [[0, 1, 0, 0], [0, 0, 1, 2]]


def test_without_positions_the_order_of_an_experts_tokens_is_unseen():
    x = _tokens()
    order = torch.tensor([3, 0, 4, 1, 2])
    shuffled = [ExpertTokens(e.states[:, order], e.mask[:, order]) for e in x]
    plain, placed = _adapter(False), _adapter(True)
    torch.testing.assert_close(plain(shuffled).context, plain(x).context, rtol=1e-5, atol=1e-6)
    diff = (placed(shuffled).context - placed(x).context).abs().max().item()
    assert diff > 1e-3  # with positions, "1234" and "4321" are two things


def test_with_positions_one_token_is_still_the_pooled_vector():
    ad = _adapter(True)
    g = torch.Generator().manual_seed(1)
    pooled = [torch.randn(4, d, generator=g) for d in DIMS]
    one = [ExpertTokens(h.unsqueeze(1), torch.ones(4, 1, dtype=torch.bool)) for h in pooled]
    torch.testing.assert_close(ad(one).context, ad(pooled).context, rtol=0, atol=0)
    # padding in front of the real token leaves it at position 0, unseen
    front = [ExpertTokens(torch.cat([torch.full((4, 2, h.shape[1]), 9.0), h.unsqueeze(1)], 1),
                          torch.tensor([[False, False, True]] * 4)) for h in pooled]
    torch.testing.assert_close(ad(front).context, ad(pooled).context, rtol=1e-6, atol=1e-7)


def test_config_refuses_positions_that_would_go_unread(tmp_path):
    base = dict(task="arithmetic:easier@direct", team="oracle", token_positions=True)
    pooled = resolve_config(overrides=dict(base, method="perceiver", channel="pooled"))
    assert "pos" not in pooled.run_path().name  # one token per expert, code 0: no change
    with pytest.raises(UserError, match="averages each expert's tokens"):
        resolve_config(overrides=dict(base, method="no_cross_attn", channel="answer"))
    cfg = resolve_config(overrides=dict(base, method="perceiver", channel="answer"))
    assert cfg.token_positions and cfg.run_path().name.endswith("-answer-1-pos-s0")
    # Single reads no C: the field is ignored, not refused
    assert resolve_config(overrides=dict(base, method="single", channel="pooled")).method
    fields = {"task": "arithmetic:easier@direct", "method": "perceiver", "team": "oracle",
              "channel": "answer", "seed": 0}
    assert run_name("pocket", fields | {"token_positions": True}).endswith("answer-pos-s0")
    assert run_name("pocket", fields | {"token_positions": False}) == run_name("pocket", fields)
    pooled_fields = fields | {"channel": "pooled", "pooling": "last"}
    assert run_name("pocket", pooled_fields | {"token_positions": True}) == run_name(
        "pocket", pooled_fields)
