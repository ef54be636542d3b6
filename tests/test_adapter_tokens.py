"""The adapter on token channels: Eq. 10 with a key mask against a NumPy reference, A summed
per expert (Eq. 15), and the pooled channel as the one-token case."""

import math

import numpy as np
import pytest
import torch

from musketeers.method.adapter import (
    ExpertTokens,
    HardRoutingAdapter,
    NoCrossAttnAdapter,
    PerceiverAdapter,
)
from musketeers.method.methods import build_adapter
from musketeers.method.routing import routing_entropy, utilisation

DIMS = [3, 5, 7]


def np_w(linear: torch.nn.Linear) -> np.ndarray:
    return linear.weight.detach().double().numpy().T


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ragged(batch: int, dims=DIMS, seed: int = 0, most: int = 4) -> list[list[np.ndarray]]:
    """Per expert, per row, [T, d_i] states with 1..most tokens (different per row/expert)."""
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=(int(rng.integers(1, most + 1)), d)) for _ in range(batch)]
            for d in dims]


def padded(rows: list[np.ndarray], garbage: float = 0.0) -> ExpertTokens:
    """Rows zero-padded (or padded with ``garbage``, which the mask must hide)."""
    t = max(len(r) for r in rows)
    states = np.full((len(rows), t, rows[0].shape[1]), garbage)
    mask = np.zeros((len(rows), t), dtype=bool)
    for b, r in enumerate(rows):
        states[b, :len(r)] = r
        mask[b, :len(r)] = True
    return ExpertTokens(torch.tensor(states, dtype=torch.float32), torch.from_numpy(mask))


def np_masked_perceiver(ad: PerceiverAdapter, experts: list[list[np.ndarray]]):
    """Eq. 6–11 per row and head over only the real tokens (no padding exists here at all):
    (C [B, m, d_policy], per-token weights per row, A [B, m, n])."""
    q_lat = ad.latents.detach().double().numpy()
    q = q_lat @ np_w(ad.w_q)
    dh = q.shape[1] // ad.heads
    cs, ws, a_all = [], [], []
    for b in range(len(experts[0])):
        z = [experts[i][b].astype(np.float32).astype(np.float64) @ np_w(ad.align.proj[i])
             for i in range(len(experts))]
        owner = np.concatenate([np.full(len(zi), i) for i, zi in enumerate(z)])
        v = np.concatenate(z)
        k, vp = v @ np_w(ad.w_k), v @ np_w(ad.w_v)
        heads_out, heads_w = [], []
        for h in range(ad.heads):
            s = slice(h * dh, (h + 1) * dh)
            w = np_softmax(q[:, s] @ k[:, s].T / math.sqrt(dh))
            heads_w.append(w)
            heads_out.append(w @ vp[:, s])
        c_prime = np.tanh(np.tanh((q_lat + np.concatenate(heads_out, axis=1)) @ np_w(ad.ffn.w1))
                          @ np_w(ad.ffn.w2))
        cs.append(c_prime @ np_w(ad.out) + ad.out.bias.detach().double().numpy())
        w = np.mean(heads_w, axis=0)
        ws.append(w)
        a_all.append(np.stack([w[:, owner == i].sum(axis=1) for i in range(len(z))], axis=1))
    return np.stack(cs), ws, np.stack(a_all)


@pytest.mark.parametrize("heads", [1, 2])
def test_masked_cross_attention_matches_numpy_reference(heads):
    torch.manual_seed(0)
    ad = PerceiverAdapter(DIMS, 6, latents=3, d_model=4, heads=heads, out_init_std=1.0)
    torch.nn.init.normal_(ad.out.bias)
    experts = ragged(5, seed=heads)
    assert len({len(r) for rows in experts for r in rows}) > 1  # really ragged: padding exists
    inputs = [padded(rows, garbage=1e3) for rows in experts]  # loud padding: any leak shows
    out = ad(inputs)
    c_ref, _, a_ref = np_masked_perceiver(ad, experts)
    np.testing.assert_allclose(out.context.detach().double().numpy(), c_ref, atol=1e-5)
    np.testing.assert_allclose(out.attention.detach().double().numpy(), a_ref, atol=1e-6)
    assert out.attention.shape == (5, 3, 3)
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(5, 3))


def test_padding_gets_exactly_zero_weight():
    torch.manual_seed(1)
    ad = PerceiverAdapter(DIMS, 6, latents=2, d_model=4, heads=2)
    experts = ragged(4, seed=3)
    inputs = [padded(rows) for rows in experts]
    v, mask, owner = ad.align.tokens(inputs)
    _, weights = ad.latent_attention(v, mask)  # [B, m, T]
    assert (~mask).any()
    assert (weights.permute(0, 2, 1)[~mask] == 0).all()
    assert (weights.permute(0, 2, 1)[mask] > 0).all()
    _, ws, _ = np_masked_perceiver(ad, experts)
    for b, w_ref in enumerate(ws):
        np.testing.assert_allclose(weights[b][:, mask[b]].detach().double().numpy(), w_ref,
                                   atol=1e-6)
    assert owner.tolist() == [i for i, e in enumerate(inputs) for _ in range(e.mask.shape[1])]


