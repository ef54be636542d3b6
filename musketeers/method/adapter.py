"""The context-token adapter g_φ (paper §3, Eq. 6–11, 13, 14, 16) and its baseline variants.

Every adapter maps the pooled expert vectors h_i (one [B, d_i] tensor per expert, Eq. 5, read
from the cache) to context tokens C [B, m, d_policy] that the policy reads through
``inputs_embeds``, plus the matrix A [B, m, n] that shows how the m tokens draw on the n experts
(Eq. 15's observable).

With a token channel (``tokens``, ``answer``) an expert gives a set of token states instead
(``ExpertTokens``: [B, T_i, d_i] and a padding mask). Each token goes through its own expert's
W_i (Eq. 6: that is its expert identity; no learned identity embedding is added, and a position
only with ``positions``, whose code vanishes at the first token, so an expert with one token is
exactly the pooled case) and carries its expert's index, the
Perceiver's keys are every real token of every expert (Eq. 10 with a key mask), and A sums the
attention over each expert's tokens (``routing.expert_attention``), so Eq. 15's H and u_i keep
their meaning. ``no_cross_attn`` and ``hard_routing`` read one vector per expert: with tokens,
the masked mean of its projected tokens (``masked_mean``).

The methods that use them, and the controls, are declared in ``musketeers.method.methods``:

- ``perceiver``      ours: m latent queries cross-attend over the aligned experts (Eq. 8–11)
- ``no_cross_attn``  Eq. 14: the token-wise FFN over the stacked V, one token per expert
- ``hard_routing``   Eq. 13: a MiniLM-embedding router picks one expert → one memory token
- ``output_collab``  Eq. 12: hints go into the prompt as text; no trainable φ (None here)
- ``single``         no experts at all (None here)

Biases: Eq. 6, 9 and 16 are written without biases, so those projections have none; Eq. 11
has b_out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from musketeers.method.expert_tokens import ExpertInput, ExpertTokens
from musketeers.method.routing import expert_attention
from musketeers.method.token_positions import fourier_code, real_positions

__all__ = ["AdapterOutput", "ExpertAlignment", "ExpertInput", "ExpertTokens", "FFN",
           "HardRoutingAdapter", "NoCrossAttnAdapter", "OutputProjection", "PerceiverAdapter",
           "cross_attention", "masked_mean"]


@dataclass
class AdapterOutput:
    context: torch.Tensor  # C, [B, m, d_policy] (m = 1 for hard_routing)
    attention: torch.Tensor | None  # A, [B, m, n], rows sum to 1 (head-averaged); None if none
    routing: torch.Tensor | None = None  # hard_routing: [B, n] one-hot (straight-through) choice


# ---------------------------------------------------------------------------------------------
# Building blocks


class FFN(nn.Module):
    """Eq. 16: FFN(x) = tanh(W2 tanh(W1 x)), W1: d → d/2, W2: d/2 → d, token-wise, no biases."""

    def __init__(self, d: int):
        super().__init__()
        self.w1 = nn.Linear(d, d // 2, bias=False)
        self.w2 = nn.Linear(d // 2, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w2(torch.tanh(self.w1(x))))


class OutputProjection(nn.Linear):
    """Eq. 11: C = C' W_out + b_out, d → d_policy, initialised near zero.

    W_out ~ N(0, out_init_std²) and b_out = 0, so C starts near zero and the policy's first
    steps match the reference layout with C = 0 (the paper's stability argument). Not exactly
    zero: a zero W_out would block every gradient into the rest of the adapter.

    "Near zero" has to be measured against the policy's first RMSNorm, not against the token
    embeddings: RMSNorm(x) = x / sqrt(mean(x²) + eps) rescales any x with mean(x²) ≳ eps to
    unit size, so a C of ~1e-4 (eps = 1e-6) already shifts first-step log-probs by ~2 nats.
    The default 1e-8 keeps C's elements ~1e-7, well under sqrt(eps) = 1e-3.
    """

    def __init__(self, d: int, d_policy: int, out_init_std: float,
                 target_rms: float | None = None):
        super().__init__(d, d_policy, bias=True)
        nn.init.normal_(self.weight, std=out_init_std)
        nn.init.zeros_(self.bias)
        self.target_rms = target_rms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 11; with ``target_rms`` (``context_scale: embedding``) each context token is
        rescaled to that rms, so only C's direction is learnt and it is as loud as a token."""
        c = super().forward(x)
        if self.target_rms is None:
            return c
        return c * (self.target_rms / c.pow(2).mean(-1, keepdim=True).clamp_min(1e-30).sqrt())


class ExpertAlignment(nn.Module):
    """Eq. 6–7: z_i = h_i W_i with W_i: d_i → d per expert, stacked into V = (z_1, …, z_n)."""

    def __init__(self, expert_dims: list[int], d: int, standardize: bool = False,
                 positions: bool = False):
        super().__init__()
        if not expert_dims:
            raise ValueError("the adapter needs at least one expert")
        self.expert_dims = list(expert_dims)
        self.proj = nn.ModuleList(nn.Linear(d_i, d, bias=False) for d_i in expert_dims)
        # An expert's pooled states share one large direction (~96 % of their norm for the
        # pocket experts' last token): what differs between items is a small remainder. With
        # ``standardize`` each dimension is centred and scaled by the train split's statistics
        # (set once by ``fit_standardizer``, saved with the adapter) before Eq. 6.
        self.standardize = standardize
        if standardize:
            for i, d_i in enumerate(expert_dims):
                self.register_buffer(f"mean_{i}", torch.zeros(d_i))
                self.register_buffer(f"std_{i}", torch.ones(d_i))
        # a token's place among its expert's tokens (``token_positions``): the Perceiver's keys
        # are otherwise a set, and a multi-digit answer's digits an unordered bag
        self.positions = positions

    def fit_standardizer(self, vectors: list[torch.Tensor]) -> None:
        """Per-dimension mean and std of each expert's vectors [N, d_i] (the train split)."""
        for i, h in enumerate(vectors):
            h = h.float()
            getattr(self, f"mean_{i}").copy_(h.mean(0))
            getattr(self, f"std_{i}").copy_(h.std(0).clamp_min(1e-6))

    def project(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Eq. 6 for expert i: z = h W_i over the last axis ([B, d_i] pooled, [B, T, d_i]
        tokens: every token alike), standardized first when asked."""
        if self.standardize:
            h = (h.float() - getattr(self, f"mean_{i}")) / getattr(self, f"std_{i}")
        return self.proj[i](h.to(self.proj[0].weight.dtype))

    def _checked(self, inputs: list[ExpertInput]) -> list[ExpertInput]:
        if len(inputs) != len(self.proj):
            raise ValueError(f"expected {len(self.proj)} expert vectors, got {len(inputs)}")
        for i, x in enumerate(inputs):
            h, want = (x.states, 3) if isinstance(x, ExpertTokens) else (x, 2)
            if h.ndim != want or h.shape[-1] != self.expert_dims[i]:
                shape = "[B, T, " if want == 3 else "[B, "
                raise ValueError(
                    f"expert {i}: expected {shape}{self.expert_dims[i]}], got {list(h.shape)}"
                )
        return inputs

    def tokens(self, inputs: list[ExpertInput]
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Eq. 6–7 over every token: each expert's tokens through its own W_i, concatenated
        along the token axis → (V [B, T, d], key mask [B, T] or None when every slot is real,
        expert [T]: the expert each slot belongs to). Pooled inputs are one token each, so
        this is Eq. 7's V = (z_1, …, z_n) with T = n. With ``positions`` each token's z also
        carries the Fourier code of its index among its expert's real tokens."""
        inputs = self._checked(inputs)
        zs, masks, owner = [], [], []
        for i, x in enumerate(inputs):
            if isinstance(x, ExpertTokens):
                z = self.project(i, x.states)
                if self.positions:
                    z = z + fourier_code(real_positions(x.mask), z.shape[-1]).to(z.dtype)
                zs.append(z)
                masks.append(x.mask)
            else:
                zs.append(self.project(i, x).unsqueeze(1))
                masks.append(None)
            owner.append(torch.full((zs[-1].shape[1],), i, dtype=torch.long))
        v = torch.cat(zs, dim=1)
        mask = None
        if any(m is not None for m in masks):
            mask = torch.cat([m if m is not None else
                              torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
                              for m, z in zip(masks, zs, strict=True)], dim=1)
        return v, mask, torch.cat(owner).to(v.device)

    def forward(self, inputs: list[ExpertInput]) -> torch.Tensor:
        """Eq. 6–7, one vector per expert → V [B, n, d]: a pooled input's z_i, or the masked
        mean of an expert's projected tokens (what no_cross_attn and hard_routing read)."""
        inputs = self._checked(inputs)
        z = [masked_mean(self.project(i, x.states), x.mask) if isinstance(x, ExpertTokens)
             else self.project(i, x) for i, x in enumerate(inputs)]
        return torch.stack(z, dim=1)


def masked_mean(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over an expert's real tokens: z [B, T, d], mask [B, T] → [B, d]. Padding
    weighs exactly 0; a row without a real token gives 0 (the reader refuses such rows)."""
    w = mask.to(z.dtype).unsqueeze(-1)
    return (z * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)


def cross_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10's inner term softmax(Q Kᵀ / √d_head) V', split over ``heads`` heads, with an
    optional key mask.

    q [B, m, d], k and v [B, T, d], key_mask [B, T] bool (False: padding, which gets weight
    exactly 0) → (output [B, m, d] with the heads concatenated, weights [B, m, T] averaged over
    heads; rows sum to 1). The paper writes √d; we scale each head by √d_head, the standard
    multi-head choice (Vaswani et al.), so the logits' scale does not shrink as heads are added.
    Written out rather than with F.scaled_dot_product_attention because the weights are an
    output (Eq. 15 reads them).
    """
    b, m, d = q.shape
    t = k.shape[1]
    d_head = d // heads
    qh = q.view(b, m, heads, d_head).transpose(1, 2)  # [B, h, m, d_head]
    kh = k.view(b, t, heads, d_head).transpose(1, 2)  # [B, h, T, d_head]
    vh = v.view(b, t, heads, d_head).transpose(1, 2)
    logits = qh @ kh.transpose(-1, -2) / math.sqrt(d_head)  # [B, h, m, T]
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    out = (weights @ vh).transpose(1, 2).reshape(b, m, d)
    return out, weights.mean(dim=1)


# ---------------------------------------------------------------------------------------------
# Adapters


class PerceiverAdapter(nn.Module):
    """Ours (§3.2): m latent queries cross-attend over the aligned experts (Eq. 6–11)."""

    def __init__(
        self,
        expert_dims: list[int],
        d_policy: int,
        *,
        latents: int = 8,
        d_model: int = 512,
        heads: int = 8,
        out_init_std: float = 1e-8,
        target_rms: float | None = None,
        standardize: bool = False,
        positions: bool = False,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads = heads
        self.n_context = latents
        self.align = ExpertAlignment(expert_dims, d_model, standardize, positions)
        # Eq. 8. Unit-variance init (as in the reference Perceiver code): the queries start
        # distinct and Q = Q_lat W_Q is not so small that attention is stuck uniform.
        self.latents = nn.Parameter(torch.randn(latents, d_model))
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.ffn = FFN(d_model)
        self.out = OutputProjection(d_model, d_policy, out_init_std, target_rms)

    def latent_attention(self, v: torch.Tensor, key_mask: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 9–10: C' = FFN(Q_lat + softmax(Q Kᵀ/√d_head) V') with Q = Q_lat W_Q, K = V W_K,
        V' = V W_V, padding keys masked. V [B, T, d] → (C' [B, m, d], weights [B, m, T])."""
        q_lat = self.latents.unsqueeze(0).expand(v.shape[0], -1, -1)
        attended, w = cross_attention(self.w_q(q_lat), self.w_k(v), self.w_v(v), self.heads,
                                      key_mask)
        return self.ffn(q_lat + attended), w

    def forward(
        self, vectors: list[ExpertInput], router_emb: torch.Tensor | None = None
    ) -> AdapterOutput:
        v, key_mask, owner = self.align.tokens(vectors)
        c_prime, weights = self.latent_attention(v, key_mask)
        context = self.out(c_prime)
        return AdapterOutput(context=context,
                             attention=expert_attention(weights, owner, len(self.align.proj)))


class NoCrossAttnAdapter(nn.Module):
    """Ablation (Eq. 14): g_φ = FFN(V), then Eq. 11's projection → one context token per expert.

    There is no attention, so A is None: this variant has no routing observable. With a token
    channel each expert's V entry is the masked mean of its projected tokens (Eq. 6 per token,
    then the mean over real tokens): still one context token per expert.
    """

    def __init__(
        self,
        expert_dims: list[int],
        d_policy: int,
        *,
        d_model: int = 512,
        out_init_std: float = 1e-8,
        target_rms: float | None = None,
        standardize: bool = False,
    ):
        super().__init__()
        self.n_context = len(expert_dims)
        self.align = ExpertAlignment(expert_dims, d_model, standardize)
        self.ffn = FFN(d_model)
        self.out = OutputProjection(d_model, d_policy, out_init_std, target_rms)

    def forward(
        self, vectors: list[ExpertInput], router_emb: torch.Tensor | None = None
    ) -> AdapterOutput:
        return AdapterOutput(context=self.out(self.ffn(self.align(vectors))), attention=None)


class HardRoutingAdapter(nn.Module):
    """Baseline (Eq. 13): g_φ = FFN(Σ_i R_i(E_T(x)) W_i h_i) → one memory token.

    A linear router head maps the cached MiniLM embedding E_T(x) to logits over the n experts.
    R is a straight-through Gumbel-softmax top-1 sample while training (one-hot forward,
    soft gradient into the router) and the argmax one-hot in eval. ``attention`` reports the
    router's soft probabilities as [B, 1, n], so Eq. 15's H and u exist for this method too.
    With a token channel, W_i h_i is the masked mean of expert i's projected tokens.
    """

    def __init__(
        self,
        expert_dims: list[int],
        d_policy: int,
        *,
        d_model: int = 512,
        router_dim: int = 384,
        out_init_std: float = 1e-8,
        tau: float = 1.0,
        target_rms: float | None = None,
        standardize: bool = False,
    ):
        super().__init__()
        self.n_context = 1
        self.tau = tau
        self.align = ExpertAlignment(expert_dims, d_model, standardize)
        self.router = nn.Linear(router_dim, len(expert_dims))
        self.ffn = FFN(d_model)
        self.out = OutputProjection(d_model, d_policy, out_init_std, target_rms)

    def route(self, router_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 13's R(E_T(x)): embedding [B, router_dim] → (one-hot R [B, n], logits [B, n])."""
        logits = self.router(router_emb.to(self.router.weight.dtype))
        if self.training:
            r = F.gumbel_softmax(logits, tau=self.tau, hard=True)
        else:
            r = F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
        return r, logits

    def forward(
        self, vectors: list[ExpertInput], router_emb: torch.Tensor | None = None
    ) -> AdapterOutput:
        if router_emb is None:
            raise ValueError("hard_routing needs router_emb (the cached MiniLM embeddings)")
        r, logits = self.route(router_emb)
        # Σ_i R_i W_i h_i: every expert is projected (they are cached, so "selective execution"
        # saves nothing here) and R keeps the chosen one while passing gradient to the router.
        memory = (r.unsqueeze(-1) * self.align(vectors)).sum(dim=1, keepdim=True)  # [B, 1, d]
        return AdapterOutput(
            context=self.out(self.ffn(memory)),
            attention=torch.softmax(logits, dim=-1).unsqueeze(1),
            routing=r,
        )
