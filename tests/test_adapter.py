"""The adapter g_φ against the paper's equations (Eq. 6–11, 13, 14, 16), computed independently."""

import math

import numpy as np
import pytest
import torch

from musketeers.cache.errors import UserError
from musketeers.method.adapter import (
    FFN,
    HardRoutingAdapter,
    NoCrossAttnAdapter,
    PerceiverAdapter,
)
from musketeers.method.methods import build_adapter
from musketeers.method.methods import names as method_names

DIMS = [3, 5, 7]  # heterogeneous expert widths


def vectors(batch: int, dims=DIMS, scale: float = 1.0, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, d, generator=g) * scale for d in dims]


def np_w(linear: torch.nn.Linear) -> np.ndarray:
    """torch stores [out, in]; the paper's x W convention wants [in, out]."""
    return linear.weight.detach().double().numpy().T


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_ffn(ffn: FFN, x: np.ndarray) -> np.ndarray:
    return np.tanh(np.tanh(x @ np_w(ffn.w1)) @ np_w(ffn.w2))


def np_align(ad, vs: list[torch.Tensor]) -> np.ndarray:
    """Eq. 6–7: V = (h_1 W_1, …, h_n W_n), [B, n, d]."""
    zs = [h.double().numpy() @ np_w(w) for h, w in zip(vs, ad.align.proj, strict=True)]
    return np.stack(zs, axis=1)


def np_perceiver(ad: PerceiverAdapter, vs: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 6–11 written out per head in numpy, from the module's own weights."""
    v = np_align(ad, vs)
    q_lat = ad.latents.detach().double().numpy()
    q, k, vp = q_lat @ np_w(ad.w_q), v @ np_w(ad.w_k), v @ np_w(ad.w_v)
    d = q_lat.shape[1]
    dh = d // ad.heads
    outs, attn = [], []
    for b in range(v.shape[0]):
        heads_out, heads_a = [], []
        for h in range(ad.heads):
            s = slice(h * dh, (h + 1) * dh)
            a = np_softmax(q[:, s] @ k[b][:, s].T / math.sqrt(dh))
            heads_a.append(a)
            heads_out.append(a @ vp[b][:, s])
        c_prime = np_ffn(ad.ffn, q_lat + np.concatenate(heads_out, axis=1))
        outs.append(c_prime @ np_w(ad.out) + ad.out.bias.detach().double().numpy())
        attn.append(np.mean(heads_a, axis=0))
    return np.stack(outs), np.stack(attn)


@pytest.mark.parametrize("heads", [1, 2])
def test_perceiver_matches_explicit_eq_9_to_11(heads):
    torch.manual_seed(0)
    ad = PerceiverAdapter(DIMS, 6, latents=2, d_model=4, heads=heads, out_init_std=1.0)
    torch.nn.init.normal_(ad.out.bias)  # exercise b_out too
    vs = vectors(3, scale=2.0)
    out = ad(vs)
    c_ref, a_ref = np_perceiver(ad, vs)
    assert out.context.shape == (3, 2, 6) and out.attention.shape == (3, 2, 3)
    np.testing.assert_allclose(out.context.detach().double().numpy(), c_ref, atol=1e-5)
    np.testing.assert_allclose(out.attention.detach().double().numpy(), a_ref, atol=1e-6)
    assert out.routing is None


def test_perceiver_default_shapes_and_attention_rows_sum_to_one():
    ad = build_adapter("perceiver", [576, 640, 896], 896)
    out = ad(vectors(4, [576, 640, 896], scale=30.0))
    assert out.context.shape == (4, 8, 896)
    assert out.attention.shape == (4, 8, 3)
    assert torch.all(out.attention >= 0)
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(4, 8))
    # A depends on the input (not stuck uniform): two prompts attend differently
    assert not torch.allclose(out.attention[0], out.attention[1], atol=1e-3)


def test_ffn_is_eq_16_with_half_bottleneck():
    torch.manual_seed(1)
    ffn = FFN(8)
    assert ffn.w1.weight.shape == (4, 8) and ffn.w2.weight.shape == (8, 4)
    x = torch.randn(5, 8) * 3
    np.testing.assert_allclose(
        ffn(x).detach().double().numpy(), np_ffn(ffn, x.double().numpy()), atol=1e-6
    )


def test_near_zero_init_keeps_context_tiny():
    # Measured per-token embedding norms (median over the vocabulary, from the GGUF packages):
    # SmolLM2-135M 3.15, Qwen2.5-Coder-0.5B 0.51 (d = 896). Expert hidden states are large.
    # FFN's tanh bounds ‖C'‖ ≤ √d, so ‖C‖ ≈ out_init_std · ‖C'‖ · √d_policy whatever the input.
    dims, d_policy, qwen_norm = [576, 640, 896], 896, 0.51
    vs = vectors(16, dims, scale=50.0)
    ad = build_adapter("perceiver", dims, d_policy)
    norms = ad(vs).context.detach().norm(dim=-1)
    assert norms.max() <= 2 * 1e-8 * math.sqrt(512) * math.sqrt(d_policy)
    # Per element C stays well under sqrt(RMSNorm eps) = 1e-3, so the norm cannot inflate it.
    assert ad(vs).context.detach().abs().max() <= 1e-5
    assert torch.count_nonzero(ad.out.bias) == 0
    small = build_adapter("perceiver", dims, d_policy, out_init_std=1e-5)
    assert small(vs).context.detach().norm(dim=-1).max() <= 1e-2 * qwen_norm


