"""The loss in row chunks (``method/loss_rows.py``): the gradient of the whole micro-batch's
loss, whatever the chunks; and the policy's copies share one set of frozen weights."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from musketeers.method.grpo import loss_denominator
from musketeers.method.loss_rows import micro_batch_backward, row_chunks
from musketeers.method.rollout import Rollout
from tests.test_policy import TOK, make_policy, tiny_model

B, G, M, T = 3, 4, 2, 6


def _rows(chunks) -> list[int]:
    return [i for _, c in chunks for i in range(c.start, c.stop)]


@pytest.mark.parametrize("rows", [0, 1, 3, 4, 7, 8, 12, 50])
def test_chunks_cover_every_row_once_and_keep_their_prompts(rows):
    chunks = row_chunks(B, G, rows)
    assert _rows(chunks) == list(range(B * G))
    for p, c in chunks:
        assert c.stop - c.start <= (rows or B * G)
        # a chunk's completions belong to its prompts: [p.start·G, p.stop·G) holds them
        assert p.start * G <= c.start < c.stop <= p.stop * G
        assert (c.stop - c.start) % G == 0 or p.stop - p.start == 1
    assert len(chunks) == (1 if rows in (0, 12, 50) else
                           {1: 12, 3: 6, 4: 3, 7: 3, 8: 2}[rows])


def _rollout(policy, keep: list[bool]) -> Rollout:
    g = torch.Generator().manual_seed(3)
    prompts = policy.encode_prompts(["what is 2+2?", "7-3", "hello there"])
    lengths = [1 + (7 * i) % T for i in range(B * G)]  # ragged, with a 1-token row
    comps = [torch.randint(3, 40, (n,), generator=g).tolist() for n in lengths]
    r = Rollout(items=[], vectors=[], router=None, prompt_ids=prompts, completions=comps,
                rewards=torch.zeros(B, G), ended=[], answered=[], context=None, attention=None)
    r.adv = torch.randn(B, G, generator=g)
    r.keep = torch.tensor(keep)
    return r


def _grads(norm: str, rows: int, keep: list[bool]) -> tuple[list[torch.Tensor], float, float]:
    torch.manual_seed(0)
    policy = make_policy(position="before_generation_prompt")
    # a stand-in adapter: C depends on trainable weights, so its gradient crosses the chunks
    adapter = torch.nn.Linear(5, M * policy.embed_dim)
    r = _rollout(policy, keep)
    context = adapter(torch.randn(B, 5, generator=torch.Generator().manual_seed(4)))
    context = context.view(B, M, policy.embed_dim)
    kept_rows = [b for b in range(B) if keep[b]]
    ctx = context.detach()[kept_rows]
    prompts = [r.prompt_ids[b] for b in kept_rows]
    comps = [r.completions[b * G + j] for b in kept_rows for j in range(G)]
    with torch.no_grad():
        r.ref_logp, _ = policy.completion_logprobs(prompts, ctx, comps, reference=True)
    r.ref_logp = r.ref_logp + 0.1  # the KL term then carries a gradient too
    cfg = SimpleNamespace(beta=0.04, clip_low=0.2, clip_high=0.2, loss_norm=norm,
                          max_new_tokens=T, loss_rows=rows, temperature=1.0)
    den = loss_denominator([len(c) for c in comps], norm, T)
    loss, kl = micro_batch_backward(cfg, 0, policy, r, context, den, fault=None,
                                    phase=lambda _: nullcontext())
    params = [p for p in policy.model.parameters() if p.requires_grad]
    params += list(adapter.parameters())
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params], loss, kl


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("keep", [[True] * B, [True, False, True]])
def test_chunked_gradient_equals_the_whole_batch(norm, rows, keep):
    whole, loss, kl = _grads(norm, 0, keep)
    parts, loss_c, kl_c = _grads(norm, rows, keep)
    assert any(g.abs().sum() > 0 for g in whole[-2:])  # the adapter's gradient is not empty
    for a, b in zip(whole, parts, strict=True):
        assert (a - b).norm() <= 1e-5 * a.norm() + 1e-12
    assert loss_c == pytest.approx(loss, rel=1e-5, abs=1e-9)
    assert kl_c == pytest.approx(kl, rel=1e-5, abs=1e-9)


def test_policy_copies_share_frozen_weights(monkeypatch):
    from musketeers.method.policy import Policy
    from musketeers.run import build

    loads = []

    def load(spec, device, dtype):
        loads.append(spec)
        return tiny_model("qwen2"), TOK

    monkeypatch.setattr(build, "load_expert", load)  # the name build loads with
    build._BASE.clear()
    try:
        first = Policy(build._load_base("tiny", "cpu", "float32")[0], TOK)
        second = build._load_base("tiny", "cpu", "float32")[0]
    finally:
        build._BASE.clear()
    assert loads == ["tiny"]  # loaded once
    base = {p.data_ptr() for p in first.model.get_base_model().parameters()}
    assert {p.data_ptr() for p in second.parameters()} <= base  # one storage for both copies
    # LoRA wrapped the first copy's modules only
    assert not any("lora" in n for n, _ in second.named_modules())


def test_loss_rows_is_off_by_default_and_refuses_negatives():
    from musketeers.cache.errors import UserError
    from musketeers.config import resolve_config

    assert resolve_config(None, {"budget": "smoke"}).loss_rows == 0
    with pytest.raises(UserError, match="'loss_rows' must be >= 0"):
        resolve_config(None, {"loss_rows": -1})


@pytest.mark.usefixtures("one_thread")
def test_a_run_in_chunks_takes_the_same_first_update(planted_store, tmp_path):
    """The trainer's path on the planted setup (C from the adapter, μ = 2 so old log-probs
    are sliced too): chunks of 3 rows (part of a group) give the first update's loss and
    gradient norm of the run in one pass."""
    import json

    from musketeers.run.trainer import train
    from tests.test_trainer import small

    rows = {}
    for n in (0, 3):
        run = tmp_path / str(n)
        train(small("perceiver", planted_store, run, steps=1, loss_rows=n), plot=False)
        rows[n] = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert rows[0]["grad_norm"] > 1e-3  # a gradient with signal, not rounding noise
    for key in ("loss", "grad_norm", "kl"):
        assert rows[3][key] == pytest.approx(rows[0][key], rel=1e-5, abs=1e-9), key
