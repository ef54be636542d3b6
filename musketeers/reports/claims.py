"""The paper's findings, each tested on our runs: its qualitative claims (§4.2–§4.4) and every
table cell beside the paper's number. A verdict says whether a difference clears the noise
of the runs behind it, since pocket-sized runs rarely do, and every claim for Ours is stated
against a control (musketeers.methods) on the same seeds: Ours' exact against the
shuffled-experts control (does it need what the experts say about this item?), its routing
(§4.3) against the shuffled-reward control (does reward, not the update itself, shape it?).
A claim without its control run is no evidence either way, and says so. Accuracy here is
``exact`` (share of greedy completions scoring 1)."""

from __future__ import annotations

import math

import numpy as np

from musketeers import experiment, methods
from musketeers.reports.aggregate import (
    Cell,
    Run,
    bernoulli_se,
    cell,
    select,
    series,
)
from musketeers.reports.figures import LATENTS
from musketeers.reports.paired import paired_cells, paired_context, paired_context_gain
from musketeers.reports.routing_claims import routing_claims
from musketeers.reports.tables import (
    DEFAULT_LATENTS,
    DEFAULT_POOLING,
    DEFAULT_TEAM,
    EXACT_CONTROL,
    ROUTING_CONTROL,
    TABLE2_KEY,
    TASK_TITLES,
    TASKS,
    paper_text,
    table1_cells,
    table2_cells,
)
from musketeers.reports.verdicts import (
    NO_CONTROL,
    SeedSpread,
    claim_line,
    seeds_text,
    two_se_clause,
    versus,
    within_noise,
)

FIGURE6_TASK = experiment.PARTS["figure6"].values("task")[0]


def routed(run: Run) -> bool:
    """§4.3's claims are stated for the run's method (the registry's ``routed``) and it is no
    control: a control's routing is the comparison, not the finding."""
    return run.spec is not None and run.spec.routed and run.spec.control_of is None


def compare(ours: Cell, paper: tuple[float, float] | None) -> str | None:
    """'agrees (within 1 std)', 'above' or 'below' the paper, by how much; None if unknown.

    "Within 1 std" means |ours − paper| ≤ the larger of our and the paper's std.
    """
    if paper is None or not ours.values:
        return None
    if ours.variants:
        return f"not comparable: ours ran {', '.join(ours.variants)}, not the paper's items"
    diff = ours.mean - paper[0]
    tol = max(ours.std or 0.0, paper[1])
    if abs(diff) <= tol:
        return f"agrees (within 1 std: {diff:+.2f} points, tolerance {tol:.2f})"
    return f"{'above' if diff > 0 else 'below'} the paper by {abs(diff):.2f} points " \
           f"(> 1 std = {tol:.2f})"


def seed_spread(runs: list[Run], task: str, latents: int = DEFAULT_LATENTS
                ) -> SeedSpread | None:
    """The noise a one-seed cell (Table 2's, Figure 6's, a baseline's) has beyond its items':
    the spread of Ours' per-seed differences from its shuffled-experts control, the
    several-seed pair most like a one-seed variant of Ours against Ours. None without ≥ 2
    seeds of both."""
    p = paired_cells(cell(runs, task=task, pooling=DEFAULT_POOLING, latents=latents,
                          **DEFAULT_TEAM), exact_control(runs, task, latents))
    if p is None or p.seed_se is None:
        return None
    return SeedSpread(p.seed_se * math.sqrt(p.runs),
                      f"Ours against shuffled experts on {TASK_TITLES[task]} over {p.runs} seeds")


def beats_claim(text: str, ours: Cell, base: Cell, base_name: str, control: Cell,
                spread: SeedSpread | None = None) -> str:
    """"Ours beats ``base``", stated against ``base`` and against Ours' shuffled-experts
    control on the same seeds: it holds only if Ours clears both. ``spread``: the seed noise
    of a ``base`` run on one seed."""
    vs_base = versus(ours, base, base_name, spread)
    if vs_base is None:
        return claim_line(text, None, "")
    ahead, noise, clause = vs_base
    vs_ctl = versus(ours, control, "shuffled experts")
    if vs_ctl is None:
        return claim_line(text, ahead, f"{clause}; no shuffled-experts run on Ours' seeds",
                          noise, NO_CONTROL if ahead else None)
    c_ahead, c_noise, c_clause = vs_ctl
    verdict = None  # within noise of the baseline already is no finding; else the control
    if ahead and not noise and c_noise:
        verdict = "does not clear its control: within noise of it, not evidence"
    elif ahead and not noise and not c_ahead:
        verdict = "does not clear its control"
    elif noise and not c_ahead and not c_noise:  # the control wins: worth saying even here
        verdict = f"within noise of {base_name}, and behind its control beyond noise"
    return claim_line(text, ahead, f"{clause}; {c_clause}", noise, verdict)


