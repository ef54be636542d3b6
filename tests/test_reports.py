"""Ablation reports: grid expansion and resume, aggregation math, tables, figures, report."""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from functools import partial
from pathlib import Path

import matplotlib.image as mpimg
import pytest
import yaml

from musketeers.cache.errors import UserError
from musketeers.design.gridspec import load_grid, run_name
from musketeers.grid.fake import fake_evaluate, fake_train
from musketeers.grid.needs import grid_needs, missing, open_task_store
from musketeers.grid.run import run_grid
from musketeers.grid.status import run_status
from musketeers.grid.walltime import wall_time_lines
from musketeers.reports import aggregate as agg
from musketeers.reports import series
from musketeers.reports.claim_registry import paper_claims
from musketeers.reports.claims import compare
from musketeers.reports.report import write_report
from musketeers.reports.tables import TABLE1, TABLE2, TASKS, table1_markdown
from musketeers.reports.verdicts import two_se_clause, within_noise
from musketeers.tasks.variants import task_title

TASK_TITLES = {t: task_title(t) for t in TASKS}  # the paper's columns, titled by their task
IDENTITY = lambda fields: fields  # noqa: E731 - the fakes take the fields dict as config


def write_run(root: Path, name: str, acc: float | None, rewards=(0.1, 0.2, 0.3),
              entropy=(1.0, 0.8, 0.5), error: str | None = None, n: int = 10, **cfg) -> Path:
    """A run folder by hand, exactly per the run-folder contract."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"budget": "t", "steps": len(rewards), **cfg}))
    rows = [{"step": i + 1, "reward_mean": r, "entropy": h, "time_s": 2.0,
             "utilisation": {"a": 0.5 + 0.1 * i, "b": 0.5 - 0.1 * i}}
            for i, (r, h) in enumerate(zip(rewards, entropy, strict=True))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if error:
        (d / "error.txt").write_text(error + "\nTraceback ...\n")
        return d
    (d / "summary.json").write_text(json.dumps({"steps": len(rewards)}))
    if acc is not None:
        (d / "eval.json").write_text(json.dumps({"exact": acc, "score": acc, "n": n,
                                                 "split": "val"}))
    return d


KEY = dict(task="arithmetic", method="perceiver", team="default", pooling="last", latents=8)


def _arith_claim(claims: list[str]) -> str:
    """§4.2's "Ours beats Single on Arithmetic" (after the regime claims, one per task)."""
    return next(c for c in claims if c.startswith("- §4.2: on Arithmetic"))


def test_mean_and_sample_std_over_seeds_match_hand_computation(tmp_path: Path):
    for seed, acc in enumerate((0.5, 0.6, 0.8)):
        write_run(tmp_path, f"r{seed}", acc, seed=seed, **KEY)
    cell = agg.cell(agg.load_runs(tmp_path), **KEY)
    # mean 63.333; deviations -13.333, -3.333, 16.667; ddof=1: sqrt(466.667 / 2) = 15.275
    assert cell.mean == pytest.approx(63.3333, abs=1e-3)
    assert cell.std == pytest.approx(15.2753, abs=1e-3)
    assert cell.text() == "63.33 ± 15.28"
    one = agg.cell(agg.load_runs(tmp_path, names=["r0"]), **KEY)
    assert one.std is None and one.text() == "50.00 (1 seed)"


def test_series_aligns_steps_and_takes_sample_std(tmp_path: Path):
    write_run(tmp_path, "a", 0.5, rewards=(0.0, 1.0), entropy=(1.0, 0.5), **KEY)
    write_run(tmp_path, "b", 0.5, rewards=(0.5, 0.0, 0.2), entropy=(1.0, 0.9, 0.1), **KEY)
    steps, mean, std = series.series(agg.load_runs(tmp_path), "reward_mean")
    assert steps.tolist() == [1, 2, 3]
    assert mean.tolist() == pytest.approx([0.25, 0.5, 0.2])
    assert std.tolist() == pytest.approx([math.sqrt(0.125), math.sqrt(0.5), 0.0])
    _, u, _ = series.series(agg.load_runs(tmp_path), "utilisation", "a")
    assert u.tolist() == pytest.approx([0.5, 0.6, 0.7])


def test_spearman_is_per_run_then_averaged(tmp_path: Path):
    write_run(tmp_path, "a", 0.5, rewards=(0.1, 0.2, 0.3), entropy=(3.0, 2.0, 1.0), **KEY)
    write_run(tmp_path, "b", 0.5, rewards=(0.1, 0.3, 0.2), entropy=(1.0, 2.0, 3.0), **KEY)
    runs = agg.load_runs(tmp_path)
    assert [r.spearman for r in runs] == pytest.approx([-1.0, 0.5])
    assert series.mean_spearman(runs) == (pytest.approx(-0.25), 2)


def test_failed_and_missing_cells_are_shown_not_dropped(tmp_path: Path):
    write_run(tmp_path, "ok", 0.7, **{**KEY, "method": "single"})
    write_run(tmp_path, "bad", None, error="RuntimeError: boom", **KEY)
    text = table1_markdown(agg.load_runs(tmp_path))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
            if line.startswith("| ")}
    for row in TABLE1:
        assert row.label in rows
    for title in TASK_TITLES.values():
        assert f"{title} (ours)" in text and f"{title} (paper)" in text
    single = rows["Single"].split(" | ")
    assert single[3] == "70.00 (1 seed)" and single[1] == "—"  # arithmetic ran, algorithmic not
    assert rows["Ours Default Team (n=3)"].split(" | ")[3] == "FAILED"
    assert "75.26 ± 5.62" in rows["Ours Default Team (n=3)"]


def test_compare_against_the_paper():
    cell = agg.Cell([])
    assert compare(cell, (50.0, 1.0)) is None
    run = agg.Run("x", Path("x"), {}, "done", eval={"exact": 0.52})
    assert compare(agg.Cell([run]), (50.0, 3.0)).startswith("agrees")
    assert compare(agg.Cell([run]), (60.0, 3.0)).startswith("below the paper by 8.00")


def test_a_claim_about_a_family_the_grid_leaves_out_says_so(tmp_path: Path):
    write_run(tmp_path, "single", 0.3, **{**KEY, "method": "single"})
    runs = agg.load_runs(tmp_path)

    def logic(claims):
        return next(c for c in claims if "on Logic, Single is the best" in c)

    assert "**cannot be checked (runs missing)**" in logic(paper_claims(runs, 8))
    assert "**not in this grid**\n  - this grid runs Algorithmic, Arithmetic" in logic(
        paper_claims(runs, 8, {"arithmetic", "algorithmic"}))
    assert "runs missing" in logic(paper_claims(runs, 8, {"arithmetic", "logic"}))


def test_verdicts_say_when_a_difference_is_within_evaluation_noise(tmp_path: Path):
    single = {**KEY, "method": "single"}
    control = {**KEY, "method": "shuffled_experts"}  # as low as Single: Ours clears both
    for d, n in (("small", 64), ("large", 1000)):
        write_run(tmp_path / d, "single", 0.0, n=n, **single)
        write_run(tmp_path / d, "ours", 2 / 64, n=n, **KEY)
        write_run(tmp_path / d, "control", 0.0, n=n, **control)
    small = agg.load_runs(tmp_path / "small")
    ours, base = agg.cell(small, **KEY), agg.cell(small, **single)
    # SE = 100·sqrt(p(1 − p)/N) = 100·sqrt(0.03125·0.96875/64) = 2.1748; Single's is 0
    assert ours.items == 64 and ours.item_se == pytest.approx(2.1748, abs=1e-3)
    assert base.item_se == 0.0
    noise, why = within_noise(ours, base)
    assert noise and "Δ 3.12 points ≤ 2 SE = 4.35" in why
    claim = _arith_claim(paper_claims(small, 8))
    assert "**no evidence either way (for it, within noise)**" in claim
    # the same 3.12 points on 1,000 items each: SE = 0.55, 2 SE = 1.10, a finding
    big = _arith_claim(paper_claims(agg.load_runs(tmp_path / "large"), 8))
    assert "**holds here**" in big and "> 2 SE = 1.10" in big
    # a tie is no finding either way, whatever its SE (here 0: both cells scored 0)
    assert within_noise(base, base) == (True, "no difference (64 and 64 graded items)")
    # a run that does not say how many items it graded gives no noise estimate
    assert agg.Cell([agg.Run("x", tmp_path, {}, "done", eval={"exact": 0.5})]).item_se is None


