"""The controls behind every claim, and the trainer's guarantees they rely on: no reward, no
movement; advantages over the whole update; one pass over the data per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from musketeers.checks.planted import planted_config
from musketeers.method import methods
from musketeers.method.grpo import compute_advantages
from musketeers.run import checkpoint as ckpt
from musketeers.run.build import build_components
from musketeers.run.data import epoch_rows
from musketeers.run.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(method: str, store: Path, run: Path, steps: int = 3, **kw):
    values = dict(prompts_per_micro=4, group_size=4, grad_accum=2, save_every=steps, beta=0.04,
                  weight_decay=0.01)
    values.update(kw)
    return planted_config(method, 0, steps, store, run, **values)


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def zero_rewards(step: int, name: str, t: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(t) if name == "rewards" else t


def weights_after(c, run: Path):
    """(adapter state, LoRA state, C and A on fixed rows) of a run's last checkpoint."""
    data, policy, adapter = build_components(c, "train", method=methods.get(c.method))
    ckpt.load_weights(ckpt.latest_checkpoint(run), policy.model, adapter)
    return _observe(data, policy, adapter)


def _observe(data, policy, adapter):
    adapter.eval()
    with torch.no_grad():
        out = adapter(data.batch(torch.arange(16))[1])
    lora = {k: v.clone() for k, v in policy.model.state_dict().items() if "lora_" in k}
    state = {k: v.clone() for k, v in adapter.state_dict().items()}
    return state, lora, out.context, out.attention


def test_no_reward_no_movement(planted_store, tmp_path):
    """20 updates with every reward 0: φ, θ, C (rms) and A stay exactly where they started.
    The same run with the skip disabled moves them (KL gradient × AdamW, weight decay), so
    the check can fail."""
    still, moved = tmp_path / "still", tmp_path / "moved"
    c = cfg("perceiver", planted_store, still, steps=20)
    data, policy, adapter = build_components(c, "train", method=methods.get(c.method))
    state0, lora0, ctx0, att0 = _observe(data, policy, adapter)
    train(c, fault=zero_rewards)
    assert all(r["update_skipped"] and r["zero_var_frac"] == 1.0 for r in rows(still))
    state, lora, ctx, att = weights_after(c, still)
    assert all(torch.equal(state0[k], state[k]) for k in state0)
    assert all(torch.equal(lora0[k], lora[k]) for k in lora0)
    assert torch.equal(ctx, ctx0) and torch.equal(att, att0)
    first, last = rows(still)[0], rows(still)[-1]
    assert last["entropy"] == pytest.approx(first["entropy"], abs=0.05)  # batches differ

    broken = cfg("perceiver", planted_store, moved, steps=20, skip_no_signal=False)
    train(broken, fault=zero_rewards)
    state, _, ctx, _ = weights_after(broken, moved)
    assert not all(torch.equal(state0[k], state[k]) for k in state0)
    assert ctx.pow(2).mean().sqrt() > 10 * ctx0.pow(2).mean().sqrt()


def test_shuffled_reward_samples_what_ours_samples(planted_store, tmp_path):
    """Same seed: the first update samples and scores the same completions (its rewards are
    the task's); only the advantages differ, so the updates, and later samples, part."""
    ours, ctrl = tmp_path / "ours", tmp_path / "ctrl"
    train(cfg("perceiver", planted_store, ours, steps=2))
    train(cfg("shuffled_reward", planted_store, ctrl, steps=2))
    a, b = rows(ours), rows(ctrl)
    assert a[0]["reward_mean"] == b[0]["reward_mean"] and a[0]["attention"] == b[0]["attention"]
    assert a[0]["loss"] != b[0]["loss"] or a[1]["attention"] != b[1]["attention"]


