"""What lets the project see expert help: the oracle control, honest controls, probes, tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats as sps

from musketeers.cache.items import Item
from musketeers.cache.prompts import oracle_view
from musketeers.method.advantages import shuffle_within_groups
from musketeers.reports import stats
from musketeers.reports.aggregate import load_runs
from musketeers.reports.probes import identical_share, probe, run_probes, wilson
from musketeers.reports.verdict_table import (
    COMPARISONS,
    VerdictRow,
    verdict_markdown,
    verdict_rows,
)

# --- the oracle expert ------------------------------------------------------------------------

def test_the_oracle_reads_the_gold_answer_and_is_a_control_in_no_real_team():
    from musketeers.teams import EXPERTS, TEAMS, resolve_team

    it = Item("i", "What is 2 + 3?", "Answer briefly.", "5", "{}", "chain_sum")
    view = oracle_view(it)
    assert view["question"].endswith("The answer is 5.") and view["system"] == it.system
    oracles = {n for n, s in EXPERTS.items() if s.oracle}
    assert oracles and all(EXPERTS[n].description.startswith("CONTROL") for n in oracles)
    for team in TEAMS:
        for roster in ("pocket", "paper", "tiny"):
            has = {s.name for s in resolve_team(team, roster)} & oracles
            assert bool(has) == (team == "oracle"), (team, roster)


def test_an_oracle_experts_vectors_differ_from_its_twin_reading_the_question(tmp_path: Path):
    from musketeers.cache.precompute import PrecomputeConfig, precompute_task
    from musketeers.cache.reader import read_vectors
    from musketeers.tasks import build_items, task_spec
    from musketeers.teams import EXPERTS

    task = "arithmetic:easier@direct"
    splits = {s: build_items(task, s, 8) for s in ("train", "val")}
    twin, oracle = EXPERTS["tiny-llama"], EXPERTS["oracle-tiny-llama"]
    precompute_task(tmp_path, task, task_spec(task), splits, [twin, oracle],
                    PrecomputeConfig(chunk_rows=4, router=False))
    a, b = read_vectors(tmp_path, task, "val", [twin.name, oracle.name], "last")
    assert a.shape == b.shape and not np.allclose(a, b)
    # the same weights: the oracle differs only by what it reads (the gold answer)
    from transformers import AutoTokenizer  # noqa: F401  (the tiny tokenizer is SmolLM2's)


# --- controls that are controls ---------------------------------------------------------------

def test_shuffled_rewards_keep_every_groups_rewards_and_move_them_within_it():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    moved = False
    for seed in range(20):
        out = shuffle_within_groups(rewards, seed)
        for r, o in zip(rewards, out, strict=True):
            assert sorted(r.tolist()) == sorted(o.tolist())  # the group's multiset kept
        moved |= not torch.equal(out, rewards)
    assert moved
    # what it replaced: one permutation over the update changes which groups carry signal
    flat = rewards.flatten()[torch.randperm(12, generator=torch.Generator().manual_seed(1))]
    assert any(sorted(r.tolist()) != sorted(o.tolist())
               for r, o in zip(rewards, flat.view(3, 4), strict=True))


def test_embedding_scale_gives_every_context_token_the_target_rms():
    from musketeers.method.methods import build_adapter

    vectors = [torch.randn(3, 16), torch.randn(3, 24)]
    near_zero = build_adapter("perceiver", [16, 24], 32, latents=4, d_model=32, heads=4)
    scaled = build_adapter("perceiver", [16, 24], 32, latents=4, d_model=32, heads=4,
                           target_rms=0.02)
    rms = scaled(vectors).context.pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.full_like(rms, 0.02), rtol=1e-4)
    assert near_zero(vectors).context.abs().max() < 1e-5  # Eq. 11's start, unchanged


# --- probes -----------------------------------------------------------------------------------

def test_a_probe_finds_planted_information_and_not_in_constant_vectors():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    informative = rng.normal(size=(200, 8))
    informative[:, 0] += 3.0 * y
    n, acc, majority = probe(informative, list(y))
    assert n == 200 and acc > majority + 0.3
    constant = np.ones((200, 8))
    n, acc, majority = probe(constant, list(y))
    assert acc <= majority + 0.05 and identical_share(constant) == 1.0
    assert identical_share(informative) == 0.0


def test_probe_results_carry_an_interval_and_the_majority_baseline():
    items = [Item(str(i), f"q{i}", "", str(i % 10 * (-1) ** i), "{}", f"s{i % 2}")
             for i in range(100)]
    x = np.array([[i % 2, (i % 10) / 10, 1.0] for i in range(100)], dtype=float)
    rows = run_probes({("e", "last"): x}, items)
    by = {r.target: r for r in rows}
    assert by["source"].accuracy == 1.0 and by["source"].beats_majority
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and by["source"].low > by["source"].majority


# --- statistics with power --------------------------------------------------------------------

def test_the_paired_t_over_seeds_matches_scipy_and_has_k_minus_1_df():
    a, b = [56.0, 57.5, 55.0], [50.0, 53.0, 52.5]
    t = stats.paired_seed_test([x - y for x, y in zip(a, b, strict=True)])
    ref = sps.ttest_rel(a, b)
    assert t.df == 2 and t.p == pytest.approx(ref.pvalue)
    half = sps.t.ppf(0.975, 2) * np.std(np.subtract(a, b), ddof=1) / np.sqrt(3)
    assert t.high - t.diff == pytest.approx(half)
    assert half > 2 * np.std(np.subtract(a, b), ddof=1) / np.sqrt(3)  # 4.30 SE, not 2


def test_seeds_that_agree_exactly_still_carry_the_items_noise():
    t = stats.paired_seed_test([-0.25, -0.25, -0.25], item_se=1.4, items=400)
    assert not t.p < 0.05 and t.df == pytest.approx(399)
    assert t.mde == pytest.approx(stats.mde(1.4, 399))
    # seeds that spread widely keep their k - 1 degrees of freedom, nearly
    wide = stats.paired_seed_test([5.0, -4.0, 1.0], item_se=0.1, items=400)
    assert 2.0 <= wide.df < 2.1


def _null_rejections(item_var, sims: int = 1000, k: int = 4, n: int = 400) -> float:
    """How often the seed test rejects at α = .05 when both arms are one policy: items of
    every difficulty, a small per-seed shift of each arm, Bernoulli grades per seed."""
    rng = np.random.default_rng(0)
    rejected = 0
    for _ in range(sims):
        p = rng.random(n)
        shift = rng.normal(0, 0.01, (2, k, 1))
        x = rng.random((k, n)) < np.clip(p + shift[0], 0, 1)
        y = rng.random((k, n)) < np.clip(p + shift[1], 0, 1)
        d = 100.0 * (x.astype(float) - y)
        var, df = item_var(d)
        t = stats.paired_seed_test(list(d.mean(axis=1)), item_se=float(np.sqrt(var)), items=n,
                                   item_df=df, floor=stats.residual_floor(d))
        rejected += t.p < 0.05
    return rejected / sims


def test_the_seed_test_rejects_a_true_null_at_its_nominal_rate():
    assert 0.03 <= _null_rejections(stats.crossed_items) <= 0.07
    # the items' variance of seed-averaged differences counts the seed × item residual a
    # second time (the seeds' spread holds it): the test then rejects far under 5 %
    def twice(d):
        return d.mean(axis=0).var(ddof=1) / d.shape[1], d.shape[1] - 1
    assert _null_rejections(twice) < 0.03


def test_the_crossed_items_component_leaves_the_residual_to_the_seeds():
    rng = np.random.default_rng(3)
    k, n = 5, 300
    d = rng.normal(0, 1.0, (k, 1)) + rng.normal(0, 2.0, (1, n)) + rng.normal(0, 6.0, (k, n))
    var, df = stats.crossed_items(d)
    assert var < d.mean(axis=0).var(ddof=1) / n  # the residual's share is taken out
    assert var == pytest.approx(4.0 / n, rel=0.5) and 0 < df < n
    assert stats.crossed_items(np.zeros((3, 10))) == (0.0, 0.0)
    assert stats.residual_floor(d)[0] == pytest.approx(36.0 / (k * n), rel=0.2)
    one, df1 = stats.crossed_items(d[:1])
    assert one == pytest.approx(d[0].var(ddof=1) / n) and df1 == n - 1


def test_seeds_that_differ_by_the_same_one_item_are_not_a_certain_difference():
    """Three seeds, each one item behind on 400 graded alike otherwise: the per-seed
    differences agree exactly (no spread) and no item is consistently behind, yet the test
    keeps the residual's noise of the mean and finds nothing."""
    rng = np.random.default_rng(0)
    d = np.zeros((3, 400))
    flips = rng.choice(400, size=(3, 7), replace=False)
    for s, items in enumerate(flips):  # 3 items lost and 3 won per seed, then one more lost
        d[s, items[:4]], d[s, items[4:]] = -100.0, 100.0
    var, df = stats.crossed_items(d)
    bare = stats.paired_seed_test(list(d.mean(axis=1)), item_se=float(np.sqrt(var)),
                                  items=400, item_df=df)
    assert bare.diff == pytest.approx(-0.25) and bare.seed_var == 0 and bare.p < 0.05
    t = stats.paired_seed_test(list(d.mean(axis=1)), item_se=float(np.sqrt(var)), items=400,
                               item_df=df, floor=stats.residual_floor(d))
    assert t.p > 0.5 and t.low < 0 < t.high


