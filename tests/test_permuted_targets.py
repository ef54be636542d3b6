"""The permuted-target experiment (musketeers.bench.permuted): each row is asked another row's
question and keeps its answer and expert states, so C is the only way to score; graded
against that target, reported by its length."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from musketeers.bench.channel import against, measure
from musketeers.bench.permuted import answer_length, by_length, constant_answer, length_table
from musketeers.cache.items import Item
from musketeers.checks.planted import DIM, EXPERTS, ORACLE, planted_config
from musketeers.method import methods
from musketeers.method.asked import (
    permute_share,
    permute_targets,
    share_permutation,
    target_permutation,
)
from musketeers.method.rollout import policy_score
from musketeers.run.build import expert_names_for
from musketeers.run.data import load_split

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_target_permutation_is_fixed_seeded_and_a_derangement():
    for n in (2, 3, 17, 128):
        sigma = target_permutation(n, 0)
        assert sigma == target_permutation(n, 0)  # fixed: the same every call
        assert sorted(sigma) == list(range(n))
        assert all(j != i for i, j in enumerate(sigma)), n  # no row keeps its question
    assert target_permutation(128, 1) != target_permutation(128, 0)


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_a_share_of_rows_is_deranged_among_itself_and_the_rest_keep_their_question(share):
    n = 40
    sigma = share_permutation(n, 0, share)
    assert sigma == share_permutation(n, 0, share)  # fixed per (n, seed, share)
    assert sorted(sigma) == list(range(n))
    moved = [i for i, j in enumerate(sigma) if j != i]
    assert len(moved) == round(share * n)  # exactly the share, and no moved row keeps its own
    assert sorted(sigma[i] for i in moved) == moved  # moved rows trade questions among themselves
    if share == 1.0:
        assert sigma == target_permutation(n, 0)  # the whole split: the full experiment
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        share_permutation(n, 0, 1.5)


def test_a_partial_permutation_moves_only_questions(planted_store, tmp_path: Path):
    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "r")
    method = methods.get(cfg.method)
    data = load_split(cfg, "train", expert_names_for(cfg, method), method=method)
    sigma = share_permutation(len(data), cfg.seed, 0.5)
    mixed = permute_share(data, cfg.seed, 0.5)
    assert [it.question for it in mixed.items] == [data.items[j].question for j in sigma]
    assert [it.answer for it in mixed.items] == [it.answer for it in data.items]
    assert [it.entry for it in mixed.items] == [it.entry for it in data.items]
    kept = sum(a.question == b.question for a, b in zip(mixed.items, data.items, strict=True))
    assert 0 < kept < len(data)


def test_a_bad_permute_share_is_refused_before_any_training(tmp_path: Path, capsys):
    from musketeers.bench.channel import main

    for args, said in ((["--permute-share", "2"], "give one in [0, 1]"),
                       (["--permute-share", "0.5", "--permute-targets"],
                        "drop --permute-share"),
                       (["--train-items", "1"], "give at least 2 rows")):
        with pytest.raises(SystemExit) as exc:
            main([*args, "--cache-dir", str(tmp_path / "no-store")])
        assert exc.value.code == 2 and said in capsys.readouterr().err


def decode_oracle(vectors: torch.Tensor) -> list[str]:
    """The digit whose planted code is nearest each oracle vector (checks.planted's codes)."""
    codes = torch.from_numpy(np.random.default_rng(0).standard_normal((10, DIM))
                             .astype(np.float32))
    return [str(int(d)) for d in torch.cdist(vectors, codes).argmin(1)]


@pytest.mark.parametrize("split", ["train", "val"])
def test_each_row_is_asked_another_question_and_its_c_carries_its_target(
        planted_store, tmp_path: Path, split: str):
    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "r")
    method = methods.get(cfg.method)
    data = load_split(cfg, split, expert_names_for(cfg, method), method=method)
    moved = permute_targets(data, cfg.seed)
    sigma = target_permutation(len(data), cfg.seed)
    assert [it.question for it in moved.items] == [data.items[j].question for j in sigma]
    assert [it.answer for it in moved.items] == [it.answer for it in data.items]
    assert [it.entry for it in moved.items] == [it.entry for it in data.items]
    items, vectors, _ = moved.batch(torch.arange(len(moved)))
    said = decode_oracle(vectors[EXPERTS.index(ORACLE)])
    # what the oracle's states say is the target the row is graded on...
    assert said == [it.answer for it in items]
    # ...and not the answer of the question the policy reads (only chance coincidences)
    own = [data.items[j].answer for j in sigma]
    assert sum(s == o for s, o in zip(said, own, strict=True)) < len(said) / 2


def test_grading_reads_the_permuted_target_not_the_questions_own_answer(planted_store,
                                                                        tmp_path: Path):
    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "r")
    method = methods.get(cfg.method)
    data = load_split(cfg, "val", expert_names_for(cfg, method), method=method)
    moved = permute_targets(data, cfg.seed)
    sigma = target_permutation(len(data), cfg.seed)
    differ = [i for i, j in enumerate(sigma) if data.items[j].answer != data.items[i].answer]
    assert differ
    for i in differ:
        asked = data.items[sigma[i]]  # the item whose question row i shows
        assert policy_score(moved.items[i], f"<answer>{moved.items[i].answer}</answer>") == 1.0
        assert policy_score(moved.items[i], f"<answer>{asked.answer}</answer>") == 0.0