def test_shuffled_experts_reads_every_row_from_another_row(planted_store, tmp_path):
    ours = build_components(cfg("perceiver", planted_store, tmp_path / "a"), "train",
                            method=methods.get("perceiver"))[0]
    ctrl = build_components(cfg("shuffled_experts", planted_store, tmp_path / "b"), "train",
                            method=methods.get("shuffled_experts"))[0]
    for v, w in zip(ours.vectors, ctrl.vectors, strict=True):
        assert not (v == w).all(dim=1).any()  # no row keeps its own vector
    assert [it.id for it in ours.items] == [it.id for it in ctrl.items]
    perm = methods.derangement(len(ours), 0)
    assert torch.equal(ctrl.vectors[0], ours.vectors[0][perm])
    assert (perm != torch.arange(len(perm))).all()


def test_zero_context_is_single_with_m_zero_positions(planted_store, tmp_path):
    """C ≡ 0, nothing in φ trains, and π_θ starts exactly at π_ref (same zero positions)."""
    run = tmp_path / "zero"
    c = cfg("zero_context", planted_store, run, steps=2)
    _, policy, adapter = build_components(c, "train", method=methods.get(c.method))
    assert adapter is not None and not list(adapter.parameters())
    train(c)
    first = rows(run)[0]
    assert first["kl"] == 0.0 and "entropy" not in first
    data, policy, adapter = build_components(c, "train", method=methods.get(c.method))
    context = adapter(data.batch(torch.arange(4))[1]).context
    assert context.shape == (4, c.latents, policy.embed_dim) and not context.any()


def test_advantages_span_the_whole_update():
    """RLOO+ per-task standardisation pools a task's prompts over every micro-batch."""
    from musketeers.cache.items import Item
    from musketeers.config import TrainConfig
    from musketeers.method.advantages import assign_advantages
    from musketeers.method.rollout import Rollout

    def rollout(sources, rewards):
        items = [Item(str(i), "q", "", "1", "{}", s) for i, s in enumerate(sources)]
        return Rollout(items, [], None, None, [], torch.tensor(rewards), [], [], None, None)

    c = TrainConfig(advantage="loo", reward_norm="task", method="perceiver")
    micro = [rollout(["a", "b"], [[1.0, 0.0], [0.0, 0.0]]),
             rollout(["a", "b"], [[1.0, 1.0], [1.0, 0.0]])]
    assign_advantages(c, 0, micro, methods.get(c.method))
    whole = compute_advantages(torch.cat([r.rewards for r in micro]), advantage="loo",
                               reward_norm="task", sources=["a", "b", "a", "b"])
    torch.testing.assert_close(torch.cat([r.adv for r in micro]), whole)
    alone = compute_advantages(micro[0].rewards, advantage="loo", reward_norm="task",
                               sources=["a", "b"])
    assert not torch.allclose(micro[0].adv, alone)  # per micro-batch would differ


def test_epochs_visit_every_row_once_and_depend_only_on_the_step():
    n, per = 10, 4
    drawn = torch.cat([epoch_rows(n, 3, s, per) for s in range(5)])  # two epochs exactly
    assert sorted(drawn[:n].tolist()) == list(range(n))
    assert sorted(drawn[n:].tolist()) == list(range(n))
    assert not torch.equal(drawn[:n], drawn[n:])  # reshuffled per epoch
    assert torch.equal(epoch_rows(n, 3, 2, per), drawn[8:12])  # resumable: no state
    assert not torch.equal(epoch_rows(n, 4, 0, per), drawn[:4])  # the seed matters


def test_every_registered_method_is_valid_config_and_has_a_label():
    from musketeers.config import TrainConfig, validate

    for name, m in methods.REGISTRY.items():
        # a method that measures the warm-up alone (warmup_only) is valid with one
        warm = {} if m.rl or not m.trains else {"adapter_warmup": 1, "warmup_policy_lr": 1e-4}
        validate(TrainConfig(method=name, **warm))
        assert m.label and m.summary
        if m.control_of:
            assert m.control_of in methods.REGISTRY
