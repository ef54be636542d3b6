"""The demo's main job: a measured effect of C on real pocket models, beside its control.

An oracle expert (SmolLM2-135M reading the question followed by "The answer is {gold}.",
cache/prompts.oracle_view) is the one expert that surely knows each answer. On a task the
policy cannot compute (``oracle_demo.task.yaml``: how many 1 bits a number of 1-255 has), a
policy that learns to read C gains only through C. Two runs of the SmolLM2-135M policy on
the same seed, with the same supervised warm-up (φ and the LoRA fitted to gold answers of
train items) and the same GRPO step, differ in one thing: Ours reads each item's own oracle
vectors, its ``shuffled_experts`` control another item's. Both are graded greedily on the
same validation items, and the comparison is paired item by item (``compare``): each arm's
exact, the difference with its 95 % interval, McNemar's exact test on the items where the
arms disagree, and the smallest effect this many items could detect. The task's best
constant answer is printed beside them. One seed, so the interval holds the items' noise
only: a demo, not a claim (the pocket-positive grid makes the claim over seeds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.config import TrainConfig, resolve_config

# count_bits on numbers 1-255: every answer one digit, and the 135M policy cannot count bits
TASK = str(Path(__file__).with_name("oracle_demo.task.yaml"))
TEAM_FILE = Path(__file__).with_name("oracle_demo.team.yaml")
POLICY = "smollm2"
OURS, CONTROL = "perceiver", "shuffled_experts"
ARMS = (OURS, CONTROL)

# The regime (docs/benchmarks-history.md, "the demo's main job"): pocket-positive's reader
# (standardised vectors, C at the embeddings' scale, φ and the LoRA fitted together by
# supervision), sized for the 135M policy on an idle 2-core CPU. Fewer than ~100 warm-up steps
# or φ's lr under 1e-2 left this policy answering the answers' prior whatever C said.
LIMIT = 128  # items per split precomputed; the warm-up draws from the train split
EVAL_ITEMS = 68  # every question of the 128 val items once (count_bits repeats numbers)
WARMUP = 150
STEPS = 1
# the oracle's layer-12 state holds the gold digit for a linear probe on 98 % of items, its
# last layer's on 87 %
POOLING = "layer:12"
REGIME: dict[str, Any] = dict(
    latents=8, standardize_experts=True, context_scale="embedding",
    adapter_warmup_batch=8, adapter_warmup_lr=1e-2, warmup_policy_lr=1e-3,
    prompts_per_micro=4, grad_accum=1, group_size=4, max_new_tokens=8,
    extraction="lenient", dtype="float32", device="cpu")


def demo_config(method: str, *, seed: int, warmup: int, steps: int, cache_dir: Path,
                run_dir: Path, task: str = TASK, policy: str = POLICY,
                team_file: Path = TEAM_FILE, pooling: str = POOLING,
                **overrides: Any) -> TrainConfig:
    """One arm's TrainConfig: the demo's regime with the arm's method. How many items are
    graded is no part of it, so another --eval-items re-evaluates the same trained run."""
    values = dict(REGIME, task=task, pooling=pooling, team=None, team_file=str(team_file),
                  method=method, policy=policy, budget="smoke", seed=seed, cache_dir=str(cache_dir),
                  run_dir=str(run_dir), steps=steps, adapter_warmup=warmup,
                  save_every=steps)
    values.update(overrides)
    return resolve_config(None, values)


def run_arm(cfg: TrainConfig, eval_items: int) -> Path:
    """Train (or resume, or reuse) one arm and evaluate it on ``eval_items`` val items;
    returns its samples file. A finished run with an evaluation of this size is reused."""
    from musketeers.run.evaluate import evaluate
    from musketeers.run.runfolder import is_finished
    from musketeers.run.runlog import eval_files
    from musketeers.run.trainer import train

    run_dir = cfg.run_path()
    result, samples = (run_dir / f for f in eval_files(True))
    if _evaluated(result, samples, eval_items):
        return samples
    if not is_finished(run_dir):  # a stopped arm resumes; a finished one is only graded again
        train(cfg, resume=(run_dir / "config.yaml").is_file(), plot=False)
    evaluate(run_dir, limit=eval_items)
    return samples


def _evaluated(result: Path, samples: Path, eval_items: int) -> bool:
    try:
        return samples.is_file() and json.loads(result.read_text())["limit"] == eval_items
    except (OSError, ValueError, KeyError, TypeError):
        return False


@dataclass(frozen=True)
class Comparison:
    """Ours − control over the same items, graded item by item (points)."""

    n: int
    ours: float  # exact, %
    control: float
    se: float  # SE of the mean paired difference over items
    low: float  # 95 % interval (t, n − 1 df)
    high: float
    mde: float | None  # smallest true difference found with 80 % power; None where se = 0
    ours_only: int  # items Ours gets right and the control wrong
    control_only: int
    mcnemar_p: float  # exact two-sided binomial test on the discordant items

    @property
    def diff(self) -> float:
        return self.ours - self.control

    @property
    def clear(self) -> bool:
        """The interval excludes zero."""
        return self.low > 0 or self.high < 0


def compare(ours: Path, control: Path) -> Comparison:
    """The paired comparison of two evaluations' samples files. Both must grade the same
    items in the same order; otherwise the difference would be two samples' noise, not C's
    effect, and it is refused."""
    from scipy import stats as sps

    from musketeers.reports.paired import by_item, paired
    from musketeers.reports.stats import mde

    a, b = by_item(ours, "exact"), by_item(control, "exact")
    if list(a) != list(b):
        raise UserError(f"{ours} and {control} grade different validation items, so they "
                        "cannot be paired; evaluate both runs with the same --limit: "
                        "musketeers demo oracle --eval-items N")
    p = paired([(ours, control)])
    if p is None:
        raise UserError(f"{ours} grades fewer than 2 items; pass --eval-items 2 or more")
    df = p.n - 1
    half = float(sps.t.ppf(0.975, df)) * p.se
    only_a = sum(a[i] > b[i] for i in a)
    only_b = sum(b[i] > a[i] for i in a)
    pval = float(sps.binomtest(only_a, only_a + only_b, 0.5).pvalue) if only_a + only_b else 1.0
    return Comparison(p.n, p.a, p.b, p.se, p.diff - half, p.diff + half,
                      mde(p.se, df) if p.se > 0 else None, only_a, only_b, pval)


def constant_baseline(task: str, samples: Path, limit: int) -> tuple[str, float]:
    """The best constant answer (the train split's most common gold) and its exact, %, on
    the items of ``samples``: what a policy scores that ignores every question. ``limit`` is
    the items per split precomputed: the graded items are among the first ``limit`` of val
    (each question once, so not always the first ones)."""
    from musketeers.tasks import build_items
    from musketeers.tasks.forgeries import best_scores, constant_answers

    ids = [json.loads(line)["id"] for line in samples.read_text("utf-8").splitlines()]
    val = {it.id: it for it in build_items(task, "val", limit=limit)}
    if set(ids) - set(val):
        raise UserError(f"{samples} grades items that are not among {task}'s first {limit} "
                        "validation items; "
                        "evaluate the run again: musketeers demo oracle")
    consts = constant_answers(build_items(task, "train", limit=limit))
    if len(set(consts.values())) != 1:  # one dataset here; a mix would need one per source
        raise UserError(f"{task} mixes datasets; the demo's baseline needs a single one")
    const = next(iter(consts.values()))
    exact, _ = best_scores([val[i] for i in ids], lambda _it: [const])
    return const, 100.0 * exact


def report(c: Comparison, const: tuple[str, float], *, task: str, warmup: int, steps: int,
           seed: int, policy: str = POLICY, minutes: float | None = None) -> list[str]:
    """What a newcomer reads: each arm, the difference with its interval, and what it means."""
    task = Path(task).name if task.endswith((".yaml", ".yml")) else task  # a task file: its name
    mde_text = f"{c.mde:.1f}" if c.mde is not None else "undefined (the arms disagree on no item)"
    lines = [
        f"oracle demo: the {policy} policy on {task}, seed {seed}, {warmup} supervised "
        f"warm-up steps then {steps} GRPO step{'s' * (steps != 1)} per arm; greedy exact on "
        f"the same {c.n} validation items",
        f"  Ours, C from the oracle's vectors of the item itself   {c.ours:5.1f} %",
        f"  control, C from another item's vectors (shuffled)     {c.control:5.1f} %",
        f"  best constant answer, {const[0]!r} to every question          {const[1]:5.1f} %",
        f"  Ours − control: {c.diff:+.1f} points, 95 % interval {c.low:+.1f} to {c.high:+.1f} "
        f"(paired over items, SE {c.se:.1f}); McNemar exact p = {c.mcnemar_p:.2g} "
        f"({c.ours_only} items only Ours gets right, {c.control_only} only the control)",
        f"  smallest difference these {c.n} items detect with 80 % power: {mde_text} points"
        # the paired SE counts only disagreements: with few of them it is itself rough
        + (" (rough: fewer than 10 items disagree)" if c.ours_only + c.control_only < 10
           else ""),
    ]
    if c.clear and c.diff > 0:
        verdict = ("the item's own oracle vectors raise exact beyond the interval's noise: "
                   "C carries what the expert knows")
    elif c.clear:
        verdict = "the control is ahead beyond the interval: C's information did not help here"
    else:
        verdict = ("no clear difference on these items (the interval holds zero): in this "
                   "budget the comparison cannot tell C's effect from the items' noise")
    lines.append(f"  reading: {verdict}.")
    lines.append("  one seed and the items' noise only: a demonstration, not a claim; the claim "
                 "over seeds is the pocket-positive grid's (reports/pocket-positive/).")
    if minutes is not None:
        lines.append(f"  ({minutes:.1f} min)")
    return lines


def check_positive(n: int, warmup: int, steps: int, eval_items: int) -> None:
    """Bad sizes are refused before any model loads."""
    for name, v, least in (("--limit", n, 8), ("--warmup", warmup, 0), ("--steps", steps, 1),
                           ("--eval-items", eval_items, 2)):
        if v < least:
            raise UserError(f"{name} must be at least {least}, got {v}")
    if eval_items > n:
        raise UserError(f"--eval-items {eval_items} exceeds the {n} val items precomputed; "
                        f"pass --limit {eval_items} or more")


def run_name(cfg: TrainConfig) -> str:
    """A run folder per arm and setting: a re-run with the same settings resumes or reuses
    it; one with other settings (steps, policy, task, ...) gets its own, never a refused
    --resume or another setting's evaluation. The digest leaves out where things live and
    how many items are graded (a new --eval-items re-evaluates the same run)."""
    import dataclasses
    import hashlib

    keep = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("run_dir", "cache_dir", "eval_limit")}
    digest = hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()
    return f"demo-oracle-{cfg.method}-s{cfg.seed}-{digest[:8]}"


def run_demo(*, task: str = TASK, team_file: Path = TEAM_FILE, policy: str = POLICY,
             limit: int = LIMIT, warmup: int = WARMUP, steps: int = STEPS,
             eval_items: int = EVAL_ITEMS, seed: int = 0, cache_dir: Path | str | None = None,
             runs: Path = Path("runs"), pooling: str = POOLING
             ) -> tuple[Comparison, tuple[str, float]]:
    """Precompute the oracle's vectors (skipped where stored), train and evaluate both arms
    on one seed, and compare them on the same validation items."""
    from musketeers.run.features import cache_root, precompute_features

    check_positive(limit, warmup, steps, eval_items)
    precompute_features(task, team_file=team_file, limit=limit, cache_dir=cache_dir,
                        dtype="float32", router=False)
    samples = {}
    for method in ARMS:
        cfg = demo_config(method, seed=seed, warmup=warmup, steps=steps,
                          cache_dir=cache_root(cache_dir), run_dir=Path(runs), task=task,
                          policy=policy, team_file=team_file, pooling=pooling)
        cfg = replace(cfg, run_dir=str(Path(runs) / run_name(cfg)))
        samples[method] = run_arm(cfg, eval_items)
    return (compare(samples[OURS], samples[CONTROL]),
            constant_baseline(task, samples[OURS], limit))
