"""Two evaluations on the same validation items, compared item by item.

Every greedy evaluation grades the same items (the val split, in order), whatever the method,
seed or context. Most items get the same verdict from two policies: the easy ones both get
right, the hard ones both miss. Two independent Bernoulli bounds ignore that, so they call a
real difference of a few points noise. The paired difference's standard error counts only
the items on which the two disagree (McNemar's idea), and is the evaluation noise a
comparison of two checkpoints on these items really has. Over several seeds the spread of
the per-seed differences adds the training's own noise; a verdict uses the larger of the two.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from musketeers.cache.errors import UserError
from musketeers.reports.aggregate import Cell, Run
from musketeers.run.runlog import eval_files


@dataclass(frozen=True)
class Paired:
    """Mean of a − b over ``n`` item pairs from ``runs`` pairs of evaluations, in points."""

    n: int
    runs: int
    a: float  # the first evaluation's mean over the paired items, %
    b: float
    se: float  # standard error of the mean paired difference over items
    seed_se: float | None  # std of the per-run-pair mean differences / sqrt(runs); runs ≥ 2

    @property
    def diff(self) -> float:
        return self.a - self.b

    @property
    def noise(self) -> float:
        """The SE a verdict uses: the items' or the seeds', whichever is larger."""
        return max(self.se, self.seed_se or 0.0)

    def counts(self) -> str:
        """How the SE was found, for a verdict's clause. On one seed it says what the SE
        leaves out: a second training seed can move a cell by more than its items' noise."""
        if self.seed_se is None:
            return f"{self.n} item pairs, one seed: the items' noise only"
        return (f"{self.n} item pairs over {self.runs} seeds; seed SE {self.seed_se:.2f}, "
                f"item SE {self.se:.2f}")


def by_item(path: Path, metric: str) -> dict[str, float]:
    """Each graded item's score in an evaluation's samples file; a file that cannot be read
    (not UTF-8, not rows) is refused with the evaluation that rewrites it."""
    out = {}
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            score = float(row["score"])
            out[str(row["id"])] = float(score >= 1.0) if metric == "exact" else score
    except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        again = " --no-context" if path.name.startswith("eval_no_context") else ""
        raise UserError(f"{path} is not a readable evaluation ({type(exc).__name__}); "
                        f"evaluate the run again: musketeers eval "
                        f"{shlex.quote(str(path.parent))}{again}") from None
    return out


def paired(files: list[tuple[Path, Path]], metric: str = "exact") -> Paired | None:
    """The paired difference over the items graded in both files of each pair (a pair with a
    missing file is skipped). None with fewer than 2 item pairs."""
    groups = []
    for fa, fb in files:
        if fa.is_file() and fb.is_file():
            a, b = by_item(fa, metric), by_item(fb, metric)
            if both := sorted(set(a) & set(b)):
                groups.append([(a[i], b[i]) for i in both])
    return _paired(groups)


def _paired(groups: list[list[tuple[float, float]]]) -> Paired | None:
    """``Paired`` of item pairs (x, y) grouped by run pair: the mean of x − y, its SE over
    items and, with ≥ 2 groups, over the groups' means."""
    pairs = [p for g in groups for p in g]
    n = len(pairs)
    if n < 2:
        return None
    diffs = [x - y for x, y in pairs]
    mean = sum(diffs) / n
    se = 100.0 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    seed_se = None
    if len(groups) >= 2:
        means = [sum(x - y for x, y in g) / len(g) for g in groups]
        m = sum(means) / len(means)
        sd = math.sqrt(sum((v - m) ** 2 for v in means) / (len(means) - 1))
        seed_se = 100.0 * sd / math.sqrt(len(means))
    return Paired(n, len(groups), 100.0 * sum(x for x, _ in pairs) / n,
                  100.0 * sum(y for _, y in pairs) / n, se, seed_se)


def paired_context(runs: list[Run]) -> Paired | None:
    """Exact with C against without C, each run against itself (Figure 5 on held-out items)."""
    return paired([(r.path / eval_files(True)[1], r.path / eval_files(False)[1]) for r in runs])


def paired_context_gain(ours: list[Run], control: list[Run]) -> Paired | None:
    """Figure 5 against its control: C's gain in Ours (exact with C − without, per item)
    against C's gain in the control run of the same seed (its C built from another item's
    expert vectors). A policy trained with m context positions may lean on their mere
    presence, so removing C can cost both runs; only the gain beyond the control's is
    the experts' item information. ``a`` and ``b`` are the two mean gains, in points."""
    by_seed = {r.seed: r for r in control}
    groups = []
    for r in ours:
        k = by_seed.get(r.seed)
        if k is None:
            continue
        files = [run.path / eval_files(c)[1] for run in (r, k) for c in (True, False)]
        if not all(f.is_file() for f in files):
            continue
        oc, ox, kc, kx = (by_item(f, "exact") for f in files)
        if both := sorted(set(oc) & set(ox) & set(kc) & set(kx)):
            groups.append([(oc[i] - ox[i], kc[i] - kx[i]) for i in both])
    return _paired(groups)


def paired_cells(a: Cell, b: Cell) -> Paired | None:
    """Cell ``a`` against cell ``b``, run against run on the same seed; a ``b`` of one run
    (the untrained policy, whose greedy evaluation has no seed) serves every seed of ``a``."""
    by_seed = {r.seed: r for r in b.graded}
    only = b.graded[0] if len(b.graded) == 1 else None
    files = [(r.path / eval_files()[1], other.path / eval_files()[1]) for r in a.graded
             if (other := by_seed.get(r.seed, only)) is not None and r.trained_alike(other)]
    return paired(files, a.metric)