def test_grid_expands_dedups_and_filters(tmp_path):
    grid = load_grid("smoke")
    names = [r.name for r in grid.runs]
    assert len(names) == len(set(names))
    # Table 1: 8 rows + 3 controls + the untrained baseline x 4 tasks; Table 2: 4 more
    # poolings; Figure 6: 6 more m
    assert len(names) == 48 + 4 + 6
    default = run_name("smoke", {**KEY, "seed": 0})
    assert default in names
    assert next(r for r in grid.runs if r.name == default).eval_no_context
    assert run_name("smoke", {"task": "logic", "method": "single", "team": "x", "seed": 1}) \
        == "smoke-logic-single-s1"
    task_file = tmp_path / "sub" / "mix.yaml"
    task_file.parent.mkdir()
    task_file.write_text("name: mix\ndatasets:\n  - {name: products, weight: 1, config: {}}\n")
    named = run_name("smoke", {"task": str(task_file), "method": "single", "seed": 0})
    assert "/" not in named and named.startswith("smoke-mix-")  # a path never nests folders
    two = load_grid("smoke", seeds=[0, 1], tasks=["logic"])
    # 11 runs per seed, and the untrained run once (its entry fixes seeds: [0])
    assert len(two.runs) == 2 * 11 + 1 and {r.fields["task"] for r in two.runs} == {"logic"}
    with pytest.raises(UserError, match="selects no runs"):
        load_grid("smoke", tasks=["planted"])
    with pytest.raises(UserError, match="--budget"):
        load_grid("huge")


def small_grid(tmp_path: Path) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "budget": "t", "seeds": [0, 1], "defaults": {"budget": "t", "pooling": "last",
                                                     "latents": 8},
        "runs": [{"task": ["arithmetic", "logic"], "method": "single"},
                 {"task": "arithmetic", "method": "perceiver", "team": "default",
                  "eval_no_context": True}]}))
    return path


def test_resume_runs_only_missing_runs_and_retries_failures(tmp_path: Path):
    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    calls: list[str] = []

    def train(fields, fail=()):
        calls.append(Path(fields["run_dir"]).name)
        if any(f in fields["run_dir"] for f in fail):
            raise RuntimeError("out of memory\nsecond line")
        return fake_train(fields, steps=3)

    result = run_grid(grid, runs_dir, partial(train, fail=("perceiver-default-last-m8-s1",)),
                      fake_evaluate, IDENTITY)
    assert len(calls) == 6 and len(result.failed) == 1
    failed = runs_dir / "t-arithmetic-perceiver-default-last-m8-s1"
    assert (failed / "error.txt").read_text().startswith("RuntimeError: out of memory second")
    assert run_status(failed) == "failed"
    # a killed run: trained but not evaluated; another never finished training
    (runs_dir / "t-logic-single-s0" / "eval.json").unlink()
    (runs_dir / "t-logic-single-s1" / "summary.json").unlink()
    calls.clear()
    evals: list[tuple[str, bool]] = []

    def evaluate(run_dir, limit, context):
        evals.append((Path(run_dir).name, context))
        return fake_evaluate(run_dir, limit, context)

    result = run_grid(grid, runs_dir, train, evaluate, IDENTITY)
    assert sorted(calls) == ["t-arithmetic-perceiver-default-last-m8-s1", "t-logic-single-s1"]
    assert ("t-logic-single-s0", True) in evals and len(result.skipped) == 3
    assert ("t-arithmetic-perceiver-default-last-m8-s1", False) in evals  # Figure 5 eval
    assert not (failed / "error.txt").exists()
    calls.clear()
    assert len(run_grid(grid, runs_dir, train, evaluate, IDENTITY).skipped) == 6
    assert calls == []


def test_hours_stops_between_runs_before_one_would_end_past_it(tmp_path: Path, monkeypatch):
    """A fake clock: each training call takes 10 min. With --hours 0.5 the grid starts a run
    only while elapsed + the longest run so far fits; the rest is left for the next call."""
    import musketeers.grid.run as grid_mod

    clock = [0.0]
    monkeypatch.setattr(grid_mod.time, "monotonic", lambda: clock[0])

    def train(fields):
        clock[0] += 600.0
        return fake_train(fields, steps=3)

    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    result = run_grid(grid, runs_dir, train, fake_evaluate, IDENTITY, hours=0.5)
    # runs end at 10, 20, 30 min; a fourth would end at 40 > 30
    assert len(result.trained) == 3 and len(result.left) == len(grid.runs) - 3
    assert [run_status(runs_dir / n) for n in result.left] == ["missing"] * len(result.left)
    again = run_grid(grid, runs_dir, train, fake_evaluate, IDENTITY)
    assert sorted(again.trained) == sorted(result.left) and not again.left


def test_wall_time_by_stage_projects_runs_not_done_from_done_ones(tmp_path: Path):
    from musketeers.grid.walltime import wall_time_by_stage

    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    cost = {"arithmetic-single": (100, 20), "logic-single": (200, 40),
            "arithmetic-perceiver": (100, 20, 30)}  # Ours adds Figure 5's no-C evaluation
    rows = []
    for run in grid.runs:
        calls = next(v for k, v in cost.items() if f"t-{k}" in run.name)
        rows.append({"phase": "train", "name": run.name, "seconds": calls[0], "ok": True})
        rows += [{"phase": "eval", "name": f"{run.name}/e{i}", "seconds": c, "ok": True}
                 for i, c in enumerate(calls[1:])]
    rows.append({"phase": "train", "name": grid.runs[0].name, "seconds": 999, "ok": False})
    (runs_dir / "ledger-t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def line(runs):
        return wall_time_by_stage(grid, runs, runs_dir)[0].split("\n  - ")[1]

    # every run done: 2 × (120 + 240 + 150) s, the interrupted call not counted
    assert line(agg.load_runs(runs_dir)) == "stage 1: 6 of 6 runs done in 0.28 h"
    for run in grid.runs:  # seed 1 not evaluated yet: projected from seed 0, kind by kind
        if run.name.endswith("s1"):
            (runs_dir / run.name / "eval.json").unlink()
    assert line(agg.load_runs(runs_dir)) == ("stage 1: 3 of 6 runs done in 0.14 h, 0.28 h "
                                             "projected for all")
    # no Logic run done: Logic's two at Arithmetic's Single, nothing to scale it by
    (runs_dir / "t-logic-single-s0" / "eval.json").unlink()
    assert line(agg.load_runs(runs_dir)) == ("stage 1: 2 of 6 runs done in 0.07 h, 0.22 h "
                                             "projected for all (2 from another family's runs "
                                             "of their kind)")


def test_wall_time_projection_scales_another_familys_runs_by_this_familys(tmp_path: Path):
    """A method not run yet on a slow family costs what it cost on a fast one times how much
    slower the slow family's done runs were: at another family's mean it would be
    underestimated, at this family's Single mean too (Ours reads experts)."""
    from musketeers.grid.walltime import wall_time_by_stage

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "budget": "t", "seeds": [0], "defaults": {"budget": "t", "pooling": "last",
                                                  "latents": 8, "team": "default"},
        "runs": [{"task": ["arithmetic", "logic"], "method": ["single", "perceiver"]}]}))
    grid = load_grid(path)
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    cost = {"arithmetic-single": 100, "arithmetic-perceiver": 200, "logic-single": 300,
            "logic-perceiver": 0}
    (runs_dir / "ledger-t.jsonl").write_text("".join(
        json.dumps({"phase": "train", "name": run.name, "ok": True,
                    "seconds": next(v for k, v in cost.items() if f"t-{k}-" in run.name)})
        + "\n" for run in grid.runs))
    (runs_dir / "t-logic-perceiver-default-last-m8-s0" / "eval.json").unlink()
    text = wall_time_by_stage(grid, agg.load_runs(runs_dir), runs_dir)[0].split("\n  - ")[1]
    # 100 + 200 + 300 measured, and Logic's Ours at 200 × 300 / 100
    assert text == ("stage 1: 3 of 4 runs done in 0.17 h, 0.33 h projected for all "
                    "(1 from another family's runs of their kind)")


