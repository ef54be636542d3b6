"""A task's reward admitted before any work: gold answers that score, forgeries that do not,
datasets that build; each refusal one line naming the dataset, the check and the override."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from musketeers.cache.errors import UserError
from musketeers.tasks import admission, build_items, score
from musketeers.tasks.admission import OVERRIDE, admit, check_reward

# a task file of one dataset whose reward any non-empty answer earns
FORGEABLE = "game_of_life_halting"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(admission.ADMISSION_DIR_ENV, str(tmp_path / "admission"))


def _gold(item) -> float:
    return score(item, f"<answer>{item.answer}</answer>")


@pytest.mark.parametrize("dataset", ["arc_1d", "arc_agi", "rearc"])
def test_gold_answers_score_one_through_the_sandboxed_scorer(dataset):
    """arc_1d imported a module inside the sandbox (refused: every grade 0); arc_agi and
    rearc compare tuples with the lists the item's JSON holds (every grade 0.05)."""
    items = build_items(f"rg:{dataset}@direct", "val", 6)
    assert [_gold(it) for it in items] == [1.0] * 6


def test_a_gold_answer_longer_than_4096_characters_is_graded():
    items = [it for it in build_items("rg:palindrome_partitioning@direct", "val", 40)
             if len(it.answer) > 4096]
    assert items and all(_gold(it) == 1.0 for it in items)


@pytest.mark.parametrize("spelling", ["nani", "NaN j", " n a n i", "N a N", "nan+nani",
                                      "(nan)", "-nani"])
def test_no_spelling_of_nan_forges_complex_arithmetic(spelling):
    items = build_items("arithmetic:easier@direct", "val", 30)
    complex_items = [it for it in items if it.source == "complex_arithmetic"][:4]
    assert complex_items
    for it in complex_items:
        assert score(it, f"<answer>{spelling}</answer>") == 0.0
        assert _gold(it) == 1.0


def test_premises_restated_or_conjoined_earn_nothing_on_propositional_logic():
    items = build_items("rg:propositional_logic@direct", "val", 12)
    for it in items:
        premises = json.loads(it.entry)["metadata"]["premises"]
        joined = " ∧ ".join(f"({p})" for p in premises)
        for answer in (joined, " ∧ ".join(f"({p})" for p in reversed(premises)),
                       f"¬¬({premises[0]})", f"({premises[0]}) ∧ ({premises[0]})", "nani"):
            assert score(it, f"<answer>{answer}</answer>") == 0.0, (answer, premises)


def test_the_pocket_datasets_and_the_issue_datasets_are_admitted():
    for task in ("rg:arc_1d@direct", "rg:complex_arithmetic@direct",
                 "rg:propositional_logic@direct", "arithmetic:easier@direct"):
        verdicts = admit(task)
        assert verdicts and all(v.failure is None for v in verdicts), verdicts
        assert all(v.gold_share >= admission.GOLD_SHARE for v in verdicts)


def test_a_forgeable_reward_is_refused_in_one_line_naming_dataset_check_and_override():
    with pytest.raises(UserError) as exc:
        admit(f"rg:{FORGEABLE}@direct")
    message = str(exc.value)
    assert "\n" not in message and FORGEABLE in message and OVERRIDE in message
    assert "forgery" in message and "cannot tell an answer from none" in message
    assert admit(f"rg:{FORGEABLE}@direct", allow=True)[0].failure  # the override goes on


def test_a_gold_that_scores_zero_is_refused():
    """Items whose stored gold is not what the scorer grades against (as arc_1d's and
    arc_agi's were, through the sandbox and the JSON): the gold check refuses the dataset."""
    from dataclasses import replace

    items = build_items("rg:chain_sum@direct", "val", 8)
    wrong = [replace(it, answer=str(int(it.answer) + 1)) for it in items]
    verdict = admission.judge("chain_sum", wrong)
    assert verdict.failure and "the gold answer scores 1 on 0% of 8 items" in verdict.failure
    assert admission.judge("chain_sum", items).failure is None


@pytest.mark.parametrize(("dataset", "reason"), [
    ("word_ladder", "Dataset size too large"),
    ("acre", "up front"),
])
def test_a_dataset_that_cannot_be_generated_is_one_line(dataset, reason):
    with pytest.raises(UserError) as exc:
        check_reward(f"rg:{dataset}@direct")
    message = str(exc.value)
    assert "\n" not in message and f"dataset {dataset} cannot be generated here" in message
    assert reason in message and "drop it from the task" in message


def test_verdicts_are_cached_per_task(monkeypatch: pytest.MonkeyPatch):
    first = check_reward("rg:chain_sum@direct")
    monkeypatch.setattr(admission, "judge", lambda *a: pytest.fail("judged again"))
    assert check_reward("rg:chain_sum@direct") == first
    with pytest.raises(pytest.fail.Exception):  # another task is another key
        check_reward("rg:products@direct")


