"""The GRPO loop on the tiny planted setup: resume, faults, checkpoints, metrics, eval."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from musketeers.cache.errors import UserError
from musketeers.checks.planted import planted_config
from musketeers.config import read_run_config
from musketeers.method import methods
from musketeers.run import checkpoint as ckpt
from musketeers.run.build import build_components
from musketeers.run.trainer import NonFiniteError, train
from musketeers.runtime.machine import cpu_model
from musketeers.tasks import extract_answer

pytestmark = pytest.mark.usefixtures("one_thread")

TIMING = {"time_s", "phase_s"}  # wall-clock: differs run to run


def small(method: str, store: Path, run: Path, steps: int = 4, **kw):
    values = dict(prompts_per_micro=4, group_size=4, grad_accum=2, save_every=2, beta=0.04,
                  inner_iters=2)
    values.update(kw)
    return planted_config(method, 0, steps, store, run, **values)


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_metrics_rows_and_artifacts(planted_store, tmp_path):
    run = tmp_path / "run"
    summary = train(small("perceiver", planted_store, run))
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for key in ("reward_mean", "reward_std", "exact", "kl", "loss", "grad_norm",
                    "completion_len", "zero_var_frac", "entropy", "attention"):
            assert key in r
        assert set(r["utilisation"]) == {"noise-a", "oracle", "noise-b"}
        assert sum(r["utilisation"].values()) == pytest.approx(1.0, abs=1e-5)
        assert 0.0 <= r["exact"] <= 1.0 and r["completion_len"] == 1.0
        # solved groups (every sample scored 1) have zero variance, and their samples are exact
        assert r["solved_frac"] <= min(r["zero_var_frac"], r["exact"])
    assert "spearman_reward_entropy" in summary and summary["status"] == "done"
    assert (run / "routing.png").stat().st_size > 1000
    assert (run / "config.yaml").is_file() and (run / "summary.json").is_file()
    last = ckpt.latest_checkpoint(run)
    assert last.name == "step-000004"
    assert (last / "lora" / "adapter_model.safetensors").is_file()
    assert (last / "lora" / "adapter_config.json").is_file()
    assert (last / "adapter.safetensors").is_file()


def test_resume_equals_uninterrupted(planted_store, tmp_path):
    method = "perceiver"
    full, cut = tmp_path / "full", tmp_path / "cut"
    # no_context_every: the π(y|x) samples must not disturb the resumed streams either
    train(small(method, planted_store, full, steps=5, save_every=2, no_context_every=2))
    # "killed" after step 3: the checkpoint is at step 2, step 3 is logged but must be redone
    partial = train(small(method, planted_store, cut, steps=5, save_every=2, no_context_every=2),
                    stop_after=3)
    assert partial["status"] == "partial"
    assert len(metrics(cut)) == 3 and ckpt.latest_checkpoint(cut).name == "step-000002"
    train(small(method, planted_store, cut, steps=5, save_every=2, no_context_every=2),
          resume=True)
    assert metrics(cut) == metrics(full)


def test_no_context_reward_is_logged_without_changing_training(planted_store, tmp_path):
    plain, probed = tmp_path / "plain", tmp_path / "probed"
    train(small("perceiver", planted_store, plain, steps=4))
    train(small("perceiver", planted_store, probed, steps=4, no_context_every=2))
    rows = metrics(probed)
    assert [r["step"] for r in rows if "reward_no_context" in r] == [1, 3]
    assert all(0.0 <= r["reward_no_context"] <= 1.0 for r in rows if "reward_no_context" in r)
    stripped = [{k: v for k, v in r.items() if k != "reward_no_context"} for r in rows]
    assert stripped == metrics(plain)  # same rewards, losses, grads: no RNG stream consumed
    assert all("reward_no_context" not in r for r in metrics(plain))


def test_no_context_reward_samples_the_policy_without_context(planted_store, tmp_path):
    """π_θ(y | x): the sampler gets no context positions, whatever the adapter would give."""
    from musketeers.method.rollout import no_context_reward

    cfg = small("perceiver", planted_store, tmp_path / "r", no_context_every=1)
    data, policy, _ = build_components(cfg, "train", method=methods.get(cfg.method))
    seen = []
    real = policy.generate

    def spy(prompt_ids, context, **kw):
        seen.append(context)
        return real(prompt_ids, context, **kw)

    policy.generate = spy
    state = torch.get_rng_state()
    value = no_context_reward(cfg, 0, policy, data, torch.arange(4))
    assert seen == [None] and 0.0 <= value <= 1.0
    assert torch.equal(state, torch.get_rng_state())
    assert no_context_reward(cfg, 0, policy, data, torch.arange(4)) == value  # seeded by step


def test_hard_routing_loss_replays_the_rollouts_gumbel_draw():
    """The loss pass must condition on the expert each row was routed to while sampling."""
    from musketeers.method.context import adapter_context, rng_snapshot
    from musketeers.method.methods import build_adapter

    torch.manual_seed(0)
    dims = [6, 10, 4]
    ad = build_adapter("hard_routing", dims, 8, d_model=8, router_dim=5, out_init_std=1.0)
    ad.train()
    vectors, router = [torch.randn(64, d) for d in dims], torch.randn(64, 5)
    snap = rng_snapshot("cpu")
    sampled, _ = adapter_context(ad, vectors, router, "cpu")
    torch.rand(100)  # the draws of sampling, in between
    after = torch.get_rng_state()
    replayed, _ = adapter_context(ad, vectors, router, "cpu", snap)
    assert torch.equal(torch.get_rng_state(), after)  # the replay leaves the stream alone
    fresh, _ = adapter_context(ad, vectors, router, "cpu")
    assert torch.equal(replayed, sampled)
    assert not torch.equal(fresh, sampled)


def test_fresh_run_refuses_existing_folder(planted_store, tmp_path):
    run = tmp_path / "run"
    train(small("single", planted_store, run, steps=1))
    with pytest.raises(UserError, match="--resume"):
        train(small("single", planted_store, run, steps=1))


@pytest.mark.parametrize("where", ["loss", "rewards", "grad_norm"])
def test_nan_stops_and_keeps_last_good_checkpoint(planted_store, tmp_path, where):
    run = tmp_path / "run"

    def fault(step: int, name: str, t: torch.Tensor) -> torch.Tensor:
        return t * float("nan") if (step == 2 and name == where) else t  # 0-based: the third

    name = "gradient" if where == "grad_norm" else where
    # the message numbers steps as metrics.jsonl does: rows 1 and 2 are logged, step 3 failed
    # every update computes its loss, whatever its rewards (a skipped update has none)
    with pytest.raises(NonFiniteError, match=f"^step 3: {name}"):
        train(small("perceiver", planted_store, run, steps=4, save_every=1,
                    skip_no_signal=False), fault=fault)
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000001", "step-000002"]
    assert [r["step"] for r in metrics(run)] == [1, 2]
    # the kept checkpoint is usable: resuming finishes the run
    train(small("perceiver", planted_store, run, steps=4, save_every=1, skip_no_signal=False),
          resume=True)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_crash_during_save_keeps_previous_checkpoint(planted_store, tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = small("perceiver", planted_store, run, steps=4, save_every=2)
    real = ckpt._write_state
    calls = {"n": 0}

    def dying(state, path):
        calls["n"] += 1
        if calls["n"] == 2:  # the second save dies after LoRA and adapter were written
            raise KeyboardInterrupt("killed mid-save")
        real(state, path)

    monkeypatch.setattr(ckpt, "_write_state", dying)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(ckpt, "_write_state", real)
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000002"]
    assert list((run / "checkpoints").glob(".tmp-*"))  # the torn save is there, ignored
    train(cfg, resume=True)
    assert ckpt.latest_checkpoint(run).name == "step-000004"
    assert not list((run / "checkpoints").glob(".tmp-*"))  # cleaned by the next save
    full = tmp_path / "full"
    train(small("perceiver", planted_store, full, steps=4, save_every=2))
    assert metrics(run) == metrics(full)


def test_near_zero_adapter_matches_zero_context(planted_store, tmp_path):
    """Eq. 11's near-zero W_out: first-step log-probs with C equal those with C = 0 (the
    reference layout; the `single` policy has no C positions at all, so it differs anyway)."""
    cfg = small("perceiver", planted_store, tmp_path / "r")
    data, policy, adapter = build_components(cfg, "train", method=methods.get(cfg.method))
    rows = torch.arange(4)
    items, vectors, _ = data.batch(rows)
    prompts = policy.encode_prompts(items)
    comps = [[3 + d] for d in range(10)] * 4
    with torch.no_grad():
        context = adapter(vectors).context
        with_c, _ = policy.completion_logprobs(prompts, context, comps)
        zero_c, _ = policy.completion_logprobs(prompts, torch.zeros_like(context), comps)
    assert context.abs().max() < 1e-2
    torch.testing.assert_close(with_c, zero_c, atol=1e-3, rtol=0)


def test_eval_writes_accuracy_with_and_without_context(planted_store, tmp_path):
    from musketeers.run.evaluate import evaluate

    run = tmp_path / "run"
    # bf16 (not the planted default float32), so a recorded dtype that ignored the config shows
    # threads other than this process's, so a recorded count that ignored the run shows
    threads = 1 if torch.get_num_threads() != 1 else 2
    train(small("perceiver", planted_store, run, steps=2, dtype="bfloat16", threads=threads))
    with_c = evaluate(run, limit=8)
    without = evaluate(run, limit=8, no_context=True)
    assert with_c["n"] == without["n"] == 8 and with_c["context"] and not without["context"]
    assert 0.0 <= with_c["exact"] <= with_c["score"] <= 1.0
    assert json.loads((run / "eval.json").read_text()) == with_c
    assert (run / "eval_no_context.json").is_file()
    # every completion is kept beside the accuracy, and the accuracy is their mean score
    rows = [json.loads(x) for x in (run / "eval_samples.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and len({r["id"] for r in rows}) == 8
    assert sum(r["score"] for r in rows) / 8 == pytest.approx(with_c["score"])
    assert sum(r["tokens"] for r in rows) / 8 == pytest.approx(with_c["completion_len"])
    assert all(r["answer"] == extract_answer(r["completion"]) and r["gold"] for r in rows)
    assert with_c["answered"] == sum(r["answer"] is not None for r in rows) / 8
    # each item's gold NLL under its prompt and C, the result's the mean of them
    assert all(r["gold_nll"] > 0 for r in rows)
    assert sum(r["gold_nll"] for r in rows) / 8 == pytest.approx(with_c["gold_nll"])
    # the dtype each half ran in, as resolved there (config.yaml keeps the name asked for)
    inputs = json.loads((run / "inputs.json").read_text())
    assert with_c["dtype"] == inputs["dtype"] == "bfloat16"
    # and the machine each half ran on: a grid's runs come from several CPUs and thread counts
    assert inputs["machine"]["threads"] == threads != torch.get_num_threads()
    assert with_c["machine"]["threads"] == torch.get_num_threads()
    assert inputs["machine"]["cpu"] == with_c["machine"]["cpu"] == cpu_model()
    # cut off = ran to max_new_tokens without an end-of-turn token
    assert with_c["truncated"] == sum(not r["ended"] for r in rows) / 8
    assert all(r["ended"] or r["tokens"] == read_run_config(run).max_new_tokens for r in rows)
    assert (run / "eval_no_context_samples.jsonl").is_file()
    with pytest.raises(UserError, match="limit"):
        evaluate(run, limit=0)


def test_missing_expert_names_the_precompute_command(planted_store, tmp_path):
    cfg = small("perceiver", planted_store, tmp_path / "r", team_file=None,
                experts=["tiny-llama"])
    fix = "musketeers precompute --task planted --experts tiny-llama"
    with pytest.raises(UserError, match=fix):
        train(cfg)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("method, tail", [("perceiver", ""), ("output_collab", " --hints")])
def test_missing_store_names_the_teams_experts_and_folder(tmp_path, method, tail):
    """The command in the error computes what this run reads, where it reads it."""
    empty = tmp_path / "elsewhere"
    cfg = small(method, empty, tmp_path / "r", team_file=None, experts=["tiny-llama", "tiny-gpt2"])
    fix = (f"run: musketeers precompute --task planted --experts tiny-llama,tiny-gpt2 "
           f"--cache-dir {empty}{tail}")
    with pytest.raises(UserError) as err:
        train(cfg)
    assert str(err.value).endswith(fix), str(err.value)
    assert not (tmp_path / "r").exists()


def test_live_experts_without_source_is_refused(planted_store, tmp_path):
    with pytest.raises(UserError, match="benchmark"):
        train(small("perceiver", planted_store, tmp_path / "r", live_experts=True))


def test_dynamic_sampling_and_loo_options_run(planted_store, tmp_path):
    run = tmp_path / "r"
    train(small("perceiver", planted_store, run, steps=2, dynamic_sampling=True,
                advantage="loo", reward_norm="task", loss_norm="constant", inner_iters=1,
                clip_high=0.28))
    rows = metrics(run)
    assert all(0.0 <= r["zero_var_frac"] <= 1.0 for r in rows)
    assert os.path.isdir(run / "checkpoints")


def test_sigkill_mid_run_then_resume_equals_uninterrupted(planted_store, tmp_path):
    """A real ``musketeers train`` process killed with SIGKILL, then ``--resume``d."""
    import signal
    import subprocess
    import sys
    import time

    from musketeers.config import save_config

    def cfg_for(run: Path):
        return small("perceiver", planted_store, run, steps=24, save_every=3, grad_accum=1)

    killed = tmp_path / "killed"
    save_config(cfg_for(killed), tmp_path / "run.yaml")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "musketeers.cli.main", "train", "--config",
                             str(tmp_path / "run.yaml")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics_path = killed / "metrics.jsonl"
    while proc.poll() is None:
        if metrics_path.exists() and len(metrics_path.read_text().splitlines()) >= 7:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert len(metrics(killed)) < 24
    train(cfg_for(killed), resume=True)
    full = tmp_path / "full"
    train(cfg_for(full))
    assert metrics(killed) == metrics(full)


def test_eval_refuses_a_damaged_checkpoint(planted_store, tmp_path):
    from musketeers.run.evaluate import evaluate

    run = tmp_path / "run"
    train(small("perceiver", planted_store, run, steps=2))
    weights = ckpt.latest_checkpoint(run) / "adapter.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the tensors: the file still loads
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match="damaged.*--resume"):
        evaluate(run, limit=4)