def _sampled_steps(run: Run) -> int:
    return sum(1 for row in run.metrics if row.get("reward_no_context") is not None)


def _completions_per_step(run: Run) -> int:
    c = run.config
    return int(c.get("prompts_per_micro") or 0) * int(c.get("grad_accum") or 1) * int(
        c.get("group_size") or 0)


def reward_control(runs: list[Run], task: str, latents: int) -> Cell:
    """Ours' (default team) shuffled-reward control on ``task``: the regime's and the
    reward's control alike."""
    return cell(runs, task=task, pooling=DEFAULT_POOLING, latents=latents,
                **{**DEFAULT_TEAM, "method": ROUTING_CONTROL})


def exact_control(runs: list[Run], task: str, latents: int) -> Cell:
    """Ours' (default team) shuffled-experts control on ``task``: every exact claim's."""
    return cell(runs, task=task, pooling=DEFAULT_POOLING, latents=latents,
                **{**DEFAULT_TEAM, "method": EXACT_CONTROL})


def learns_claim(runs: list[Run], task: str, latents: int = DEFAULT_LATENTS) -> str | None:
    """"Training teaches Single something" on ``task``: every seed of Single's exact above the
    untrained policy's by more than 2 SE (the two evaluations' Bernoulli bounds). The regime
    check behind every other claim: where Single learns nothing, no method can be told apart.
    Greedy evaluation of the untrained policy does not depend on the seed, so one untrained
    run serves every seed. Where Ours' shuffled-reward control ran on Single's seeds, Single
    must also beat it: that run takes as many updates on the same items with its rewards
    permuted, so what it gains is what updates without reward gain (it reads C and Single does
    not; the grid runs no Single with shuffled rewards). None when the task has no Single run."""
    single = cell(runs, task=task, method="single")
    if not single.graded:
        return None
    text = f"the regime: on {TASK_TITLES[task]}, training raises Single's exact above the " \
           "untrained policy's"
    base = cell(runs, task=task, method="untrained")
    if not base.values:
        return claim_line(text, None, "no untrained run", verdict=NO_CONTROL)
    u = base.mean
    clears, parts = [], []
    for r in sorted(single.graded, key=lambda r: r.seed):
        one = Cell([r])
        noise, why = within_noise(one, base)
        clears.append(one.mean > u and not noise)
        parts.append(f"seed {r.seed}: {one.mean:.2f} ({'+' if one.mean >= u else ''}"
                     f"{one.mean - u:.2f}; {why})")
    ahead = single.mean > u
    detail = f"untrained {u:.2f}; " + "; ".join(parts)
    verdict = None
    if ahead and not all(clears):
        verdict = (f"holds on {sum(clears)} of {len(clears)} seeds only: within noise"
                   if any(clears) else "within noise: not evidence")
    if (rival := versus(single, reward_control(runs, task, latents),
                        "Ours' shuffled-reward control")) is not None:
        beats, noise, clause = rival
        detail += f"; {clause}"
        if verdict is None and ahead and (noise or not beats):
            verdict = ("above the untrained policy, but not beyond Ours' shuffled-reward "
                       "control: updates without reward gain " + (
                           "as much, within noise" if noise else "more"))
    return claim_line(text, ahead, detail, verdict=verdict)


def reward_claim(runs: list[Run], task: str, latents: int) -> str | None:
    """"Reward, not the updates themselves, raises Ours": Ours (default team) against its
    shuffled-reward control on the same seeds, which takes as many updates on the same items
    with each batch's rewards permuted. Training can raise exact without reward (shorter
    answers that stop truncating, a format the scorer reads); where the control gets there
    too, Ours' exact is no evidence of RL. None when the task has no graded Ours run."""
    key = dict(task=task, pooling=DEFAULT_POOLING, latents=latents)
    ours = cell(runs, **key, **DEFAULT_TEAM)
    if not ours.graded:
        return None
    text = (f"the reward: on {TASK_TITLES[task]}, Ours (Default Team) beats its "
            "shuffled-reward control (as many updates, rewards permuted within each batch)")
    rival = versus(ours, reward_control(runs, task, latents), "shuffled reward")
    if rival is None:
        return claim_line(text, None, "no shuffled-reward run on Ours' seeds",
                          verdict=NO_CONTROL)
    ahead, noise, clause = rival
    verdict = ("within noise: no evidence that the reward, not the updates, raised Ours' exact"
               if ahead and noise else None)
    return claim_line(text, ahead, clause, noise, verdict)


