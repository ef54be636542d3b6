"""Tasks: splits, gold answers through the stored entry, limit invariance, GSM8K input errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reasoning_gym.utils import SYSTEM_PROMPTS

from musketeers.cache.errors import UserError
from musketeers.cache.items import items_fingerprint
from musketeers.tasks import (
    MAX_ANSWER_CHARS,
    TASKS,
    build_items,
    check_disjoint,
    families,
    score,
    task_spec,
)
from musketeers.tasks import reasoning_gym_tasks as rgt
from musketeers.tasks.gsm8k import final_answer
from musketeers.tasks.hardening import forged
from musketeers.tasks.planted import planted_digit

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
N_TRAIN, N_VAL = 100, 40
RG = ("arithmetic", "algorithmic", "logic", "gsm_symbolic")


@pytest.fixture(scope="module")
def rg_items():
    rgt.prebuild([(t, s, n) for t in RG for s, n in (("train", N_TRAIN), ("val", N_VAL))])
    return {t: (build_items(t, "train", N_TRAIN), build_items(t, "val", N_VAL)) for t in RG}


def gold_text(item) -> str:
    """The gold answer; propositional_logic has none and grades its metadata's example."""
    if item.answer is not None:
        return item.answer
    return json.loads(item.entry)["metadata"]["example_answer"]


def test_tasks_listed():
    assert TASKS == ("arithmetic", "algorithmic", "logic", "gsm8k", "gsm_symbolic", "planted")


@pytest.mark.parametrize("task", RG)
def test_rg_splits_disjoint_and_in_their_hash_bucket(rg_items, task):
    train, val = rg_items[task]
    assert len(train) == N_TRAIN and len(val) == N_VAL
    check_disjoint(train, val)
    assert all(rgt.split_of(it.question) == "train" for it in train)
    assert all(rgt.split_of(it.question) == "val" for it in val)
    assert len({it.id for it in train + val}) == N_TRAIN + N_VAL


def test_check_disjoint_fails_loudly(rg_items):
    train, val = rg_items["algorithmic"]
    with pytest.raises(RuntimeError, match="share 1 questions"):
        check_disjoint(train, [*val, train[3]])


@pytest.mark.parametrize("task", RG)
def test_every_sub_dataset_gold_scores_one_from_stored_json(rg_items, task):
    train, val = rg_items[task]
    expected = {n for n, _ in families().get(task, ((task, {}),))}
    assert {it.source for it in train} == expected  # every listed dataset is drawn
    for it in train + val:
        assert it.system == SYSTEM_PROMPTS["DeepSeekZero"]
        entry = json.loads(it.entry)
        assert entry["question"] == it.question
        gold = gold_text(it)
        assert len(gold) < MAX_ANSWER_CHARS
        if gold == "":  # RG 0.1.25 string_manipulation can produce "", which RG scores 0
            continue
        # Reasoning Gym's own example conclusion is sometimes a premise restated, which
        # infers nothing and is refused as a forgery (musketeers.tasks.hardening)
        want = 0.0 if forged(gold, entry) else 1.0
        assert score(it, f"<think>...</think>\n<answer>{gold}</answer>") == want, it.source
        assert score(it, "I do not know.") == 0.0


def test_rg_wrong_answers_score_below_one(rg_items):
    train, _ = rg_items["arithmetic"]
    graded = [score(it, "<answer>not an answer at all</answer>") for it in train[:20]]
    assert max(graded) < 1.0


def test_limit_invariance_and_fresh_generation(rg_items):
    full, _ = rg_items["algorithmic"]
    rgt._BUILT.clear()
    rgt.make_dataset.cache_clear()
    short = build_items("algorithmic", "train", 25)
    assert short == full[:25]


def test_items_do_not_depend_on_the_hash_seed(rg_items):
    # polynomial_multiplication, intermediate_integration and isomorphic_strings iterate sets
    # in string-hash order: a process with another hash seed must still get the same items
    code = ("from musketeers.tasks import build_items; from musketeers.cache.items import "
            "items_fingerprint as f; print(f(build_items('arithmetic', 'train', 40)))")
    seed = "12345" if os.environ.get("PYTHONHASHSEED") != "12345" else "54321"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == items_fingerprint(rg_items["arithmetic"][0][:40])


