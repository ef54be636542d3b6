"""What the runs' own logs say about how they trained, beside their results: how much GRPO
signal the sampled groups carried (zero-variance groups, skipped updates) and whether the
greedy validation completions kept the answer format (tagged, answered, truncated)."""

from __future__ import annotations

import numpy as np

from musketeers.reports.aggregate import Run
from musketeers.reports.verdicts import bullet

# Above this mean fraction of zero-variance groups most of a step's samples teach nothing; the
# pocket regime was sized for at most this share over the main runs.
WEAK_SIGNAL = 0.5


def learning_signal(runs: list[Run]) -> list[str]:
    """How much GRPO signal the grid's training had, as measured: the share of sampled groups
    whose G rewards were all equal (advantage 0), the updates skipped for want of any such
    signal, and, only for runs trained without ``skip_no_signal``, the warning that their
    KL-only updates moved the adapter without reward."""
    # a baseline whose GRPO step is at lr 0 (``untrained``, ``warmup_only``) samples groups
    # too, but its share says nothing of the signal the trained runs had
    trained = [r for r in runs if r.status == "done" and r.no_signal is not None
               and (r.spec is None or r.spec.rl_updates)]
    if not trained:
        return answer_format(runs)
    fracs = [float(r.no_signal) for r in trained]
    mean = float(np.mean(fracs))
    head = (f"Learning signal: on average {mean:.0%} of the sampled groups had G equal rewards "
            "(zero advantage, no policy gradient), "
            + ("at most" if mean <= WEAK_SIGNAL else "above")
            + f" the {WEAK_SIGNAL:.0%} the pocket regime was sized for")
    items = [f"{min(fracs):.0%}–{max(fracs):.0%} across the {len(fracs)} finished trained "
             f"run{'s' * (len(fracs) != 1)}"]
    by_method: dict[str, list[float]] = {}
    for r in trained:
        name = r.spec.label if r.spec is not None else str(r.config.get("method"))
        if r.key.get("team") is not None:
            name += f" ({r.key['team']} team)"
        by_method.setdefault(name, []).append(float(r.no_signal))
    if len(by_method) > 1:
        # a method that collapses drags the mean up: say which carry the share
        items.append("by method: " + ", ".join(f"{k} {np.mean(v):.0%}"
                                               for k, v in by_method.items()))
    both = [(float(r.no_signal), s) for r in trained
            if (s := r.metric_mean("solved_frac")) is not None]
    if both and sum(z for z, _ in both) > 0:
        easy = sum(s for _, s in both) / sum(z for z, _ in both)
        items.append(f"of the zero-variance groups of the {len(both)} run"
                     f"{'s' * (len(both) != 1)} that logged it, {easy:.0%} were solved by "
                     "every sample (too easy) and the rest scored alike below 1 (too hard)")
    skipped = [(r.updates_skipped, len(r.metrics)) for r in trained
               if r.updates_skipped is not None]
    if skipped:
        items.append(f"{sum(k for k, _ in skipped)} of {sum(n for _, n in skipped)} updates "
                     "were skipped because no group in them had signal")
    if mean > WEAK_SIGNAL:
        items.append("most samples carried no reward signal, so differences between methods "
                     "rest on few informative groups: read them with the verdicts' noise bars")
    unguarded = [r for r in trained if r.config.get("skip_no_signal") is False]
    if unguarded:
        items.append(f"{len(unguarded)} of these runs trained without `skip_no_signal`: on "
                     "their updates without signal the KL term's gradient is all there is, "
                     "and Adam scales even a tiny one to lr-sized steps, so their routing "
                     "curves move without reward")
    return [bullet(head, items), *answer_format(runs)]


STOPPED_ANSWERING = 50  # % of greedy completions with an <answer>, below which a run is named
# % of greedy completions cut off at max_new_tokens above which a run is named: under lenient
# extraction a rambling policy still "answers" (its last line), so truncation is what shows it
MOSTLY_TRUNCATED = 50


def answer_format(runs: list[Run]) -> list[str]:
    """Why greedy exact and score are low, when they are: completions without an
    ``<answer>`` score 0, and a completion cut off at max_new_tokens rarely reached one."""
    out = []
    for key, what in (("tagged", "wrote an `<answer>…</answer>` pair"),
                      ("answered", "had an answer for the scorer to grade under the run's "
                                   "extraction (lenient also takes a last line)"),
                      ("truncated", "ran out of new tokens before ending")):
        shares = [v for r in runs if (v := r.eval_share(key)) is not None]
        if shares:
            out.append(f"{np.mean(shares):.0f}% {what} ({min(shares):.0f}%–"
                       f"{max(shares):.0f}% over {len(shares)} run{'s' * (len(shares) != 1)} "
                       "with that count)")
    if not out:
        return []
    silent = [f"{r.name} ({v:.0f}%)" for r in runs
              if (v := r.eval_share("answered")) is not None and v < STOPPED_ANSWERING]
    if silent:
        # such a policy gets reward 0 on every sample, so no update has signal again: its
        # exact measures the collapse, not what the method does with its experts
        out.append(f"runs whose policy stopped answering (under {STOPPED_ANSWERING}% answered): "
                   f"{', '.join(silent)}; their exact measures that collapse, not the method")
    rambling = [f"{r.name} ({v:.0f}%)" for r in runs
                if (v := r.eval_share("truncated")) is not None and v > MOSTLY_TRUNCATED]
    if rambling:
        out.append(f"runs whose greedy completions mostly ran out of new tokens (over "
                   f"{MOSTLY_TRUNCATED}% truncated): {', '.join(rambling)}; a cut-off answer "
                   "rarely scores, so their exact measures the lost answer format first")
    return [bullet("Answer format of the greedy validation completions (one without an answer "
                   "scores 0 whatever it says; each run's are in its `eval_samples.jsonl`):",
                   out)]
