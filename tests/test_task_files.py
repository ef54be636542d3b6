"""Any Reasoning Gym task: ``rg:NAME`` and task files in Reasoning Gym's composite form, checked
before anything is generated or written, each mistake one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from musketeers.cache.errors import UserError
from musketeers.cache.store import store_name, store_path
from musketeers.tasks import build_items, check_disjoint, check_task, score, task_spec
from musketeers.tasks.reasoning_gym_tasks import prebuild, scorer_config, split_of
from musketeers.tasks.variants import system_prompt

MIX = """\
name: my_mix
prompt: direct
datasets:
  - {name: chain_sum, weight: 2, config: {min_terms: 2, max_terms: 2, max_digits: 1}}
  - name: decimal_arithmetic
    weight: 1
    config: {min_num_decimal_places: 1, max_num_decimal_places: 1, precision: 3}
levels:
  one:
    datasets: [products]
"""


@pytest.fixture
def mix(tmp_path: Path) -> Path:
    path = tmp_path / "mix.yaml"
    path.write_text(MIX)
    return path


def test_rg_name_runs_a_dataset_at_its_defaults():
    prebuild([("rg:chain_sum", "train", 30), ("rg:chain_sum@direct", "val", 10)])
    train, val = build_items("rg:chain_sum", "train", 30), build_items("rg:chain_sum@direct",
                                                                      "val", 10)
    check_disjoint(train, val)
    assert all(split_of(it.question) == "train" for it in train)
    assert {it.source for it in train} == {"chain_sum"}
    assert val[0].system == system_prompt("direct") != train[0].system
    assert score(train[0], f"<answer>{train[0].answer}</answer>") == 1.0
    spec = task_spec("rg:chain_sum")
    assert spec["kind"] == "dataset" and spec["datasets"] == [
        {"name": "chain_sum", "weight": 1, "config": {}}]


def test_a_task_file_is_a_weighted_composite_with_its_prompt_and_levels(mix):
    task = str(mix)
    prebuild([(task, "train", 40), (task, "val", 20)])
    train, val = build_items(task, "train", 40), build_items(task, "val", 20)
    check_disjoint(train, val)
    counts = {s: sum(it.source == s for it in train) for s in ("chain_sum", "decimal_arithmetic")}
    assert counts["chain_sum"] > counts["decimal_arithmetic"] > 0  # weight 2 against 1
    assert train[0].system == system_prompt("direct")  # the file's prompt
    assert build_items(f"{task}@simple", "val", 1)[0].system == system_prompt("simple")
    assert {it.source for it in build_items(f"{task}:one", "val", 5)} == {"products"}
    # each item is graded by its own dataset's scorer, built with the file's config for it
    dec = next(it for it in val if it.source == "decimal_arithmetic")
    assert scorer_config(dec.id, "decimal_arithmetic")["precision"] == 3
    assert score(dec, f"<answer>{dec.answer}</answer>") == 1.0
    spec = task_spec(task)
    assert spec["kind"] == "composite" and spec["system_prompt"] == "direct"
    assert [d["weight"] for d in spec["datasets"]] == [2, 1]


def test_a_task_files_store_follows_its_content_not_its_spelling(mix, monkeypatch):
    name = store_name(str(mix))
    assert name.startswith("mix-") and "/" not in name and store_name(f"{mix}@simple") == \
        f"{name}@simple"
    monkeypatch.chdir(mix.parent)
    assert store_name("./mix.yaml") == name and task_spec("./mix.yaml") == task_spec(str(mix))
    assert build_items("./mix.yaml", "val", 3) == build_items(str(mix), "val", 3)
    before = task_spec(str(mix))
    mix.write_text(MIX + "# an edit that changes no dataset\n")
    assert store_name(str(mix)) != name and store_path("s", str(mix)) != store_path("s", name)
    assert task_spec(str(mix))["file_sha256"] != before["file_sha256"]


BAD = {
    "an unknown dataset": ("datasets: [{name: chain_sums, weight: 1}]",
                           "unknown Reasoning Gym dataset 'chain_sums'; did you mean chain_sum"),
    "an unknown config key": ("datasets: [{name: chain_sum, config: {max_term: 3}}]",
                              "chain_sum has no config key 'max_term'; valid keys: .*max_terms"),
    "a zero weight": ("datasets: [{name: chain_sum, weight: 0}]",
                      "weight must be a positive number, got 0"),
    "a negative weight": ("datasets: [{name: chain_sum, weight: -1}]",
                          "weight must be a positive number, got -1"),
    "an empty list": ("datasets: []", "datasets must be a non-empty list"),
    "no datasets": ("name: x", "no datasets list"),
    "not YAML": ("datasets: [{name: chain_sum", "is not YAML"),
    "not a mapping": ("- chain_sum\n- products", "must be a YAML mapping"),
    "an unknown key": ("dataset: [chain_sum]", "unknown key 'dataset'; valid: name, title, prompt"),
    "a bad value": ("datasets: [{name: chain_sum, config: {min_terms: 0}}]",
                    "chain_sum's config is invalid"),
    "a twice-listed dataset": ("datasets: [chain_sum, chain_sum]", "'chain_sum' is listed twice"),
    "a bad prompt": ("prompt: loud\ndatasets: [chain_sum]", "unknown prompt style 'loud'"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_task_file_is_one_line_naming_the_fix(tmp_path: Path, case: str):
    text, says = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=says) as err:
        check_task(str(path))
    assert "\n" not in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("task,says", [
    ("rg:chain_sums", "unknown Reasoning Gym dataset 'chain_sums'; did you mean chain_sum"),
    ("rg:composite", "unknown Reasoning Gym dataset 'composite'"),
    ("nothere.yaml", "task file nothere.yaml: No such file"),
    ("arithmetic:hard", "no level 'hard' for arithmetic; valid: .*arithmetic:easy"),
])
def test_a_bad_task_name_is_one_line(task, says):
    with pytest.raises(UserError, match=says) as err:
        check_task(task)
    assert "\n" not in str(err.value)


def test_nothing_is_written_before_the_task_file_is_checked(tmp_path: Path):
    from musketeers.run.features import precompute_features

    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: [{name: chain_sum, weight: 0}]")
    stores = tmp_path / "stores"
    with pytest.raises(UserError, match="weight must be a positive number"):
        precompute_features(str(bad), experts=["nope"], cache_dir=stores)
    assert not stores.exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "musketeers.cli.main", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "250"})


def test_the_cli_exits_non_zero_with_one_line_on_a_bad_task_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: [{name: chain_sum, config: {max_term: 3}}]")
    out = _cli("tasks", "show", str(bad))
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1 and "no config key 'max_term'" in out.stderr


def test_tasks_list_and_show_cover_rg_names_and_task_files(mix):
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    runner = CliRunner()
    listed = runner.invoke(app, ["tasks", "list"])
    assert listed.exit_code == 0, listed.output
    assert "arithmetic:easier: chain_sum" in listed.output and "rg:NAME" in listed.output
    assert "zebra_puzzles" in listed.output.split("rg:NAME")[1]  # every registry dataset
    for task, source in (("rg:products", "products"), (str(mix), "chain_sum")):
        out = runner.invoke(app, ["tasks", "show", task, "--limit", "12"],
                            env={"COLUMNS": "250"})
        assert out.exit_code == 0, out.output
        assert source in out.output and "constant exact" in out.output
    assert json.dumps(task_spec(str(mix)))  # the spec is JSON, as a store's attributes need


def test_a_task_files_store_remembers_the_file_it_was_built_from(mix, tmp_path: Path):
    """``cache verify`` regenerates a store's items from its task: for a task file's store
    that is the file, not the store's folder name."""
    from musketeers.cache.store import open_root, stored_task

    path = store_path(tmp_path / "stores", str(mix))
    open_root(path, str(mix), task_spec(str(mix)))
    assert path.name == f"{store_name(str(mix))}.zarr" and stored_task(path) == str(mix)
    assert stored_task(tmp_path / "arithmetic.zarr") == "arithmetic"  # no root: its name


def test_a_runs_default_folder_names_a_task_file_by_its_store(mix):
    from musketeers.config import TrainConfig

    assert TrainConfig(task=str(mix)).run_path().parent.name == "runs"
    assert TrainConfig(task=str(mix)).run_path().name.startswith(store_name(str(mix)) + "-")
    assert TrainConfig(task="arithmetic:easier@direct").run_path().name.startswith(
        "arithmetic:easier@direct-")