def test_task_spec_matches_the_appendix():
    spec = task_spec("algorithmic")
    json.dumps(spec)
    configs = {d["name"]: d["config"] for d in spec["datasets"]}
    assert configs["jugs"] == {"difficulty": 6}
    assert configs["string_manipulation"] == {"max_string_length": 15, "max_num_rules": 6}
    assert all(d["weight"] == 1 for d in spec["datasets"])
    assert [d["name"] for d in task_spec("logic")["datasets"]] == [
        "aiw", "circuit_logic", "knights_knaves", "propositional_logic", "self_reference",
        "syllogism", "zebra_puzzles"]
    assert len(task_spec("arithmetic")["datasets"]) == 9
    assert spec["sizes"] == {"train": 16_000, "val": 4_000}
    assert spec["seeds"]["train"] != spec["seeds"]["val"]
    for t in TASKS:
        json.dumps(task_spec(t))


@pytest.mark.parametrize("bad", ["nope", "GSM8K", ""])
def test_unknown_task_lists_valid_names(bad):
    with pytest.raises(UserError, match="valid: arithmetic, algorithmic, logic"):
        build_items(bad, "train", 2)
    with pytest.raises(UserError, match="unknown task .*; valid: arithmetic"):
        task_spec(bad)


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_bad_limit(limit):
    with pytest.raises(UserError, match="positive integer"):
        build_items("planted", "train", limit)


def test_unknown_split():
    with pytest.raises(UserError, match="valid splits: train, val"):
        build_items("planted", "test", 2)


# --- GSM8K -----------------------------------------------------------------------------------

def test_gsm8k_gold_scores_one_and_official_split_is_disjoint():
    train = build_items("gsm8k", "train", gsm8k_dir=GSM8K)
    val = build_items("gsm8k", "val", gsm8k_dir=GSM8K)
    assert (len(train), len(val)) == (7473, 1319)
    check_disjoint(train, val)
    assert val[0].answer == "18"  # Janet's ducks
    for it in train[:200] + val[:200]:
        assert "," not in it.answer
        assert score(it, f"<answer>{it.answer}</answer>") == 1.0
        assert score(it, f"<answer>{int(float(it.answer)) + 1}</answer>") == 0.0
    assert build_items("gsm8k", "val", 5, gsm8k_dir=GSM8K) == val[:5]


def test_gsm8k_env_var(monkeypatch):
    monkeypatch.setenv("MUSKETEERS_GSM8K_DIR", str(GSM8K))
    assert len(build_items("gsm8k", "val", 3)) == 3


def test_gsm8k_final_answer_strips_commas():
    assert final_answer("so 1,000 + 234 = 1,234\n#### 1,234") == "1234"
    with pytest.raises(ValueError):
        final_answer("no marker")


def test_gsm8k_missing_folder_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("MUSKETEERS_GSM8K_DIR", raising=False)
    for kwargs in ({}, {"gsm8k_dir": tmp_path}):
        with pytest.raises(UserError) as err:
            build_items("gsm8k", "train", 2, **kwargs)
        msg = str(err.value)
        assert "--gsm8k-dir" in msg and "MUSKETEERS_GSM8K_DIR" in msg and "gsm_symbolic" in msg
        assert "github.com/openai/grade-school-math" in msg and "\n" not in msg


@pytest.mark.parametrize("bad_line", [
    '{"question": "q", "answer": "a #### 3"',      # truncated JSON
    '{"question": "q", "answer": "no marker"}',    # no final answer
    '{"question": 3, "answer": "#### 3"}',         # wrong type
    '["q", "a #### 3"]',                           # not an object
])
def test_gsm8k_malformed_line_named(tmp_path, bad_line):
    good = json.dumps({"question": "q?", "answer": "x #### 3"})
    (tmp_path / "train.jsonl").write_text(f"{good}\n\n{good}\n{bad_line}\n{good}\n")
    with pytest.raises(UserError, match=r"train\.jsonl:4: malformed GSM8K line"):
        build_items("gsm8k", "train", gsm8k_dir=tmp_path)
    assert len(build_items("gsm8k", "train", 2, gsm8k_dir=tmp_path)) == 2  # stops before it


# --- planted ---------------------------------------------------------------------------------

def test_planted_digit_unreadable_from_prompt_and_scored():
    train = build_items("planted", "train", 1000)
    val = build_items("planted", "val", 200)
    check_disjoint(train, val)
    digits = [int(it.answer) for it in train]
    assert set(digits) == set(range(10))
    assert max(digits.count(d) for d in range(10)) < 140  # ~uniform (100 expected)
    # the prompt minus its index tag is one fixed string: nothing in it carries the digit
    assert len({it.question.split("]", 1)[1] for it in train + val}) == 1
    it = train[7]
    assert it.answer == str(planted_digit("train", 7))
    assert score(it, f"<answer>{it.answer}</answer>") == 1.0
    assert score(it, f"<answer>{(int(it.answer) + 1) % 10}</answer>") == 0.0
    assert len(it.question) + len(it.system) < 200
