"""GRPO (paper Eq. 4) and the RLOO+ options, one small function per term.

Eq. 4 maximises E[r(x, y) - β⁻¹·log π_θ(y|[x‖C]) / π_ref(y|x)]: reward minus a KL penalty.
The paper writes β⁻¹ yet reports "KL coefficient β = 0.04" (§4.1); we follow the reported
coefficient, β multiplying the KL, as GRPO implementations do. π_ref sees zeros in C's
positions (§4.1), not the bare x, so both policies share one token layout. GRPO optimises
it with a PPO-clipped surrogate on group-relative advantages plus a per-token k3 KL penalty:

    L = -agg_t [ min(ρ_t A, clip(ρ_t, 1-ε_low, 1+ε_high) A) - β·k3_t ]

with ρ_t = π_θ(y_t|·) / π_old(y_t|·). With μ = 1 inner iteration old_logp = logp.detach(),
so ρ = 1 in value but ∇ρ = ∇logp: the surrogate's gradient is the policy gradient A·∇logp.

Options from the RLOO+ report (§4.1): leave-one-out advantage, per-task reward z-scoring,
dynamic sampling (drop zero-variance groups), asymmetric clip-higher, and constant-length
(Dr. GRPO) loss normalisation.

Shapes: rewards [B, G] (B prompts, G completions each); per-token tensors [N, T] with
N = B·G rows in group-major order (row b·G + g), T completion positions, mask 1 on real tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from musketeers.method.grpo_options import ADVANTAGES, LOSS_NORMS, REWARD_NORMS

F = TypeVar("F", bound=Callable)
# name → function, filled by the decorators below: one lookup per option (as verl's
# register_adv_est), its names declared torch-free in grpo_options for config validation
REWARD_NORMALIZERS: dict[str, Callable[..., Tensor]] = {}
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor]] = {}
LOSS_AGGREGATIONS: dict[str, Callable[..., tuple[Tensor, Tensor | float]]] = {}
LOSS_DENOMINATORS: dict[str, Callable[[list[int], int], float]] = {}


def _registrar(registry: dict[str, Callable], declared: tuple[str, ...], what: str
               ) -> Callable[[str], Callable[[F], F]]:
    def register(name: str) -> Callable[[F], F]:
        if name not in declared:
            raise ValueError(f"{what} {name!r} is not declared in grpo_options")

        def add(fn: F) -> F:
            registry[name] = fn
            return fn
        return add
    return register


register_reward_norm = _registrar(REWARD_NORMALIZERS, REWARD_NORMS, "reward normalisation")
register_adv_est = _registrar(ADVANTAGE_ESTIMATORS, ADVANTAGES, "advantage")
register_loss_agg = _registrar(LOSS_AGGREGATIONS, LOSS_NORMS, "loss normalisation")
register_loss_denominator = _registrar(LOSS_DENOMINATORS, LOSS_NORMS, "loss normalisation")


def _lookup(registry: dict[str, Callable], name: str, what: str, valid: tuple[str, ...]
            ) -> Callable:
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(valid)}") from None


def _group_std(rewards: Tensor) -> Tensor:
    # GRPO's std is the unbiased sample std (Bessel, N-1), as in DeepSeekMath's reference
    # implementations, TRL and verl (torch.std's default). A group of one has no spread: 0.
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards[..., :1])
    return rewards.std(dim=-1, keepdim=True, correction=1)


@register_reward_norm("group")
def group_zscore(rewards: Tensor, sources: list[str] | None, eps: float) -> Tensor:
    """r̃_bg = (r_bg - mean_g r_b·) / (std_g r_b· + eps)   (GRPO, unbiased std)."""
    return (rewards - rewards.mean(-1, keepdim=True)) / (_group_std(rewards) + eps)


@register_reward_norm("task")
def task_zscore(rewards: Tensor, sources: list[str] | None, eps: float) -> Tensor:
    """r̃_bg = (r_bg - mean_{s(b')=s(b)} r) / (std_{s(b')=s(b)} r + eps): z-score over every
    completion of every prompt from the same task source s across the batch (RLOO+ per-task
    standardisation; unbiased std)."""
    if sources is None or len(sources) != rewards.shape[0]:
        raise ValueError("reward_norm='task' needs one source name per prompt (row)")
    out = torch.empty_like(rewards)
    for src in dict.fromkeys(sources):
        rows = torch.tensor([s == src for s in sources], device=rewards.device)
        vals = rewards[rows].flatten()
        std = vals.std(correction=1) if vals.numel() > 1 else vals.new_zeros(())
        out[rows] = (rewards[rows] - vals.mean()) / (std + eps)
    return out


@register_reward_norm("none")
def raw_rewards(rewards: Tensor, sources: list[str] | None, eps: float) -> Tensor:
    """r̃ = r."""
    return rewards


def normalize_rewards(
    rewards: Tensor, mode: str = "group", sources: list[str] | None = None, eps: float = 1e-6
) -> Tensor:
    """Reward standardisation before advantages: the function registered under ``mode``
    (group, task, none)."""
    fn = _lookup(REWARD_NORMALIZERS, mode, "reward normalisation", REWARD_NORMS)
    return fn(rewards.float(), sources, eps)


@register_adv_est("group")
def group_relative(rewards: Tensor, eps: float) -> Tensor:
    """A_i = (r_i - mean_j r_j) / (std_j r_j + eps)   (GRPO, unbiased std)."""
    return group_zscore(rewards, None, eps)


@register_adv_est("loo")
def leave_one_out(rewards: Tensor, eps: float) -> Tensor:
    """A_i = r_i - 1/(G-1) Σ_{j≠i} r_j = G/(G-1) · (r_i - mean_j r_j)   (RLOO)."""
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError("leave-one-out advantages need a group size G >= 2")
    return g / (g - 1) * (rewards - rewards.mean(-1, keepdim=True))


def group_advantages(rewards: Tensor, kind: str = "group", eps: float = 1e-6) -> Tensor:
    """Per-completion advantage A_bg from a group's rewards: the estimator registered under
    ``kind`` (group, loo). Both sum to zero within a group."""
    return _lookup(ADVANTAGE_ESTIMATORS, kind, "advantage", ADVANTAGES)(rewards.float(), eps)


def compute_advantages(
    rewards: Tensor,
    *,
    advantage: str = "group",
    reward_norm: str = "group",
    sources: list[str] | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """A = group_advantages(normalize_rewards(r, reward_norm), advantage).

    Paper default (GRPO): advantage=group, reward_norm=group. RLOO+: advantage=loo,
    reward_norm=task. A group z-score is invariant to any per-task affine rescaling, so
    reward_norm only changes the result for advantage=loo; group-on-group is applied once.
    """
    if advantage == "group" and reward_norm == "group":
        return normalize_rewards(rewards, "group", eps=eps)
    return group_advantages(normalize_rewards(rewards, reward_norm, sources, eps), advantage, eps)


def zero_variance_groups(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Dynamic sampling (DAPO): True for groups whose rewards all agree, max_g r - min_g r <= eps.

    Such groups have A ≡ 0 and carry no policy gradient (only KL), so RLOO+ drops them.
    """
    return (rewards.amax(-1) - rewards.amin(-1)) <= eps


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate (Schulman's k3), the KL term of Eq. 4.

    k3 = exp(log π_ref - log π_θ) - (log π_ref - log π_θ) - 1 ≥ 0, zero iff equal; unbiased
    for KL under samples from π_θ.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, adv: Tensor, clip_low: float = 0.2, clip_high: float = 0.2
) -> Tensor:
    """Per-token PPO surrogate min(ρA, clip(ρ, 1-ε_low, 1+ε_high)·A), ρ = exp(logp - old_logp).

    adv is per sequence ([N] or [N, 1]) or per token ([N, T]). ε_high > ε_low is DAPO's
    clip-higher. Larger is better (the loss negates it).
    """
    if adv.dim() == logp.dim() - 1:
        adv = adv.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.minimum(ratio * adv, clipped * adv)