def test_exact_by_length_counts_each_length_with_its_interval():
    def item(a: str) -> Item:
        return Item(id=a, question="q", system="", answer=a, entry="{}", source="s")

    assert [answer_length(a) for a in ("7", "-12", "3.50", "yes")] == [1, 2, 3, 3]
    items = [item(a) for a in ("1", "2", "10", "-11", "12", "2")]
    assert constant_answer(items) == "2"
    rows = by_length(items, {"own": [True, True, True, False, False, True]})
    assert [(r["length"], r["n"]) for r in rows] == [(1, 3), (2, 3)]
    p, low, high = rows[0]["own"]
    assert p == 100.0 and 40 < low < 100 and high == pytest.approx(100.0)
    p, low, high = rows[1]["own"]
    assert p == pytest.approx(100 / 3) and low < p < high
    table = length_table("tokens", rows, ["own"])
    assert table[-2].startswith("| 1 | 3 | 100.0 [") and table[-1].startswith("| 2 | 3 | 33.3 [")


def test_c_is_the_only_way_to_score_a_permuted_target(planted_store, tmp_path: Path):
    """Trained by supervision on permuted targets, the planted oracle's own states name the
    target; another item's states and no C leave the policy at chance."""
    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "r",
                         adapter_warmup=60, adapter_warmup_lr=1e-2, adapter_warmup_batch=16)
    out, _ = measure(cfg, 16, permute=True)
    assert out["permute_targets"] and [r["n"] for r in out["by_length"]] == [16]
    assert out["exact_own"] >= out["exact_shuffled"] + 30, out
    assert out["exact_own"] >= out["exact_constant"] + 30, out
    # the teacher-forced readout agrees: own C makes the gold likelier than another item's C
    # or none, by an interval clear of 0
    for other in ("shuffled", "none"):
        assert out[f"val_nll_own_minus_{other}"]["high"] < 0, out
    assert out["val_nll_own"] < out["val_nll_shuffled"], out
    # the same run paired with itself (--against its own --save) differs by nothing
    same = against(out, out)
    assert same["exact_own"]["diff"] == 0 and same["nll_own"]["diff"] == 0
    assert same["exact_own"]["n"] == len(out["per_item"]["question"]) == 16
    assert same["exact_own_2plus_digits"] is None  # the planted targets are one token


def test_the_warm_up_can_read_the_first_train_rows_only(planted_store, tmp_path: Path):
    """``--train-items N``: the warm-up sees the first N train rows (is the read learnt per
    item or in general?); the validation items graded are the same."""
    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "r", adapter_warmup=2,
                         adapter_warmup_batch=4)
    every = len(load_split(cfg, "train", expert_names_for(cfg, methods.get(cfg.method)),
                           method=methods.get(cfg.method)))
    few, _ = measure(cfg, 8, permute=True, train_items=6)
    whole, _ = measure(cfg, 8, permute=True)
    assert (few["train_items"], whole["train_items"]) == (6, every) and every > 6
    assert few["per_item"]["question"] == whole["per_item"]["question"]
    # a run names its seed and thread count: reruns on other thread counts train apart
    assert (few["seed"], few["threads"]) == (cfg.seed, torch.get_num_threads())


def test_against_pairs_two_configurations_item_by_item():
    def run(exact: list[bool], nll: list[float], questions=("a", "b", "c", "d")) -> dict:
        return {"per_item": {"question": list(questions), "length": [1, 2, 3, 2],
                             "exact_own": exact, "nll_own": nll}}

    now = run([True, True, False, True], [1.0, 2.0, 3.0, 4.0])
    then = run([True, False, False, False], [2.0, 2.5, 3.0, 6.0])
    out = against(now, then)
    d = np.array([0, 100, 0, 100.0])
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert out["exact_own"]["diff"] == pytest.approx(50.0)
    assert out["exact_own"]["low"] == pytest.approx(50.0 - half)
    # 2+ digit targets are items 1, 2 and 3: +100, 0, +100
    assert out["exact_own_2plus_digits"]["n"] == 3
    assert out["exact_own_2plus_digits"]["diff"] == pytest.approx(200 / 3)
    assert out["nll_own"]["diff"] == pytest.approx(-0.875)
    with pytest.raises(ValueError, match="other items"):
        against(now, run([True] * 4, [1.0] * 4, questions=("a", "b", "x", "d")))


def test_a_bad_against_file_is_refused_before_any_training(tmp_path: Path, capsys):
    from musketeers.bench.channel import main

    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"channel": "pooled", "per_item": {}}]))
    for path, said in ((other, "holds no channel answer"),
                       (tmp_path / "absent.json", "is not a --save file")):
        with pytest.raises(SystemExit) as exc:
            main(["--channel", "answer", "--against", str(path), "--cache-dir",
                  str(tmp_path / "no-store")])
        assert exc.value.code == 2 and said in capsys.readouterr().err
