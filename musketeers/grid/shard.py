"""A grid split between workers: worker K of N takes runs i with i % N == K - 1, in run order.

Every worker loads the same grid, so the shares are disjoint and together hold every run;
each worker publishes its runs as they end, and a report built from the shared published
folder (``ablate --report-only``) sees them all.
"""

from __future__ import annotations

import re
from dataclasses import replace

from musketeers.cache.errors import UserError
from musketeers.design.gridspec import Grid

_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` → (K, N) with 1 ≤ K ≤ N, or a one-line UserError."""
    m = _SHARD.fullmatch(text)
    if m is None:
        raise UserError(f"--shard takes K/N, e.g. 1/8 (worker 1 of 8); got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise UserError(f"--shard {text}: K must be 1 to N and N at least 1, e.g. 1/{max(n, 1)}")
    return k, n


def shard(grid: Grid, k: int, n: int) -> Grid:
    """Worker ``k`` of ``n``'s share of ``grid``: every n-th run from the (k-1)-th."""
    return replace(grid, runs=[r for i, r in enumerate(grid.runs) if i % n == k - 1])
