"""The paper's findings, each tested on our runs: its qualitative claims (§4.2–§4.4) and every
table cell beside the paper's number. A verdict says whether a difference clears the noise
of the runs behind it, since pocket-sized runs rarely do."""

from __future__ import annotations

import math

import numpy as np

from musketeers.reports.aggregate import (
    Cell,
    Run,
    bernoulli_se,
    cell,
    mean_std,
    select,
    series,
    spearmans,
)
from musketeers.reports.figures import LATENTS
from musketeers.reports.tables import TASK_TITLES, TASKS, paper_text, table1_cells, table2_cells

PAPER_SPEARMAN = -0.48
# §4.3's ρ is over the Perceiver's attention entropy: no_cross_attn has no attention, and
# hard routing's "entropy" is its router's softmax, another quantity
ROUTED = ("perceiver",)


def compare(ours: Cell, paper: tuple[float, float] | None) -> str | None:
    """'agrees (within 1 std)', 'above' or 'below' the paper, by how much; None if unknown.

    "Within 1 std" means |ours − paper| ≤ the larger of our and the paper's std.
    """
    if paper is None or not ours.values:
        return None
    diff = ours.mean - paper[0]
    tol = max(ours.std or 0.0, paper[1])
    if abs(diff) <= tol:
        return f"agrees (within 1 std: {diff:+.2f} points, tolerance {tol:.2f})"
    return f"{'above' if diff > 0 else 'below'} the paper by {abs(diff):.2f} points " \
           f"(> 1 std = {tol:.2f})"


def within_noise(a: Cell, b: Cell) -> tuple[bool, str]:
    """Whether two cells differ by no more than their evaluation's sampling noise, and a clause
    saying by how much: |Δ| ≤ 2·sqrt(SE_a² + SE_b²), with each SE the Bernoulli bound of
    `Cell.item_se`. On 64 items a 3 % accuracy has SE ≈ 2.2 points, so one seed's 1–2 items
    of difference prove nothing either way, and the verdict must say so.
    """
    se_a, se_b = a.item_se, b.item_se
    if se_a is None or se_b is None:
        return False, ""
    return _noise(a.mean, se_a, b.mean, se_b, "points", f"{a.items} and {b.items} graded items")


def _noise(a: float, se_a: float, b: float, se_b: float, unit: str,
           counts: str) -> tuple[bool, str]:
    two_se = 2.0 * math.sqrt(se_a**2 + se_b**2)
    diff, f = abs(a - b), (".2f" if unit == "points" else ".3f")
    if diff == 0:
        return True, f"no difference at all, over {counts}"
    if diff > two_se:
        return False, f"the difference, {diff:{f}} {unit}, exceeds 2 SE ({two_se:{f}})"
    return True, f"the difference, {diff:{f}} {unit}, is within 2 SE ({two_se:{f}}) of {counts}"


def _claim(text: str, holds: bool | None, detail: str, noise: bool = False) -> str:
    verdict = "cannot be checked (runs missing)" if holds is None else (
        "holds here" if holds else "does NOT hold here")
    if holds is not None and noise:
        verdict += ", but within noise"
    return f"- {text}: **{verdict}**{' — ' + detail if detail else ''}."


def _sampled_steps(run: Run) -> int:
    return sum(1 for row in run.metrics if row.get("reward_no_context") is not None)


def _completions_per_step(run: Run) -> int:
    c = run.config
    return int(c.get("prompts_per_micro") or 0) * int(c.get("grad_accum") or 1) * int(
        c.get("group_size") or 0)


