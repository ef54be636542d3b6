"""Two real training steps on the committed fixture stores (tiny roster), every method; and
two steps of a pocket policy (SmolLM2) on a small real cache (slow)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from musketeers.config import resolve_config
from musketeers.run import checkpoint as ckpt
from musketeers.run.trainer import train

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# the experts the fixture stores hold (musketeers.cache.experts.TINY_EXPERTS)
TINY = ["tiny-llama", "tiny-gpt2", "tiny-qwen2"]


def run_cfg(tmp_path: Path, method: str, **kw):
    values = dict(task="logic", team=None, experts=TINY, method=method, policy="tiny",
                  budget="smoke", steps=2, max_new_tokens=4, cache_dir=str(FIXTURES),
                  run_dir=str(tmp_path / method), dtype="float32", device="cpu",
                  # random tiny policies never score: without this every update would be
                  # skipped (no signal) and the loss path these tests walk would not run
                  skip_no_signal=False)
    values.update(kw)
    return resolve_config(None, values)


@pytest.mark.parametrize("method", ["perceiver", "no_cross_attn", "hard_routing",
                                    "output_collab", "single"])
def test_two_steps_on_fixture_store(tmp_path, method):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention on a shared CPU
    try:
        _two_steps(tmp_path, method)
    finally:
        torch.set_num_threads(threads)


def _two_steps(tmp_path: Path, method: str) -> None:
    cfg = run_cfg(tmp_path, method)
    train(cfg)
    run = Path(cfg.run_dir)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["loss"] is not None and r["grad_norm"] >= 0 for r in rows)
    has_a = method in ("perceiver", "hard_routing")
    assert all(("utilisation" in r) == has_a for r in rows)
    for r in rows:  # where the step's time went, and the work each phase did
        assert 0 < sum(r["phase_s"].values()) <= r["time_s"] and r["phase_s"]["sample"] > 0
        w = r["work"]
        assert w["decode_rows"] == cfg.prompts_per_micro * cfg.grad_accum * cfg.group_size
        assert 1 <= w["decode_steps"] <= cfg.max_new_tokens * cfg.grad_accum
        assert w["forward_passes"] == cfg.inner_iters and w["reference_passes"] == 1
        assert w["logprob_tokens"] > w["decode_rows"] and w["logprob_attention"] > 0
    last = ckpt.latest_checkpoint(run)
    assert (last / "adapter.safetensors").is_file() == (method not in ("output_collab",
                                                                         "single"))


def test_output_collab_puts_hints_in_the_prompt():
    from musketeers.run.data import HINTS_HEADER, load_split

    cfg = resolve_config(None, dict(task="logic", team=None, experts=TINY, method="output_collab",
                                    budget="smoke", cache_dir=str(FIXTURES)))
    from musketeers.method import methods
    from musketeers.run.build import expert_names_for

    method = methods.get(cfg.method)
    data = load_split(cfg, "train", expert_names_for(cfg, method), method=method, limit=3)
    assert data.vectors == [] and data.router is None
    assert all(HINTS_HEADER in it.question for it in data.items)


@pytest.mark.slow
def test_two_steps_of_smollm2_on_a_real_cache(tmp_path):
    """The pocket SmolLM2 policy on a small real cache (fixture store of tiny experts)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "stores"
    shutil.copytree(FIXTURES / "logic.zarr", cache / "logic.zarr")
    cfg = run_cfg(tmp_path, "perceiver", policy="smollm2", cache_dir=str(cache),
                  max_new_tokens=8)
    summary = train(cfg)
    assert summary["steps"] == 2
    from musketeers.run.evaluate import evaluate

    result = evaluate(Path(cfg.run_dir), limit=2)
    assert result["n"] == 2


