"""The tests behind every verdict: paired over training seeds, with the right degrees of freedom.

Two methods trained on the same seeds and graded on the same items differ, per seed s, by d_s =
mean_i(a_si − b_si). Their spread carries the training seed's noise, with k − 1 degrees of
freedom (with k = 3 the 95 % critical value is 4.30, not 2). The items' noise is common to
every seed, since every seed grades the same items, so the spread cannot show it: the items'
own variance component is added (``crossed_items``: seeds × items as a crossed design, so the
seed × item residual, which the seeds' spread already holds, is not counted twice), and the
degrees of freedom are Welch–Satterthwaite's over the parts. Each test gives its interval, its
p-value and the **minimum detectable effect**: the true difference it would find with 80 %
power at its own noise, (t_{1−α/2} + t_{power}) · SE. A difference that is not significant is
"no evidence either way, could detect ≥ MDE", never "equivalent". Across the claims of one
report, p-values are adjusted by Holm's step-down method, which controls the family-wise error
without assuming independence.

A comparison on one seed has no spread over seeds to test against: it is descriptive only.
``seeds_for_mde`` projects, from a comparison's measured spreads, how many seeds would bring
its minimum detectable effect to a planned size: the count a grid's part needs.
``cluster_bootstrap`` gives a second opinion that resamples seeds and, within them, items
clustered by item (one item is graded on every seed, so its draws are not independent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
POWER = 0.80
PLANNED_MDE = 5.0  # points: the smallest effect a grid's main comparison is sized to detect
MOST_SEEDS = 50  # where ``seeds_for_mde`` stops looking


@dataclass(frozen=True)
class SeedTest:
    """A paired comparison over training seeds (points, i.e. percentages)."""

    diff: float  # mean of the per-seed differences
    low: float  # 95 % interval (t with k − 1 df); NaN on one seed
    high: float
    p: float | None  # two-sided; None on one seed (descriptive only)
    df: float  # Welch–Satterthwaite's over the seeds' and the items' variance; 0 on one seed
    mde: float | None  # smallest true difference found with 80 % power; None on one seed
    seeds: int
    seed_var: float = math.nan  # variance of the per-seed differences (ddof = 1)
    item_var: float = 0.0  # the items' variance component of the mean (item_se²)
    items: int = 0
    item_df: float | None = None  # that component's df (None: items − 1)

    @property
    def testable(self) -> bool:
        return self.p is not None


def mde(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable effect of a two-sided t test with standard error ``se``, ``df``
    degrees of freedom: (t_{1−α/2, df} + t_{power, df}) · se."""
    return float((sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)) * se)


