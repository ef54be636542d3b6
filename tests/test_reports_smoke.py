"""Ablation grids end to end on the committed fixture stores: real trainer and evaluator,
tiny random policy and experts. Proves grid → runs → tables → figures → report, and that a
second invocation trains nothing. The whole smoke grid (58 runs of 3 steps) runs in `make test`
and CI on every change, in a few minutes on a quiet 2-core CPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import yaml
from typer.testing import CliRunner

from musketeers.cli.main import app
from musketeers.design.gridspec import load_grid
from musketeers.grid.pack import editing, opened, read_pack
from musketeers.reports.tables import TABLE1, TABLE2, TASKS
from musketeers.tasks.variants import task_title

TASK_TITLES = {t: task_title(t) for t in TASKS}  # the paper's columns, titled by their task

REPO = Path(__file__).resolve().parents[1]


def test_three_run_grid_end_to_end(tmp_path: Path):
    grid = tmp_path / "mini.yaml"
    grid.write_text(yaml.safe_dump({
        "budget": "smoke", "seeds": [0],
        "defaults": {"budget": "smoke", "roster": "tiny", "policy": "tiny", "steps": 2,
                     "eval_limit": 2, "pooling": "last", "latents": 8, "threads": 1},
        "runs": [{"task": "arithmetic", "method": "single"},
                 {"task": "arithmetic", "method": "perceiver", "team": "default",
                  "latents": [4, 8], "eval_no_context": True}]}))
    args = ["ablate", "--grid", str(grid), "--runs-dir", str(tmp_path / "runs"),
            "--reports-dir", str(tmp_path / "reports"),
            "--cache-dir", str(REPO / "tests" / "fixtures")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "3 trained" in first.output and "0 failed" in first.output
    out = tmp_path / "reports" / "smoke"
    readme = (out / "README.md").read_text()
    assert "| smoke-arithmetic-single-s0 | done |" in readme
    table1 = (out / "table1.md").read_text()
    assert "| Single | — | 51.56 ± 0.55 | " in table1  # algorithmic not run: shown as —
    for png in ("figure4_arithmetic.png", "figure5_context.png", "figure6_latents.png"):
        assert mpimg.imread(out / png).ndim == 3
    second = CliRunner().invoke(app, args)
    assert "0 trained" in second.output and "3 already done" in second.output
    # the report folder is the published result: each finished run's small artefacts, no
    # checkpoints, enough to rebuild the same report on another machine; one pack beside it
    assert not (out / "runs").exists()
    packed = read_pack(out / "runs.tar.xz")
    assert {Path(m).name for m in packed if m.startswith("smoke-arithmetic-single-s0/")} >= {
        "config.yaml", "metrics.jsonl", "summary.json", "eval.json"}
    assert not [m for m in packed if m.endswith(".safetensors")]
    rebuilt = CliRunner().invoke(app, ["ablate", "--grid", str(grid), "--report-only",
                                       "--runs-dir", str(out / "runs"),
                                       "--reports-dir", str(tmp_path / "elsewhere")])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert (tmp_path / "elsewhere" / "smoke" / "table1.md").read_text() == table1
    # another machine or a fresh clone: no run folders, only the committed report. The grid adopts
    # what was published (and its ledger) and runs only what is not there
    with editing(out / "runs") as folder:
        shutil.rmtree(folder / "smoke-arithmetic-single-s0")
    fresh = [*args[:args.index("--runs-dir") + 1], str(tmp_path / "runs2"),
             *args[args.index("--runs-dir") + 2:]]
    third = CliRunner().invoke(app, fresh)
    assert third.exit_code == 0, third.output
    assert "2 finished runs adopted" in third.output
    assert "1 trained" in third.output and "2 already done" in third.output
    ledger = (tmp_path / "runs2" / "ledger-smoke.jsonl").read_text().splitlines()
    first_ledger = (tmp_path / "runs" / "ledger-smoke.jsonl").read_text().splitlines()
    assert ledger[:len(first_ledger)] == first_ledger and len(ledger) > len(first_ledger)
    assert "smoke-arithmetic-single-s0/eval.json" in read_pack(out / "runs.tar.xz")
    # a setting of the context runs changes: they are set aside and run again, and their
    # published copies move to runs/stale/ beside the new ones, so a report rebuilt from the
    # published folder never mixes the two settings (Single reads no adapter: it stays)
    raw = yaml.safe_load(grid.read_text())
    raw["defaults"]["adapter_lr"] = 5e-5
    grid.write_text(yaml.safe_dump(raw))
    fourth = CliRunner().invoke(app, fresh)
    assert fourth.exit_code == 0, fourth.output
    assert "2 trained" in fourth.output and "2 stale" in fourth.output
    with opened(out / "runs") as published:
        kept = sorted(p.name.split(".")[0] for p in (published / "stale").iterdir())
        context_runs = sorted(p.name for p in published.glob("smoke-*perceiver*"))
        assert kept == context_runs and len(kept) == 2
        for name in context_runs:
            assert yaml.safe_load((published / name / "config.yaml").read_text())[
                "adapter_lr"] == 5e-5
        old = next((published / "stale").iterdir())
        assert yaml.safe_load((old / "config.yaml").read_text())["adapter_lr"] == 1e-4
        assert (old / "eval.json").is_file()


def _decodes_non_empty(png: Path) -> bool:
    """A PNG that decodes to an RGB(A) image with something drawn on it (not one flat colour)."""
    img = mpimg.imread(png)
    return img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100 and float(img.std()) > 0


def test_smoke_grid_end_to_end(tmp_path: Path):
    args = ["ablate", "--budget", "smoke", "--runs-dir", str(tmp_path / "runs"),
            "--reports-dir", str(tmp_path / "reports"),
            "--cache-dir", str(REPO / "tests" / "fixtures")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    grid = load_grid("smoke")
    assert f"{len(grid.runs)} trained" in first.output and "0 failed" in first.output

    out = tmp_path / "reports" / "smoke"
    readme = (out / "README.md").read_text()
    table1, table2 = (out / "table1.md").read_text(), (out / "table2.md").read_text()
    for row in TABLE1:
        assert f"| {row.label} |" in table1
    for title in TASK_TITLES.values():
        assert f"{title} (ours)" in table1
    for label, _, _ in TABLE2:
        assert label in table2
    # every cell has a result: nothing failed, nothing missing
    cells = "\n".join(x for x in (table1 + table2).splitlines() if x.startswith("|"))
    assert "FAILED" not in cells and "| — |" not in cells  # (the legend names both)
    for run in grid.runs:
        assert f"| {run.name} | done |" in readme
    # the Table 1 header has a column per task (ours and the paper's)
    header = next(line for line in table1.splitlines() if line.startswith("| Method"))
    for title in TASK_TITLES.values():
        assert f"{title} (ours)" in header and f"{title} (paper)" in header
    pngs = sorted(out.glob("*.png"))
    assert {p.name for p in pngs} >= {"figure5_context.png", "figure6_latents.png",
                                      *(f"figure4_{t}.png" for t in TASK_TITLES)}
    for png in pngs:
        assert _decodes_non_empty(png), png
        assert f"({png.name})" in readme  # shown inline
    # Figure 5 is drawn from the per-step π(y|x) rewards the grid's no_context_every logs
    runs = tmp_path / "runs"
    fig5 = [r for r in grid.runs if r.fields.get("no_context_every")]
    assert len(fig5) == 2
    for r in fig5:
        rows = [json.loads(x) for x in (runs / r.name / "metrics.jsonl").read_text().splitlines()]
        assert all(0.0 <= row["reward_no_context"] <= 1.0 for row in rows)
    # 3 steps make ρ(reward, H) computable; a random policy's reward is 0 at every step, so
    # the report must say "undefined" per task rather than "no runs" or a made-up number
    for title in TASK_TITLES.values():
        line = next(x for x in readme.splitlines() if x.startswith(f"- {title}: "))
        assert line.startswith(f"- {title}: ρ = ") or "undefined in all" in line, line

    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "0 trained" in second.output and f"{len(grid.runs)} already done" in second.output


def test_a_grid_of_new_tasks_precomputes_trains_and_reports_them(tmp_path: Path, monkeypatch):
    """rg:NAME and a task file of one's own through a whole grid with no code edit: their
    stores are built (the task without experts' runs too), and the report titles them by the
    task and breaks the file's mix down by source dataset."""
    monkeypatch.chdir(tmp_path)
    Path("mix.yaml").write_text("name: mix\ntitle: Number theory\ndatasets:\n"
                                "  - {name: gcd, config: {max_value: 100}}\n  - {name: lcm}\n")
    Path("grid.yaml").write_text(yaml.safe_dump({
        "budget": "smoke", "name": "mix", "seeds": [0],
        "precompute": {"limit": 8, "dtype": "float32"},
        "defaults": {"budget": "smoke", "roster": "tiny", "policy": "tiny", "steps": 1,
                     "eval_limit": 6, "latents": 8, "threads": 1},
        "runs": [{"task": "mix.yaml", "method": ["single", "perceiver"], "team": "default"},
                 {"task": "rg:gcd@direct", "method": "single"}]}))
    out = CliRunner().invoke(app, ["ablate", "--grid", "grid.yaml", "--runs-dir", "runs",
                                   "--reports-dir", "reports", "--cache-dir", "stores"])
    assert out.exit_code == 0, out.output
    assert "3 trained" in out.output and "0 failed" in out.output
    assert Path("stores/rg:gcd@direct.zarr").is_dir()  # built for a run that reads no expert
    readme = Path("reports/mix/README.md").read_text()
    header = next(x for x in Path("reports/mix/table1.md").read_text().splitlines()
                  if x.startswith("| Method"))
    assert "| Number theory (ours) | Number theory (paper) |" in header and "gcd (ours)" in header
    assert "**Number theory**, exact (%) per source dataset" in readme
    assert "| Method | gcd | lcm |" in readme
    with opened(Path("reports/mix/runs")) as folder:  # its pack, runs.tar.xz
        published = yaml.safe_load(next(folder.glob("*mix*single*/config.yaml")).read_text())
    assert published["task"] == "mix.yaml"
