"""Eq. 15 routing metrics and the Spearman ρ helper."""

import json
import math

import pytest
import torch
from scipy import stats

from musketeers.method.routing import batch_routing_stats, routing_entropy, spearman, utilisation


def test_entropy_uniform_is_log_n_and_one_hot_is_zero():
    n = 5
    uniform = torch.full((2, 3, n), 1.0 / n)
    torch.testing.assert_close(routing_entropy(uniform), torch.full((2,), math.log(n)))
    one_hot = torch.nn.functional.one_hot(torch.tensor([[0, 4, 2]]), n).float()
    h = routing_entropy(one_hot)
    assert torch.isfinite(h).all() and torch.equal(h, torch.zeros(1))


def test_entropy_hand_computed_mean_over_queries():
    a = torch.tensor([[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], [[0.2, 0.3, 0.5], [0.5, 0.5, 0.0]]])
    row = -(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5))
    torch.testing.assert_close(routing_entropy(a), torch.tensor([math.log(2) / 2,
                                                                 (row + math.log(2)) / 2]))


def test_utilisation_is_column_mean_and_sums_to_one():
    a = torch.softmax(torch.randn(4, 8, 3), dim=-1)
    u = utilisation(a)
    assert u.shape == (4, 3)
    torch.testing.assert_close(u.sum(-1), torch.ones(4))
    torch.testing.assert_close(u[1, 2], a[1, :, 2].mean())


def test_batch_routing_stats_json_ready_and_named():
    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]], requires_grad=True)
    s = batch_routing_stats(a, ["coder", "smol"])
    json.dumps(s)  # plain floats and lists only
    assert s["attention"] == [[1.0, 0.0], [0.5, 0.5]]
    assert s["entropy"] == 0.0
    assert s["utilisation"] == {"coder": 0.75, "smol": 0.25}
    assert batch_routing_stats(None, ["coder"]) == {}
    with pytest.raises(ValueError, match="names"):
        batch_routing_stats(a, ["coder"])


def test_spearman_matches_scipy_and_is_nan_safe():
    x = [0.1, 0.4, 0.35, 0.8, 0.7, 0.9]
    y = [2.0, 1.5, 1.7, 0.9, 1.2, 0.3]
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
    assert spearman([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))  # constant series: ρ undefined
    assert math.isnan(spearman([1], [2]))
    # non-finite pairs are dropped, not propagated
    assert spearman([1, 2, float("nan"), 4], [1, 2, 9, 3]) == pytest.approx(
        stats.spearmanr([1, 2, 4], [1, 2, 3]).statistic
    )
