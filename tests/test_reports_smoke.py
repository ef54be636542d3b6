"""Ablation grids end to end on the committed fixture stores: real trainer and evaluator,
tiny random policy and experts. Proves grid → runs → tables → figures → report, and that a
second invocation trains nothing. A three-run grid runs with the fast tests (~2 min here);
the whole smoke grid (42 runs, ~40 s each on this 2-core CPU) is marked slow.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest
import yaml
from typer.testing import CliRunner

from musketeers.cli.main import app
from musketeers.reports.grid import load_grid
from musketeers.reports.tables import TABLE1, TABLE2, TASK_TITLES

REPO = Path(__file__).resolve().parents[1]


def test_three_run_grid_end_to_end(tmp_path: Path):
    grid = tmp_path / "mini.yaml"
    grid.write_text(yaml.safe_dump({
        "budget": "smoke", "seeds": [0],
        "defaults": {"budget": "smoke", "roster": "tiny", "policy": "tiny", "steps": 2,
                     "eval_limit": 2, "pooling": "last", "latents": 8},
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


@pytest.mark.slow

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
    assert "FAILED" not in table1 + table2 and "| — |" not in table1 + table2
    for run in grid.runs:
        assert f"| {run.name} | done |" in readme
    pngs = sorted(out.glob("*.png"))
    assert {p.name for p in pngs} >= {"figure5_context.png", "figure6_latents.png",
                                      "figure4_arithmetic.png"}
    for png in pngs:
        assert png.stat().st_size > 10_000 and mpimg.imread(png).ndim == 3

    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "0 trained" in second.output and f"{len(grid.runs)} already done" in second.output