def test_main_comparison_costs_each_family_a_night_on_the_grids_own_seeds(
        tmp_path: Path, monkeypatch):
    """Only the grid's own seeds count (a part's extra seed adds power, not the main
    comparison); a family's stores cost every precompute call of its task, an interrupted
    one too, and an expert never precomputed in this ledger costs another family's call
    for it; a family over the night is said not to fit."""
    import musketeers.grid.walltime as walltime

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "budget": "t", "seeds": [0], "defaults": {"budget": "t", "pooling": "last",
                                                  "latents": 8, "team": "default"},
        "runs": [{"task": ["arithmetic", "logic"], "method": ["single", "perceiver"]},
                 {"task": "arithmetic", "method": "single", "seeds": [0, 1]}]}))
    grid = load_grid(path)
    assert grid.seeds == [0] and len(grid.runs) == 5
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    (runs_dir / "t-logic-perceiver-default-last-m8-s0" / "eval.json").unlink()
    rows = [{"phase": "train", "name": run.name, "ok": True,
             "seconds": 7200 if "perceiver" in run.name else 3600} for run in grid.runs]
    team = "qwen2.5-coder-0.5b-instruct, smollm2-135m-instruct"
    rows += [{"phase": "precompute", "name": n, "seconds": s, "ok": ok} for n, s, ok in [
        (f"arithmetic: {team}", 1800, True), ("arithmetic: gemma-3-270m", 600, True),
        (f"logic: {team}", 1000, False), ("logic: smollm2-135m-instruct", 400, True)]]
    (runs_dir / "ledger-t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(walltime, "NIGHT_HOURS", 3.6)
    text = walltime.main_comparison_by_family(grid, agg.load_runs(runs_dir), runs_dir)[0]
    head, arithmetic, logic = text.split("\n  - ")
    assert head.endswith("every cell on the grid's seeds 0), one family a night (`--tasks`), "
                         "from the same measurements")
    # 3600 + 7200 s of runs (seed 1's Single left out) and 1800 + 600 s of stores
    assert arithmetic == ("arithmetic: 2 runs (2 done), 3.00 h + its stores 0.67 h = 3.67 h: "
                          "does not fit a 3.6-hour night")
    # Logic's Ours at Arithmetic's; its gemma store at Arithmetic's call for it
    assert logic == ("logic: 2 runs (1 done), 3.00 h projected (1 from another family's runs "
                     "of their kind) + its stores 0.56 h (1 of them at another family's "
                     "measured call) = 3.56 h: fits a 3.6-hour night")


def test_report_says_which_dtype_each_half_ran_in(tmp_path: Path):
    """config.yaml keeps `auto`; the report counts the dtype each run's training and
    evaluation resolved to on their machines (inputs.json, eval.json)."""
    from musketeers.reports.report import _computed_in

    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    names = [g.name for g in grid.runs]
    for i, name in enumerate(names[:3]):  # three trained in float32, one evaluated in bf16
        (runs_dir / name / "inputs.json").write_text(json.dumps({"dtype": "float32"}))
        path = runs_dir / name / "eval.json"
        path.write_text(json.dumps({**json.loads(path.read_text()),
                                    "dtype": "bfloat16" if i == 0 else "float32"}))
    (line,) = _computed_in(agg.load_runs(runs_dir))
    assert "training float32 ×3, not recorded ×3; evaluation bfloat16 ×1, float32 ×2, " \
        "not recorded ×3" in line


def test_report_says_which_machine_each_half_ran_on(tmp_path: Path):
    """A grid's runs are trained on whatever machine a night lends: the report counts the CPU,
    its native bf16 and the threads of each run's training and evaluation, and says nothing
    where no run recorded them (a published grid's report rebuilds as it was)."""
    from musketeers.reports.report import _machines

    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    assert _machines(agg.load_runs(runs_dir)) == []
    xeon = {"cpu": "Xeon", "avx512_bf16": True, "amx_bf16": True, "threads": 2}
    epyc = {"cpu": "EPYC", "avx512_bf16": False, "amx_bf16": False, "threads": 1}
    for i, name in enumerate(g.name for g in grid.runs[:3]):  # two on the Xeon, one on the EPYC
        (runs_dir / name / "inputs.json").write_text(json.dumps({"machine": [xeon, xeon, epyc][i]}))
        path = runs_dir / name / "eval.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "machine": epyc}))
    (line,) = _machines(agg.load_runs(runs_dir))
    assert line == ("- Machines (runs): training EPYC (no native bf16; 1 threads) ×1; "
                    "Xeon (avx512_bf16, AMX; 2 threads) ×2; not recorded ×3; "
                    "evaluation EPYC (no native bf16; 1 threads) ×3; not recorded ×3")


def test_report_states_learning_rates_of_the_runs_that_use_them(tmp_path: Path):
    """The adapter's learning rate is read from the runs that have an adapter: Single's
    config carries the field too, unused, and must not show up beside it."""
    path = small_grid(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["runs"][0]["adapter_lr"] = 0.5  # Single: a value nothing reads
    raw["runs"][1]["adapter_lr"] = 1e-5
    path.write_text(yaml.safe_dump(raw))
    grid = load_grid(path)
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("- Learning rates")]
    assert "adapter 1e-05 (runs that read C)" in line and "0.5" not in line


def test_report_names_every_run_and_every_failure(tmp_path: Path):
    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"

    def train(fields):
        if "logic-single-s1" in fields["run_dir"]:
            raise ValueError("no feature cache for task 'logic'")
        return fake_train(fields, steps=5)

    run_grid(grid, runs_dir, train, fake_evaluate, IDENTITY)
    # left by an earlier report: an old figure goes, the user's own file stays
    out = tmp_path / "reports" / grid.budget
    out.mkdir(parents=True)
    (out / "figure4_gsm8k.png").write_bytes(b"old")
    (out / "notes.md").write_text("mine")
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert not (out / "figure4_gsm8k.png").exists() and (out / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in out.glob("figure*.png")) == sorted(
        re.findall(r"\]\((figure\w+\.png)\)", text))
    for run in grid.runs:
        assert run.name in text
    assert "ValueError: no feature cache for task 'logic'" in text
    assert "| t-logic-single-s1 | FAILED |" in text
    assert "## Table 1" in text and "## Table 2" in text and "Spearman" in text
    # the cell-by-cell comparison is one table, a row per cell with both numbers
    assert "| table | row | task | ours | paper | verdict |" in text
    assert "| Table 1 | Single | Logic | " in text
    assert "(1 seed) (1 FAILED) | 96.88 ± 1.10 | below the paper" in text


def test_report_states_how_much_learning_signal_the_runs_had(tmp_path: Path):
    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=5), fake_evaluate, IDENTITY)
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert "Learning signal: on average 10% of the sampled groups" in text  # fake: 0.1/step
    assert "at most the 50% the pocket regime was sized for" in text
    assert "0 of 30 updates were skipped" in text  # six runs of five steps, none skipped
    assert "  - by method: Ours (default team) 10%, Single 10%\n" in text
    # fake: 0.04 of the groups solved by every sample, of the 0.1 with zero variance
    assert "of the 6 runs that logged it, 40% were solved by every sample (too easy)" in text
    assert "few informative groups" not in text and "without `skip_no_signal`" not in text
    assert "| train reward | groups without signal |" in text
    # one of the six runs without any signal: five at 10 % and one at 100 % average 25 %
    path = runs_dir / grid.runs[0].name / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "zero_var_frac": 1.0, "completion_len": 1.0 + i})
                            + "\n" for i, r in enumerate(rows)))
    ev = runs_dir / grid.runs[0].name / "eval.json"
    ev.write_text(json.dumps({**json.loads(ev.read_text()), "answered": 0.25,
                              "truncated": 0.5}))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert len(grid.runs) == 6
    row = next(line for line in text.splitlines() if line.startswith(f"| {grid.runs[0].name} |"))
    # mean completion length over steps 1..5 (tokens 1..5), then the share with <answer> tags
    assert "| 100% | 3.0 | 25 | 50 |" in row
    other = next(line for line in text.splitlines() if line.startswith(f"| {grid.runs[1].name} |"))
    assert "| 10% | " in other and " | — | — | " in other  # an eval.json without the counts
    assert ("Answer format of the greedy validation completions" in text
            and "\n  - 25% had an answer for the scorer to grade under the run's extraction "
            "(lenient also takes a last line) (25%–25% over 1 run with that count)\n"
            "  - 50% ran out of new tokens") in text
    # the tagged share is its own count (here: from eval.json, 0.75 of the answered)
    ev.write_text(json.dumps({**json.loads(ev.read_text()), "tagged": 0.125}))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert "12% wrote an `<answer>…</answer>` pair (12%–12% over 1 run" in text
    assert f"stopped answering (under 50% answered): {grid.runs[0].name} (25%)" in text
    assert text.count("stopped answering") == 1  # the runs that answered are not named
    assert "mostly ran out of new tokens" not in text  # 50% truncated is not over 50%
    assert "on average 25%" in text and "10%–100% across the 6 finished trained runs" in text
    # the same run as an untrained baseline (lr 0) leaves the trained runs' average alone
    cfg_path = runs_dir / grid.runs[0].name / "config.yaml"
    cfg_path.write_text(yaml.safe_dump({**yaml.safe_load(cfg_path.read_text()),
                                        "method": "untrained"}))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert "on average 10%" in text and "10%–10% across the 5 finished trained runs" in text
    for run in grid.runs:
        p = runs_dir / run.name / "metrics.jsonl"
        p.write_text("".join(json.dumps({**json.loads(x), "zero_var_frac": 0.9}) + "\n"
                             for x in p.read_text().splitlines()))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert "above the 50% the pocket regime was sized for" in text
    assert "few informative groups" in text and "without `skip_no_signal`" not in text
    # a run trained without the guard is named: its KL-only updates moved routing
    cfg_path = runs_dir / grid.runs[1].name / "config.yaml"
    cfg_path.write_text(yaml.safe_dump({**yaml.safe_load(cfg_path.read_text()),
                                        "skip_no_signal": False}))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert "1 of these runs trained without `skip_no_signal`" in text
    # a run that answers (lenient extraction) but mostly runs out of tokens is named too
    ev = runs_dir / grid.runs[2].name / "eval.json"
    ev.write_text(json.dumps({**json.loads(ev.read_text()), "answered": 1.0, "truncated": 0.875}))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert (f"mostly ran out of new tokens (over 50% truncated): {grid.runs[2].name} (88%)"
            in text)
    assert grid.runs[0].name not in text.split("mostly ran out of new tokens")[1].split("\n")[0]