def paper_claims(runs: list[Run], latents: int) -> list[str]:
    """The paper's qualitative findings, each tested on our runs."""
    t1 = {row.label: cells for row, cells in table1_cells(runs, latents)}
    out = []
    single, ours = t1["Single"]["arithmetic"], t1["Ours Default Team (n=3)"]["arithmetic"]
    ok = single.values and ours.values
    noise, why = within_noise(ours, single) if ok else (False, "")
    out.append(_claim("§4.2: on Arithmetic, Ours (Default Team) beats Single",
                      ours.mean > single.mean if ok else None,
                      f"{ours.mean:.2f} vs {single.mean:.2f}" + (f"; {why}" if why else "")
                      if ok else "", noise))
    logic = {label: cells["logic"] for label, cells in t1.items() if cells["logic"].values}
    if "Single" in logic:
        best = max(logic, key=lambda k: logic[k].mean)
        # the claim's rival: the best other method if Single leads, else Single itself
        rival = "Single" if best != "Single" else max(
            (k for k in logic if k != "Single"), key=lambda k: logic[k].mean, default=None)
        noise, why = within_noise(logic[best], logic[rival]) if rival else (False, "")
        detail = f"best is {best} ({logic[best].mean:.2f})" + (
            f", then {rival} ({logic[rival].mean:.2f}); {why}" if why else "")
        out.append(_claim("§4.2: on Logic, Single is the best method", best == "Single",
                          detail, noise))
    else:
        out.append(_claim("§4.2: on Logic, Single is the best method", None, ""))
    rhos = spearmans([r for r in runs if r.config.get("method") in ROUTED])
    rho, sd = mean_std(rhos) if rhos else (None, None)
    n = len(rhos)
    # the runs' spread is the noise here: is the mean ρ more than 2 SE (std / √n) from 0?
    se = sd / math.sqrt(n) if sd is not None else None
    noise = se is not None and abs(rho) <= 2 * se
    out.append(_claim(f"§4.3: reward and routing entropy correlate negatively "
                      f"(paper: mean ρ = {PAPER_SPEARMAN})", None if rho is None else rho < 0,
                      "" if rho is None else f"mean ρ = {rho:+.2f} over {n} runs" + (
                          f"; 2 SE of that mean over runs = {2 * se:.2f}" if se is not None
                          else ""), noise))
    t2 = {label: c for label, c, _ in table2_cells(runs, latents) if c.values}
    first, last = t2.get("First token (h^(L)_{i,0})"), t2.get("Last (ours, n=3)")
    if first and last:
        # comparable: within 1 std over seeds or within the evaluation's noise (one seed
        # has no std, and 0 tolerance would call any one-item difference a disagreement);
        # comparable only because noise hides the difference is flagged as such
        stds = [c.std for c in (first, last) if c.std is not None]
        tol = max(stds, default=0.0)
        noise, why = within_noise(first, last)
        out.append(_claim("§4.4: first-token pooling is comparable to last-token pooling",
                          abs(first.mean - last.mean) <= tol or noise,
                          f"{first.mean:.2f} vs {last.mean:.2f}"
                          + (f", seed std {tol:.2f}" if stds else "")
                          + (f"; {why}" if why else ""),
                          noise and abs(first.mean - last.mean) > tol))
    else:
        out.append(_claim("§4.4: first-token pooling is comparable to last-token pooling",
                          None, ""))
    for task in ("logic", "arithmetic"):
        rs = [r for r in select(runs, task=task, method="perceiver", team="default",
                                pooling="last", latents=latents) if r.status == "done"]
        steps_c, with_c, _ = series(rs, "reward_mean")
        steps_x, without_c, _ = series(rs, "reward_no_context")
        with_c = with_c[np.isin(steps_c, steps_x)]  # the no-C reward is sampled every N steps
        ok = with_c.size and without_c.size
        noise, detail = False, ""
        if ok:
            a, b = float(with_c.mean()), float(without_c.mean())
            # each sampled step draws prompts x G completions both ways, over every seed
            n = sum(_sampled_steps(r) * _completions_per_step(r) for r in rs)
            noise, why = _noise(a, bernoulli_se(a, n), b, bernoulli_se(b, n), "reward",
                                f"{n} completions each way") if n else (False, "")
            detail = f"{a:.3f} vs {b:.3f}" + (f"; {why}" if why else "")
        out.append(_claim(f"§4.4 / Figure 5: on {TASK_TITLES[task]}, reward with C exceeds "
                          "reward without C (mean over the steps sampled both ways)",
                          a > b if ok else None, detail, noise))
    accs = {m: c for m in LATENTS
            if (c := cell(runs, task="arithmetic", method="perceiver", team="default",
                          pooling="last", latents=m)).values}
    best = max(c.mean for c in accs.values()) if len(accs) > 1 else None
    peaks = [m for m, c in accs.items() if c.mean == best]
    detail, noise = "", False
    if best is not None:
        # the claim's rival: m = 8 if it is not the peak, else the runner-up
        if peaks == [8]:
            rival = max((c for m, c in accs.items() if m != 8), key=lambda c: c.mean)
            against = "the runner-up, "
        else:
            rival, against = accs.get(8), "m = 8's "
        noise, why = within_noise(accs[peaks[0]], rival) if rival is not None else (False, "")
        detail = f"peak at m = {', '.join(map(str, peaks))} ({best:.2f}%)" + (
            f"; {why} against {against}{rival.mean:.2f}%" if why else "")
    out.append(_claim("§4.4 / Figure 6: accuracy on Arithmetic peaks at m = 8",
                      None if best is None else peaks == [8], detail, noise))
    return out


def cell_comparisons(runs: list[Run], latents: int) -> list[str]:
    """Every cell with both our number and the paper's, as one table (a list of 40 bullets
    reads worse than 40 rows)."""
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
