"""The planted-expert check: RLVR through the real trainer learns to use the one
informative expert. Eight seeds: what holds on every seed is asked of each, the rest of the
paired differences against the shuffled_reward control over the seeds
(musketeers.checks.planted)."""

from __future__ import annotations

import numpy as np
import pytest

from musketeers.checks.planted import CHANCE, MARGINS, check_rows, run_planted

SEEDS = list(MARGINS["plain"].seeds)
STEPS = MARGINS["plain"].steps


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("planted")


@pytest.fixture(scope="module")
def rows(workdir):
    return run_planted(SEEDS, STEPS, workdir)


def test_reward_well_above_chance_with_context(rows):
    ours = [r for r in rows if r["method"] == "perceiver"]
    assert len(ours) == len(SEEDS)
    for r in ours:  # every seed learns something; how much varies by seed (0.19-0.86)
        assert r["reward_last"] > r["reward_first"], r
    assert np.mean([r["reward_last"] for r in ours]) >= 3 * CHANCE
    assert np.mean([r["reward_last"] - r["reward_first"] for r in ours]) > 0.15


def test_reward_at_chance_without_context(rows):
    for r in (r for r in rows if r["method"] == "single"):
        assert r["reward_last"] <= 2 * CHANCE, r


def test_routing_concentrates_on_the_informative_expert(rows):
    ours = [r for r in rows if r["method"] == "perceiver"]
    for r in ours:
        assert r["entropy_last"] < r["entropy_first"] - 0.05, r
        assert r["rho"] < 0, r
    assert np.mean([r["oracle_last"] - r["oracle_first"] for r in ours]) > 0.05


def test_trained_runs_score_on_held_out_items(rows, workdir):
    """`musketeers eval` on the val split: new noise draws around the same digit codes, so the
    trained adapter must carry over (val once had codes of its own: chance by construction)."""
    from musketeers.run.evaluate import evaluate

    exact = []
    for seed in SEEDS:
        run = workdir / "runs" / f"planted-perceiver-s{seed}"
        with_c = evaluate(run)
        without = evaluate(run, no_context=True)
        assert with_c["n"] == without["n"] == 128
        assert with_c["exact"] > without["exact"], (seed, with_c, without)
        assert without["exact"] <= 2 * CHANCE, (seed, without)
        exact.append(with_c["exact"])
    assert np.mean(exact) >= 3 * CHANCE, exact


def test_check_rows_agrees(rows):
    assert check_rows(rows) == []
    broken = [dict(rows[0], reward_last=CHANCE)]
    assert check_rows(broken)
    # two seeds leave no standard error for the paired verdicts: no pass on them
    two = [r for r in rows if r["seed"] in SEEDS[:2]]
    assert any("a verdict needs 3" in line for line in check_rows(two))
    # Ours' utilisation of the informative expert held flat: it no longer beats the drift
    # its control shows, and the check says so
    flat = [dict(r, oracle_last=r["oracle_first"]) if r["method"] == "perceiver" else r
            for r in rows]
    assert any("oracle utilisation" in line for line in check_rows(flat))


def test_check_needs_ours_to_beat_its_shuffled_reward_control(rows):
    """Ours' rows relabelled as their own control gain nothing over it: the check fails, and
    without the control runs no gain counts at all."""
    ours = [r for r in rows if r["method"] == "perceiver"]
    as_control = [dict(r, method="shuffled_reward") for r in ours]
    assert any("control" in line for line in check_rows(ours + as_control))
    assert any("no shuffled_reward run" in line for line in check_rows(ours))
    shuffled = [r for r in rows if r["method"] == "shuffled_reward"]
    assert len(shuffled) == len(SEEDS)
    for r in shuffled:  # the control really has no signal to learn from
        assert r["reward_last"] <= 2 * CHANCE, r


# ---- the chat variant: a chat template, multi-token answers, β > 0
# (musketeers.checks.planted_chat)
# Only Ours and its control (the check judges one against the other; each run costs 15-30 s
# on a 2-core CPU), on the chat variant's seeds (figures at MARGINS in musketeers.checks.planted).

CHAT_METHODS = ("perceiver", "shuffled_reward")
CHAT_SEEDS = list(MARGINS["chat"].seeds)


def _chat_rows(tmp_path_factory, seeds):
    workdir = tmp_path_factory.mktemp("planted-chat")
    return workdir, run_planted(seeds, MARGINS["chat"].steps, workdir, methods=CHAT_METHODS,
                                variant="chat")


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    return _chat_rows(tmp_path_factory, CHAT_SEEDS)


def _metrics(workdir, method, seed):
    from musketeers.run.runlog import read_metrics

    return read_metrics(workdir / "runs" / f"planted-chat-{method}-s{seed}" / "metrics.jsonl")


def test_chat_variant_passes_its_check(chat_run):
    _, rows = chat_run
    assert len(rows) == len(CHAT_SEEDS) * len(CHAT_METHODS)
    assert all(r["variant"] == "chat" for r in rows)
    assert check_rows(rows) == []


