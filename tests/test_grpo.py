"""Each GRPO / RLOO+ term against hand-computed numbers."""

import math

import pytest
import torch

from musketeers.method import grpo

R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])


def test_group_advantages_hand_computed():
    a = grpo.group_advantages(R, "group", eps=0.0 + 1e-12)
    # row 0: mean 0.5, unbiased std sqrt(4·0.25/3) = 1/sqrt(3)
    s0 = 1 / math.sqrt(3)
    assert torch.allclose(a[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / s0, atol=1e-5)
    # row 1: mean 0.25, unbiased std = sqrt((3·0.0625 + 0.5625)/3) = 0.5
    assert torch.allclose(a[1], torch.tensor([-0.5, -0.5, -0.5, 1.5]), atol=1e-5)
    assert torch.equal(a[2], torch.zeros(4))  # zero variance → zero advantage, no 0/0
    assert torch.allclose(a.sum(-1), torch.zeros(3), atol=1e-5)


def test_loo_advantage_formula():
    a = grpo.group_advantages(R, "loo")
    # row 1: A_4 = 1 - 0 = 1; A_1 = 0 - 1/3
    assert torch.allclose(a[1], torch.tensor([-1 / 3, -1 / 3, -1 / 3, 1.0]), atol=1e-6)
    for b in range(3):
        for i in range(4):
            others = torch.cat([R[b, :i], R[b, i + 1 :]])
            assert a[b, i].item() == pytest.approx((R[b, i] - others.mean()).item(), abs=1e-6)
    assert torch.allclose(a.sum(-1), torch.zeros(3), atol=1e-6)
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.ones(2, 1), "loo")


def test_task_normalisation_per_source():
    r = torch.tensor([[1.0, 0.0], [3.0, 3.0], [10.0, 20.0]])
    z = grpo.normalize_rewards(r, "task", sources=["a", "a", "b"], eps=0.0)
    va = torch.tensor([1.0, 0.0, 3.0, 3.0])
    assert torch.allclose(z[:2].flatten(), (va - va.mean()) / va.std(), atol=1e-6)
    # row 1 has zero group variance but not zero task variance: its z-score is not zero
    assert z[1, 0].item() > 0
    vb = torch.tensor([10.0, 20.0])
    assert torch.allclose(z[2], (vb - 15) / vb.std(), atol=1e-6)
    assert torch.equal(grpo.normalize_rewards(r, "none"), r)
    with pytest.raises(ValueError):
        grpo.normalize_rewards(r, "task")
    with pytest.raises(ValueError, match="valid"):
        grpo.normalize_rewards(r, "bogus")


def test_compute_advantages_combinations():
    torch.manual_seed(0)
    r = torch.rand(4, 5)
    src = ["x", "x", "y", "y"]
    grpo_a = grpo.compute_advantages(r, advantage="group", reward_norm="group")
    assert torch.allclose(grpo_a, grpo.group_advantages(r, "group"))
    rloo_plus = grpo.compute_advantages(r, advantage="loo", reward_norm="task", sources=src)
    z = grpo.normalize_rewards(r, "task", src)
    assert torch.allclose(rloo_plus, grpo.group_advantages(z, "loo"))
    # per-group z-scoring ignores per-task scaling (up to eps)
    g_task = grpo.compute_advantages(r, advantage="group", reward_norm="task", sources=src)
    assert torch.allclose(g_task, grpo_a, atol=1e-4)


def test_zero_variance_groups():
    assert grpo.zero_variance_groups(R).tolist() == [False, False, True]


def test_k3_kl():
    lp = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.equal(grpo.k3_kl(lp, lp), torch.zeros(3))
    ref = torch.tensor([-1.5, -1.0, -3.0])
    d = ref - lp
    assert torch.allclose(grpo.k3_kl(lp, ref), torch.exp(d) - d - 1)
    assert (grpo.k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()
    # hand value: d = ref - logp = 1 → e¹ - 1 - 1
    assert grpo.k3_kl(torch.tensor(0.0), torch.tensor(1.0)).item() == pytest.approx(math.e - 2)


def test_clipped_surrogate_both_bounds_both_signs():
    ratios = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5])
    old = torch.zeros(2, 5)
    logp = torch.log(ratios).expand(2, 5)
    adv = torch.tensor([2.0, -2.0])
    s = grpo.clipped_surrogate(logp, old, adv, clip_low=0.2, clip_high=0.3)
    # A > 0: min(ρA, clip(ρ)A) → ρ capped above at 1.3, not raised below (0.5 stays 0.5)
    assert torch.allclose(s[0], 2 * torch.tensor([0.5, 0.9, 1.0, 1.1, 1.3]), atol=1e-6)
    # A < 0: ρ floored at 0.8 (can't profit from pushing ρ lower), not capped above
    assert torch.allclose(s[1], -2 * torch.tensor([0.8, 0.9, 1.0, 1.1, 1.5]), atol=1e-6)
    # the clipped branch carries no gradient
    lp = torch.log(ratios).clone().requires_grad_(True)
    grpo.clipped_surrogate(lp, torch.zeros(5), torch.tensor([2.0])).sum().backward()
    assert lp.grad[0] != 0 and lp.grad[4] == 0


MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
X = torch.tensor([[1.0, 2.0, 3.0, 100.0], [10.0, 100.0, 100.0, 100.0]])


def test_aggregations_on_ragged_mask():
    assert grpo.aggregate(X, MASK, "token").item() == pytest.approx(16 / 4)
    assert grpo.aggregate(X, MASK, "sequence").item() == pytest.approx((2 + 10) / 2)
    assert grpo.aggregate(X, MASK, "constant").item() == pytest.approx(16 / (2 * 4))
    assert grpo.aggregate(X, MASK, "constant", max_len=8).item() == pytest.approx(16 / 16)
    with pytest.raises(ValueError, match="token, sequence, constant"):
        grpo.aggregate(X, MASK, "mean")


@pytest.mark.parametrize("mode", grpo.LOSS_NORMS)
def test_micro_batches_sum_to_the_whole_batch_loss(mode):
    """Gradient accumulation: rows split 2 + 3 (different widths), each micro-batch over the
    update's denominator, sum to the loss of all five rows at once."""
    torch.manual_seed(0)
    lengths = [3, 1, 4, 2, 5]
    x = torch.randn(5, 5)
    mask = (torch.arange(5) < torch.tensor(lengths).unsqueeze(-1)).float()
    whole = grpo.aggregate(x, mask, mode, max_len=6)
    den = grpo.loss_denominator(lengths, mode, max_len=6)
    parts = [grpo.aggregate(x[:2, :3], mask[:2, :3], mode, 6, den),
             grpo.aggregate(x[2:], mask[2:], mode, 6, den)]
    assert sum(parts).item() == pytest.approx(whole.item(), abs=1e-6)
    # the per-micro-batch mean (what accumulation without it computes) differs here
    naive = (grpo.aggregate(x[:2, :3], mask[:2, :3], mode, 6)
             + grpo.aggregate(x[2:], mask[2:], mode, 6)) / 2
    assert naive.item() != pytest.approx(whole.item(), abs=1e-3)


def test_loss_is_minus_mean_advantage_at_ratio_one():
    torch.manual_seed(0)
    logp = (torch.randn(2, 4) - 2).requires_grad_(True)
    adv = torch.tensor([1.5, -0.5])
    loss, stats = grpo.grpo_loss(logp, logp.detach(), None, adv, MASK, beta=0.0,
                                 loss_norm="sequence")
    assert loss.item() == pytest.approx(-adv.mean().item())
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0
    loss.backward()
    # μ = 1: ratio is 1 in value but ∇L = -1/N Σ_n A_n/|y_n| ∇logp on real tokens
    expected = -(adv[:, None] / MASK.sum(-1, keepdim=True)) / 2 * MASK
    assert torch.allclose(logp.grad, expected)


def test_loss_with_kl_hand_computed():
    logp = torch.tensor([[-1.0, -2.0, -1.0, 0.0], [-0.5, 0.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.0, -1.0, -2.0, 0.0], [-1.5, 0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = grpo.grpo_loss(logp, logp, ref, adv, MASK, beta=0.1, loss_norm="token")
    k = grpo.k3_kl(logp, ref)
    kl_tok = (k * MASK).sum() / 4
    assert stats["kl"] == pytest.approx(kl_tok.item())
    # surrogate at ρ=1 is A per token: (3·1 + 1·(-1)) / 4 tokens
    assert loss.item() == pytest.approx(-(2 / 4 - 0.1 * kl_tok.item()), abs=1e-6)
    with pytest.raises(ValueError):
        grpo.grpo_loss(logp, logp, None, adv, MASK, beta=0.1)


def test_clip_fraction_stat():
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5, 1.0]]))
    _, stats = grpo.grpo_loss(logp, torch.zeros(1, 4), None, torch.tensor([1.0]),
                              torch.ones(1, 4), beta=0.0, loss_norm="token")
    # A > 0: only ρ = 1.5 > 1.2 is clipped
    assert stats["clip_frac"] == pytest.approx(0.25)


def test_the_registries_hold_exactly_the_declared_names():
    """config validates against grpo_options; grpo registers a function under each name."""
    from musketeers.method import grpo_options

    assert tuple(grpo.ADVANTAGE_ESTIMATORS) == grpo_options.ADVANTAGES
    assert tuple(grpo.REWARD_NORMALIZERS) == grpo_options.REWARD_NORMS
    assert tuple(grpo.LOSS_AGGREGATIONS) == grpo_options.LOSS_NORMS
    assert tuple(grpo.LOSS_DENOMINATORS) == grpo_options.LOSS_NORMS


def test_an_undeclared_name_cannot_be_registered():
    with pytest.raises(ValueError, match="not declared"):
        grpo.register_adv_est("vtrace")


def test_the_declared_names_import_without_torch():
    """What config validation reads must stay cheap: no torch behind it."""
    import subprocess
    import sys

    code = ("import sys, musketeers.method.grpo_options as o; "
            "print(o.ADVANTAGES, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().endswith("False")


def test_config_refuses_an_unregistered_advantage():
    from musketeers.cache.errors import UserError
    from musketeers.config import resolve_config, validate

    with pytest.raises(UserError, match="unknown advantage 'vtrace'; valid: group, loo"):
        validate(resolve_config(overrides={"advantage": "vtrace"}))