def paper_claims(runs: list[Run], latents: int, families: set[str] | None = None
                 ) -> list[str]:
    """The paper's qualitative findings, each tested on our runs (exact, in %), after the
    regime check (does Single learn at all?) on every task with a Single run and the reward
    check (does reward, not the updates, raise Ours?) on every task with an Ours run.
    ``families``: the task families the grid runs at all (None: any), so that a claim about a
    family it leaves out says so instead of waiting for runs that will never come."""
    key = dict(pooling=DEFAULT_POOLING, latents=latents)
    out = [c for t in TASKS if (c := learns_claim(runs, t, latents)) is not None]
    out += [c for t in TASKS if (c := reward_claim(runs, t, latents)) is not None]
    single = methods.get("single").label
    # the paper's claim is Arithmetic's; every other family where Ours ran is checked too
    for task in [t for t in TASKS if t == "arithmetic" or select(runs, task=t, **key,
                                                                    **DEFAULT_TEAM)]:
        out.append(beats_claim(
            f"§4.2: on {TASK_TITLES[task]}, Ours (Default Team) beats Single"
            + ("" if task == "arithmetic" else " (the paper: on Arithmetic)"),
            cell(runs, task=task, **key, **DEFAULT_TEAM),
            cell(runs, task=task, method="single", **key), single,
            exact_control(runs, task, latents)))
    # the paper's methods only: a control is no rival for "best method"
    logic = {row.label: cells["logic"] for row, cells in table1_cells(runs, latents)
             if not row.control and cells["logic"].values}
    if single in logic:
        best = max(logic, key=lambda k: logic[k].mean)
        # the claim's rival: the best other method if Single leads, else Single itself
        rival = single if best != single else max(
            (k for k in logic if k != single), key=lambda k: logic[k].mean, default=None)
        noise, why = within_noise(logic[best], logic[rival]) if rival else (False, "")
        detail = f"best is {best} ({logic[best].mean:.2f})" + (
            f", then {rival} ({logic[rival].mean:.2f}); {why}" if why else "")
        out.append(claim_line("§4.2: on Logic, Single is the best method", best == single,
                              detail, noise))
    elif families is not None and "logic" not in families:
        out.append(claim_line("§4.2: on Logic, Single is the best method", None, "this grid runs "
                              + ", ".join(TASK_TITLES.get(f, f) for f in sorted(families)),
                              verdict="not in this grid"))
    else:
        out.append(claim_line("§4.2: on Logic, Single is the best method", None, ""))
    out += baseline_claims(runs, latents)
    tasks = [t for t in TASKS if select(runs, task=t, **key, **DEFAULT_TEAM)] or ["arithmetic"]
    for task in tasks:
        out += routing_claims(runs, task, latents)
    out.append(pooling_claim(runs, latents))
    sampled = [t for t in TASKS if any(_sampled_steps(r) for r in select(
        runs, task=t, **key, **DEFAULT_TEAM))]
    for task in sampled or experiment.PARTS["figure5"].values("task"):
        rs = [r for r in select(runs, task=task, **key, **DEFAULT_TEAM) if r.status == "done"]
        steps_c, with_c, _ = series(rs, "reward_mean")
        steps_x, without_c, _ = series(rs, "reward_no_context")
        with_c = with_c[np.isin(steps_c, steps_x)]  # the no-C reward is sampled every N steps
        ok = with_c.size and without_c.size
        noise, detail = False, ""
        if ok:
            a, b = float(with_c.mean()), float(without_c.mean())
            # each sampled step draws prompts x G completions both ways, over every seed
            n = sum(_sampled_steps(r) * _completions_per_step(r) for r in rs)
            se = math.hypot(bernoulli_se(a, n), bernoulli_se(b, n)) if n else 0.0
            noise, why = two_se_clause(a, b, se, "reward", f"{n} completions each way") if n else (
                False, "")
            detail = f"{a:.3f} vs {b:.3f}" + (f"; {why}" if why else "")
        # no control samples without C while it trains (that would change its training
        # settings), so this one is uncontrolled; the held-out claim after it is not
        if ok:
            detail += "; no control run samples without C: the held-out claim below has one"
        out.append(claim_line(f"§4.4 / Figure 5: on {TASK_TITLES[task]}, reward with C exceeds "
                              "reward without C (mean over the steps sampled both ways)",
                              a > b if ok else None, detail, noise,
                              NO_CONTROL if ok and a > b else None))
        control = [r for r in select(runs, task=task, **key,
                                     **{**DEFAULT_TEAM, "method": EXACT_CONTROL})
                   if r.status == "done"]
        out.append(_paired_claim(task, rs, control))
    out.append(latents_claim(runs))
    return out