def test_pooled_equals_tokens_with_one_token_per_expert():
    torch.manual_seed(2)
    ad = PerceiverAdapter(DIMS, 6, latents=3, d_model=8, heads=2, out_init_std=0.5)
    g = torch.Generator().manual_seed(0)
    pooled = [torch.randn(4, d, generator=g) for d in DIMS]
    one = [ExpertTokens(h.unsqueeze(1), torch.ones(4, 1, dtype=torch.bool)) for h in pooled]
    a, b = ad(pooled), ad(one)
    torch.testing.assert_close(b.context, a.context, rtol=0, atol=0)
    torch.testing.assert_close(b.attention, a.attention, rtol=0, atol=0)
    # one real token padded among others' longer rows reads the same: the padding is unseen
    pads = [ExpertTokens(torch.cat([h.unsqueeze(1), torch.full((4, 2, h.shape[1]), 7.0)], 1),
                         torch.tensor([[True, False, False]] * 4)) for h in pooled]
    c = ad(pads)
    torch.testing.assert_close(c.context, a.context, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(c.attention, a.attention, rtol=1e-6, atol=1e-7)


def test_mixed_pooled_and_token_experts():
    torch.manual_seed(3)
    ad = PerceiverAdapter(DIMS, 6, latents=2, d_model=4, heads=1, out_init_std=1.0)
    experts = ragged(3, seed=5)
    inputs = [padded(experts[0]), torch.tensor(np.stack([r[0] for r in experts[1]]),
                                               dtype=torch.float32), padded(experts[2])]
    out = ad(inputs)
    _, _, a_ref = np_masked_perceiver(ad, [experts[0], [r[:1] for r in experts[1]], experts[2]])
    np.testing.assert_allclose(out.attention.detach().double().numpy(), a_ref, atol=1e-6)


def test_eq15_reads_per_expert_sums():
    """A spread over many tokens of one expert is that expert's mass: H and u see experts."""
    torch.manual_seed(4)
    ad = PerceiverAdapter([2, 2], 4, latents=2, d_model=4, heads=1)
    # expert 0 has 6 copies of one state, expert 1 one: per-token attention gives expert 0 6/7
    h0 = torch.randn(1, 2)
    with torch.no_grad():
        ad.align.proj[1].weight.copy_(ad.align.proj[0].weight)
    out = ad([ExpertTokens(h0.expand(6, 2).unsqueeze(0), torch.ones(1, 6, dtype=torch.bool)),
              ExpertTokens(h0.unsqueeze(0), torch.ones(1, 1, dtype=torch.bool))])
    torch.testing.assert_close(out.attention, torch.tensor([[[6 / 7, 1 / 7]] * 2]))
    torch.testing.assert_close(utilisation(out.attention), torch.tensor([[6 / 7, 1 / 7]]))
    assert float(routing_entropy(out.attention.detach())) < math.log(2)


def test_no_cross_attn_and_hard_routing_read_the_masked_token_mean():
    torch.manual_seed(5)
    experts = ragged(3, seed=7)
    inputs = [padded(rows, garbage=50.0) for rows in experts]
    means = [torch.tensor(np.stack([r.mean(0) for r in rows]), dtype=torch.float32)
             for rows in experts]
    nca = NoCrossAttnAdapter(DIMS, 6, d_model=4, out_init_std=1.0)
    torch.testing.assert_close(nca(inputs).context, nca(means).context, rtol=1e-5, atol=1e-6)
    hr = HardRoutingAdapter(DIMS, 6, d_model=4, router_dim=8, out_init_std=1.0).eval()
    emb = torch.randn(3, 8)
    torch.testing.assert_close(hr(inputs, emb).context, hr(means, emb).context, rtol=1e-5,
                               atol=1e-6)


def test_standardized_tokens_use_each_experts_statistics():
    ad = build_adapter("perceiver", DIMS, 6, latents=2, d_model=4, heads=1, standardize=True)
    experts = ragged(6, seed=9)
    ad.align.fit_standardizer([torch.tensor(np.concatenate(rows), dtype=torch.float32)
                               for rows in experts])
    pooled_like = [ExpertTokens(torch.tensor(np.stack([r[0] for r in rows]),
                                             dtype=torch.float32).unsqueeze(1),
                                torch.ones(6, 1, dtype=torch.bool)) for rows in experts]
    pooled = [x.states[:, 0] for x in pooled_like]
    torch.testing.assert_close(ad(pooled_like).context, ad(pooled).context, rtol=0, atol=0)
    assert not torch.equal(ad.align.mean_0, torch.zeros(3))


def test_token_shapes_are_checked():
    ad = PerceiverAdapter(DIMS, 6, latents=2, d_model=4, heads=1)
    bad = [ExpertTokens(torch.zeros(2, 3, d + (i == 1)), torch.ones(2, 3, dtype=torch.bool))
           for i, d in enumerate(DIMS)]
    with pytest.raises(ValueError, match="expert 1: expected \\[B, T, 5\\]"):
        ad(bad)
    with pytest.raises(ValueError, match="mask"):
        ExpertTokens(torch.zeros(2, 3, 4), torch.ones(2, 4, dtype=torch.bool))


def test_gradient_flows_through_token_channel_and_not_into_padding():
    torch.manual_seed(6)
    ad = PerceiverAdapter(DIMS, 6, latents=2, d_model=4, heads=2, out_init_std=1.0)
    inputs = [padded(rows) for rows in ragged(3, seed=11)]
    states = [x.states.clone().requires_grad_(True) for x in inputs]
    out = ad([ExpertTokens(s, x.mask) for s, x in zip(states, inputs, strict=True)])
    out.context.pow(2).sum().backward()
    for s, x in zip(states, inputs, strict=True):
        assert (s.grad[~x.mask] == 0).all()
        assert s.grad[x.mask].abs().sum() > 0
