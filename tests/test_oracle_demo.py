"""``musketeers demo oracle``: the paired comparison of C against its shuffled control."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from musketeers.cache.errors import UserError
from musketeers.checks.oracle_demo import compare


def _samples(path: Path, scores: list[float], ids: list[str] | None = None) -> Path:
    ids = ids or [f"item-{i}" for i in range(len(scores))]
    path.write_text("".join(json.dumps({"id": i, "score": s}) + "\n"
                            for i, s in zip(ids, scores, strict=True)))
    return path


def test_compare_is_paired_over_items(tmp_path: Path) -> None:
    # Ours right on items 0-5, the control on items 4-5 and 9: 4 items only Ours gets
    # right, 1 only the control
    ours = _samples(tmp_path / "a.jsonl", [1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    ctrl = _samples(tmp_path / "b.jsonl", [0, 0, 0, 0, 1, 1, 0, 0, 0, 1])
    c = compare(ours, ctrl)
    assert (c.n, c.ours, c.control) == (10, 60.0, 30.0)
    assert c.diff == pytest.approx(30.0)
    assert (c.ours_only, c.control_only) == (4, 1)
    assert c.mcnemar_p == pytest.approx(0.375)  # exact binomial, 5 discordant items
    # paired SE: the spread of the per-item differences, not two independent proportions
    diffs = [1, 1, 1, 1, 0, 0, 0, 0, 0, -1]
    mean = sum(diffs) / 10
    se = 100 * (sum((d - mean) ** 2 for d in diffs) / 9 / 10) ** 0.5
    assert c.se == pytest.approx(se)
    assert c.low < c.diff < c.high and not c.clear  # 10 items cannot tell 30 points apart
    assert c.mde is not None and c.mde > c.diff


def test_compare_refuses_different_items(tmp_path: Path) -> None:
    ours = _samples(tmp_path / "a.jsonl", [1, 0, 1, 0])
    other = _samples(tmp_path / "b.jsonl", [1, 0, 1, 0], ids=["item-0", "item-1", "x", "y"])
    with pytest.raises(UserError, match="different validation items"):
        compare(ours, other)
    shorter = _samples(tmp_path / "c.jsonl", [1, 0, 1])  # evaluated on fewer items
    with pytest.raises(UserError, match="same --limit"):
        compare(ours, shorter)


def test_oracle_demo_end_to_end_on_tiny_models(tmp_path: Path) -> None:
    """The command precomputes a tiny oracle, trains and evaluates both arms on one seed,
    and prints the paired difference with its interval; a second call reuses the runs."""
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    team = tmp_path / "oracle.team.yaml"
    team.write_text("experts: [oracle-tiny-llama]\n")
    args = ["demo", "oracle", "--team-file", str(team), "--policy", "tiny", "--limit", "8",
            "--warmup", "2", "--steps", "1", "--eval-items", "8", "--pooling", "last",
            "--cache-dir", str(tmp_path / "stores"), "--runs", str(tmp_path / "runs")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert re.search(r"Ours − control: [+-]\d+\.\d points, 95 % interval [+-]\d+\.\d to "
                     r"[+-]\d+\.\d", res.output), res.output
    assert "best constant answer" in res.output
    runs = sorted(r for r in (tmp_path / "runs").iterdir() if r.is_dir())
    assert [r.name.rsplit("-", 1)[0] for r in runs] == ["demo-oracle-perceiver-s0",
                                                         "demo-oracle-shuffled_experts-s0"]
    samples = [r / "eval_samples.jsonl" for r in runs]
    ids = [[json.loads(line)["id"] for line in s.read_text().splitlines()] for s in samples]
    assert ids[0] == ids[1] and len(ids[0]) == 8
    before = [s.stat().st_mtime_ns for s in samples]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert [s.stat().st_mtime_ns for s in samples] == before  # reused, not re-evaluated
    # fewer items graded: the same trained runs, evaluated again
    at = args.index("--eval-items")
    fewer = CliRunner().invoke(app, [*args[:at], "--eval-items", "6", *args[at + 2:]])
    assert fewer.exit_code == 0, fewer.output
    assert sorted(r for r in (tmp_path / "runs").iterdir() if r.is_dir()) == runs
    assert [len(s.read_text().splitlines()) for s in samples] == [6, 6]


def test_the_constant_baseline_finds_graded_items_past_a_repeated_question(
        tmp_path: Path) -> None:
    """The demo's task draws numbers 1-255, so val repeats questions and the graded items
    (each question once, ``scored_rows``) reach past the first n val items. The baseline
    looks them up among the precomputed ones and scores the train split's commonest gold."""
    from musketeers.checks.oracle_demo import TASK, constant_baseline
    from musketeers.run.data import scored_rows
    from musketeers.tasks import build_items

    val = build_items(TASK, "val", limit=64)
    graded = [val[i] for i in scored_rows(val)][:16]
    assert val.index(graded[-1]) >= len(graded)  # a repeat pushed the 16th past row 16
    samples = _samples(tmp_path / "s.jsonl", [0.0] * len(graded), [it.id for it in graded])
    const, exact = constant_baseline(TASK, samples, 64)
    train = [it.answer for it in build_items(TASK, "train", limit=64)]
    assert const == max(set(train), key=train.count)
    assert exact == pytest.approx(100 * sum(it.answer == const for it in graded) / len(graded))