def satterthwaite(parts: list[tuple[float, float]]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of variance estimates (var, df)."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if df > 0 and v > 0)
    return total * total / denom if denom > 0 else float("inf")


def crossed_items(d: np.ndarray) -> tuple[float, float]:
    """What the items add to the seeds' variance of a seeds × items mean, and its df.

    ``d`` [k seeds, n items] (points): d_si = μ + a_s + b_i + e_si. The mean's variance is
    σ_a²/k + σ_b²/n + σ_e²/(kn) = (E[MS_seeds] + E[MS_items] − E[MS_residual]) / kn. The
    per-seed differences' spread gives MS_seeds / kn (``paired_seed_test``'s seed part); this
    returns the rest, (MS_items − MS_residual) / kn for the items' component σ_b²/n, clamped
    at 0. The variance of the seed-averaged item differences alone (MS_items / kn) would count
    σ_e²/(kn) a second time.

    Degrees of freedom: Welch–Satterthwaite's for the difference of the two mean squares. On
    one seed: MS_items / kn with n − 1 df. The mean's variance is never below the residual's
    own share (``residual_floor``), which ``paired_seed_test`` keeps as a floor.
    """
    d = np.asarray(d, dtype=float)
    k, n = d.shape
    if n < 2:
        return 0.0, 0.0
    items = d.mean(axis=0)
    ms_items = k * float(items.var(ddof=1))
    if k < 2:
        return ms_items / n, float(n - 1)
    resid = d - d.mean(axis=1, keepdims=True) - items + d.mean()
    ms_resid = float((resid ** 2).sum()) / ((k - 1) * (n - 1))
    if ms_items <= ms_resid:
        return 0.0, 0.0
    var = (ms_items - ms_resid) / (k * n)
    denom = ms_items ** 2 / (n - 1) + ms_resid ** 2 / ((k - 1) * (n - 1))
    return var, (ms_items - ms_resid) ** 2 / denom


def residual_floor(d: np.ndarray) -> tuple[float, float] | None:
    """(σ_e²/(kn), its df): the least variance a seeds × items mean has, whatever its seeds'
    and items' parts are estimated at (MS_residual / kn, (k − 1)(n − 1) df). None under 2
    seeds or items."""
    d = np.asarray(d, dtype=float)
    k, n = d.shape
    if k < 2 or n < 2:
        return None
    resid = d - d.mean(axis=1, keepdims=True) - d.mean(axis=0) + d.mean()
    df = (k - 1) * (n - 1)
    return float((resid ** 2).sum()) / df / (k * n), float(df)


def paired_seed_test(diffs: list[float], alpha: float = ALPHA,
                     item_se: float | None = None, items: int = 0,
                     item_df: float | None = None,
                     floor: tuple[float, float] | None = None) -> SeedTest:
    """The paired t over seeds of per-seed differences ``diffs`` (points).

    Every seed grades the same items, so the items' share of the noise is common to all
    seeds and their spread cannot show it: ``item_se`` (the SE of the seed-averaged
    difference over ``items`` items, clustered by item) is added to the seeds' variance, and
    the degrees of freedom are Welch–Satterthwaite's over the two (k − 1 where the seeds
    dominate; three seeds that differ by the same one item do not make a test certain).
    ``item_df``: the item part's degrees of freedom (``crossed_items``'), else items − 1.
    ``floor`` (variance, df): where the parts sum to less, the test uses it instead
    (``residual_floor``: seeds that agree exactly by chance, no item effect).
    """
    d = np.round(np.asarray(diffs, dtype=float), 9)  # exacts are shares: no float dust
    k = len(d)
    if k == 0:
        raise ValueError("no seed to compare on")
    mean = float(d.mean())
    if k == 1:
        return SeedTest(mean, math.nan, math.nan, None, 0, None, 1)
    seed_var = float(d.var(ddof=1))
    item_var, items = (item_se * item_se, items) if item_se is not None else (0.0, 0)
    se, df = _noise(seed_var, k, item_var, items, item_df)
    if floor is not None and se * se < floor[0]:
        se, df = math.sqrt(floor[0]), floor[1]
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    if se == 0.0:  # every seed and item agree: no spread to weigh the difference against
        p = 1.0 if mean == 0 else 0.0
    else:
        p = float(2 * sps.t.sf(abs(mean) / se, df))
    return SeedTest(mean, mean - crit * se, mean + crit * se, p, df, mde(se, df, alpha), k,
                    seed_var, item_var, items, item_df)


def _noise(seed_var: float, k: int, item_var: float, items: int,
           item_df: float | None = None) -> tuple[float, float]:
    """(SE, Welch–Satterthwaite df) of a mean over ``k`` seeds with the items' noise added."""
    parts: list[tuple[float, float]] = [(seed_var / k, k - 1)]
    if item_var > 0 and items > 1:
        parts.append((item_var, items - 1 if item_df is None else item_df))
    return math.sqrt(sum(v for v, _ in parts)), min(satterthwaite(parts), 10_000.0)


def seeds_for_mde(test: SeedTest, target: float, most: int = MOST_SEEDS) -> int | None:
    """The fewest seeds at which ``test``'s comparison would reach a minimum detectable effect
    of ``target`` points, projected from its measured spreads: the per-seed differences'
    variance over k seeds, the items' component held as measured (seeds never average it
    away). None on one seed, or past ``most`` seeds (the
    items' noise alone may exceed the target: then more items, not seeds, is the lever)."""
    if not test.testable or math.isnan(test.seed_var):
        return None
    for k in range(2, most + 1):
        se, df = _noise(test.seed_var, k, test.item_var, test.items, test.item_df)
        if mde(se, df) <= target:
            return k
    return None


def items_floor(test: SeedTest) -> float:
    """The smallest effect ``test``'s comparison could detect on infinitely many seeds: its
    items' noise alone (every seed grades the same items, so seeds never average it away)."""
    if test.item_var <= 0 or test.items < 2:
        return 0.0
    return mde(*_noise(0.0, 2, test.item_var, test.items, test.item_df))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of ``pvalues`` (None entries are left out and kept)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    order = sorted(idx, key=lambda i: pvalues[i])  # type: ignore[arg-type, return-value]
    m = len(order)
    out: list[float | None] = list(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))  # type: ignore[operator]
        out[i] = running
    return out


def cluster_bootstrap(a: np.ndarray, b: np.ndarray, reps: int = 2000, seed: int = 0
                      ) -> tuple[float, float]:
    """95 % percentile interval of mean(a − b), points, resampling seeds and, within the
    resample, items clustered by item. ``a``, ``b``: [seeds, items] scores in [0, 1]."""
    d = 100.0 * (np.asarray(a, float) - np.asarray(b, float))
    k, n = d.shape
    rng = np.random.default_rng(seed)
    means = np.empty(reps)
    for r in range(reps):
        rows = rng.integers(0, k, k)
        cols = rng.integers(0, n, n)  # one item draw for every seed: items are clusters
        means[r] = d[np.ix_(rows, cols)].mean()
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def verdict(test: SeedTest, p_adjusted: float | None, alpha: float = ALPHA,
            family: bool = True) -> str:
    """The words of a verdict: significant either way, no evidence either way (with what the
    test could have seen), or descriptive only. ``family``: the p is Holm's over a family;
    else the test's own p, named so."""
    if not test.testable:
        return "descriptive only: one seed has no spread over seeds to test against"
    p = p_adjusted if p_adjusted is not None else test.p
    name = "Holm p" if family else "p, not family-wise"
    if p is not None and p < alpha:
        return f"{'ahead' if test.diff > 0 else 'behind'}, significant ({name} = {p:.3g})"
    return (f"no evidence either way ({name} = {p:.2g}; could detect ≥ {test.mde:.1f} "
            "points)")