def test_one_seed_is_descriptive_only():
    t = stats.paired_seed_test([3.0])
    assert not t.testable and "descriptive only" in stats.verdict(t, None)


def test_holm_adjusts_step_down_and_keeps_order():
    assert stats.holm([0.01, 0.04, None, 0.03]) == [0.03, 0.06, None, 0.06]


def test_not_significant_is_no_evidence_either_way_with_what_could_be_seen():
    t = stats.paired_seed_test([1.0, -2.0, 0.5])
    words = stats.verdict(t, t.p)
    assert words.startswith("no evidence either way") and f"{t.mde:.1f}" in words
    assert "equivalent" not in words and "within noise" not in words


def test_seeds_for_mde_is_the_first_count_whose_test_could_detect_the_target():
    # two seeds that differ by 4 points, 400 items with an items' SE of 0.87 (as on Arithmetic)
    t = stats.paired_seed_test([2.25, -1.75], item_se=0.87, items=400)
    k = stats.seeds_for_mde(t, 5.0)
    assert k is not None and k > 2

    def at(seeds: int) -> float:  # the test's MDE with the same spreads over `seeds` seeds
        d = np.resize([2.25 - 0.25, -1.75 - 0.25], seeds)
        scale = np.sqrt(t.seed_var / d.var(ddof=1))
        return stats.paired_seed_test(list(d * scale), item_se=0.87, items=400).mde

    assert at(k) <= 5.0 < at(k - 1)
    assert stats.seeds_for_mde(t, 1.0) is None  # the items' noise alone exceeds 1 point
    assert stats.seeds_for_mde(stats.paired_seed_test([3.0]), 5.0) is None