def test_figures_are_readable_pngs(tmp_path: Path):
    grid = load_grid("smoke", seeds=[0, 1], tasks=["arithmetic"])
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=30), fake_evaluate, IDENTITY)
    readme = write_report(grid, runs_dir, tmp_path / "reports")
    pngs = sorted(readme.parent.glob("*.png"))
    assert [p.name for p in pngs] == ["figure4_arithmetic.png", "figure5_context.png",
                                      "figure6_latents.png"]
    for png in pngs:
        assert png.stat().st_size > 20_000
        image = mpimg.imread(png)
        assert image.ndim == 3 and image.shape[0] > 300 and image.std() > 0.05
        assert f"]({png.name})" in readme.read_text()
    table2 = (readme.parent / "table2.md").read_text()
    assert all(label in table2 for label, _, _ in TABLE2) and "FAILED" not in table2


def test_no_figure_draws_outside_its_canvas(tmp_path: Path, monkeypatch):
    """A title wider than its panels is cut off in the PNG: one task and one team are the
    narrowest figures a partial grid gives."""
    from musketeers.reports import figures

    grid = load_grid("smoke", seeds=[0], tasks=["arithmetic"])
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=5), fake_evaluate, IDENTITY)
    runs = agg.load_runs(runs_dir)
    closed = []
    monkeypatch.setattr(figures.plt, "close", closed.append)
    for subset in (runs, [r for r in runs if r.config.get("team") in ("default", None)]):
        figures.all_figures(subset, tmp_path / "figs")
    assert len(closed) == 6
    for fig in closed:
        drawn = fig.get_tightbbox(fig.canvas.get_renderer())
        canvas = fig.bbox_inches
        assert (drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= canvas.x1 + 0.01
                and drawn.y1 <= canvas.y1 + 0.01), (fig.get_suptitle(), drawn, canvas)


def test_grid_needs_union_of_experts_hints_and_router(tmp_path: Path):
    grid = load_grid(small_grid(tmp_path), overrides={"cache_dir": str(tmp_path / "none")})
    teams = {"default": ["e1", "e2"]}
    need, logic = grid_needs(grid, lambda team, roster: teams[team])
    assert need.task == "arithmetic" and list(need.experts) == ["e1", "e2"]
    # logic runs only Single: its store is needed for the items, no expert in it
    assert logic.task == "logic" and not logic.experts and not logic.router
    assert not need.hint_experts and not need.router
    assert missing(need, open_task_store(need)) == (["e1", "e2"], [], False)


def test_a_custom_grids_experts_are_what_it_needs_and_its_hint_is_their_precompute(tmp_path):
    import shlex

    from musketeers.grid.needs import ensure_cache

    stores = tmp_path / "my stores"
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"budget": "smoke", "runs": [
        {"task": "arithmetic", "method": "perceiver", "roster": "tiny", "cache_dir": str(stores),
         "experts": "tiny-gpt2,tiny-llama"}]}))
    grid = load_grid(path)
    (need,) = grid_needs(grid)  # the default team is not what these runs read
    assert list(need.experts) == ["tiny-gpt2", "tiny-llama"]
    with pytest.raises(UserError) as err:
        ensure_cache(grid, None)
    fix = shlex.split(str(err.value).split("; run: ")[1])
    assert fix[:4] == ["musketeers", "precompute", "--task", "arithmetic"]
    assert fix[fix.index("--experts") + 1] == "tiny-gpt2,tiny-llama"
    assert fix[fix.index("--cache-dir") + 1] == str(stores) and "tiny" in fix


def test_a_run_listed_twice_is_one_run_unless_its_fields_clash(tmp_path: Path):
    path = tmp_path / "g.yaml"
    base = {"task": "logic", "method": "perceiver", "team": "default"}
    path.write_text(yaml.safe_dump({"budget": "t", "runs": [
        {**base, "save_every": 2}, {**base, "eval_no_context": True, "no_context_every": 5}]}))
    (run,) = load_grid(path).runs
    assert run.eval_no_context and run.fields["save_every"] == 2
    assert run.fields["no_context_every"] == 5
    path.write_text(yaml.safe_dump({"budget": "t", "runs": [
        {**base, "no_context_every": 1}, {**base, "no_context_every": 5}]}))
    with pytest.raises(UserError, match="listed twice with different no_context_every"):
        load_grid(path)


def test_grid_precomputes_into_the_folder_its_runs_read(tmp_path: Path, monkeypatch):
    """With no --cache-dir, both follow $MUSKETEERS_CACHE_DIR (the grid once used ./stores)."""
    from musketeers.config import TrainConfig

    monkeypatch.setenv("MUSKETEERS_CACHE_DIR", str(tmp_path / "env-stores"))
    grid = load_grid(small_grid(tmp_path))
    need, _ = grid_needs(grid, lambda team, roster: ["e1"])
    assert "cache_dir" not in next(iter(grid.runs)).fields
    assert need.cache_dir == str(tmp_path / "env-stores") == TrainConfig().cache_dir


def test_grid_refuses_a_store_with_fewer_items_than_it_precomputes(tmp_path: Path):
    from musketeers.grid.needs import ensure_cache

    fixtures = Path(__file__).resolve().parent / "fixtures"
    n = min(int(json.loads((fixtures / "arithmetic.zarr" / split / "items" / "zarr.json")
                           .read_text())["attributes"]["n"]) for split in ("train", "val"))
    grid = load_grid(small_grid(tmp_path), overrides={"cache_dir": str(fixtures)})
    teams = {"default": ["tiny-llama"]}
    before = sorted(p.stat().st_mtime_ns for p in (fixtures / "arithmetic.zarr").rglob("*"))
    with pytest.raises(UserError, match=f"holds {n} (train|val) items .*--cache-dir"):
        ensure_cache(grid, {"limit": n + 1}, lambda team, roster: teams[team])
    # at the store's own size it passes the check (and finds the expert already there)
    assert ensure_cache(grid, {"limit": n}, lambda team, roster: teams[team]) == []
    after = sorted(p.stat().st_mtime_ns for p in (fixtures / "arithmetic.zarr").rglob("*"))
    assert before == after


def test_grid_refuses_a_store_computed_in_another_dtype(tmp_path: Path):
    """A store of the right size but other numerics (a bf16 precompute on another CPU) is
    refused by name, not read as the grid's; the fixtures' experts are float32."""
    from musketeers.grid.needs import ensure_cache

    fixtures = Path(__file__).resolve().parent / "fixtures"
    grid = load_grid(small_grid(tmp_path), overrides={"cache_dir": str(fixtures)})
    teams = {"default": ["tiny-llama"]}
    with pytest.raises(UserError, match="tiny-llama computed in float32 .* bfloat16.*--cache-dir"):
        ensure_cache(grid, {"dtype": "bfloat16", "device": "cpu"}, lambda t, r: teams[t])
    for same in ("float32", "fp32", "auto"):  # auto: this machine's choice, nothing to compare
        assert ensure_cache(grid, {"dtype": same, "device": "cpu"}, lambda t, r: teams[t]) == []


def test_ledger_sums_every_phase_across_resumed_invocations(tmp_path: Path):
    from musketeers.grid.ledger import ledger_path, timed, totals

    grid = load_grid(small_grid(tmp_path))
    runs_dir = tmp_path / "runs"
    ledger = ledger_path(runs_dir, grid.budget)

    def train(fields):
        if "logic-single-s1" in fields["run_dir"]:
            raise RuntimeError("boom")
        return fake_train(fields, steps=3)

    run_grid(grid, runs_dir, train, fake_evaluate, IDENTITY, ledger=ledger)
    rows = [json.loads(x) for x in ledger.read_text().splitlines()]
    trains = [r for r in rows if r["phase"] == "train"]
    assert len(trains) == 6 and sum(not r["ok"] for r in trains) == 1  # a failed call counts
    evals = [r for r in rows if r["phase"] == "eval"]
    assert len(evals) == 3 + 2 * 2  # 3 single runs; 2 perceiver runs, with and without C
    # the resumed grid records only what it runs again
    run_grid(grid, runs_dir, fake_train, fake_evaluate, IDENTITY, ledger=ledger)
    again = [json.loads(x) for x in ledger.read_text().splitlines()][len(rows):]
    assert [r["name"] for r in again] == ["t-logic-single-s1", "t-logic-single-s1/eval.json"]
    with pytest.raises(KeyboardInterrupt), timed(ledger, "precompute", "logic: a"):
        time.sleep(0.02)
        raise KeyboardInterrupt
    with ledger.open("a") as f:
        f.write('{"phase": "train", "sec')  # a torn last line: the process killed mid-write
    t = totals(ledger)
    every = [json.loads(x) for x in ledger.read_text().splitlines()[:-1]]
    for phase in ("precompute", "train", "eval"):
        assert t[phase] == pytest.approx(sum(r["seconds"] for r in every if r["phase"] == phase))
    assert t["total"] == pytest.approx(sum(r["seconds"] for r in every))
    assert t["finished"] == pytest.approx(sum(r["seconds"] for r in every if r["ok"]))
    assert t["finished"] < t["total"]
    assert every[-1] == {**every[-1], "phase": "precompute", "ok": False}
    text = write_report(grid, runs_dir, tmp_path / "reports",
                        wall_time=wall_time_lines(grid, runs_dir)).read_text()
    assert f"Measured wall time of this grid's commands: {t['total']:.0f} s" in text


