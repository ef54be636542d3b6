"""Sides timed in alternating rounds, so load that comes and goes on the machine falls on all.

A side is one configuration timed in child processes of its own (``machine.run_child``). Each
round starts every side's child once, in the same order (a, b, c, a, b, c, …); a child is
fresh each round, so its peak RSS is its own and each round pays its own warm-up. A side's
children are then read as one result (``merged``), whose repetitions a ratio can judge
(``report.steady_ratio``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Child = Callable[[int], dict[str, Any]]  # round index -> the child's result


def alternate(sides: dict[str, Child], rounds: int) -> dict[str, dict[str, Any]]:
    """{side: its rounds merged}: ``rounds`` rounds, each calling every side's child once in
    the order of ``sides``."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for k in range(rounds):
        for side, child in sides.items():
            runs[side].append(child(k))
    return {side: merged(rs) for side, rs in runs.items()}


def merged(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's children, run in alternating rounds, as one result: every round's step
    times in order, the round each came from, and the largest peak RSS."""
    if bad := next((r for r in rounds if "error" in r), None):
        return bad
    out = dict(rounds[-1])
    out["step_s"] = [t for r in rounds for t in r["step_s"]]
    out["round"] = [k for k, r in enumerate(rounds) for _ in r["step_s"]]
    out["peak_rss_mib"] = max(r["peak_rss_mib"] for r in rounds)
    phases = [r.get("phase_peak_rss_mib", {}) for r in rounds]
    out["phase_peak_rss_mib"] = {k: max(p.get(k, 0.0) for p in phases)
                                 for k in dict.fromkeys(k for p in phases for k in p)}
    return out