def test_the_cluster_bootstrap_covers_a_known_difference():
    rng = np.random.default_rng(1)
    b = (rng.random((3, 400)) < 0.5).astype(float)
    a = np.maximum(b, (rng.random((3, 400)) < 0.2).astype(float))
    low, high = stats.cluster_bootstrap(a, b, reps=500)
    truth = 100 * (a - b).mean()
    assert low < truth < high and low > 0


def _run(root: Path, name: str, exact: float, **cfg) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"budget": "t", "steps": 1, **cfg}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.1}) + "\n")
    (d / "summary.json").write_text(json.dumps({"steps": 1}))
    (d / "eval.json").write_text(json.dumps({"exact": exact, "score": exact, "n": 400}))


def test_the_verdict_table_finds_cells_by_key_and_names_the_positive_control(tmp_path: Path):
    base = dict(task="arithmetic:easier@direct", pooling="last", latents=8)
    for s, (single, oracle, ctl) in enumerate([(0.56, 0.80, 0.57), (0.57, 0.84, 0.56),
                                               (0.55, 0.79, 0.58)]):
        _run(tmp_path, f"single{s}", single, method="single", seed=s, **base)
        _run(tmp_path, f"oracle{s}", oracle, method="perceiver", team="oracle", seed=s, **base)
        _run(tmp_path, f"ctl{s}", ctl, method="shuffled_experts", team="oracle", seed=s, **base)
    rows = verdict_rows(load_runs(tmp_path), ["arithmetic"])
    names = [r.comparison.name for r in rows]
    assert names == ["oracle > Single", "oracle > its shuffled experts"]
    assert all(r.test.diff > 20 and r.verdict.startswith("ahead, significant") for r in rows)
    table = "\n".join(verdict_markdown(rows))
    assert "oracle > Single (positive control) | Arithmetic | 81.00 | 56.00 | +25.00" in table
    assert "Seeds to detect" not in table  # a significant row needs no more power
    assert {c.name for c in COMPARISONS} >= {"oracle > Single", "Ours > shuffled experts"}