def test_a_store_computed_again_on_another_machine_counts_once(tmp_path: Path):
    """Stores do not outlive a machine everywhere: the grid resumed elsewhere precomputes the
    same store again, and one uninterrupted invocation would have done that once."""
    from musketeers.grid.ledger import totals

    ledger = tmp_path / "ledger.jsonl"
    rows = [("precompute", "logic: a", 500.0, True), ("train", "r", 40.0, True),
            ("precompute", "logic: a", 30.0, False),  # cut off: real time, not finished
            ("precompute", "logic: a", 600.0, True), ("precompute", "logic: b", 70.0, True)]
    ledger.write_text("".join(json.dumps({"phase": p, "name": n, "seconds": s, "ok": ok})
                              + "\n" for p, n, s, ok in rows))
    t = totals(ledger)
    assert t["precompute"] == 600 + 30 + 70 and t["discarded"] == 500
    assert t["finished"] == 600 + 70 + 40 and t["total"] == 600 + 30 + 70 + 40


def test_a_run_made_with_other_settings_is_set_aside_and_run_again(tmp_path: Path):
    from musketeers.grid.ledger import ledger_path, totals

    runs_dir = tmp_path / "runs"
    grid = load_grid(small_grid(tmp_path))
    for run in grid.runs:
        run.fields["context_position"] = "after_prompt"
    ledger = ledger_path(runs_dir, grid.budget)
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY, ledger=ledger)
    n_first = len(ledger.read_text().splitlines())
    # a setting changed since they ran (as the default context position did); the single runs
    # have no C, so for them it changes nothing and they stay
    changed = load_grid(small_grid(tmp_path))
    perceiver = sorted(r.name for r in changed.runs if r.fields["method"] == "perceiver")
    for run in changed.runs:
        run.fields["context_position"] = "before_prompt"
    calls: list[str] = []

    def train(fields):
        calls.append(Path(fields["run_dir"]).name)
        return fake_train(fields, steps=3)

    result = run_grid(changed, runs_dir, train, fake_evaluate, IDENTITY, ledger=ledger)
    assert sorted(result.stale) == perceiver and sorted(calls) == perceiver
    kept = sorted((runs_dir / "stale").iterdir())
    assert [p.name.split(".")[0] for p in kept] == perceiver  # nothing lost
    for old in kept:
        assert yaml.safe_load((old / "config.yaml").read_text())["context_position"] == \
            "after_prompt"
        assert (old / "metrics.jsonl").is_file() and (old / "eval.json").is_file()
    again = run_grid(changed, runs_dir, train, fake_evaluate, IDENTITY, ledger=ledger)
    assert again.stale == [] and again.trained == [] and len(calls) == len(perceiver)
    # the set-aside runs' first calls leave the grid's wall time and are reported apart
    rows = [json.loads(x) for x in ledger.read_text().splitlines()]
    old_calls = [r for r in rows[:n_first] if r["name"].split("/")[0] in perceiver]
    t = totals(ledger)
    assert len(old_calls) == 2 * 3 and t["discarded"] == pytest.approx(
        sum(r["seconds"] for r in old_calls))
    assert t["total"] == pytest.approx(sum(r["seconds"] for r in rows) - t["discarded"])
    text = write_report(changed, runs_dir, tmp_path / "reports",
                        wall_time=wall_time_lines(changed, runs_dir)).read_text()
    assert "runs later set aside as stale" in text
    assert f"Runs: {len(changed.runs)} found of {len(changed.runs)}" in text