# Table 1's baselines that the paper ranks below Ours; its §3 says that removing
# cross-attention "isolates the role of cross-attention in enabling input-dependent expert
# aggregation", and its §5 that the method "avoids brittle decisions" of hard routing.
BASELINES = ("hard_routing", "no_cross_attn")


def baseline_claims(runs: list[Run], latents: int) -> list[str]:
    """Table 1: Ours (default team) beats each baseline in ``BASELINES``, on every family
    where that baseline ran (a baseline's cells may run on fewer seeds than Ours: the
    comparison is on the seeds both ran), stated like §4.2 against Ours' shuffled-experts
    control too: beating a baseline says the experts' information about the item helps only
    if Ours also clears that control."""
    out = []
    table = table1_cells(runs, latents)
    ours_row, ours = next((row, cells) for row, cells in table if row.key == DEFAULT_TEAM)
    baselines = [(row, cells) for row, cells in table if row.key["method"] in BASELINES]
    # each family's control and seed spread once: every baseline of it is read against them
    ran = [t for t in TASKS if any(cells[t].values for _, cells in baselines)]
    control = {t: exact_control(runs, t, latents) for t in ran}
    spread = {t: seed_spread(runs, t, latents) for t in ran}
    for row, cells in baselines:
        for task in [t for t in TASKS if cells[t].values]:
            paper = (f" (paper: {ours_row.paper[task][0]:.2f} vs {row.paper[task][0]:.2f})"
                     if ours_row.paper and row.paper else "")
            out.append(beats_claim(
                f"Table 1: on {TASK_TITLES[task]}, Ours (Default Team) beats {row.label}{paper}",
                ours[task], cells[task], row.label, control[task], spread[task]))
    return out


def _paired_claim(task: str, runs: list[Run], control: list[Run]) -> str:
    """Figure 5's claim on held-out items: greedy exact with C against without C, paired
    item by item (musketeers.reports.paired), then against the same gain in the
    shuffled-experts control on the same seeds: a policy trained beside m context positions
    can lose accuracy without them whatever they hold, so only a gain beyond the control's
    says that C carries the experts' information about the item."""
    text = (f"§4.4 / Figure 5: on {TASK_TITLES[task]}, C raises greedy exact on validation "
            "items (same checkpoints and items with and without C, paired), beyond C's gain "
            "in the shuffled-experts control")
    p = paired_context(runs)
    if p is None:
        return claim_line(text, None, "")
    noise, why = two_se_clause(p.a, p.b, p.noise, "points", p.counts())
    detail = f"Ours {p.a:.2f} with C vs {p.b:.2f} without; {why}"
    g = paired_context_gain(runs, control)
    if g is None:
        return claim_line(text, p.diff > 0, f"{detail}; no shuffled-experts run evaluated without "
                          "C on Ours' seeds", noise, NO_CONTROL if p.diff > 0 else None)
    g_noise, g_why = two_se_clause(g.a, g.b, g.noise, "points", g.counts())
    detail += (f"; C's gain {g.a:+.2f} in Ours vs {g.b:+.2f} in the control "
               f"({g.runs} seed{'s' * (g.runs > 1)}): {g_why}")
    verdict = None  # within noise without C already is no finding; else the control
    if p.diff > 0 and not noise and g_noise:
        verdict = "does not clear its control: within noise of it, not evidence"
    elif p.diff > 0 and not noise and g.diff <= 0:
        verdict = "does not clear its control"
    return claim_line(text, p.diff > 0, detail, noise, verdict)


