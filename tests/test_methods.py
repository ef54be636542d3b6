"""Adding a method is one registry entry: a throwaway ``mean_pool`` adapter trains, evaluates
and gets its row in a grid report without any other module knowing its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from musketeers.checks.planted import planted_config, write_planted_store
from musketeers.config import TrainConfig
from musketeers.design.gridspec import load_grid
from musketeers.grid.run import run_grid
from musketeers.method import methods
from musketeers.method.adapter import AdapterOutput, ExpertAlignment, OutputProjection
from musketeers.method.warmup import warms_up
from musketeers.reports.report import write_report
from musketeers.run.evaluate import evaluate
from musketeers.run.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")


class MeanPool(nn.Module):
    """Mean of the aligned experts → one context token; no attention matrix."""

    def __init__(self, dims: list[int], d_policy: int, d: int, out_init_std: float):
        super().__init__()
        self.align = ExpertAlignment(dims, d)
        self.out = OutputProjection(d, d_policy, out_init_std)
        self.n_context = 1

    def forward(self, vectors: list[torch.Tensor], router_emb: torch.Tensor | None = None
                ) -> AdapterOutput:
        return AdapterOutput(context=self.out(self.align(vectors).mean(1, keepdim=True)),
                             attention=None)


def _mean_pool(dims: list[int], d_policy: int, o: dict[str, Any]) -> nn.Module:
    return MeanPool(dims, d_policy, o["d_model"], o["out_init_std"])


MEAN_POOL = methods.Method("mean_pool", "Mean pool (test)", _mean_pool,
                           frozenset({"vectors"}), ignores=("latents", "heads"),
                           summary="the aligned experts averaged into one token")


def test_registered_is_scoped():
    with methods.registered(MEAN_POOL):
        assert methods.get("mean_pool") is MEAN_POOL
        with pytest.raises(ValueError, match="already registered"):
            methods.register(MEAN_POOL)
    assert "mean_pool" not in methods.names()


def test_no_method_ignores_a_warm_up_that_trains_it():
    """A field a method ignores leaves its run's name, cell and staleness check; the warm-up's
    steps train every trained method's LoRA once warmup_policy_lr > 0, Single's included, so
    a run warmed up for 80 steps must never read as the same run warmed up for 0."""
    warmed = []
    for name in methods.names():
        cfg = TrainConfig(method=name, adapter_warmup=5, warmup_policy_lr=1e-4)
        if warms_up(cfg, None, methods.get(name)):
            warmed.append(name)
            assert not {"adapter_warmup", "adapter_warmup_batch", "warmup_policy_lr"} & set(
                methods.ignored(name)), name
        else:
            assert "adapter_warmup" in methods.ignored(name), name
    assert {"single", "perceiver", "zero_context"} <= set(warmed) and "untrained" not in warmed


def test_a_new_method_trains_evaluates_and_reports(tmp_path: Path):
    stores, runs = tmp_path / "stores", tmp_path / "runs"
    write_planted_store(stores, n_train=32, n_val=8)
    base = planted_config("perceiver", 0, 2, stores, runs / "x", prompts_per_micro=4,
                          group_size=2, eval_limit=8).to_dict()
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(yaml.safe_dump({
        "budget": "smoke", "seeds": [0], "eval_limit": 8,
        "defaults": {k: v for k, v in base.items() if k not in ("run_dir", "method", "team")},
        "runs": [{"method": "mean_pool"}]}))

    with methods.registered(MEAN_POOL):
        grid = load_grid(grid_path)
        (run,) = grid.runs

        def train_fn(cfg):
            summary = train(cfg, plot=False)
            assert summary["steps"] == 2
            return cfg.run_path()

        def eval_fn(run_dir: Path, limit: int | None, context: bool) -> dict:
            out = evaluate(run_dir, limit=limit, no_context=not context)
            assert out["context"] and out["method"] == "mean_pool" and out["n"] == 8
            return out

        result = run_grid(grid, runs, train_fn=train_fn, eval_fn=eval_fn)
        assert not result.failed, result.failed
        assert result.trained == result.evaluated == [run.name]
        report = write_report(grid, runs, tmp_path / "reports")
        table1 = (report.parent / "table1.md").read_text()

    assert "mean_pool" not in methods.names()  # nothing leaks into other tests
    # table1.md holds the exact table, then the score table: one row each
    line, _ = [x for x in table1.splitlines() if x.startswith("| Mean pool (test)")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert "Planted (ours)" in table1 and "planted (ours)" not in table1  # titled by its task
    assert cells[-2] not in ("—", "FAILED") and cells[-2][0].isdigit(), line
    assert "mean_pool" in report.read_text()


def test_a_run_resolves_its_method_once(tmp_path: Path, monkeypatch):
    """Training and evaluating a run each look its method up in the registry once; every part
    of the run (data, store check, adapter, optimizer, warm-up, advantages) reads that one."""
    stores = tmp_path / "stores"
    write_planted_store(stores, n_train=8, n_val=4)
    cfg = planted_config("shuffled_reward", 0, 2, stores, tmp_path / "run", prompts_per_micro=2,
                         group_size=2, eval_limit=4)
    looked_up: list[str] = []
    real = methods.get

    def counting(name: str) -> methods.Method:
        looked_up.append(name)
        return real(name)

    monkeypatch.setattr(methods, "get", counting)
    train(cfg, plot=False)
    assert looked_up == ["shuffled_reward"]
    looked_up.clear()
    evaluate(cfg.run_path(), limit=4)
    assert looked_up == ["shuffled_reward"]