@register_loss_agg("token")
def token_mean(masked: Tensor, mask: Tensor, max_len: int | None
               ) -> tuple[Tensor, Tensor | float]:
    """Σ_{n,t} x m / Σ_{n,t} m   (DAPO token-level mean)."""
    return masked.sum(), mask.sum().clamp(min=1)


@register_loss_agg("sequence")
def sequence_mean(masked: Tensor, mask: Tensor, max_len: int | None
                  ) -> tuple[Tensor, Tensor | float]:
    """1/N Σ_n (Σ_t x m / Σ_t m)   (original GRPO)."""
    return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum(), masked.shape[0]


@register_loss_agg("constant")
def constant_length(masked: Tensor, mask: Tensor, max_len: int | None
                    ) -> tuple[Tensor, Tensor | float]:
    """Σ_{n,t} x m / (N · L_max), L_max = max_len or T   (Dr. GRPO, no length bias)."""
    length = max_len if max_len is not None else masked.shape[-1]
    return masked.sum(), masked.shape[0] * length


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str = "token", max_len: int | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce a per-token objective [N, T] over real tokens (mask) to a scalar, by the
    aggregation registered under ``mode`` (token, sequence, constant).

    ``denominator`` replaces the batch's own Σ m, N or N · L_max by the whole update's
    (``loss_denominator``): the micro-batches of one update then sum to its exact loss.
    """
    fn = _lookup(LOSS_AGGREGATIONS, mode, "loss normalisation", LOSS_NORMS)
    mask = mask.to(per_token.dtype)
    num, den = fn(per_token * mask, mask, max_len)
    return num / (den if denominator is None else denominator)


@register_loss_denominator("token")
def update_tokens(lengths: list[int], max_len: int) -> float:
    """Σ lengths: every completion token of the update."""
    return float(max(sum(lengths), 1))


@register_loss_denominator("sequence")
def update_sequences(lengths: list[int], max_len: int) -> float:
    """The number of completions of the update."""
    return float(len(lengths))


@register_loss_denominator("constant")
def update_constant(lengths: list[int], max_len: int) -> float:
    """The number of completions times ``max_len``."""
    return float(len(lengths) * max_len)


def loss_denominator(lengths: list[int], mode: str, max_len: int) -> float:
    """``aggregate``'s denominator over every completion of one update (their token counts),
    registered under ``mode``: each micro-batch's loss over it, summed, is the loss of the
    whole batch."""
    return _lookup(LOSS_DENOMINATORS, mode, "loss normalisation", LOSS_NORMS)(lengths, max_len)


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    adv: Tensor,
    mask: Tensor,
    *,
    beta: float = 0.04,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_norm: str = "token",
    max_len: int | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Eq. 4 as a loss: L = -agg[ min(ρA, clip(ρ)A) - β·k3(logp, ref_logp) ].

    ref_logp may be None when β = 0 (no reference forward needed). ``denominator``: see
    ``aggregate`` (one micro-batch of a larger update). Returns the scalar loss
    and float statistics over real tokens: kl (token mean of k3), clip_frac (tokens whose
    clipped branch is active), ratio_mean, adv_mean, surrogate.
    """
    mask = mask.to(logp.dtype)
    surrogate = clipped_surrogate(logp, old_logp, adv, clip_low, clip_high)
    per_token = surrogate
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        per_token = surrogate - beta * kl
    elif beta != 0:
        raise ValueError("grpo_loss needs ref_logp when beta != 0")
    loss = -aggregate(per_token, mask, loss_norm, max_len, denominator)

    with torch.no_grad():
        a = adv.unsqueeze(-1) if adv.dim() == logp.dim() - 1 else adv
        ratio = torch.exp(logp - old_logp)
        clipped = ((ratio < 1 - clip_low) & (a < 0)) | ((ratio > 1 + clip_high) & (a > 0))
        n_tok = mask.sum().clamp(min=1)
        stats = {
            "kl": float((kl * mask).sum() / n_tok) if kl is not None else 0.0,
            "clip_frac": float((clipped.to(mask.dtype) * mask).sum() / n_tok),
            "ratio_mean": float((ratio * mask).sum() / n_tok),
            "adv_mean": float(adv.float().mean()),
            "surrogate": float((surrogate * mask).sum() / n_tok),
        }
    return loss, stats
