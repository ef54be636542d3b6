"""With C against without C on the same items: a paired difference of greedy exact.

Figure 5's claim is read twice. Its training reward without C is sampled on a few steps only,
so its noise is wide. Every run of Figure 5 is also evaluated greedily with and without C on
the same validation items, from the same checkpoint. Compared item by item, most items get
the same verdict both ways. The standard error of the mean paired difference is then far
smaller than two independent Bernoulli bounds (McNemar's idea), so this is the claim's
well-powered form.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from musketeers.reports.aggregate import Run

SAMPLES = {True: "eval_samples.jsonl", False: "eval_no_context_samples.jsonl"}


@dataclass(frozen=True)
class Paired:
    """Exact with C minus exact without C, in points, over ``n`` item pairs of ``runs`` runs."""

    n: int
    runs: int
    with_c: float  # exact with C, %
    without_c: float  # exact without C, %
    se: float  # standard error of the mean paired difference, points

    @property
    def diff(self) -> float:
        return self.with_c - self.without_c


def _exact_by_item(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out[row["id"]] = int(float(row["score"]) >= 1.0)
    return out


def paired_exact(runs: list[Run]) -> Paired | None:
    """The paired difference over every item graded both ways in ``runs`` (seeds pooled:
    each item of each run is one pair). None when no run has both sample files."""
    diffs, with_c, used = [], [], 0
    for r in runs:
        paths = {c: r.path / name for c, name in SAMPLES.items()}
        if not all(p.is_file() for p in paths.values()):
            continue
        a, b = _exact_by_item(paths[True]), _exact_by_item(paths[False])
        both = sorted(set(a) & set(b))
        diffs += [a[i] - b[i] for i in both]
        with_c += [a[i] for i in both]
        used += bool(both)
    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    pc = 100.0 * sum(with_c) / n
    return Paired(n, used, pc, pc - 100.0 * mean, 100.0 * math.sqrt(var / n))
