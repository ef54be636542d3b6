"""The paper's findings, each tested on our runs: its qualitative claims (§4.2–§4.4) and every
table cell beside the paper's number. A verdict says whether a difference clears the noise
of the runs behind it, since pocket-sized runs rarely do, and every claim for Ours is stated
against a control (musketeers.method.methods) on the same seeds: Ours' exact against the
shuffled-experts control (does it need what the experts say about this item?), its routing
(§4.3) against the shuffled-reward control (does reward, not the update itself, shape it?).
A claim without its control run is no evidence either way, and says so. Accuracy here is
``exact`` (share of greedy completions scoring 1)."""

from __future__ import annotations

from musketeers.method import methods
from musketeers.reports.aggregate import Cell, Run, cell
from musketeers.reports.controls import exact_control, reward_control, seed_spread
from musketeers.reports.keys import select
from musketeers.reports.tables import (
    DEFAULT_LATENTS,
    DEFAULT_POOLING,
    DEFAULT_TEAM,
    paper_text,
    table1_cells,
    table2_cells,
    tasks_of,
)
from musketeers.reports.verdicts import (
    NO_CONTROL,
    SeedSpread,
    claim_line,
    versus,
    within_noise,
)
from musketeers.tasks.variants import task_title


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
    text = f"the regime: on {task_title(task)}, training raises Single's exact above the " \
           "untrained policy's"
    base = cell(runs, task=task, method="untrained")
    if not base.values:
        return claim_line(text, None, "no untrained run", verdict=NO_CONTROL)
    u = base.mean
    clears, parts, counts = [], [], ""
    for r in sorted(single.graded, key=lambda r: r.seed):
        one = Cell([r])
        noise, why = within_noise(one, base)
        clears.append(one.mean > u and not noise)
        test, _, counts = why.partition(" (")  # every seed's counts alike: said once, below
        parts.append(f"seed {r.seed}: {one.mean:.2f} ({test})")
    ahead = single.mean > u
    detail = f"untrained {u:.2f}; " + "; ".join(parts) + (f" (each: {counts}" if counts else "")
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
    text = (f"the reward: on {task_title(task)}, Ours (Default Team) beats its "
            "shuffled-reward control (as many updates, rewards permuted within each batch)")
    rival = versus(ours, reward_control(runs, task, latents), "shuffled reward")
    if rival is None:
        return claim_line(text, None, "no shuffled-reward run on Ours' seeds",
                          verdict=NO_CONTROL)
    ahead, noise, clause = rival
    verdict = ("within noise: no evidence that the reward, not the updates, raised Ours' exact"
               if ahead and noise else None)
    return claim_line(text, ahead, clause, noise, verdict)


def ours_beats_single_claims(runs: list[Run], latents: int) -> list[str]:
    """§4.2: Ours (Default Team) beats Single, stated against Ours' shuffled-experts control
    too. The paper's claim is Arithmetic's; every other family where Ours ran is checked
    too."""
    key = dict(pooling=DEFAULT_POOLING, latents=latents)
    single = methods.get("single").label
    return [beats_claim(
        f"§4.2: on {task_title(task)}, Ours (Default Team) beats Single"
        + ("" if task == "arithmetic" else " (the paper: on Arithmetic)"),
        cell(runs, task=task, **key, **DEFAULT_TEAM),
        cell(runs, task=task, method="single", **key), single,
        exact_control(runs, task, latents))
        for task in [t for t in tasks_of(runs)
                     if t == "arithmetic" or select(runs, task=t, **key, **DEFAULT_TEAM)]]


SINGLE_KEY = {"method": "single"}


def logic_best_claim(runs: list[Run], latents: int, families: set[str] | None = None
                     ) -> list[str]:
    """§4.2: on Logic, Single is the best of the paper's methods (a control is no rival for
    "best method"). Rows are found by their keys; their labels are only printed."""
    text = "§4.2: on Logic, Single is the best method"
    logic = {tuple(sorted(row.key.items())): (row.label, cells["logic"])
             for row, cells in table1_cells(runs, latents)
             if not row.control and cells["logic"].values}
    single = tuple(sorted(SINGLE_KEY.items()))
    if single in logic:
        best = max(logic, key=lambda k: logic[k][1].mean)
        # the claim's rival: the best other method if Single leads, else Single itself
        rival = single if best != single else max(
            (k for k in logic if k != single), key=lambda k: logic[k][1].mean, default=None)
        (best_label, best_cell) = logic[best]
        noise, why = within_noise(best_cell, logic[rival][1]) if rival else (False, "")
        detail = f"best is {best_label} ({best_cell.mean:.2f})" + (
            f", then {logic[rival][0]} ({logic[rival][1].mean:.2f}); {why}" if why else "")
        return [claim_line(text, best == single, detail, noise)]
    if families is not None and "logic" not in families:
        return [claim_line(text, None, "this grid runs "
                           + ", ".join(task_title(f) for f in sorted(families)),
                           verdict="not in this grid")]
    return [claim_line(text, None, "")]


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
    ran = [t for t in tasks_of(runs) if any(cells[t].values for _, cells in baselines)]
    control = {t: exact_control(runs, t, latents) for t in ran}
    spread = {t: seed_spread(runs, t, latents) for t in ran}
    for row, cells in baselines:
        for task in [t for t in tasks_of(runs) if cells[t].values]:
            has = ours_row.paper and row.paper and task in ours_row.paper and task in row.paper
            paper = (f" (paper: {ours_row.paper[task][0]:.2f} vs {row.paper[task][0]:.2f})"
                     if has else "")
            out.append(beats_claim(
                f"Table 1: on {task_title(task)}, Ours (Default Team) beats {row.label}{paper}",
                ours[task], cells[task], row.label, control[task], spread[task]))
    return out


def cell_comparisons(runs: list[Run], latents: int) -> list[str]:
    """Every cell with both our number (exact) and the paper's (its accuracy), as one table
    (a list of 40 bullets reads worse than 40 rows)."""
    rows = []
    for row, cells in table1_cells(runs, latents):
        for task in tasks_of(runs):
            paper = row.paper.get(task) if row.paper else None
            verdict = compare(cells[task], paper)
            if verdict:
                rows.append(f"| Table 1 | {row.label} | {task_title(task)} | "
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