def test_sigterm_still_records_the_interrupted_call(tmp_path: Path):
    """``kill`` (SIGTERM) of a musketeers command unwinds like Ctrl-C: the ledger gets the
    interrupted call, and the exit status is 128 + 15. Python's default would skip it."""
    import signal
    import subprocess
    import sys

    ledger = tmp_path / "ledger.jsonl"
    code = ("import time\n"
            "from pathlib import Path\n"
            "from musketeers.cli.main import _exit_on_sigterm\n"
            "from musketeers.grid.ledger import timed\n"
            "_exit_on_sigterm()\n"
            f"with timed(Path({str(ledger)!r}), 'train', 'r'):\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    [row] = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert row["phase"] == "train" and row["name"] == "r" and row["ok"] is False
    assert 0.2 <= row["seconds"] < 30


def test_an_old_eval_json_reads_as_score_with_exact_unknown(tmp_path: Path):
    """eval.json once held only `accuracy`, the mean score: it is the score, and exact is
    unknown — shown as such, never guessed."""
    d = write_run(tmp_path, "old", None, seed=0, **{**KEY, "method": "single"})
    (d / "eval.json").write_text(json.dumps({"accuracy": 0.4, "n": 10}))
    (run,) = agg.load_runs(tmp_path)
    assert run.score == pytest.approx(40.0) and run.exact is None
    exact, score = (table1_markdown([run], metric=m) for m in ("exact", "score"))
    assert "| Single | — | 51.56 ± 0.55 | unknown | " in exact
    assert "| Single | — | 51.56 ± 0.55 | 40.00 (1 seed) | " in score
    assert "Reasoning Gym's score, as far as the paper says" in exact
    grid = load_grid(small_grid(tmp_path))
    text = write_report(grid, tmp_path, tmp_path / "reports").read_text()  # no grid run there
    assert "Exact is unknown" not in text
    runs_dir = tmp_path / "runs"
    run_grid(grid, runs_dir, partial(fake_train, steps=3), fake_evaluate, IDENTITY)
    ev = runs_dir / grid.runs[0].name / "eval.json"
    ev.write_text(json.dumps({"accuracy": 0.25, "n": 4}))
    text = write_report(grid, runs_dir, tmp_path / "reports").read_text()
    assert f"Exact is unknown for 1 run whose eval.json predates it ({grid.runs[0].name})" in text
    row = next(x for x in text.splitlines() if x.startswith(f"| {grid.runs[0].name} |"))
    assert "| unknown | 25.00 |" in row
    assert "accuracy (%)" not in text.lower().replace("paper's accuracy (%)", "")


def _accuracy_claim(root: Path, ours: float, single: float, control: float | None,
                    control_seed: int = 0) -> str:
    write_run(root, "single", single, n=1000, seed=0, **{**KEY, "method": "single"})
    write_run(root, "ours", ours, n=1000, seed=0, **KEY)
    if control is not None:
        write_run(root, "ctl", control, n=1000, seed=control_seed,
                  **{**KEY, "method": "shuffled_experts"})
    return _arith_claim(paper_claims(agg.load_runs(root), 8))


def test_the_accuracy_claim_for_ours_must_clear_its_shuffled_experts_control(tmp_path: Path):
    # Ours beats Single by 30 points, but the control with shuffled expert vectors does as well
    tie = _accuracy_claim(tmp_path / "tie", 0.6, 0.3, 0.6)
    assert "**does not clear its control: within noise of it, not evidence**" in tie
    assert "vs Single (seed 0): 60.00 vs 30.00" in tie
    assert "vs shuffled experts (seed 0): 60.00 vs 60.00" in tie
    better = _accuracy_claim(tmp_path / "better", 0.6, 0.3, 0.8)
    assert "**does not clear its control**" in better
    # within noise of Single, and the control ahead of Ours beyond noise: said, not hidden
    behind = _accuracy_claim(tmp_path / "behind", 0.31, 0.3, 0.6)
    assert "**within noise of Single, and behind its control beyond noise**" in behind
    clear = _accuracy_claim(tmp_path / "clear", 0.6, 0.3, 0.3)
    assert "**holds here**" in clear and "> 2 SE" in clear
    # no control run, or only on another seed: not evidence, never a silent pass
    for name, seed in (("none", None), ("other-seed", 1)):
        claim = _accuracy_claim(tmp_path / name, 0.6, 0.3, None if seed is None else 0.3,
                                control_seed=seed or 0)
        assert "**no control run: not evidence**" in claim and "holds here" not in claim
    assert "**does NOT hold here**" in _accuracy_claim(tmp_path / "below", 0.2, 0.3, None)


def _routing_claims(root: Path, ours: list[tuple], control: list[tuple],
                    control_rewards: tuple = (0.1, 0.2, 0.3)) -> dict[str, str]:
    """§4.3 claims on Arithmetic from runs whose entropy series are given per seed."""
    for seed, entropy in enumerate(ours):
        write_run(root, f"ours{seed}", 0.5, entropy=entropy, seed=seed, **KEY)
    for seed, entropy in enumerate(control):
        write_run(root, f"ctl{seed}", 0.5, entropy=entropy, seed=seed, rewards=control_rewards,
                  **{**KEY, "method": "shuffled_reward"})
    claims = [c for c in paper_claims(agg.load_runs(root), 8) if "§4.3: on Arithmetic" in c]
    assert len(claims) == 3
    return {key: next(c for c in claims if key in c)
            for key in ("entropy falls", "utilisation concentrates", "correlate negatively")}


def test_a_difference_of_thousandths_prints_the_digits_that_separate_it_from_its_2_se():
    # at three decimals both would read 0.001, and "0.001 > 2 SE = 0.001" says nothing
    noise, why = two_se_clause(0.0012, 0.0003, 0.0004, "", "2 seeds")
    assert not noise and why == "Δ 0.00090 > 2 SE = 0.00080 (2 seeds)"
    assert two_se_clause(0.5, 0.3, 0.2, "", "2 seeds")[1].startswith("Δ 0.200 ≤")


def test_routing_verdicts_are_stated_against_the_shuffled_reward_control(tmp_path: Path):
    falls = [(1.0, 0.8, 0.5), (1.0, 0.7, 0.4)]  # drops 0.5 and 0.6
    # entropy falls as much when the rewards carry no meaning: no evidence about reward
    same = _routing_claims(tmp_path / "same", falls, [(1.0, 0.7, 0.4), (1.0, 0.8, 0.5)])
    assert "**within noise of its control: not evidence**" in same["entropy falls"]
    assert ("H at the start minus H at the end: +0.5500 nats in Ours, +0.5500 under shuffled "
            "reward (seeds 0, 1)") in same["entropy falls"]
    flat = _routing_claims(tmp_path / "flat", falls, [(1.0, 1.0, 1.0), (1.0, 0.99, 0.98)])
    assert "**holds here**" in flat["entropy falls"] and "> 2 SE" in flat["entropy falls"]
    # one seed: no SE, no verdict
    one = _routing_claims(tmp_path / "one", falls[:1], [(1.0, 0.95, 0.9)])
    for claim in one.values():
        assert "**no verdict: 1 seed**" in claim and "the SE is unknown" in claim
    # no control run: not evidence, whatever Ours did
    alone = _routing_claims(tmp_path / "alone", falls, [])
    for claim in alone.values():
        assert "**no control run: not evidence**" in claim
    # utilisation concentrates by 0.2 in every write_run run
    assert "**within noise of its control: not evidence**" in flat["utilisation concentrates"]
    # ρ against the control's entropy: seed 0's flat entropy defines none, so one seed is left
    assert "**no verdict: 1 seed**" in flat["correlate negatively"]
    assert "mean ρ(reward, H) = -1.00 in Ours and -1.00 with the control's entropy" in \
        flat["correlate negatively"]


def test_the_spearman_claim_swaps_in_the_controls_entropy_against_ours_own_reward(
        tmp_path: Path):
    """ρ(reward, H) over steps can come from which items each step drew (the control draws
    the same ones): Ours' ρ is evidence only beyond the same reward against the control's
    entropy. The control's ρ with its own reward does not enter: here it is +1 throughout."""
    falls = [(1.0, 0.8, 0.5), (1.0, 0.7, 0.4)]
    # the control's routing ran the other way on the same steps: the correlation is Ours'
    rises = [(0.5, 0.8, 1.0), (0.4, 0.7, 1.0)]
    claim = _routing_claims(tmp_path / "rises", falls, rises, control_rewards=(0.3, 0.2, 0.1))
    text = claim["correlate negatively"]
    assert "**holds here**" in text and "-1.00 in Ours and +1.00 with the control's" in text
    # broken on purpose: the control's entropy follows the same steps as Ours' (the items'
    # doing), and its own reward does not track it at all: no evidence about reward
    same = _routing_claims(tmp_path / "same", falls, falls, control_rewards=(0.3, 0.2, 0.1))
    assert "**within noise of its control: not evidence**" in same["correlate negatively"]


def test_routing_claims_are_judged_per_channel_against_the_control_on_that_channel(
        tmp_path: Path):
    """A grid through a token channel gets §4.3's claims on that channel; a shuffled-reward
    control on another channel is no control for them."""
    answer = {**KEY, "pooling": None, "channel": "answer", "token_layer": -1}
    falls, flat = [(1.0, 0.8, 0.5), (1.0, 0.7, 0.4)], [(1.0, 1.0, 1.0), (1.0, 0.99, 0.98)]
    for seed in range(2):
        write_run(tmp_path, f"ours{seed}", 0.5, entropy=falls[seed], seed=seed, **answer)
        # the only flat control is pooled: it must not serve the answer channel's claims
        write_run(tmp_path, f"ctl{seed}", 0.5, entropy=flat[seed], seed=seed,
                  **{**KEY, "method": "shuffled_reward"})
    runs = agg.load_runs(tmp_path)
    claims = [c for c in paper_claims(runs, 8) if "§4.3: on Arithmetic" in c]
    assert len(claims) == 3
    assert all("Ours (default team, answer channel) vs" in c for c in claims)
    entropy = next(c for c in claims if "entropy falls" in c)
    assert "**no control run: not evidence**" in entropy
    for seed in range(2):  # now its own channel's control, flat: the fall holds
        write_run(tmp_path, f"actl{seed}", 0.5, entropy=flat[seed], seed=seed,
                  **{**answer, "method": "shuffled_reward"})
    claims = [c for c in paper_claims(agg.load_runs(tmp_path), 8) if "§4.3: on Arithmetic" in c]
    entropy = next(c for c in claims if "entropy falls" in c)
    assert "**holds here**" in entropy and "(seeds 0, 1)" in entropy


def test_routing_changes_come_from_the_summary_when_it_has_them(tmp_path: Path):
    d = write_run(tmp_path, "r", 0.5, entropy=(1.0, 0.9, 0.8), **KEY)
    (d / "summary.json").write_text(json.dumps({
        "steps": 3, "entropy_first": 1.1, "entropy_last10pct": 0.6,
        "utilisation_first": {"a": 0.5, "b": 0.5}, "utilisation_last10pct": {"a": 0.9, "b": 0.1}}))
    (run,) = agg.load_runs(tmp_path)
    assert run.entropy_drop == pytest.approx(0.5) and run.concentration == pytest.approx(0.4)
    (d / "summary.json").write_text(json.dumps({"steps": 3}))
    (run,) = agg.load_runs(tmp_path)  # from metrics.jsonl: first step vs the last 10 %
    assert run.entropy_drop == pytest.approx(0.2) and run.concentration == pytest.approx(0.2)


def test_table1_has_control_rows_after_the_methods(tmp_path: Path):
    from musketeers.design import experiment
    from musketeers.method import methods

    # without runs, the controls the design runs (warm-up only needs a grid that warms up)
    designed = {m for part in experiment.DESIGN for m in part.values("method")}
    controls = [m.name for m in methods.REGISTRY.values() if m.control_of and m.name in designed]
    assert "untrained" in controls and "warmup_only" not in controls
    assert [row.key["method"] for row in TABLE1[-len(controls):]] == controls
    assert not any(row.control for row in TABLE1[:-len(controls)])
    write_run(tmp_path, "ctl", 0.25, seed=0, **{**KEY, "method": "zero_context"})
    text = table1_markdown(agg.load_runs(tmp_path))
    assert f"| {methods.get('zero_context').label} | — | n/a | 25.00 (1 seed) | n/a |" in text


def test_names_groups_staleness_and_store_needs_follow_the_registry(tmp_path: Path):
    from musketeers.grid.status import stale_fields

    # no_cross_attn ignores m (registry): one run and one group whatever latents says
    base = {"task": "logic", "team": "default", "pooling": "last", "seed": 0}
    assert run_name("t", {**base, "method": "no_cross_attn", "latents": 16}) == \
        "t-logic-no_cross_attn-default-last-s0"
    assert run_name("t", {**base, "method": "zero_context", "latents": 4}) == \
        "t-logic-zero_context-default-m4-s0"  # m positions of zeros: m matters, pooling not
    assert agg.group_key({**base, "method": "single", "latents": 8}) == {
        "task": "logic", "method": "single", "team": None, "pooling": None, "channel": None,
        "token_layer": None, "token_positions": None, "latents": None,
        "warmup_permute_share": 0.0}
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({**base, "method": "single",
                                                   "adapter_lr": 1e-3, "steps": 3}))
    assert stale_fields(d, {**base, "method": "single", "adapter_lr": 1e-4, "steps": 3}) == {}
    assert stale_fields(d, {**base, "method": "single", "adapter_lr": 1e-3, "steps": 4}) == {
        "steps": (3, 4)}
    # how many prompts share a decode step changes no prompt's samples: the same run
    (d / "config.yaml").write_text(yaml.safe_dump({**base, "method": "single", "steps": 3,
                                                   "decode_prompts": 0}))
    assert stale_fields(d, {**base, "method": "single", "steps": 3, "decode_prompts": 32}) == {}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"budget": "t", "defaults": {"cache_dir": str(tmp_path)},
                                    "runs": [{"task": "logic", "team": "default", "method": [
                                        "single", "shuffled_experts", "shuffled_reward",
                                        "zero_context"]}]}))
    (need,) = grid_needs(load_grid(path), lambda team, roster: ["e1", "e2"])
    assert list(need.experts) == ["e1", "e2"] and not need.hint_experts and not need.router
    path.write_text(yaml.safe_dump({"budget": "t", "defaults": {"cache_dir": str(tmp_path)},
                                    "runs": [{"task": "logic", "team": "default", "method": [
                                        "output_collab", "hard_routing"]}]}))
    (need,) = grid_needs(load_grid(path), lambda team, roster: ["e1"])
    assert list(need.hint_experts) == ["e1"] and need.router


