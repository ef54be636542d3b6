"""A grid's published result: the report folder holds every finished run's small artefacts.

Run folders (``runs/``) and stores are machine-local and gitignored; a grid outlasts a session
and moves between machines. So after each grid call the report folder
(``reports/<budget>/``) gets ``runs/<name>/`` with what a report is rebuilt from — the resolved
config, metrics.jsonl, summary.json, eval*.json, the evaluated completions, fingerprints — and
the grid's wall-time ledger; never checkpoints or stores. Committing ``reports/pocket/``
publishes the result; ``musketeers ablate --budget pocket --report-only --runs-dir
reports/pocket/runs`` rebuilds the report from it anywhere, and copying its runs into a fresh
``runs/`` lets the grid skip them and go on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from musketeers.reports.grid import Grid, is_finished
from musketeers.reports.ledger import ledger_path

ARTEFACTS = ("config.yaml", "metrics.jsonl", "summary.json", "fingerprints.json", "inputs.json",
             "error.txt",
             "eval.json", "eval_samples.jsonl", "eval_no_context.json",
             "eval_no_context_samples.jsonl")


def publish_runs(grid: Grid, runs_dir: Path, dest: Path) -> list[str]:
    """Copy the artefacts of the grid's finished runs (and its ledger) into ``dest``; returns
    the names copied. A run folder already in ``dest`` is replaced, so a re-run updates it."""
    runs_dir, dest = Path(runs_dir), Path(dest)
    copied = []
    for run in grid.runs:
        src = runs_dir / run.name
        if src.resolve() == (dest / run.name).resolve() or not is_finished(src):
            continue
        out = dest / run.name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in ARTEFACTS:
            if (src / name).is_file():
                shutil.copy2(src / name, out / name)
        copied.append(run.name)
    ledger = ledger_path(runs_dir, grid.budget)
    if ledger.is_file() and ledger.resolve() != ledger_path(dest, grid.budget).resolve():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ledger, ledger_path(dest, grid.budget))
    return copied
