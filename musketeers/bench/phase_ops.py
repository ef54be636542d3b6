"""Why a phase of the training step is slow: the operations that take its time.

A phase's share of the roofline (``bench.roofline``) says how far it is from what the machine
can do, not why. ``PhaseOps`` runs steps under ``torch.profiler`` with each phase of
``runtime.step_profile.PhaseClock`` (sample, reference, forward, backward, optimizer) marked as
a range, then sums, inside each phase, every operation's own CPU time (its time minus its
children's). A phase's time not spent in any operation is Python between them, listed as
``(python)``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

MARK = "musketeers.phase:"  # the profiler range of each phase
PYTHON = "(python)"


class PhaseOps:
    """Within the ``with`` block, every phase is profiled (a range of its own, by
    ``step_profile.observing``); ``by_phase`` then holds, per phase,
    its seconds and each operation's own seconds."""

    def __init__(self) -> None:
        self.by_phase: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> PhaseOps:
        import torch

        from musketeers.runtime.step_profile import observing

        self._ranges = observing(lambda name: torch.profiler.record_function(MARK + name))
        self._ranges.__enter__()
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profiler.__exit__(None, None, None)
        self._ranges.__exit__(None, None, None)
        self.by_phase = phase_ops(self._profiler.events())


def phase_ops(events: Any) -> dict[str, dict[str, Any]]:
    """``{phase: {"s": seconds, "ops": {name: own seconds}}}`` from the profiler's events: each
    operation is billed to the outermost phase range around it (a phase that calls another's
    code, as the loss's forward inside the step's, is not counted twice)."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        if not e.name.startswith(MARK) or _inside_phase(e):
            continue
        entry = out.setdefault(e.name[len(MARK):], {"s": 0.0, "ops": defaultdict(float)})
        entry["s"] += e.cpu_time_total / 1e6
        stack = [e]
        while stack:
            node = stack.pop()
            name = PYTHON if node is e or node.name.startswith(MARK) else node.name
            entry["ops"][name] += node.self_cpu_time_total / 1e6
            stack.extend(node.cpu_children)
    return {k: {"s": v["s"], "ops": dict(v["ops"])} for k, v in out.items()}


def _inside_phase(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(MARK):
            return True
        parent = parent.cpu_parent
    return False


def top_ops(entry: dict[str, Any], n: int = 5) -> list[tuple[str, float]]:
    """The phase's ``n`` operations with the most own time, as (name, share of the phase)."""
    total = entry["s"] or 1.0
    ranked = sorted(entry["ops"].items(), key=lambda kv: -kv[1])[:n]
    return [(name, seconds / total) for name, seconds in ranked]