def test_the_verdict_table_says_how_many_seeds_would_detect_five_points(tmp_path: Path):
    base = dict(task="arithmetic:easier@direct", pooling="last", latents=8)
    for s, (single, oracle) in enumerate([(0.56, 0.50), (0.57, 0.70), (0.55, 0.58)]):
        _run(tmp_path, f"single{s}", single, method="single", seed=s, **base)
        _run(tmp_path, f"oracle{s}", oracle, method="perceiver", team="oracle", seed=s, **base)
    (row,) = verdict_rows(load_runs(tmp_path), ["arithmetic"])
    k = stats.seeds_for_mde(row.test, stats.PLANNED_MDE)
    assert row.test.mde > 5 and k is not None and k > 3
    table = "\n".join(verdict_markdown([row]))
    assert f"- oracle > Single, Arithmetic: {k} seeds (now 3, smallest detectable " in table


def test_past_the_seeds_it_could_run_the_table_names_the_lever_that_limits_it():
    """Seeds that spread by tens of points are not cured by grading more items, and items
    too few to resolve the target are not cured by more seeds: the line names which."""
    wild = stats.paired_seed_test([40.0, -20.0, 30.0], item_se=0.87, items=400)
    few = stats.paired_seed_test([2.0, -1.0, 0.5], item_se=3.0, items=400)
    assert stats.seeds_for_mde(wild, 5.0) is None and stats.seeds_for_mde(few, 5.0) is None
    assert stats.items_floor(wild) < 5.0 < stats.items_floor(few)
    rows = []
    for test in (wild, few):
        row = VerdictRow(COMPARISONS[0], "arithmetic", 50.0, 50.0 - test.diff, test)
        row.p_adjusted = 1.0
        rows.append(row)
    lines = [x for x in verdict_markdown(rows) if x.startswith(f"- {COMPARISONS[0].name}")]
    assert len(lines) == 2
    assert "grade more items" not in lines[0] and "spread by 32.1 points" in lines[0]
    assert "grade more items" in lines[1] and f"{stats.items_floor(few):.1f}" in lines[1]


