"""The context-token adapter g_φ (paper §3, Eq. 6–11, 13, 14, 16) and its baseline variants.

Every adapter maps the pooled expert vectors h_i (one [B, d_i] tensor per expert, Eq. 5, read
from the cache) to context tokens C [B, m, d_policy] that the policy reads through
``inputs_embeds``, plus the matrix A [B, m, n] that shows how the m tokens draw on the n experts
(Eq. 15's observable). The methods that use them, and the controls, are declared in
``musketeers.method.methods``:

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

    def __init__(self, expert_dims: list[int], d: int, standardize: bool = False):
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

    def fit_standardizer(self, vectors: list[torch.Tensor]) -> None:
        """Per-dimension mean and std of each expert's vectors [N, d_i] (the train split)."""
        for i, h in enumerate(vectors):
            h = h.float()
            getattr(self, f"mean_{i}").copy_(h.mean(0))
            getattr(self, f"std_{i}").copy_(h.std(0).clamp_min(1e-6))

    def forward(self, vectors: list[torch.Tensor]) -> torch.Tensor:
        """[B, d_i] per expert → V [B, n, d]."""
        if len(vectors) != len(self.proj):
            raise ValueError(f"expected {len(self.proj)} expert vectors, got {len(vectors)}")
        dtype = self.proj[0].weight.dtype
        z = []
        for i, (h, w) in enumerate(zip(vectors, self.proj, strict=True)):
            if h.ndim != 2 or h.shape[1] != self.expert_dims[i]:
                raise ValueError(
                    f"expert {i}: expected [B, {self.expert_dims[i]}], got {list(h.shape)}"
                )
            if self.standardize:
                h = (h.float() - getattr(self, f"mean_{i}")) / getattr(self, f"std_{i}")
            z.append(w(h.to(dtype)))
        return torch.stack(z, dim=1)


def cross_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10's inner term softmax(Q Kᵀ / √d_head) V', split over ``heads`` heads.

    q [B, m, d], k and v [B, n, d] → (output [B, m, d] with the heads concatenated, A [B, m, n]
    averaged over heads). The paper writes √d; we scale each head by √d_head, the standard
    multi-head choice (Vaswani et al.), so the logits' scale does not shrink as heads are added.
    Written out rather than with F.scaled_dot_product_attention because A itself is an output.
    """
    b, m, d = q.shape
    n = k.shape[1]
    d_head = d // heads
    qh = q.view(b, m, heads, d_head).transpose(1, 2)  # [B, h, m, d_head]
    kh = k.view(b, n, heads, d_head).transpose(1, 2)  # [B, h, n, d_head]
    vh = v.view(b, n, heads, d_head).transpose(1, 2)
    weights = torch.softmax(qh @ kh.transpose(-1, -2) / math.sqrt(d_head), dim=-1)  # [B,h,m,n]
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
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads = heads
        self.n_context = latents
        self.align = ExpertAlignment(expert_dims, d_model, standardize)
        # Eq. 8. Unit-variance init (as in the reference Perceiver code): the queries start
        # distinct and Q = Q_lat W_Q is not so small that attention is stuck uniform.
        self.latents = nn.Parameter(torch.randn(latents, d_model))
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.ffn = FFN(d_model)
        self.out = OutputProjection(d_model, d_policy, out_init_std, target_rms)

    def latent_attention(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 9–10: C' = FFN(Q_lat + softmax(Q Kᵀ/√d_head) V') with Q = Q_lat W_Q, K = V W_K,
        V' = V W_V. V [B, n, d] → (C' [B, m, d], A [B, m, n])."""
        q_lat = self.latents.unsqueeze(0).expand(v.shape[0], -1, -1)
        attended, a = cross_attention(self.w_q(q_lat), self.w_k(v), self.w_v(v), self.heads)
        return self.ffn(q_lat + attended), a

    def forward(
        self, vectors: list[torch.Tensor], router_emb: torch.Tensor | None = None
    ) -> AdapterOutput:
        c_prime, a = self.latent_attention(self.align(vectors))
        return AdapterOutput(context=self.out(c_prime), attention=a)


class NoCrossAttnAdapter(nn.Module):
    """Ablation (Eq. 14): g_φ = FFN(V), then Eq. 11's projection → one context token per expert.

    There is no attention, so A is None: this variant has no routing observable.
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
        self, vectors: list[torch.Tensor], router_emb: torch.Tensor | None = None
    ) -> AdapterOutput:
        return AdapterOutput(context=self.out(self.ffn(self.align(vectors))), attention=None)


class HardRoutingAdapter(nn.Module):
    """Baseline (Eq. 13): g_φ = FFN(Σ_i R_i(E_T(x)) W_i h_i) → one memory token.

    A linear router head maps the cached MiniLM embedding E_T(x) to logits over the n experts.
    R is a straight-through Gumbel-softmax top-1 sample while training (one-hot forward,
    soft gradient into the router) and the argmax one-hot in eval. ``attention`` reports the
    router's soft probabilities as [B, 1, n], so Eq. 15's H and u exist for this method too.
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
        self, vectors: list[torch.Tensor], router_emb: torch.Tensor | None = None
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
