"""``musketeers tasks headroom``: the share of items an expert answers right where the policy is
wrong, measured on the same validation items for both, and its table and error lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_shard import run_cli

from musketeers.cache import from_memory, layout
from musketeers.cache import store as st
from musketeers.cache.errors import UserError
from musketeers.cache.items import items_fingerprint
from musketeers.reports.headroom import (
    ANY,
    POSITIVE_GRID,
    TaskHeadroom,
    headroom,
    measure_task,
    team_headroom,
    warmup_config,
)
from musketeers.reports.headroom_report import columns, markdown, read_rows, write_report
from musketeers.tasks import build_items, task_spec

TASK = "rg:chain_sum@direct"
N = 3
EXPERT = "tiny-llama"  # a registry name, so --experts resolves it


def test_headroom_counts_expert_right_where_the_policy_is_wrong():
    policy = [True, True, False]  # right on {0, 1}
    expert = [False, True, True]  # right on {1, 2}
    assert headroom(policy, expert) == pytest.approx(1 / 3)
    assert headroom([True] * 3, [True] * 3) == 0.0  # right where the policy is right: no room
    assert headroom([False] * 3, expert) == pytest.approx(2 / 3)
    got = team_headroom(policy, {"a": expert, "b": [True, False, False]})
    assert got == {"a": pytest.approx(1 / 3), "b": 0.0, ANY: pytest.approx(1 / 3)}
    # two experts, each right on another item the policy misses: any expert adds them up
    both = team_headroom([False] * 3, {"a": [True, False, False], "b": [False, True, False]})
    assert both[ANY] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="same items"):
        headroom(policy, expert[:2])


def build_store(cache_dir: Path, scores: list[float], hint_scores: bool = True) -> None:
    """A store of ``TASK`` with one expert whose hints score ``scores`` on the val items."""
    root = st.open_root(st.store_path(cache_dir, TASK), TASK, task_spec(TASK), force=True)
    for split in layout.SPLITS:
        items = build_items(TASK, split, N)
        sg = root.require_group(split)
        layout.write_items(sg, items, items_fingerprint(items), N)
        arrays = {"last": np.arange(N * 4, dtype=np.float32).reshape(N, 4),
                  "hints": np.array(["x"] * N, dtype=object)}
        if hint_scores:
            arrays["hint_scores"] = np.array(scores, np.float32)
        from_memory.write_expert(sg, EXPERT, arrays, fingerprint={EXPERT: split}, n_layers=1, d=4,
                                 dtype="float32", chunk_rows=N, hints=True)


class StubPolicy:
    """A policy that answers the gold on the items at ``right`` and a wrong number elsewhere."""

    eos_ids = (0,)
    embed_dim = 8
    embedding_rms = 1.0

    def __init__(self, right: set[int]):
        self.right, self.items = right, []

    def encode_prompts(self, items):
        self.items = list(items)
        return [[i + 1] for i in range(len(items))]

    def generate(self, prompts, context, group_size, max_new_tokens, greedy):
        assert context is None and greedy  # untrained, no C
        return [[p[0], 0] for p in prompts]

    def decode(self, ids):
        i = ids[0] - 1
        answer = self.items[i].answer if i in self.right else "-12345"
        return f"<answer>{answer}</answer>"


def test_measure_task_pairs_the_policy_and_the_expert_item_by_item(tmp_path):
    build_store(tmp_path, scores=[0.0, 1.0, 1.0])  # the expert is right on {1, 2}
    row = measure_task(TASK, "stub", [EXPERT], tmp_path, N,
                       policy_factory=lambda cfg: StubPolicy({0, 1}))
    assert row.items == N
    assert row.ids == [it.id for it in build_items(TASK, "val", N)]
    assert row.policy_right == [True, True, False]
    assert row.expert_right == {EXPERT: [False, True, True]}
    assert row.policy_exact == pytest.approx(2 / 3)
    assert row.expert_exact == {EXPERT: pytest.approx(2 / 3)}
    assert row.headroom == {EXPERT: pytest.approx(1 / 3), ANY: pytest.approx(1 / 3)}
    assert row.warmup_exact is None  # not measured, and said so in the table
    # --limit takes the first items of both sides alike
    two = measure_task(TASK, "stub", [EXPERT], tmp_path, 2,
                       policy_factory=lambda cfg: StubPolicy({0, 1}))
    assert (two.items, two.headroom[ANY]) == (2, 0.0)


def test_the_table_has_one_row_per_task_and_its_figures(tmp_path):
    build_store(tmp_path, scores=[0.0, 1.0, 1.0])
    row = measure_task(TASK, "stub", [EXPERT], tmp_path, N,
                       policy_factory=lambda cfg: StubPolicy({0, 1}))
    other = measure_task(TASK, "stub2", [EXPERT], tmp_path, N,
                         policy_factory=lambda cfg: StubPolicy(set()))
    text = markdown([row, other]).splitlines()
    head = [c.strip() for c in text[0].strip("|").split("|")]
    assert head == columns([row])
    body = [[c.strip() for c in line.strip("|").split("|")] for line in text[2:]]
    assert len(body) == 2 and all(len(b) == len(head) for b in body)
    cell = dict(zip(head, body[0], strict=True))
    assert cell["task"] == TASK and cell["items"] == "3"
    assert cell["policy exact"] == "66.7" and cell[f"{EXPERT} exact"] == "66.7"
    assert cell[f"{EXPERT} headroom"] == "33.3" and cell[f"headroom ({ANY})"] == "33.3"
    assert cell["policy after warm-up"] == "not measured"
    assert dict(zip(head, body[1], strict=True))[f"headroom ({ANY})"] == "66.7"
    paths = write_report([row, other], tmp_path / "out", plot=False)
    assert [p.name for p in paths] == ["headroom.json", "headroom.md"]
    assert read_rows(paths[0]) == [row, other]
    assert json.loads(paths[0].read_text())[0]["headroom"][EXPERT] == pytest.approx(1 / 3)


def test_a_missing_store_is_one_line_naming_precompute(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "tasks", "headroom", "--task", TASK,
                             "--policy", "tiny", "--experts", "tiny-llama",
                             "--cache-dir", str(tmp_path), "--out", str(tmp_path / "r"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "musketeers precompute" in err and TASK in err
    assert not (tmp_path / "r").exists()


def test_a_store_without_hint_scores_names_precompute_with_hints(tmp_path, monkeypatch,
                                                                  capsys):
    build_store(tmp_path, scores=[], hint_scores=False)
    code, out, err = run_cli(monkeypatch, capsys, "tasks", "headroom", "--task", TASK,
                             "--policy", "tiny", "--experts", EXPERT,
                             "--cache-dir", str(tmp_path), "--out", str(tmp_path / "r"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "hint_scores" in err and "--hints" in err and "musketeers precompute" in err


def test_precompute_split_val_builds_the_store_headroom_reads(tmp_path, monkeypatch, capsys):
    from musketeers.cache.describe import describe

    args = ("precompute", "--task", TASK, "--experts", EXPERT, "--limit", "2", "--no-router",
            "--cache-dir", str(tmp_path))
    code, _, err = run_cli(monkeypatch, capsys, *args, "--split", "test")
    assert code == 2 and "--split val" in err and not any(tmp_path.iterdir())
    code, _, err = run_cli(monkeypatch, capsys, *args, "--split", "val", "--hints")
    assert code == 0, err
    info = describe(st.store_path(tmp_path, TASK))
    assert {u.split for u in info.units} == {"val"}
    assert [u.hint_accuracy is not None for u in info.units] == [True]


def test_the_warmed_columns_grade_the_policy_after_the_grids_warm_up(tmp_path, monkeypatch):
    build_store(tmp_path, scores=[0.0, 1.0, 1.0])  # the expert is right on {1, 2}
    calls = []

    def warm_up(cfg, policy, adapter, data):  # the real one fits the LoRA; this one teaches all
        calls.append((cfg.task, cfg.adapter_warmup, cfg.warmup_policy_lr, adapter, len(data)))
        policy.right = {0, 1, 2}

    monkeypatch.setattr("musketeers.method.warmup.warm_up_adapter", warm_up)
    cfg = warmup_config(POSITIVE_GRID, TASK, "tiny", tmp_path)
    assert (cfg.method, cfg.adapter_warmup, cfg.adapter_warmup_batch) == ("single", 80, 8)
    row = measure_task(TASK, "tiny", [EXPERT], tmp_path, N, warmup=cfg,
                       policy_factory=lambda c: StubPolicy(set()))
    assert calls == [(TASK, 80, pytest.approx(1e-4), None, N)]  # train split, no adapter
    assert row.policy_right == [False] * N  # the untrained column is a fresh policy
    assert row.headroom[ANY] == pytest.approx(2 / 3)
    assert row.warmup_right == [True] * N and row.warmup_exact == 1.0
    assert row.warmup_headroom == {EXPERT: 0.0, ANY: 0.0}  # the warm-up taught what it knew
    head = columns([row])
    cell = dict(zip(head, [c.strip() for c in markdown([row]).splitlines()[2].strip("|")
                           .split("|")], strict=True))
    assert cell["policy after warm-up"] == "100.0"
    assert cell[f"headroom after warm-up ({ANY})"] == "0.0"
    assert read_rows(write_report([row], tmp_path / "out", plot=False)[0]) == [row]


def test_a_grid_without_a_warmed_single_arm_is_refused(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("budget: smoke\ntasks: {t: logic}\nruns:\n  - {task: logic, method: single}\n")
    with pytest.raises(UserError, match="no supervised warm-up"):
        warmup_config(grid, TASK, "tiny", tmp_path)
    grid.write_text("budget: smoke\nruns:\n  - {task: logic, method: perceiver}\n")
    with pytest.raises(UserError, match="no Single arm"):
        warmup_config(grid, TASK, "tiny", tmp_path)


def test_the_figure_marks_what_was_not_measured(tmp_path, monkeypatch):
    build_store(tmp_path, scores=[0.0, 1.0, 1.0])
    row = measure_task(TASK, "stub", [EXPERT], tmp_path, N,
                       policy_factory=lambda cfg: StubPolicy({0, 1}))
    other = TaskHeadroom(**{**row.to_json(), "policy": "other", "expert_exact": {"x": 0.5},
                            "headroom": {"x": 0.5, ANY: 0.5}, "warmup_exact": 0.25,
                            "warmup_headroom": {"x": 0.25, ANY: 0.25}, "probes": []})
    import matplotlib.axes

    marks = []
    text = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text",
                        lambda self, x, y, s, **kw: marks.append(s) or text(self, x, y, s, **kw))
    paths = write_report([row, other], tmp_path / "out")
    assert paths[-1].name == "headroom.png" and paths[-1].stat().st_size > 0
    # not measured: row's two warm-up bars, other's tiny-llama bar, row's x bar
    assert marks.count("n/m") == 4