def test_table2_says_which_poolings_gave_every_item_the_same_vector(tmp_path: Path):
    """first_token pooling reads the chat template's first token: a constant per expert. The
    report must say so beside the cell, since it tests expert identity, not the prompt."""
    from musketeers.reports.tables import table2_markdown

    first = write_run(tmp_path, "first", 0.2, **dict(KEY, pooling="first_token"))
    (first / "inputs.json").write_text(json.dumps({"rows": 10, "constant_experts": ["qwen"]}))
    write_run(tmp_path, "last", 0.3, **KEY)
    (tmp_path / "last" / "inputs.json").write_text(json.dumps({"rows": 10,
                                                               "constant_experts": []}))
    text = table2_markdown(agg.load_runs(tmp_path))
    note = text.split("Same vector for every item")[1].split("\n")[0]
    assert "First token" in note and ": qwen" in note and "Last" not in note
    (first / "inputs.json").unlink()
    assert "Same vector for every item" not in table2_markdown(agg.load_runs(tmp_path))


def test_the_pooling_claim_compares_on_the_seeds_both_cells_ran_and_says_when_first_is_constant(
        tmp_path: Path):
    """Table 2's first-token cell runs on seed 0 only, Last (Table 1's Ours) on every seed: the
    claim compares seed 0 with seed 0, and says when the first-token vectors were the same
    for every item (the cell then carries no prompt information)."""
    first = write_run(tmp_path, "first", 0.6, seed=0, **dict(KEY, pooling="first_token"))
    (first / "inputs.json").write_text(json.dumps({"rows": 10, "constant_experts": ["qwen"]}))
    for seed, acc in enumerate((0.5, 0.9, 0.9)):
        write_run(tmp_path, f"last{seed}", acc, seed=seed, **KEY)

    def claim() -> str:
        return next(c for c in paper_claims(agg.load_runs(tmp_path), 8) if "first-token" in c)

    assert "60.00 vs 50.00 (seed 0)" in claim()  # not against the 3-seed mean, 76.67
    assert "same vector for qwen: that cell holds no prompt information" in claim()
    (first / "inputs.json").unlink()
    assert "same vector" not in claim()


def test_the_latents_peak_is_read_on_the_seeds_every_m_ran(tmp_path: Path):
    """Figure 6's m cells run on seed 0 only, m = 8 on every seed: the peak is read on seed 0,
    where m = 4 beats m = 8 (60 vs 50), not against m = 8's three-seed mean (76.67)."""
    write_run(tmp_path, "m4", 0.6, seed=0, **dict(KEY, latents=4))
    for seed, acc in enumerate((0.5, 0.9, 0.9)):
        write_run(tmp_path, f"m8s{seed}", acc, seed=seed, **KEY)
    claim = next(c for c in paper_claims(agg.load_runs(tmp_path), 8) if "Figure 6" in c)
    assert "**no evidence either way (against it" in claim
    assert "peak at m = 4 (60.00%, seed 0)" in claim
    assert "against m = 8's 50.00%" in claim


def test_ours_meets_each_baseline_on_the_seeds_that_baseline_ran(tmp_path: Path):
    """Table 1's baselines run on seed 0 only: Ours (default team) is read on seed 0 (not its
    3-seed mean, nor the naive team's seed 0), and against its shuffled-experts control too."""
    for seed, acc in enumerate((0.50, 0.90, 0.90)):
        write_run(tmp_path, f"ours{seed}", acc, n=1000, seed=seed, **KEY)
        write_run(tmp_path, f"ctl{seed}", 0.30, n=1000, seed=seed,
                  **{**KEY, "method": "shuffled_experts"})
    write_run(tmp_path, "naive0", 0.95, n=1000, seed=0, **{**KEY, "team": "naive"})
    write_run(tmp_path, "hr0", 0.40, n=1000, seed=0, **{**KEY, "method": "hard_routing"})
    write_run(tmp_path, "nca0", 0.60, n=1000, seed=0, **{**KEY, "method": "no_cross_attn"})
    claims = paper_claims(agg.load_runs(tmp_path), 8)
    hard = next(c for c in claims if c.startswith("- Table 1: on Arithmetic, Ours (Default "
                                                  "Team) beats Hard Routing (paper: 75.26 vs "
                                                  "32.47)"))
    assert "**holds here**" in hard and "vs Hard Routing (seed 0): 50.00 vs 40.00" in hard
    assert "vs shuffled experts (seeds 0, 1, 2): 76.67 vs 30.00" in hard
    cross = next(c for c in claims if "beats Ours w/o Cross-Attn (n=3)" in c)
    assert "**does NOT hold here**" in cross and "50.00 vs 60.00" in cross
    # a family no baseline ran has no such claim
    assert not any(c.startswith("- Table 1: on Algorithmic") for c in claims)


def test_a_one_seed_cell_is_weighed_against_the_seed_spread_ours_and_its_control_show(
        tmp_path: Path):
    """Figure 6's m = 2 runs on seed 0 only, 20 of 400 items (5 points) above m = 8 there:
    beyond the items' 2 SE (2.18), but Ours and its shuffled-experts control differ by +5, -5
    and 0 points over three seeds (sd 5), so one seed's 5 points are within 2 SE (10)."""
    def graded(d: Path, right: int) -> None:
        (d / "eval_samples.jsonl").write_text("".join(
            json.dumps({"id": f"i{k}", "score": float(k < right)}) + "\n" for k in range(400)))

    for seed, (o, c) in enumerate(((140, 120), (120, 140), (130, 130))):
        graded(write_run(tmp_path, f"ours{seed}", o / 400, n=400, seed=seed, **KEY), o)
        graded(write_run(tmp_path, f"ctl{seed}", c / 400, n=400, seed=seed,
                         **{**KEY, "method": "shuffled_experts"}), c)
    graded(write_run(tmp_path, "m2", 0.4, n=400, seed=0, **{**KEY, "latents": 2}), 160)

    def figure6() -> str:
        return next(c for c in paper_claims(agg.load_runs(tmp_path), 8) if "Figure 6" in c)

    claim = figure6()
    assert "**no evidence either way (against it, within noise)**" in claim
    assert ("Δ 5.00 points ≤ 2 SE = 10.00 (one seed; SE from the seed spread of Ours "
            "against shuffled experts on Arithmetic over 3 seeds, sd 5.00 > item SE 1.09)"
            ) in claim
    # without the control's seeds no spread is measured: the items' noise alone calls it
    for seed in range(3):
        shutil.rmtree(tmp_path / f"ctl{seed}")
    claim = figure6()
    assert "**does NOT hold here**" in claim and "> 2 SE = 2.18" in claim
    assert "the items' noise only" in claim


