"""The warm-up-only arm: Single's supervised warm-up, then a GRPO step at learning rate 0, so
that a grid measures what RL adds beyond the warm-up every arm gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from musketeers.cache.errors import UserError
from musketeers.checks.planted import planted_config, write_planted_store
from musketeers.config import resolve_config
from musketeers.design.comparisons import COMPARISONS
from musketeers.method import methods, warmup
from musketeers.run import build, trainer

pytestmark = pytest.mark.usefixtures("one_thread")

WARM = dict(adapter_warmup=3, adapter_warmup_batch=4, warmup_policy_lr=1e-2)


def test_warmup_only_needs_a_warm_up_and_runs_one_step():
    with pytest.raises(UserError, match="--adapter-warmup N .* --warmup-policy-lr"):
        resolve_config(None, {"method": "warmup_only"})
    with pytest.raises(UserError, match="warm-up alone"):
        resolve_config(None, {"method": "warmup_only", "adapter_warmup": 5})
    cfg = resolve_config(None, {"method": "warmup_only", "steps": 40, **WARM})
    assert cfg.steps == 1
    spec = methods.get("warmup_only")
    assert spec.trains and not spec.rl_updates and methods.get("single").rl_updates
    assert any(c.tested == {"method": "single"} and c.control == {"method": "warmup_only"}
               for c in COMPARISONS)


def _trained(method: str, tmp_path: Path, monkeypatch) -> tuple[dict, dict, list]:
    """(LoRA after the warm-up, LoRA at the end, the warm-up's rows) of a one-step run."""
    stores = tmp_path / "stores"
    if not stores.exists():
        write_planted_store(stores, n_train=16, n_val=4)
    cfg = planted_config(method, 0, 1, stores, tmp_path / method, prompts_per_micro=4,
                         group_size=2, **WARM)
    policies, after_warmup, rows = [], {}, []
    real = warmup.warm_up_adapter  # the module's, not a wrapper an earlier call patched in

    def warm_up(cfg, policy, adapter, data):
        out = real(cfg, policy, adapter, data)
        after_warmup.update({n: p.detach().clone() for n, p in
                             policy.model.named_parameters() if p.requires_grad})
        rows.extend(out)
        return out

    def factory(cfg):
        policies.append(build.build_policy(cfg))
        return policies[-1]

    monkeypatch.setattr(trainer, "warm_up_adapter", warm_up)
    trainer.train(cfg, policy_factory=factory, plot=False)
    end = {n: p.detach() for n, p in policies[0].model.named_parameters() if p.requires_grad}
    return after_warmup, end, rows


def test_the_grpo_step_moves_nothing_after_the_warm_up(tmp_path, monkeypatch):
    warmed, end, rows = _trained("warmup_only", tmp_path, monkeypatch)
    assert len(rows) == 3 and warmed  # the warm-up ran and fitted the LoRA
    assert all(torch.equal(warmed[n], end[n]) for n in warmed)  # RL at lr 0
    s_warmed, s_end, s_rows = _trained("single", tmp_path, monkeypatch)
    assert s_rows == rows  # the same seeded warm-up as Single's
    assert all(torch.equal(warmed[n], s_warmed[n]) for n in warmed)
    assert any(not torch.equal(s_warmed[n], s_end[n]) for n in s_warmed)  # Single's RL moves


def test_table1_has_a_warm_up_only_row_where_the_runs_hold_one():
    """The design's grids do not warm up, so they cannot run this arm: its row would be
    empty in every one of their reports. A grid that ran it has the row."""
    from pathlib import Path

    from musketeers.reports.aggregate import Run
    from musketeers.reports.tables import table1_rows

    def labels(runs):
        return [row.key.get("method") for row in table1_rows(runs)]

    assert "warmup_only" not in labels([])
    assert "untrained" in labels([])  # a control the design runs keeps its row
    run = Run("w", Path("w"), {"method": "warmup_only", "task": "arithmetic"}, "done")
    assert "warmup_only" in labels([run])
