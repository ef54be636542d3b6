"""A stand-in trainer and evaluator that write run folders exactly as the real ones do.

Used by the tests (counting calls, injecting failures) and to preview the figures without
training: `python -m musketeers.grid.fake OUT_DIR` writes a synthetic report.
The curves are made up (routing sharpens, reward rises) and say nothing about the method.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from musketeers.config import TrainConfig
from musketeers.method import methods
from musketeers.run.runlog import eval_files, summarize

FAKE_TEAMS = {
    "default": ["qwen-math", "qwen-coder", "llama-generalist"],
    "naive": ["qwen-math", "qwen-coder", "llama-generalist", "gpt2-random"],
    "llm": ["qwen-math", "qwen-coder", "gpt-oss-20b"],
    "generalist": ["qwen-math", "phi-3.5-mini", "gemma-2-2b", "mistral-7b", "llama-generalist"],
}


def _seed(fields: dict[str, Any]) -> int:
    text = json.dumps({k: fields.get(k) for k in sorted(fields) if k != "run_dir"})
    return sum(text.encode()) * 7919 % (2**31)


def fake_train(fields: dict[str, Any], steps: int = 40) -> Path:
    """Write config.yaml, metrics.jsonl and summary.json for ``fields`` under its run_dir."""
    run_dir = Path(fields["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(_seed(fields))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(dict(fields), sort_keys=False))
    method = methods.get(str(fields.get("method", TrainConfig.method)))
    experts = FAKE_TEAMS.get(fields.get("team") or "", []) if method.uses_experts else []
    favourite = rng.integers(len(experts)) if experts else 0
    # under shuffled rewards routing has nothing to sharpen towards
    sharpen = 0.0 if method.shuffle_rewards else 3.0
    rows = []
    for step in range(steps):
        progress = step / max(1, steps - 1)
        reward = float(np.clip(0.2 + 0.5 * progress + rng.normal(0, 0.05), 0, 1))
        row: dict[str, Any] = {
            "step": step + 1, "reward_mean": reward, "reward_std": 0.3,
            "exact": 0.8 * reward, "kl": 0.01 * progress, "loss": -0.1, "grad_norm": 1.0,
            "completion_len": 60.0, "zero_var_frac": 0.1, "solved_frac": 0.04,
            "truncated_frac": 0.2, "answered_frac": 0.7, "update_skipped": False, "time_s": 1.5,
        }
        if method.attention and experts:
            logits = np.zeros(len(experts))
            logits[favourite] = sharpen * progress
            if "gpt2-random" in experts:
                logits[experts.index("gpt2-random")] = -2.0 * progress
            logits += rng.normal(0, 0.1, len(experts))
            attn = np.exp(logits) / np.exp(logits).sum()
            m = int(fields.get("latents") or 8)
            a = np.tile(attn, (m, 1))
            row["attention"] = a.tolist()
            row["utilisation"] = dict(zip(experts, a.mean(0).tolist(), strict=True))
            row["entropy"] = float(-(a * np.log(a)).sum(1).mean())
            row["reward_no_context"] = float(np.clip(reward - 0.15 * progress, 0, 1))
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summarize(run_dir, steps)  # summary.json by the trainer's own code
    return run_dir


def fake_evaluate(run_dir: Path, limit: int | None = None, context: bool = True) -> dict:
    """Write and return eval.json (or eval_no_context.json) with made-up exact and score
    (partial credit puts the score above exact)."""
    fields = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    rng = np.random.default_rng(_seed(fields))
    exact = float(np.clip(0.5 + rng.normal(0, 0.08) - (0 if context else 0.1), 0, 1))
    result = {"exact": exact, "score": min(1.0, exact + 0.05), "n": limit or 64,
              "split": "val"}
    name = eval_files(context)[0]
    (Path(run_dir) / name).write_text(json.dumps(result))
    return result


def main(out: str) -> None:
    """Preview: run the smoke grid with the fake trainer, 3 seeds, and write its report."""
    from musketeers.design.gridspec import load_grid
    from musketeers.grid.run import run_grid
    from musketeers.grid.walltime import wall_time_lines
    from musketeers.reports.report import write_report

    root = Path(out)
    grid = load_grid("smoke", seeds=[0, 1, 2])
    run_grid(grid, root / "runs", train_fn=fake_train, eval_fn=fake_evaluate,
             config_fn=lambda f: f)
    print(write_report(grid, root / "runs", root / "reports",
                       wall_time=wall_time_lines(grid, root / "runs")))


if __name__ == "__main__":
    main(sys.argv[1])
