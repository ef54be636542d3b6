"""The headroom left after training: the experts' own scores are published beside a grid's runs,
and the report pairs them item by item with each run's graded completions."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from test_headroom import EXPERT, TASK, build_store
from test_reports import KEY, write_run

from musketeers.cache.reader import read_items
from musketeers.grid import expert_scores
from musketeers.grid.needs import TaskNeed
from musketeers.grid.pack import opened, pack_of
from musketeers.reports import aggregate as agg
from musketeers.reports.trained_headroom import headroom_markdown, read_scores, scores_file

SINGLE = {**KEY, "method": "single"}


def graded(run: Path, right: list[bool]) -> None:
    """The run's kept completions: item ``q<i>`` scored 1 where ``right[i]``."""
    rows = [{"id": f"q{i}", "score": 1.0 if ok else 0.0} for i, ok in enumerate(right)]
    (run / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_headroom_pairs_each_runs_completions_with_the_experts_scores(tmp_path: Path):
    expert = {"q0": 0.0, "q1": 1.0, "q2": 1.0, "q3": 0.5}  # partial credit is not right
    graded(write_run(tmp_path, "s0", 0.5, seed=0, **SINGLE), [True, True, False, False])
    graded(write_run(tmp_path, "s1", 0.25, seed=1, **SINGLE), [True, False, False, False])
    lines = headroom_markdown(agg.load_runs(tmp_path), {"arithmetic": {"e": expert}})
    # seed 0: the expert is right on q2 alone where the policy is wrong (1/4); seed 1: q1, q2
    # where the expert is right (q1, q2), seed 0 gets q1 and seed 1 neither
    assert ("| Single | e | 2 | 4 | 37.5 (25.0–50.0) | 50.0 | 37.5 (25.0–50.0) | "
            "25.0 (0.0–50.0) |") in lines, lines
    never = headroom_markdown(agg.load_runs(tmp_path), {"arithmetic": {"e": dict.fromkeys(
        expert, 0.0)}})  # an expert right on no item: nothing to take up
    assert "| Single | e | 2 | 4 | 37.5 (25.0–50.0) | 0.0 | 0.0 | — |" in never, never
    assert lines[0] == "## Headroom left after training"
    # scores of other items than the run graded say nothing about it: no section
    assert headroom_markdown(agg.load_runs(tmp_path), {"arithmetic": {"e": {"q9": 1.0}}}) == []
    assert headroom_markdown(agg.load_runs(tmp_path), {}) == []


def test_the_grid_publishes_each_experts_scores_beside_its_runs(tmp_path: Path, monkeypatch):
    cache = tmp_path / "stores"
    build_store(cache, scores=[1.0, 0.0, 1.0])
    need = TaskNeed(TASK, str(cache), "pocket", hint_experts={EXPERT: None, "absent": None})
    monkeypatch.setattr(expert_scores, "grid_needs", lambda grid: [need])
    grid, runs, published = SimpleNamespace(name="g"), tmp_path / "runs", tmp_path / "rep" / "runs"
    local = expert_scores.publish_expert_scores(grid, runs, published)
    ids = [item.id for item in read_items(cache, TASK, "val")]
    # an expert without stored hints has no scores to publish, and is left out
    assert read_scores(runs, "g") == {TASK: {EXPERT: dict(zip(ids, [1.0, 0.0, 1.0], strict=True))}}
    assert local == scores_file(runs, "g")
    with opened(published) as folder:
        assert read_scores(folder, "g") == read_scores(runs, "g")
    # the same scores again: the pack is left as it was (no needless change to commit)
    before = pack_of(published).stat().st_mtime_ns
    expert_scores.publish_expert_scores(grid, runs, published)
    assert pack_of(published).stat().st_mtime_ns == before
    # a shard's worker whose runs read another expert adds its scores and drops none
    other = TaskNeed(TASK, str(cache), "pocket", hint_experts={"absent": None})
    monkeypatch.setattr(expert_scores, "grid_needs", lambda grid: [other])
    monkeypatch.setattr(expert_scores, "read_hint_scores", lambda *a: [[0.0, 1.0, 1.0]])
    expert_scores.publish_expert_scores(grid, tmp_path / "other", published)
    with opened(published) as folder:
        both = read_scores(folder, "g")[TASK]
    assert set(both) == {EXPERT, "absent"} and both["absent"] == dict(
        zip(ids, [0.0, 1.0, 1.0], strict=True))
    assert read_scores(tmp_path / "other", "g")[TASK] == both


def test_ablate_publishes_the_scores_once_the_stores_are_ready(tmp_path: Path, monkeypatch,
                                                               capsys):
    """The command a user runs (here `--precompute-only`) leaves the scores in both places."""
    from test_shard import run_cli

    cache = tmp_path / "stores"
    build_store(cache, scores=[0.0, 1.0, 1.0])
    grid = tmp_path / "g.yaml"
    grid.write_text(json.dumps({
        "budget": "smoke", "name": "g", "seeds": [0],
        "defaults": {"roster": "tiny", "policy": "tiny", "steps": 1, "eval_limit": 3},
        "runs": [{"task": TASK, "method": "output_collab", "experts": [EXPERT]}]}))
    code, _, err = run_cli(monkeypatch, capsys, "ablate", "--grid", str(grid), "--precompute-only",
                           "--cache-dir", str(cache), "--runs-dir", str(tmp_path / "runs"),
                           "--reports-dir", str(tmp_path / "reports"))
    assert code == 0, err
    expected = [0.0, 1.0, 1.0]
    assert list(read_scores(tmp_path / "runs", "g")[TASK][EXPERT].values()) == expected
    with opened(tmp_path / "reports" / "g" / "runs") as folder:
        assert list(read_scores(folder, "g")[TASK][EXPERT].values()) == expected


def test_each_cell_has_its_row_labelled_by_what_tells_the_cells_apart(tmp_path: Path):
    """Channel and team cells outside Table 1 have rows too, named by the fields that vary."""
    ours = {**KEY, "channel": "answer"}
    graded(write_run(tmp_path, "single", 0.25, seed=0, **SINGLE), [True, False, False, False])
    graded(write_run(tmp_path, "team", 0.5, seed=0, **ours), [True, True, False, False])
    graded(write_run(tmp_path, "oracle", 0.75, seed=0, **{**ours, "team": "oracle"}),
           [True, True, True, False])
    lines = headroom_markdown(agg.load_runs(tmp_path),
                              {"arithmetic": {"e": dict.fromkeys(["q0", "q1", "q2", "q3"], 1.0)}})
    rows = {line.split(" | ")[0].lstrip("| ") for line in lines if line.endswith(" |")} - {
        "Method", "|---"}
    assert rows == {"Single", "Ours, team default", "Ours, team oracle"}, rows
