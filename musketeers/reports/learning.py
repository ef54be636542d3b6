"""Does RL move Single? Its training reward's rise over the GRPO steps, tested across seeds.

Each seed's rise is the fitted change of its reward over the run (``run.learning``). The
seeds are independent trainings, so the claim's test is the one-sample t over their rises
with k − 1 degrees of freedom (``stats.paired_seed_test`` with no item part: every seed
samples its own completions), in points of reward. The rise is measured on the GRPO steps
only: a supervised warm-up is logged apart and is not RL's doing.
"""

from __future__ import annotations

import math

from musketeers.reports.aggregate import Run
from musketeers.reports.claims import SINGLE_KEY
from musketeers.reports.keys import select
from musketeers.reports.stats import paired_seed_test
from musketeers.reports.verdicts import claim_line, seeds_text
from musketeers.run.learning import RewardTrend, reward_trend
from musketeers.tasks.variants import task_title


def seed_rises(runs: list[Run]) -> dict[int, RewardTrend]:
    """{seed: its reward trend} of the finished runs with enough logged steps."""
    out = {}
    for r in runs:
        if r.status == "done" and (trend := reward_trend(r.metrics)) is not None:
            out[r.seed] = trend
    return out


def rl_moves_claim(runs: list[Run], task: str, latents: int) -> str | None:
    """"GRPO raises Single's training reward" on ``task``: the seeds' mean rise, its 95 %
    interval (t, k − 1 df), p and smallest detectable rise; it holds where the interval
    excludes 0 above. On one seed the run's own interval (autocorrelation-widened) is
    descriptive only. None when the task has no Single run with logged steps."""
    trends = seed_rises(select(runs, task=task, **SINGLE_KEY))
    if not trends:
        return None
    text = f"RL moves the policy: on {task_title(task)}, Single's training reward rises over " \
           "its GRPO steps"
    per_seed = "; ".join(f"seed {s}: {100 * t.rise:+.2f} over {t.steps} steps"
                         + ("" if math.isnan(t.low) else
                            f" (run's own 95 % {100 * t.low:+.2f} to {100 * t.high:+.2f})")
                         for s, t in sorted(trends.items()))
    rises = [100 * t.rise for _, t in sorted(trends.items())]
    test = paired_seed_test(rises)
    if not test.testable:
        one = next(iter(trends.values()))
        holds = None if math.isnan(one.low) else one.low > 0
        verdict = "one seed: descriptive only, not evidence"
        return claim_line(text, holds, f"fitted rise, points of reward: {per_seed}",
                          verdict=verdict)
    detail = (f"fitted rise, points of reward: {per_seed}; mean over {seeds_text(trends)} "
              f"{test.diff:+.2f}, 95 % {test.low:+.2f} to {test.high:+.2f} (t, df {test.df:.0f}), "
              f"p {test.p:.3g}, smallest detectable {test.mde:.2f}")
    if test.low > 0:
        return claim_line(text, True, detail)
    verdict = ("falls beyond noise" if test.high < 0 else
               f"no evidence either way: the interval holds 0; rises under {test.mde:.2f} "
               "points could not be seen")
    return claim_line(text, test.diff > 0, detail, verdict=verdict)