def test_the_verdict_table_refuses_to_compare_runs_trained_in_other_dtypes(tmp_path: Path):
    """bf16 where the CPU computes it natively is allowed, but a method and its control must
    share it: a seed whose two runs trained in different dtypes is left out, and a comparison
    with no seed left is refused by name, not tested."""
    base = dict(task="arithmetic:easier@direct", pooling="last", latents=8)
    mixed, apart = tmp_path / "mixed", tmp_path / "apart"
    for s, dtypes in enumerate([("float32", "float32"), ("bfloat16", "float32"),
                                ("bfloat16", "bfloat16")]):
        _run(mixed, f"oracle{s}", 0.80, method="perceiver", team="oracle", seed=s,
             dtype=dtypes[0], **base)
        _run(mixed, f"single{s}", 0.50 + s / 100, method="single", seed=s, dtype=dtypes[1],
             **base)
    row = {r.comparison.name: r for r in verdict_rows(load_runs(mixed), ["arithmetic"])}
    assert row["oracle > Single"].test.seeds == 2  # seed 1 is bfloat16 against float32
    assert row["oracle > Single"].verdict.endswith("seeds trained in bfloat16 vs float32 left out")
    _run(apart, "oracle", 0.80, method="perceiver", team="oracle", seed=0, dtype="bfloat16",
         **base)
    _run(apart, "ctl", 0.50, method="shuffled_experts", team="oracle", seed=0, dtype="float32",
         **base)
    (refused,) = verdict_rows(load_runs(apart), ["arithmetic"])
    assert refused.verdict == ("refused: trained in bfloat16 vs float32; a method and its "
                               "control must share one dtype")
    assert "| 80.00 | — | — | — | — | refused" in "\n".join(verdict_markdown([refused]))


def test_standardized_experts_are_centred_by_the_train_split_and_saved_with_the_adapter(
        tmp_path: Path):
    from safetensors.torch import load_file, save_file

    from musketeers.method.methods import build_adapter

    g = torch.Generator().manual_seed(0)
    shared = 50.0 * torch.randn(1, 16, generator=g)  # one large direction every item shares
    train = [shared + torch.randn(64, 16, generator=g)]
    ad = build_adapter("perceiver", [16], 32, latents=2, d_model=32, heads=4, standardize=True)
    ad.align.fit_standardizer(train)
    z = (train[0] - ad.align.mean_0) / ad.align.std_0
    assert z.mean(0).abs().max() < 1e-4 and (z.std(0) - 1).abs().max() < 1e-4
    save_file(dict(ad.state_dict()), str(tmp_path / "a.safetensors"))
    fresh = build_adapter("perceiver", [16], 32, latents=2, d_model=32, heads=4,
                          standardize=True)
    fresh.load_state_dict(load_file(str(tmp_path / "a.safetensors")))
    assert torch.equal(fresh.align.mean_0, ad.align.mean_0)
    plain = build_adapter("perceiver", [16], 32, latents=2, d_model=32, heads=4)
    assert "align.mean_0" not in plain.state_dict()  # older checkpoints stay loadable