def test_the_regime_claim_needs_every_single_seed_beyond_2_se_of_the_untrained_policy(
        tmp_path: Path):
    from musketeers.reports.claims import learns_claim

    task = "arithmetic:easy@direct"
    write_run(tmp_path, "u", 0.21, n=400, seed=0, task=task, method="untrained")
    for seed, acc in enumerate((0.33, 0.35)):
        write_run(tmp_path, f"s{seed}", acc, n=400, seed=seed, task=task, method="single")
    text = learns_claim(agg.load_runs(tmp_path), "arithmetic")
    assert "**holds here**" in text and "untrained 21.00" in text and "seed 1: 35.00" in text
    # one seed within noise of the untrained policy (2 SE of two 400-item cells ≈ 5.9 points
    # here): no longer evidence that the regime learns
    write_run(tmp_path, "s2", 0.23, n=400, seed=2, task=task, method="single")
    text = learns_claim(agg.load_runs(tmp_path), "arithmetic")
    assert "**holds on 2 of 3 seeds only: within noise**" in text
    # without the untrained run there is nothing to measure against
    shutil.rmtree(tmp_path / "u")
    assert "no control run: not evidence" in learns_claim(agg.load_runs(tmp_path), "arithmetic")
    assert learns_claim(agg.load_runs(tmp_path), "logic") is None


def test_the_regime_claim_must_also_clear_the_shuffled_reward_control_on_its_seeds(
        tmp_path: Path):
    """Updates without reward can raise exact as much as Single's (algorithmic's shuffled-reward
    run at seed 0 did, by shorter answers): then the regime's gain is no evidence of reward."""
    from musketeers.reports.claims import learns_claim

    write_run(tmp_path, "u", 0.17, n=400, seed=0, method="untrained", task="arithmetic")
    write_run(tmp_path, "s0", 0.37, n=400, seed=0, method="single", task="arithmetic")
    ctl = write_run(tmp_path, "ctl", 0.15, n=400, seed=0,
                    **{**KEY, "method": "shuffled_reward"})
    text = learns_claim(agg.load_runs(tmp_path), "arithmetic", 8)
    assert "**holds here**" in text and "vs Ours' shuffled-reward control (seed 0): " \
        "37.00 vs 15.00" in text
    # broken on purpose: the control learns as much as Single
    (ctl / "eval.json").write_text(json.dumps({"exact": 0.365, "score": 0.365, "n": 400}))
    text = learns_claim(agg.load_runs(tmp_path), "arithmetic", 8)
    assert "**above the untrained policy, but not beyond Ours' shuffled-reward control" in text
    # a control on another seed says nothing of Single's
    shutil.rmtree(ctl)
    write_run(tmp_path, "ctl1", 0.365, n=400, seed=1, **{**KEY, "method": "shuffled_reward"})
    text = learns_claim(agg.load_runs(tmp_path), "arithmetic", 8)
    assert "**holds here**" in text and "shuffled-reward" not in text


def test_the_reward_claim_holds_only_where_ours_clears_its_shuffled_reward_control(
        tmp_path: Path):
    """Updates without reward can raise exact too (shorter answers): Ours' exact is evidence
    of RL only beyond its shuffled-reward run on the same seed."""
    from musketeers.reports.claims import reward_claim

    write_run(tmp_path, "ours", 0.56, n=400, seed=0, **KEY)
    ctl = write_run(tmp_path, "ctl", 0.24, n=400, seed=0, **{**KEY, "method": "shuffled_reward"})
    text = reward_claim(agg.load_runs(tmp_path), "arithmetic", 8)
    assert "**holds here**" in text and "56.00 vs 24.00" in text
    # the control learns as much (as algorithmic's did at seed 0): no longer evidence
    (ctl / "eval.json").write_text(json.dumps({"exact": 0.555, "score": 0.555, "n": 400}))
    text = reward_claim(agg.load_runs(tmp_path), "arithmetic", 8)
    assert ("**within noise: no evidence that the reward, not the updates, raised Ours' "
            "exact**") in text
    shutil.rmtree(ctl)
    assert "**no control run: not evidence**" in reward_claim(agg.load_runs(tmp_path),
                                                              "arithmetic", 8)
    assert reward_claim(agg.load_runs(tmp_path), "logic", 8) is None


def test_a_variant_fills_its_family_column_and_the_table_names_it(tmp_path: Path):
    write_run(tmp_path, "v", 0.33, n=400, task="arithmetic:easy@direct", method="single")
    text = table1_markdown(agg.load_runs(tmp_path))
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert header.count("(ours)") == len(TASK_TITLES)  # no column of the variant's own
    assert "| Single | — | 51.56 ± 0.55 | 33.00 (1 seed) |" in text
    assert "Arithmetic = `arithmetic:easy@direct`" in text


def test_a_new_task_fills_tables_and_claims_under_its_own_title(tmp_path: Path):
    """rg:NAME and a task file of one's own need no code edit: their own column and claims,
    titled by the task (the file's ``title``, the dataset's name), and no paper number."""
    mix = tmp_path / "mix.yaml"
    mix.write_text("name: mix\ntitle: Number theory\ndatasets:\n  - {name: gcd}\n")
    runs = tmp_path / "runs"
    for task in ("rg:lcm@direct", f"{mix}:@direct".replace(":@", "@")):
        for seed, (ours, single) in enumerate(((0.6, 0.4), (0.7, 0.5))):
            tag = f"{'mix' if 'yaml' in task else 'lcm'}-{seed}"
            write_run(runs, f"o-{tag}", ours, seed=seed, **{**KEY, "task": task})
            write_run(runs, f"s-{tag}", single, seed=seed, **{**KEY, "task": task,
                                                            "method": "single"})
    loaded = agg.load_runs(runs)
    assert {r.key["task"] for r in loaded} == {"rg:lcm", str(mix)}
    text = table1_markdown(loaded)
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert "| lcm (ours) | lcm (paper) |" in header and "Number theory (ours)" in header
    single = next(line for line in text.splitlines() if line.startswith("| Single |"))
    assert single.endswith("| 45.00 ± 7.07 | n/r | 45.00 ± 7.07 | n/r |"), single
    claims = paper_claims(loaded, 8)
    for title in ("lcm", "Number theory"):
        assert any(c.startswith(f"- §4.2: on {title}, Ours (Default Team) beats Single")
                   for c in claims), title
    mix.unlink()  # rebuilt where the file is absent: the column keeps the file's stem
    assert "| mix (ours) |" in table1_markdown(agg.load_runs(runs))


def test_exact_is_broken_down_by_source_dataset_from_eval_json_or_the_kept_samples(
        tmp_path: Path):
    from musketeers.reports.by_source import by_source_markdown

    for seed, (a, b) in enumerate(((1.0, 0.5), (0.5, 0.0))):
        d = write_run(tmp_path, f"s{seed}", 0.5, seed=seed, **{**KEY, "method": "single"})
        ev = json.loads((d / "eval.json").read_text())
        if seed == 0:  # a newer evaluation writes by_source itself
            ev["by_source"] = {"gcd": {"items": 2, "exact": a, "score": a},
                               "lcm": {"items": 2, "exact": b, "score": b}}
        else:  # an older one: counted from its graded completions
            rows = [{"source": "gcd", "score": 1.0}, {"source": "gcd", "score": 0.0},
                    {"source": "lcm", "score": 0.3}, {"source": "lcm", "score": 0.0}]
            (d / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "eval.json").write_text(json.dumps(ev))
    lines = by_source_markdown(agg.load_runs(tmp_path))
    assert "| Method | gcd | lcm |" in lines
    assert "| Single | 75.0 (n=2) | 25.0 (n=2) |" in lines, lines  # lcm's 0.3 is no exact


def test_figure5_training_reward_claim_is_no_evidence_without_a_control(tmp_path: Path):
    """No control samples without C while it trains, so reward with C above reward without
    C during training is said, but as no evidence, however large the gap."""
    d = write_run(tmp_path, "ours", 0.5, rewards=(0.9, 0.9, 0.9), seed=0, **KEY)
    rows = [{**json.loads(x), "reward_no_context": 0.1}
            for x in (d / "metrics.jsonl").read_text().splitlines()]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    claims = paper_claims(agg.load_runs(tmp_path), 8)
    line = next(c for c in claims if "Arithmetic, reward with C exceeds" in c)
    assert "**no control run: not evidence**" in line and "0.900 vs 0.100" in line


def test_what_was_run_names_the_supervised_warm_up_of_the_runs_that_had_one():
    """The GRPO rates are not the whole story of a warmed-up grid: the report names the
    warm-up, and leaves out the method it does not train (untrained: lr 0, no warm-up)."""
    from musketeers.reports.report import _supervised_warmup

    warm = {"adapter_warmup": 80, "adapter_warmup_batch": 8, "adapter_warmup_lr": 1e-3,
            "warmup_policy_lr": 1e-4}
    assert _supervised_warmup([{"method": "single", **warm}, {"method": "perceiver", **warm},
                               {"method": "untrained", **warm}]) == [
        "- Supervised warm-up before GRPO (gold answers; Single's without C): 80 steps of 8 "
        "items, adapter lr 0.001, LoRA lr 0.0001"]
    assert _supervised_warmup([{"method": "untrained", **warm},
                               {"method": "perceiver", "adapter_warmup": 0}]) == []