def test_gsm8k_and_planted_are_admitted_without_their_data():
    assert admit("gsm8k") == [] and admit("planted") == []


def test_a_generator_that_prints_does_not_break_item_building(monkeypatch: pytest.MonkeyPatch):
    """bf prints while generating: the child that builds items under PYTHONHASHSEED=0 had its
    reply corrupted (JSONDecodeError); it now keeps stdout for the reply alone."""
    if not sys.flags.hash_randomization:
        pytest.skip("items are built in this process when the hash seed is already fixed")
    assert len(build_items("rg:bf@direct", "val", 3)) == 3


def test_tasks_show_and_train_refuse_in_one_line(tmp_path: Path):
    """The CLI's UserError is its one-line exit 2 (``musketeers.cli.main``)."""
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    def refused(result) -> str:
        assert isinstance(result.exception, UserError), result.output
        assert "\n" not in str(result.exception)
        return str(result.exception)

    runner = CliRunner()
    shown = runner.invoke(app, ["tasks", "show", "rg:word_ladder@direct", "--limit", "4"])
    assert "dataset word_ladder cannot be generated here" in refused(shown)
    forged = runner.invoke(app, ["tasks", "show", f"rg:{FORGEABLE}@direct", "--limit", "4"],
                           env={"COLUMNS": "250"})
    assert OVERRIDE in refused(forged) and FORGEABLE in refused(forged)
    assert "non-finite 1.00" in forged.output  # the table came first
    allowed = runner.invoke(app, ["tasks", "show", f"rg:{FORGEABLE}@direct", "--limit", "4",
                                  OVERRIDE], env={"COLUMNS": "250"})
    assert allowed.exit_code == 0 and f"not admitted: {FORGEABLE}" in allowed.output
    trained = runner.invoke(app, ["train", "--task", f"rg:{FORGEABLE}@direct",
                                  "--run-dir", str(tmp_path / "run"),
                                  "--cache-dir", str(tmp_path / "stores")])
    assert OVERRIDE in refused(trained)
    assert not (tmp_path / "run").exists()  # refused before anything was made
    precomputed = runner.invoke(app, ["precompute", "--task", f"rg:{FORGEABLE}@direct",
                                      "--roster", "tiny", "--cache-dir", str(tmp_path)])
    assert OVERRIDE in refused(precomputed) and not list(tmp_path.glob("*.zarr"))


def test_a_grid_with_an_unadmitted_reward_is_refused_before_any_store_or_run(tmp_path: Path):
    """``ablate`` admits every task of its grid first, as ``train`` and ``precompute`` do."""
    import yaml
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "name": "forged", "seeds": [0],
        "defaults": {"budget": "smoke", "roster": "tiny", "policy": "tiny"},
        "runs": [{"task": f"rg:{FORGEABLE}@direct", "method": "single"}]}))
    args = ["ablate", "--grid", str(grid), "--runs-dir", str(tmp_path / "runs"),
            "--reports-dir", str(tmp_path / "reports"), "--cache-dir", str(tmp_path / "stores")]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, UserError), result.output
    assert OVERRIDE in str(result.exception) and FORGEABLE in str(result.exception)
    assert not (tmp_path / "stores").exists() and not list((tmp_path / "runs").glob("*/"))


def test_absurd_sizes_in_a_task_file_are_refused_before_any_item_is_made(tmp_path: Path):
    task = tmp_path / "huge.yaml"
    task.write_text("datasets:\n  - {name: rotate_matrix, config: {max_n: 1000000000}}\n")
    with pytest.raises(UserError, match=r"rotate_matrix's max_n 1000000000 is beyond .*lower it"):
        check_reward(str(task))
    task.write_text("datasets:\n  - {name: chain_sum, config: {size: 1000000000000}}\n")
    with pytest.raises(UserError, match="size and seed are the split rule's"):
        check_reward(str(task))


# Reasoning Gym 0.1.25 at its defaults: the datasets admission refuses, and why (each an
# upstream bug, docs/upstream-scorer-bugs.md); every other dataset is admitted
REFUSED = {
    "acre": "cannot be generated here",
    "word_ladder": "cannot be generated here",
    "game_of_life_halting": "cannot tell an answer from none",
    "puzzle24": "does not read the question",
}


@pytest.mark.slow
def test_admission_over_every_reasoning_gym_dataset():
    from musketeers.tasks.task_files import rg_datasets

    outcome = {}
    for name in rg_datasets():
        try:
            verdicts = check_reward(f"rg:{name}@direct")
        except UserError as exc:
            outcome[name] = str(exc)
            continue
        failed = [v.failure for v in verdicts if v.failure]
        if failed:
            outcome[name] = failed[0]
    assert set(outcome) == set(REFUSED), outcome
    for name, why in REFUSED.items():
        assert why in outcome[name], (name, outcome[name])