def test_chat_variant_renders_prompts_through_the_template(tmp_path):
    """Role tokens in every prompt, and C placed between the user turn and the generation
    prompt <|assistant|> (``context_position``'s default)."""
    import torch

    from musketeers.checks.planted import planted_config
    from musketeers.checks.planted_chat import ROLES
    from musketeers.run.build import build_policy
    from musketeers.tasks import build_items

    cfg = planted_config("perceiver", 0, 2, tmp_path, tmp_path / "run", variant="chat")
    assert cfg.beta > 0 and cfg.max_new_tokens > 1
    policy = build_policy(cfg)
    tok = policy.tokenizer
    assert tok.chat_template and policy.generation_prompt_len == 1
    prompts = policy.encode_prompts(build_items("planted", "train", limit=3))
    for p in prompts:
        tokens = tok.convert_ids_to_tokens(p)
        assert all(role in tokens for role in ROLES), tokens
        assert tokens[0] == "<|system|>" and tokens[-1] == "<|assistant|>", tokens
    m = 4
    context = torch.randn(len(prompts), m, policy.embed_dim)
    inp = policy.build_inputs(prompts, context)
    weight = policy.model.get_input_embeddings().weight
    p = inp.prefix_len
    with torch.no_grad():  # [… <|end|> ‖ C ‖ <|assistant|>], completions from column p
        assert torch.equal(inp.inputs_embeds[:, p - 1 - m: p - 1], context)
        for col, token in ((p - 1, "<|assistant|>"), (p - 2 - m, "<|end|>")):
            row = weight[tok.convert_tokens_to_ids(token)]
            assert torch.equal(inp.inputs_embeds[:, col], row.expand(len(prompts), -1))


def test_chat_variant_answers_in_several_tokens_graded_by_the_scorer(chat_run):
    """The warmed-up base answers in format (<answer> d </answer> [EOS], 4 tokens) at chance,
    and the normal scorer finds the digit in what the policy decodes once it has learnt. An
    early update may shorten the completions for a few steps (2.8 tokens on one seed's
    second step); the format must hold over the run and at its end."""
    workdir, _ = chat_run
    best = []
    for seed in CHAT_SEEDS:
        ms = _metrics(workdir, "perceiver", seed)
        lens = sorted(m["completion_len"] for m in ms)
        assert lens[len(lens) // 2] >= 3.9, seed
        assert min(m["completion_len"] for m in ms[-10:]) >= 3.5, seed
        assert ms[0]["answered_frac"] >= 0.9, ms[0]
        assert ms[0]["reward_mean"] <= 2 * CHANCE, ms[0]
        best.append(max(m["reward_mean"] for m in ms))
    # every seed's digits are graded above chance; how far above varies by seed (the slowest
    # measured peaked at 0.29 where others passed 0.6), so the mean carries the 3x bar
    assert min(best) > 2 * CHANCE, best
    assert np.mean(best) >= 3 * CHANCE, best


def test_chat_variant_trains_against_the_reference_policy(chat_run):
    """β > 0: reference log-probs are computed and the KL term is nonzero once LoRA and C
    have moved the policy off π_ref."""
    workdir, _ = chat_run
    for method in CHAT_METHODS:
        for seed in CHAT_SEEDS:
            kls = [m["kl"] for m in _metrics(workdir, method, seed) if m["kl"] is not None]
            assert kls and max(kls) > 1e-3, (method, seed, kls[:5])


def test_chat_check_fails_when_broken(chat_run):
    """Ours relabelled as its own control, without its control, or at chance: fails."""
    _, rows = chat_run
    ours = [r for r in rows if r["method"] == "perceiver"]
    controls = [r for r in rows if r["method"] == "shuffled_reward"]
    as_control = [dict(r, method="shuffled_reward") for r in ours]
    assert any("control" in line for line in check_rows(ours + as_control))
    assert any("no shuffled_reward run" in line for line in check_rows(ours))
    assert check_rows([dict(r, reward_last=r["reward_first"]) for r in ours] + controls)
    # the plain variant's control does not stand in for the chat variant's
    plain = [dict(r, variant="plain") for r in controls]
    assert any("no shuffled_reward run" in line for line in check_rows(ours + plain))


def test_no_expert_stands_out_by_its_scale():
    """The oracle differs from the noise experts only in what it encodes, not in how loud it
    is: a louder oracle drew attention under shuffled rewards too (the control's drift)."""
    from musketeers.checks.planted import EXPERTS, ORACLE, planted_vectors

    noise = 0.5
    digits = np.random.default_rng(0).integers(0, 10, 4000)
    for seed in range(3):
        vectors = planted_vectors(digits, seed=seed, noise=noise)
        power = {name: float((v**2).mean()) for name, v in vectors.items()}
        for name in EXPERTS:
            if name != ORACLE:  # the oracle's code + noise has E[h²] = 1 + noise² as well
                assert abs(power[name] - (1 + noise**2)) < 0.05, (seed, power)
        # the oracle's ten codes are one draw, so its power varies by seed, but not by a
        # scale the others lack
        assert 0.8 < power[ORACLE] / power[EXPERTS[0]] < 1.2, (seed, power)


def test_paired_verdict_uses_the_t_distribution_of_its_seeds():
    """A mean of 2.2 SE passes a normal 2 SE rule but not t at df = 4 (2.78) or 7 (2.36); 3 SE
    passes both. Fewer than MIN_SEEDS never pass."""
    from musketeers.checks.planted import MIN_SEEDS, Verdict

    assert not Verdict("x", 2.2, 1.0, 5, 0.0).passed
    assert not Verdict("x", 2.2, 1.0, 8, 0.0).passed
    assert Verdict("x", 3.0, 1.0, 8, 0.0).passed
    assert not Verdict("x", 100.0, 1.0, MIN_SEEDS - 1, 0.0).passed
    assert not Verdict("x", 3.0, 1.0, 8, 5.0).passed  # below its floor
    assert "t = 3.0" in Verdict("x", 3.0, 1.0, 8, 0.0).line()