def test_bench_paired_steps_alternate_cached_and_live(tmp_path):
    """The benchmark's timing child: cached and live steps alternate on one policy, the
    experts run only in the live ones, and their token count is per live step."""
    from musketeers.bench.train_bench import run_steps

    overrides = dict(team=None, experts=TINY, policy="tiny", budget="smoke", max_new_tokens=4,
                     dtype="float32", prompts_per_micro=2, grad_accum=1, group_size=2)
    r = run_steps({"task": "logic", "cache_dir": str(FIXTURES), "run_dir": str(tmp_path),
                   "device": "cpu", "reps": 2, "warmup": 1, "paired": True,
                   "overrides": overrides})
    assert len(r["step_s"]) == len(r["live_step_s"]) == len(r["live_expert_s"]) == 2
    assert len(r["warmup_s"]) == 1 and len(r["completion_len"]) == 6
    assert r["expert_s"] == [0.0, 0.0] and all(s > 0 for s in r["live_expert_s"])
    assert all(e < s for e, s in zip(r["live_expert_s"], r["live_step_s"], strict=True))
    # 3 live steps × 2 prompts: tokens per prompt is a prompt's length, not a third of it
    prompt_len = r["prompt_len"]
    assert all(0.5 * prompt_len < t < 2 * prompt_len for t in r["expert_tokens_per_prompt"])


def test_first_token_pooling_is_one_vector_per_expert_and_flagged():
    """Every fixture prompt starts with the same template or system tokens, so first_token
    pooling gives each expert one constant vector; last-token pooling does not."""
    from musketeers.method import methods
    from musketeers.run.data import load_split

    def constant(pooling: str) -> list[str]:
        cfg = resolve_config(None, dict(task="logic", team=None, experts=TINY, method="perceiver",
                                        budget="smoke", cache_dir=str(FIXTURES), pooling=pooling))
        return load_split(cfg, "train", TINY, method=methods.get(cfg.method)).constant_experts()

    assert set(constant("first_token")) == set(TINY)
    assert constant("last") == []
    hints_only = resolve_config(None, dict(task="logic", team=None, experts=TINY, budget="smoke",
                                           method="output_collab", cache_dir=str(FIXTURES)))
    assert load_split(hints_only, "train", TINY, method=methods.get(hints_only.method)
                      ).constant_experts() == []  # no vectors read


def test_evaluation_batches_by_length_and_keeps_the_split_order(tmp_path):
    """Logic prompts of unequal length: batches of 3 grouped by length give every item the
    completion it gets alone (batch 1, no padding), and the samples keep the split's order."""
    from musketeers.cache.reader import read_items
    from musketeers.run.data import scored_rows
    from musketeers.run.evaluate import evaluate, longest_first_batches

    cfg = run_cfg(tmp_path, "perceiver", steps=1)
    train(cfg)
    run = Path(cfg.run_dir)
    rows = {}
    for b in (1, 3):
        result = evaluate(run, limit=8, batch_size=b)
        rows[b] = [json.loads(x) for x in (run / "eval_samples.jsonl").read_text().splitlines()]
    # exact per source dataset: every sample counted once, under its own source
    sources = {r["source"] for r in rows[3]}
    assert set(result["by_source"]) == sources and len(sources) > 1
    for src, part in result["by_source"].items():
        mine = [r["score"] for r in rows[3] if r["source"] == src]
        assert part == {"items": len(mine), "exact": sum(x >= 1.0 for x in mine) / len(mine),
                        "score": sum(mine) / len(mine)}
    assert json.loads((run / "eval.json").read_text())["by_source"] == result["by_source"]
    val = read_items(FIXTURES, "logic", "val")
    ids = [val[i].id for i in scored_rows(val)[:8]]  # each question once, with its gold
    assert len({val[i].question for i in scored_rows(val)}) == len(scored_rows(val)) < len(val)
    assert [r["id"] for r in rows[3]] == [r["id"] for r in rows[1]] == ids
    assert [r["completion"] for r in rows[3]] == [r["completion"] for r in rows[1]]
    lengths = [5, 9, 2, 9, 7]
    batches = [b.tolist() for b in longest_first_batches([[0] * n for n in lengths], 2)]
    assert batches == [[1, 3], [4, 0], [2]]