def test_gradient_reaches_every_perceiver_parameter():
    torch.manual_seed(2)
    ad = build_adapter("perceiver", DIMS, 16, d_model=32, heads=4, latents=3)
    c = ad(vectors(2)).context
    (c * torch.randn_like(c)).sum().backward()
    for name, p in ad.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_heterogeneous_dims_are_checked_and_inputs_cast():
    ad = build_adapter("perceiver", DIMS, 16, d_model=32, heads=4)
    out = ad([v.double() for v in vectors(2)])  # float64 from numpy is cast to the weights
    assert out.context.dtype == torch.float32
    with pytest.raises(ValueError, match="expert 1"):
        ad([torch.randn(2, 3), torch.randn(2, 6), torch.randn(2, 7)])
    with pytest.raises(ValueError, match="expected 3 expert vectors"):
        ad(vectors(2)[:2])


def test_permuting_experts_permutes_attention_columns():
    torch.manual_seed(3)
    ad = build_adapter("perceiver", DIMS, 16, d_model=32, heads=4, out_init_std=0.1)
    perm = [2, 0, 1]
    permuted = build_adapter(
        "perceiver", [DIMS[i] for i in perm], 16, d_model=32, heads=4, out_init_std=0.1
    )
    state = ad.state_dict()
    for j, i in enumerate(perm):
        state[f"align.proj.{j}.weight"] = ad.state_dict()[f"align.proj.{i}.weight"]
    permuted.load_state_dict(state)
    vs = vectors(4)
    a, b = ad(vs), permuted([vs[i] for i in perm])
    torch.testing.assert_close(b.attention, a.attention[..., perm])
    # attention pools over a set: C itself does not depend on the experts' order
    torch.testing.assert_close(b.context, a.context)


def test_no_cross_attn_is_eq_14_one_token_per_expert():
    torch.manual_seed(4)
    ad = build_adapter("no_cross_attn", DIMS, 6, d_model=4, out_init_std=1.0)
    assert isinstance(ad, NoCrossAttnAdapter) and ad.n_context == len(DIMS)
    vs = vectors(2, scale=2.0)
    out = ad(vs)
    assert out.context.shape == (2, 3, 6) and out.attention is None
    v = np_align(ad, vs)
    ref = np_ffn(ad.ffn, v) @ np_w(ad.out) + ad.out.bias.detach().double().numpy()
    np.testing.assert_allclose(out.context.detach().double().numpy(), ref, atol=1e-5)


def routed_reference(ad: HardRoutingAdapter, vs, chosen: torch.Tensor) -> torch.Tensor:
    """Eq. 13 for a known choice: out(FFN(W_k h_k)) with k the chosen expert per row."""
    rows = [ad.align.proj[k](vs[k][b]) for b, k in enumerate(chosen.tolist())]
    return ad.out(ad.ffn(torch.stack(rows))).unsqueeze(1)


def test_hard_routing_eval_is_argmax_one_hot():
    torch.manual_seed(5)
    ad = build_adapter("hard_routing", DIMS, 6, d_model=8, router_dim=10, out_init_std=1.0)
    ad.eval()
    vs, emb = vectors(6), torch.randn(6, 10)
    out = ad(vs, emb)
    logits = ad.router(emb)
    assert out.context.shape == (6, 1, 6)
    assert torch.equal(out.routing, torch.nn.functional.one_hot(logits.argmax(-1), 3).float())
    torch.testing.assert_close(out.attention, torch.softmax(logits, -1).unsqueeze(1))
    torch.testing.assert_close(out.context, routed_reference(ad, vs, logits.argmax(-1)))
    assert torch.equal(ad(vs, emb).routing, out.routing)  # deterministic in eval


def test_hard_routing_training_is_straight_through():
    torch.manual_seed(6)
    ad = build_adapter("hard_routing", DIMS, 6, d_model=8, router_dim=10, out_init_std=1.0)
    ad.train()
    vs, emb = vectors(8), torch.randn(8, 10)
    out = ad(vs, emb)
    r = out.routing
    assert torch.equal(r.sum(-1), torch.ones(8)) and set(r.unique().tolist()) <= {0.0, 1.0}
    # the forward value is exactly the sampled expert's memory token
    torch.testing.assert_close(out.context, routed_reference(ad, vs, r.argmax(-1)))
    (out.context * torch.randn_like(out.context)).sum().backward()
    assert ad.router.weight.grad is not None and ad.router.weight.grad.abs().sum() > 0


def test_hard_routing_needs_router_embeddings():
    ad = build_adapter("hard_routing", DIMS, 6, d_model=8)
    with pytest.raises(ValueError, match="router_emb"):
        ad(vectors(2))


def test_build_adapter_methods():
    assert build_adapter("output_collab", DIMS, 6) is None
    assert build_adapter("single", DIMS, 6) is None
    assert isinstance(build_adapter("perceiver", DIMS, 6, latents=4), PerceiverAdapter)
    assert build_adapter("perceiver", DIMS, 6, latents=4).n_context == 4
    assert build_adapter("hard_routing", DIMS, 6).n_context == 1
    with pytest.raises(UserError) as err:
        build_adapter("moe", DIMS, 6)
    assert all(m in str(err.value) for m in method_names()) and "\n" not in str(err.value)
