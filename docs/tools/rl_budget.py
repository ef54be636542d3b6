"""The RL budget search's table: for each pilot run, its GRPO budget and its training reward's
fitted rise over the steps, with the interval ``run.learning.reward_trend`` gives it.

A budget moves the policy when the rise's 95 % interval excludes 0 (one run's description;
the grid then tests RL's contribution across seeds against its warm-up-only arm).

    python docs/tools/rl_budget.py reports/rl-budget/runs/*    # prints the markdown table
    python docs/tools/rl_budget.py --copy DEST RUN_DIR...       # first publishes each run's
                                                                # small artefacts to DEST/<name>

The table is rebuilt from the published artefacts (config.yaml, metrics.jsonl), copied as a
grid publishes a run (``grid.publish.publish_run``: no checkpoint, machine paths dropped).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

from musketeers.grid.publish import publish_run
from musketeers.run.learning import MIN_STEPS, reward_trend

EDGE = 10  # steps averaged at each end of the run, beside the fitted rise


def row(run: Path) -> str:
    if not all((run / name).is_file() for name in ("config.yaml", "metrics.jsonl")):
        raise SystemExit(f"{run} holds no config.yaml and metrics.jsonl: pass a finished "
                         "run's folder")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    reward = np.array([r["reward_mean"] for r in rows])
    t = reward_trend(rows)
    if t is None:  # too few steps for a line with residuals to judge it by
        raise SystemExit(f"{run} logged {len(rows)} GRPO steps: a rise needs at least "
                         f"{MIN_STEPS}; pass a longer run")
    verdict = ("**rises**" if t.low > 0 else "falls" if t.high < 0 else "no rise shown")
    return (f"| {run.name} | {cfg['policy']} | {cfg['task']} | {cfg['lr']:g} | {cfg['beta']:g} "
            f"| {cfg['prompts_per_micro'] * cfg['grad_accum']} × {cfg['group_size']} "
            f"| {len(rows)} | {100 * reward[:EDGE].mean():.1f} | {100 * reward[-EDGE:].mean():.1f} "
            f"| {100 * t.rise:+.1f} ({100 * t.low:+.1f} to {100 * t.high:+.1f}) "
            f"| {np.mean([r['zero_var_frac'] for r in rows]):.2f} "
            f"| {_edges(rows, 'kl') if cfg['beta'] else '– (β = 0: not computed)'} "
            f"| {_edges(rows, 'truncated_frac', 100, 0)} | {verdict} |")


def _edges(rows: list[dict], key: str, scale: float = 1.0, digits: int = 2) -> str:
    """``key`` over the first and the last ``EDGE`` steps, "first → last"."""
    v = [scale * r[key] for r in rows if r.get(key) is not None]
    return f"{np.mean(v[:EDGE]):.{digits}f} → {np.mean(v[-EDGE:]):.{digits}f}" if v else "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--copy", type=Path, help="keep each run's small artefacts under this folder")
    args = ap.parse_args()
    runs = args.runs
    if args.copy:
        for run in runs:
            publish_run(run, args.copy / run.name)
        runs = [args.copy / run.name for run in runs]
    table = [row(run) for run in sorted(runs)]  # every run read before a line is printed
    print("| run | policy | task | LoRA lr | β | prompts × G per step | GRPO steps "
          f"| reward, first {EDGE} steps (%) | reward, last {EDGE} steps (%) "
          "| fitted rise, points (95 %) | zero-variance groups "
          f"| KL to the reference, first → last {EDGE} steps "
          f"| truncated (%), first → last {EDGE} steps | verdict |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