def test_the_adapter_warm_up_fits_phi_alone_and_its_control_reads_its_own_vectors(
        planted_store, tmp_path: Path, one_thread):
    """The warm-up lowers the gold NLL through C, leaves the policy's weights as they were,
    reads the vectors its method reads (deranged ones learn less) and is skipped where nothing
    in φ trains."""
    from musketeers.checks.planted import planted_config
    from musketeers.method import methods
    from musketeers.method.warmup import gold_nll, warm_up_adapter
    from musketeers.run.build import build_components
    from musketeers.run.trainer import train

    def cfg(method: str, run: str, **kw):
        return planted_config(method, 0, 1, planted_store, tmp_path / run, prompts_per_micro=8,
                              group_size=2, adapter_warmup=40, adapter_warmup_lr=1e-2, **kw)

    c = cfg("perceiver", "direct")
    data, policy, adapter = build_components(c, "train", method=methods.get(c.method))
    lora = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    rows = torch.arange(32)
    with torch.no_grad():
        before = gold_nll(policy, adapter, data, rows, "cpu").item()
    warm = warm_up_adapter(c, policy, adapter, data)
    with torch.no_grad():
        after = gold_nll(policy, adapter, data, rows, "cpu").item()
    assert len(warm) == 40 and after < before - 0.5, (before, after)
    for n, p in policy.model.named_parameters():
        if n in lora:
            assert torch.equal(p, lora[n]) and p.requires_grad and p.grad is None, n

    train(cfg("perceiver", "run"), plot=False)
    assert len((tmp_path / "run" / "warmup.jsonl").read_text().splitlines()) == 40
    train(cfg("shuffled_experts", "control"), plot=False)
    control = [json.loads(x)["gold_nll"]
               for x in (tmp_path / "control" / "warmup.jsonl").read_text().splitlines()]
    ours = [json.loads(x)["gold_nll"]
            for x in (tmp_path / "run" / "warmup.jsonl").read_text().splitlines()]
    # the planted oracle's vectors name the answer; deranged, they name another item's
    assert np.mean(ours[-10:]) < np.mean(control[-10:]) - 0.2, (ours[-10:], control[-10:])
    train(cfg("zero_context", "zero"), plot=False)
    assert not (tmp_path / "zero" / "warmup.jsonl").exists()


def test_the_warm_up_can_fit_the_policys_lora_and_then_gives_single_the_same_steps(
        planted_store, tmp_path: Path, one_thread):
    """warmup_policy_lr: the LoRA learns beside φ (the reader, not only what it reads), and a
    method without an adapter gets the same supervised steps on its LoRA alone."""
    from musketeers.checks.planted import planted_config
    from musketeers.method import methods
    from musketeers.method.warmup import warm_up_adapter, warms_up
    from musketeers.run.build import build_components

    for method in ("perceiver", "single"):
        c = planted_config(method, 0, 1, planted_store, tmp_path / method, prompts_per_micro=8,
                           group_size=2, adapter_warmup=5, adapter_warmup_lr=1e-2,
                           warmup_policy_lr=1e-2)
        data, policy, adapter = build_components(c, "train", method=methods.get(method))
        assert warms_up(c, adapter, methods.get(method))
        lora = {n: p.detach().clone() for n, p in policy.model.named_parameters()
                if p.requires_grad}
        phi = None if adapter is None else [p.detach().clone() for p in adapter.parameters()]
        assert len(warm_up_adapter(c, policy, adapter, data)) == 5
        moved = [n for n, p in policy.model.named_parameters()
                 if n in lora and not torch.equal(p, lora[n])]
        assert moved and all(p.requires_grad for n, p in policy.model.named_parameters()
                             if n in lora), method
        if phi is not None:
            assert any(not torch.equal(a, b) for a, b in zip(adapter.parameters(), phi,
                                                              strict=True))
    off = planted_config("single", 0, 1, planted_store, tmp_path / "off", adapter_warmup=5)
    # without warmup_policy_lr Single has nothing to warm up
    assert not warms_up(off, None, methods.get("single"))


def test_the_channel_diagnostic_pairs_its_conditions_item_by_item():
    from musketeers.bench.channel import paired

    own = [True, True, False, True]
    other = [False, True, False, False]
    got = paired(own, other)
    assert got["diff"] == 50.0  # two of four items gained, none lost
    assert abs(got["se"] - 100 * (np.std([1, 0, 0, 1], ddof=1) / 2)) < 1e-9


def test_validation_counts_each_question_once_and_only_with_a_gold_answer():
    from musketeers.cache.items import Item
    from musketeers.run.data import scored_rows

    def item(i: int, q: str, a: str | None) -> Item:
        return Item(id=str(i), question=q, system="", answer=a, entry="{}", source="s")

    items = [item(0, "1+1", "2"), item(1, "2+2", "4"), item(2, "1+1", "2"),
             item(3, "3+3", None), item(4, "5+5", "10")]
    assert scored_rows(items) == [0, 1, 4]