def cell_comparisons(runs: list[Run], latents: int) -> list[str]:
    """Every cell with both our number (exact) and the paper's (its accuracy), as one table
    (a list of 40 bullets reads worse than 40 rows)."""
    rows = []
    for row, cells in table1_cells(runs, latents):
        for task in TASKS:
            paper = row.paper[task] if row.paper else None
            verdict = compare(cells[task], paper)
            if verdict:
                rows.append(f"| Table 1 | {row.label} | {TASK_TITLES[task]} | "
                            f"{cells[task].text()} | {paper_text(paper)} | {verdict} |")
    for label, c, paper in table2_cells(runs, latents):
        verdict = compare(c, paper)
        if verdict:
            rows.append(f"| Table 2 | {label} | Arithmetic | {c.text()} | {paper_text(paper)} "
                        f"| {verdict} |")
    if not rows:
        return ["- No cell has both our result and the paper's yet."]
    return ["| table | row | task | ours | paper | verdict |",
            "|---|---|---|---:|---:|---|", *rows]


def pooling_claim(runs: list[Run], latents: int) -> str:
    """§4.4: "first-token pooling is comparable to last-token pooling", on the seeds both cells
    ran (Table 2's cells run on the first seed only; Last is Table 1's Ours over every seed).
    Comparable: within 1 std over those seeds or within the evaluation's noise (one seed has
    no std, and 0 tolerance would call any one-item difference a disagreement); comparable
    only because noise hides the difference is flagged as such. Where first-token pooling
    gave every item the same vector, the line says so: the cell then matches Last only as far
    as Last's own vectors carry nothing beyond each expert's identity."""
    text = "§4.4: first-token pooling is comparable to last-token pooling"
    t2 = {label: c for label, c, _ in table2_cells(runs, latents) if c.values}
    first, last = t2.get("First token (h^(L)_{i,0})"), t2.get("Last (ours, n=3)")
    common = first.seeds & last.seeds if first and last else set()
    if not common:
        return claim_line(text, None, "")
    first, last = first.on(common), last.on(common)
    stds = [c.std for c in (first, last) if c.std is not None]
    tol = max(stds, default=0.0)
    noise, why = within_noise(first, last, seed_spread(runs, TABLE2_KEY["task"], latents))
    detail = (f"{first.mean:.2f} vs {last.mean:.2f} ({seeds_text(common)})"
              + (f", seed std {tol:.2f}" if stds else "") + (f"; {why}" if why else ""))
    if first.constant_experts:
        detail += ("; first-token pooling gave every item the same vector for "
                   f"{', '.join(first.constant_experts)}: that cell holds no prompt information")
    return claim_line(text, abs(first.mean - last.mean) <= tol or noise, detail,
                      noise and abs(first.mean - last.mean) > tol)


def latents_claim(runs: list[Run]) -> str:
    """§4.4 / Figure 6: exact on Arithmetic peaks at m = 8, each m on the seeds every m ran
    (Figure 6's cells run on the first seed only; m = 8 is Table 1's Ours over every seed)."""
    text = "§4.4 / Figure 6: exact on Arithmetic peaks at m = 8 (paper: accuracy)"
    accs = {m: c for m in LATENTS
            if (c := cell(runs, task=FIGURE6_TASK, pooling=DEFAULT_POOLING, latents=m,
                          **DEFAULT_TEAM)).values}
    common = set.intersection(*(c.seeds for c in accs.values())) if len(accs) > 1 else set()
    if not common:
        return claim_line(text, None, "")
    accs = {m: c.on(common) for m, c in accs.items()}
    best = max(c.mean for c in accs.values())
    peaks = [m for m, c in accs.items() if c.mean == best]
    # the claim's rival: m = 8 if it is not the peak, else the runner-up
    if peaks == [8]:
        rival = max((c for m, c in accs.items() if m != 8), key=lambda c: c.mean)
        against = "the runner-up, "
    else:
        rival, against = accs.get(8), "m = 8's "
    noise, why = (within_noise(accs[peaks[0]], rival, seed_spread(runs, FIGURE6_TASK))
                  if rival is not None else (False, ""))
    detail = (f"peak at m = {', '.join(map(str, peaks))} ({best:.2f}%, {seeds_text(common)})"
              + (f", against {against}{rival.mean:.2f}%; {why}" if why else ""))
    return claim_line(text, peaks == [8], detail, noise)
